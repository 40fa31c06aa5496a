"""Whether a model can run a task, decided from its config, its hook points and the tokenizer, before any forward.

    aspan.check_model(model, tokenizer, "reversal")   # one line on what fits, or a UsageError naming the fix

A model built by hand fails deep inside TransformerLens otherwise: a vocabulary smaller than the tokenizer's ids is an
`IndexError` in the embedding, a context shorter than the longest sample breaks the rotary tables, a model without
attention hook points is never edited. `evaluate`, `rank_heads`, `train` and the experiment engine make the same
checks on what they are given (`check_fit`), and `aspan doctor --model` prints the result.
"""
from __future__ import annotations

from typing import NamedTuple

from .. import tasks
from ..errors import UsageError
from ..tasks.base import Task
from ..tokenization import CharTokenizer, Tokenizer, check_tokenizer, require_tokenizer

# The hook points aspan reads and edits attention at, in every layer (`hooks.pattern_name`, `hooks.scores_name`).
ATTENTION_HOOKS = ("hook_pattern", "hook_attn_scores")
CONFIG_FIELDS = ("n_layers", "n_heads", "n_ctx", "d_vocab")
BUILD_ONE = ("build a HookedTransformer (TransformerLens 3), boot a TransformerBridge in compatibility mode "
             "(TransformerBridge.boot_transformers(path), then .enable_compatibility_mode()), or load it with "
             "aspan.models.load(path)")


class Workload(NamedTuple):
    """What a task or a set of samples asks of a model: the characters its texts use and the longest text."""

    chars: str  # every character of the texts
    longest: int  # characters of the longest text (prompt and target)
    task: Task | int  # the task (its parameters advise on what fits), or the longest length alone


def workload(task: Task | str) -> Workload:
    """The workload of `task` (a task name: its OOD preset, the longest samples it will be asked)."""
    task = tasks.preset(task, "ood") if isinstance(task, str) else task
    return Workload(task.alphabet, task.max_text_len(), task)


def of_samples(samples) -> Workload:
    """The workload of a list of samples (their characters and longest text)."""
    longest = max(len(s.text) for s in samples)
    return Workload("".join(sorted({c for s in samples for c in s.text})), longest, longest)


def check_model(model, tokenizer: Tokenizer, task: Task | str | None = None) -> str:
    """Whether `model` with `tokenizer` can run `task` (a Task, or a task name: its OOD preset; None: the vocabulary
    and hook points alone), without a forward. Returns one line saying what fits; raises a one-line `UsageError`
    naming the fix (a TypeError for a tokenizer that is not aspan's) when:

    - the model has no TransformerLens attention hook points in every layer (`blocks.L.attn.hook_pattern` and
      `hook_attn_scores`: a plain Hugging Face or PyTorch module);
    - a task character is not exactly one token of the tokenizer;
    - the vocabulary is too small: an id the tokenizer gives is >= the model's `d_vocab` (or `d_vocab_out`);
    - the context is too short for the longest sample: prefix (`tokenizer.offset`) + text + EOS > `n_ctx`.
    """
    require_tokenizer(tokenizer, "check_model: tokenizer")
    return check_fit(model, tokenizer, None if task is None else workload(task), "check_model")


def check_fit(model, tokenizer: Tokenizer, need: Workload | None, where: str) -> str:
    """`check_model` on a workload (None: the vocabulary and hook points alone), its errors prefixed by `where`."""
    cfg = check_hookable(model, where)
    chars = need.chars if need is not None else getattr(tokenizer, "chars", "")
    _check_single_tokens(tokenizer, chars, where)
    top = _check_vocabulary(cfg, tokenizer, chars, where)
    line = (f"{type(model).__name__} {cfg.n_layers} layers x {cfg.n_heads} heads: d_vocab {cfg.d_vocab} covers the "
            f"tokenizer's ids (up to {top})")
    if need is None:
        return f"{line}; n_ctx {cfg.n_ctx} (no task given: its context is not checked)"
    needed = _check_context(cfg.n_ctx, tokenizer, need, where)
    return f"{line}; n_ctx {cfg.n_ctx} >= the {needed} tokens of the longest {_name(need)} sample"


