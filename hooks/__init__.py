"""TransformerLens hook functions that read and edit attention (capture, rollout, head scores, reinforcement, biases).

Depends on torch, einops, jaxtyping and transformer_lens only, never on aspan.
"""
