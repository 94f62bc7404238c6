"""Black-box target LLMs: the contract, the backends and the generation cache."""

from calibdcd.targets.base import (
    GenerationParams,
    Target,
    available_backends,
    create_target,
    register_backend,
    validate_prompts,
)

__all__ = [
    "GenerationParams",
    "Target",
    "available_backends",
    "create_target",
    "register_backend",
    "validate_prompts",
]
