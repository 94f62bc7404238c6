"""Black-box target LLMs: the contract, the backends and the generation cache."""

from calibdcd.targets.base import (
    GenerationParams,
    Target,
    available_backends,
    create_target,
    register_backend,
    validate_prompts,
)
from calibdcd.targets.cache import CachedTarget, CacheStats

__all__ = [
    "CacheStats",
    "CachedTarget",
    "GenerationParams",
    "Target",
    "available_backends",
    "create_target",
    "register_backend",
    "validate_prompts",
]
