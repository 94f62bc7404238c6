"""The black-box target contract: prompt strings in, completion strings out.

Everything else in calibdcd (the detectors, CalibDCD's views, the experiment runner) sees a
target LLM only through :class:`Target`. Backends register themselves under a short name so a
config can say ``backend: hf`` or ``backend: openai``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Protocol, runtime_checkable

__all__ = [
    "GenerationParams",
    "Target",
    "available_backends",
    "create_target",
    "register_backend",
    "unknown_options",
    "validate_prompts",
]


@dataclasses.dataclass(frozen=True)
class GenerationParams:
    """How to sample completions. ``temperature == 0`` means greedy decoding.

    ``seed`` and the sample index (0..n-1) together determine a sampled completion, so a cached
    completion and a fresh one agree whatever the batch size or order.
    """

    max_new_tokens: int
    temperature: float
    top_p: float = 1.0
    top_k: int | None = None
    n: int = 1
    seed: int = 0

    def __post_init__(self) -> None:
        if not isinstance(self.max_new_tokens, int) or self.max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be an integer >= 1, got {self.max_new_tokens!r}")
        if not isinstance(self.n, int) or self.n < 1:
            raise ValueError(f"n must be an integer >= 1, got {self.n!r}")
        if not (self.temperature >= 0.0):
            raise ValueError(f"temperature must be >= 0, got {self.temperature!r}")
        if not (0.0 < self.top_p <= 1.0):
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p!r}")
        if self.top_k is not None and (not isinstance(self.top_k, int) or self.top_k < 1):
            raise ValueError(f"top_k must be None or an integer >= 1, got {self.top_k!r}")
        if not isinstance(self.seed, int):
            raise ValueError(f"seed must be an integer, got {self.seed!r}")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0

    def as_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


@runtime_checkable
class Target(Protocol):
    """A black-box LLM. ``generate`` returns, for each prompt, ``params.n`` completions
    (the prompt text itself is never included)."""

    #: stable identity for cache keys: model path or id plus a weights fingerprint
    name: str
    #: chat family used to pick model-specific views: "qwen2.5", "llama3.1",
    #: "deepseek-r1-distill-qwen", "lab", ... or None when unknown
    family: str | None

    def generate(self, prompts: Sequence[str], params: GenerationParams) -> list[list[str]]: ...


def validate_prompts(prompts: Sequence[str]) -> list[str]:
    """Check the ``prompts`` argument of :meth:`Target.generate` and return it as a list."""
    if isinstance(prompts, str):
        raise ValueError("prompts must be a sequence of strings, not a single string")
    out = list(prompts)
    if not out:
        raise ValueError("prompts is empty: nothing to generate")
    for i, p in enumerate(out):
        if not isinstance(p, str):
            raise ValueError(f"prompts[{i}] is {type(p).__name__}, expected str")
    return out


_BACKENDS: dict[str, Callable[..., Target]] = {}


def register_backend(name: str) -> Callable[[Callable[..., Target]], Callable[..., Target]]:
    """Class/function decorator: make a backend constructible by name via :func:`create_target`."""

    def deco(factory: Callable[..., Target]) -> Callable[..., Target]:
        if name in _BACKENDS and _BACKENDS[name] is not factory:
            raise ValueError(f"backend {name!r} is already registered")
        _BACKENDS[name] = factory
        return factory

    return deco


def available_backends() -> list[str]:
    _import_builtin_backends()
    return sorted(_BACKENDS)


def create_target(backend: str, **kwargs: Any) -> Target:
    """Build a target from a backend name and its keyword arguments (e.g. from a YAML config)."""
    _import_builtin_backends()
    try:
        factory = _BACKENDS[backend]
    except KeyError:
        raise ValueError(
            f"unknown target backend {backend!r}; available: {', '.join(sorted(_BACKENDS))}"
        ) from None
    unknown = unknown_options(backend, kwargs)
    if unknown:
        raise ValueError("; ".join(unknown))
    return factory(**kwargs)


def unknown_options(backend: str, options: Mapping[str, Any]) -> list[str]:
    """One message per option name that ``backend``'s constructor does not take (with the
    closest known name), checked against its signature without building anything."""
    import difflib
    import inspect

    _import_builtin_backends()
    factory = _BACKENDS.get(backend)
    if factory is None:
        return []
    params = inspect.signature(factory).parameters
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values()):
        return []
    known = [n for n, p in params.items() if p.kind is not inspect.Parameter.VAR_POSITIONAL]
    out = []
    for name in options:
        if name not in known:
            close = difflib.get_close_matches(name, known, n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            out.append(
                f"{name!r} is not an option of backend {backend!r}{hint}; "
                f"known: {', '.join(sorted(known))}"
            )
    return out


def _import_builtin_backends() -> None:
    # Imported lazily so that `import calibdcd` never needs torch.
    import importlib

    for mod in ("calibdcd.targets.hf", "calibdcd.targets.openai"):
        try:
            importlib.import_module(mod)
        except ImportError:  # optional extra not installed, or module not written yet
            pass
