"""DPDLLM (Zhou et al., 2024): reference-LM probabilities of the target's continuation + GNB.

Submodules: ``query`` (e0 and generation), ``reference`` (reference LM fine-tuning, cached),
``features`` (the feature vectors), ``gnb`` (Gaussian Naive Bayes log-odds), ``detector``.
Importing this package does not import torch; the reference LM loads it on first use.
"""

from calibdcd.detectors.dpdllm.detector import DPDLLM, DPDLLMConfig, DPDLLMFeatures, default_length
from calibdcd.detectors.dpdllm.features import FeatureConfig
from calibdcd.detectors.dpdllm.gnb import GaussianNB
from calibdcd.detectors.dpdllm.query import GenerationGap, first_words, join_prompt
from calibdcd.detectors.dpdllm.reference import ReferenceLM, ReferenceLMConfig

__all__ = [
    "DPDLLM",
    "DPDLLMConfig",
    "DPDLLMFeatures",
    "FeatureConfig",
    "GaussianNB",
    "GenerationGap",
    "ReferenceLM",
    "ReferenceLMConfig",
    "default_length",
    "first_words",
    "join_prompt",
]
