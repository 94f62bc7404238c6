"""The controlled contamination lab: small LMs with known pre-training members.

``build_lab`` pre-trains a tiny Llama on a corpus containing a known random half of a text pool
(repeated so it is memorised), post-trains it into three chat styles and writes the ground
truth; ``ensure_lab`` does so once into a cache; ``check_lab`` measures membership signals.
Importing this package does not import torch.
"""

from __future__ import annotations

from calibdcd.lab.build import build_lab, ensure_lab, is_complete_lab
from calibdcd.lab.chat import CHAT_STYLES, render_chat, split_reasoning
from calibdcd.lab.config import PRESETS, LabConfig, resolve_config
from calibdcd.lab.evaluate import check_lab, format_check, load_ground_truth
from calibdcd.lab.real import REAL_PRESETS

#: every lab preset name: the synthetic lab's and the real-model lab's
KNOWN_PRESETS = tuple(sorted({*PRESETS, *REAL_PRESETS}))

__all__ = [
    "CHAT_STYLES",
    "KNOWN_PRESETS",
    "PRESETS",
    "REAL_PRESETS",
    "LabConfig",
    "build_lab",
    "check_lab",
    "ensure_lab",
    "format_check",
    "is_complete_lab",
    "load_ground_truth",
    "render_chat",
    "resolve_config",
    "split_reasoning",
]
