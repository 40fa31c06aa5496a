"""The toolkit never touches the network: Hugging Face's offline switches, forced for the whole process.

`force_offline()` runs when `aspan` is imported, before anything imports `transformers` or `huggingface_hub` (both
read `HF_HUB_OFFLINE` / `TRANSFORMERS_OFFLINE` once, at import), and again before every model load, where it also
flips `huggingface_hub`'s switch in case that package was imported first. Every `from_pretrained` call in the
toolkit passes `local_files_only=True` as well, and none passes `trust_remote_code`.
"""
from __future__ import annotations

import os
import sys

OFFLINE_VARIABLES = ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE")


def force_offline() -> None:
    """Set Hugging Face's offline switches (environment, and `huggingface_hub.constants` if already imported)."""
    for name in OFFLINE_VARIABLES:
        os.environ[name] = "1"
    constants = sys.modules.get("huggingface_hub.constants")
    if constants is not None:
        constants.HF_HUB_OFFLINE = True