def check_hookable(model, where: str):
    """The model's TransformerLens config when every layer has the attention hook points aspan uses; UsageError
    naming how to get such a model otherwise."""
    cfg, points = getattr(model, "cfg", None), getattr(model, "hook_dict", None)
    kind = type(model).__name__
    if cfg is None or not isinstance(points, dict) or any(not hasattr(cfg, f) for f in CONFIG_FIELDS):
        raise UsageError(f"{where}: model: a {kind} is not a TransformerLens model (aspan reads and edits attention "
                         f"at its hook points, and reads n_layers, n_heads, n_ctx and d_vocab from model.cfg): "
                         f"{BUILD_ONE}")
    for layer in range(cfg.n_layers):
        for hook in ATTENTION_HOOKS:
            name = f"blocks.{layer}.attn.{hook}"
            if name not in points:
                fix = ("call model.enable_compatibility_mode() on the bridge first" if _is_bridge(model) else BUILD_ONE)
                raise UsageError(f"{where}: model: this {kind} has no hook point {name!r} (aspan reads and edits "
                                 f"attention at blocks.L.attn.{' and '.join(ATTENTION_HOOKS)} of every layer): {fix}")
    return cfg


def _is_bridge(model) -> bool:
    return getattr(model, "original_model", None) is not None


def _check_single_tokens(tokenizer: Tokenizer, chars: str, where: str) -> None:
    """UsageError naming the task characters the tokenizer does not map to exactly one token each."""
    try:
        check = getattr(tokenizer, "check", None)
        check(chars) if callable(check) else check_tokenizer(tokenizer, chars)
    except ValueError as e:
        fix = ("extend it with aspan.CharTokenizer.for_alphabets(task.alphabet), and build the model with d_vocab >= "
               "its vocab_size" if isinstance(tokenizer, CharTokenizer) else
               "choose a task whose characters it has as single tokens, or a model with aspan.CharTokenizer()")
        raise UsageError(f"{where}: tokenizer: {e}; the tasks need one token per character: {fix}") from None


def _check_vocabulary(cfg, tokenizer: Tokenizer, chars: str, where: str) -> int:
    """The largest id the workload gives the model; UsageError when it is outside the model's vocabulary (the
    embedding's `d_vocab`, or the unembedding's `d_vocab_out` for the ids it must predict)."""
    targets = [*tokenizer.encode(chars), *([] if tokenizer.eos_id is None else [tokenizer.eos_id])]
    inputs = [*targets, *tokenizer.prefix_ids(), tokenizer.pad_id]
    d_vocab = int(cfg.d_vocab)
    d_out = int(getattr(cfg, "d_vocab_out", -1) or -1)
    d_out = d_vocab if d_out < 1 else d_out
    for ids, size, name in ((inputs, d_vocab, "d_vocab"), (targets, d_out, "d_vocab_out")):
        top = max(ids)
        if top >= size:
            raise UsageError(f"{where}: model: vocabulary too small: {name}={size} but the tokenizer gives ids up to "
                             f"{top} ({tokenizer!r}); build the model with {name} >= {top + 1} (e.g. "
                             f"HookedTransformerConfig(d_vocab=tokenizer.vocab_size, ...)), or pair it with the "
                             f"tokenizer it was trained with")
    return max(inputs)


def _check_context(n_ctx: int, tokenizer: Tokenizer, need: Workload, where: str) -> int:
    """The tokens the longest sample needs; UsageError (naming the n_ctx to build, and what this one fits) when the
    context is shorter."""
    from .tiny import check_context

    try:
        return check_context(int(n_ctx), need.task if isinstance(need.task, Task) else need.longest, tokenizer.offset,
                             eos=tokenizer.eos_id is not None)
    except ValueError as e:
        raise UsageError(f"{where}: model: {e}") from None


def _name(need: Workload) -> str:
    return need.task.name if isinstance(need.task, Task) and need.task.name else "given"
