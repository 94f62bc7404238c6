"""VeilProbe (Hu et al., 2025): black-box pre-training text detection by input-output mapping
features and key-token perturbation, with explicit feature blocks for CalibDCD.

Modules: :mod:`.config` (typed config, ``official``/``paper``/``cpu`` presets),
:mod:`.sampling` (module A),
:mod:`.ot` + :mod:`.attribution` + :mod:`.perturb` + :mod:`.mlm` (module A'), :mod:`.mapping`
(module B/B'), :mod:`.features` (z = [E | D | dE | dD], pruning, normalisation),
:mod:`.protonet` (module C), :mod:`.detector` (the ``Detector``).

Importing this package does not import torch; the torch-backed modules import it lazily.
"""

from .config import (
    PRESETS,
    AttributionConfig,
    FeatureConfig,
    MappingConfig,
    MaskedLMConfig,
    PerturbConfig,
    ProtoNetConfig,
    SamplingConfig,
    VeilProbeConfig,
)
from .detector import VeilProbe, VeilProbeClassifier
from .features import BLOCKS, OUTPUT_BLOCKS, Preprocessor
from .ot import ipot, ot_distance
from .protonet import ProtoNetIB

__all__ = [
    "BLOCKS",
    "OUTPUT_BLOCKS",
    "PRESETS",
    "AttributionConfig",
    "FeatureConfig",
    "MappingConfig",
    "MaskedLMConfig",
    "PerturbConfig",
    "Preprocessor",
    "ProtoNetConfig",
    "ProtoNetIB",
    "SamplingConfig",
    "VeilProbe",
    "VeilProbeClassifier",
    "VeilProbeConfig",
    "ipot",
    "ot_distance",
]
