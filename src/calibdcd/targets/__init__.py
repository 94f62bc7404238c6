"""Black-box target LLMs: the contract, the backends and the generation cache."""

from calibdcd.targets.base import (
    INHERIT,
    GenerationParams,
    Target,
    available_backends,
    create_target,
    generation_record,
    register_backend,
    resolve_params,
    validate_prompts,
)
from calibdcd.targets.cache import CachedTarget, CacheStats

__all__ = [
    "INHERIT",
    "CacheStats",
    "CachedTarget",
    "GenerationParams",
    "Target",
    "available_backends",
    "create_target",
    "generation_record",
    "register_backend",
    "resolve_params",
    "validate_prompts",
]
