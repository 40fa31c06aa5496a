"""Why did this answer fail: the failure anatomy of one sample (`explain`) and across lengths (`explain_lengths`).

    from aspan.anatomy import explain
    anatomy = explain(model, tokenizer, sample)          # one row per output token, every head read
    anatomy.causes                                       # the likely cause in words, from tested rules
    anatomy.figure(); anatomy.view()                     # plotly: tokens x heads; circuitsvis, references highlighted

The heads followed are the ranking's (Spiegel et al. 2025, Appendix F, with the shifted-reference scan) unless given;
the rules behind each sentence are in `aspan.anatomy.causes`.
"""
from .causes import MASS_ON, RULES
from .heads import ExplainOptions, NamedEdit
from .lengths import LengthAnatomy, LengthOptions, explain_lengths
from .sample import Anatomy, explain

__all__ = ["MASS_ON", "RULES", "Anatomy", "ExplainOptions", "LengthAnatomy", "LengthOptions", "NamedEdit",
           "explain", "explain_lengths"]
