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
    "INHERIT",
    "INHERITABLE",
    "GenerationParams",
    "Target",
    "available_backends",
    "backend_options",
    "create_target",
    "generation_record",
    "loads_hub_models",
    "option_problems",
    "register_backend",
    "resolve_params",
    "unknown_options",
    "validate_prompts",
]


#: marks a decoding field left to the target: an in-process backend fills it from the checkpoint's
#: ``generation_config`` (transformers' defaults where that is silent), a server backend leaves it
#: out of the request so the server applies its own (vLLM: the model's generation config)
INHERIT = "inherit"
#: the fields that may be :data:`INHERIT`
INHERITABLE = ("temperature", "top_p", "top_k", "repetition_penalty")


@dataclasses.dataclass(frozen=True)
class GenerationParams:
    """How to sample completions. ``temperature == 0`` means greedy decoding.

    ``top_k`` None (or 0) = no top-k truncation, ``top_p`` 1.0 = no nucleus truncation,
    ``repetition_penalty`` 1.0 = none (> 1 penalises every token already in the prompt or the
    completion, as transformers' ``RepetitionPenaltyLogitsProcessor``). Any field of
    :data:`INHERITABLE` may be :data:`INHERIT` (``"inherit"``): the target decides it (see
    :meth:`inherited` and the backends' ``resolve_params``).

    ``seed`` and the sample index (0..n-1) together determine a sampled completion, so a cached
    completion and a fresh one agree whatever the batch size or order.
    """

    max_new_tokens: int
    temperature: float | str
    top_p: float | str = 1.0
    top_k: int | str | None = None
    n: int = 1
    seed: int = 0
    repetition_penalty: float | str = 1.0

    def __post_init__(self) -> None:
        if not isinstance(self.max_new_tokens, int) or self.max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be an integer >= 1, got {self.max_new_tokens!r}")
        if not isinstance(self.n, int) or self.n < 1:
            raise ValueError(f"n must be an integer >= 1, got {self.n!r}")
        for name in INHERITABLE:
            v = getattr(self, name)
            if isinstance(v, str) and v != INHERIT:
                raise ValueError(f"{name} must be a number or {INHERIT!r}, got {v!r}")
        t, p, k, r = self.temperature, self.top_p, self.top_k, self.repetition_penalty
        if t != INHERIT and not (t >= 0.0):
            raise ValueError(f"temperature must be >= 0, got {t!r}")
        if p != INHERIT and not (0.0 < p <= 1.0):
            raise ValueError(f"top_p must be in (0, 1], got {p!r}")
        if k not in (None, INHERIT) and (isinstance(k, bool) or not isinstance(k, int) or k < 0):
            raise ValueError(f"top_k must be None, {INHERIT!r} or an integer >= 0, got {k!r}")
        if k == 0:  # transformers' and vLLM's "no top-k": one spelling inside calibdcd
            object.__setattr__(self, "top_k", None)
        if r != INHERIT and not (r > 0.0):
            raise ValueError(f"repetition_penalty must be > 0, got {r!r}")
        if not isinstance(self.seed, int):
            raise ValueError(f"seed must be an integer, got {self.seed!r}")

    @property
    def greedy(self) -> bool:
        """Greedy decoding (``temperature == 0``); False while the temperature is inherited."""
        return self.temperature == 0.0

    def inherited(self) -> tuple[str, ...]:
        """The fields left to the target (:data:`INHERIT`)."""
        return tuple(f for f in INHERITABLE if getattr(self, f) == INHERIT)

    def as_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def resolve_params(target: Any, params: GenerationParams) -> GenerationParams:
    """``params`` as ``target`` decodes them: ``target.resolve_params(params)`` when the target
    has it (in-process backends fill inherited fields; server backends keep them, to be left out
    of the request); unchanged for a target without it (e.g. a user's wrapper around a built-in
    backend), which receives ``"inherit"`` as it is and must handle or forward it."""
    fn = getattr(target, "resolve_params", None)
    return fn(params) if callable(fn) else params


def generation_record(target: Any, params: GenerationParams) -> dict[str, Any]:
    """What ``target`` decodes ``params`` with, for a run directory: ``requested`` (the detector's
    params, ``"inherit"`` where it left a field open) and the backend's own account (in-process:
    ``used`` = every resolved value and where inherited values came from; server: ``sent`` = the
    request fields, ``left_to_server`` = the fields omitted)."""
    fn = getattr(target, "generation_record", None)
    if callable(fn):
        return fn(params)
    used = resolve_params(target, params)
    return {
        "requested": params.as_dict(),
        "used": None if used.inherited() else used.as_dict(),
        "note": None if not used.inherited() else "the target does not report inherited values",
    }


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


#: checks a backend's option values without building anything: ``check(model, options)`` raises
#: ValueError, TypeError or RuntimeError for what the backend's constructor would reject
OptionCheck = Callable[[str, Mapping[str, Any]], None]


@dataclasses.dataclass(frozen=True)
class _Backend:
    """What a backend registered: how to build it, and what the contract asks of it by name."""

    factory: Callable[..., Target]
    check_options: OptionCheck | None = None
    hub_models: bool = False


_BACKENDS: dict[str, _Backend] = {}


def register_backend(
    name: str, *, check_options: OptionCheck | None = None, hub_models: bool = False
) -> Callable[[Callable[..., Target]], Callable[..., Target]]:
    """Class/function decorator: make a backend constructible by name via :func:`create_target`.

    ``check_options(model, options)``: the backend's check of option values without loading a
    model or opening a connection (:func:`value_problem_of`; none: nothing is checked).
    ``hub_models``: the backend loads hub ids (``org/name``) from the local hub cache, so a
    target's identity records the cached snapshot's revision (:mod:`calibdcd.targets.identity`).
    """

    def deco(factory: Callable[..., Target]) -> Callable[..., Target]:
        known = _BACKENDS.get(name)
        if known is not None and known.factory is not factory:
            raise ValueError(f"backend {name!r} is already registered")
        _BACKENDS[name] = _Backend(factory, check_options, hub_models)
        return factory

    return deco


def available_backends() -> list[str]:
    _import_builtin_backends()
    return sorted(_BACKENDS)


def create_target(backend: str, **kwargs: Any) -> Target:
    """Build a target from a backend name and its keyword arguments (e.g. from a YAML config)."""
    _import_builtin_backends()
    try:
        factory = _BACKENDS[backend].factory
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
    return [
        f"{key[0]!r} {msg}"
        for key, msg in option_problems(backend, options)
        if "not an option" in msg
    ]


def backend_options(backend: str) -> list[str]:
    """The option names ``backend``'s constructor takes, read from its signature (nothing is
    built; [] for an unknown backend)."""
    import inspect

    factory = _factory(backend)
    if factory is None:
        return []
    params = inspect.signature(factory).parameters.values()
    return [p.name for p in params if p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)]


def option_problems(backend: str, options: Mapping[str, Any]) -> list[tuple[tuple[str], str]]:
    """(option name, problem) for every option ``backend``'s constructor does not take (with the
    closest known name) or whose value does not fit its annotation; nothing is built."""
    import inspect

    from calibdcd.options import suggestion, type_hints, type_problem

    factory = _factory(backend)
    if factory is None:
        return []
    params = inspect.signature(factory).parameters
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values()):
        return []
    known = [n for n, p in params.items() if p.kind is not inspect.Parameter.VAR_POSITIONAL]
    hints = type_hints(factory)
    out: list[tuple[tuple[str], str]] = []
    for name, value in options.items():
        if name not in known:
            close = suggestion(name, known)
            hint = close if close.startswith(" (did") else ""
            out.append(
                (
                    (name,),
                    f"is not an option of backend {backend!r}{hint}; "
                    f"known: {', '.join(sorted(known))}",
                )
            )
            continue
        problem = type_problem(hints.get(name), value)
        if problem is not None:
            out.append(((name,), f"{problem} (option of backend {backend!r})"))
    return out


def value_problem_of(backend: str, model: str, options: Mapping[str, Any]) -> str | None:
    """What ``backend``'s constructor would reject in the option values (a negative timeout, a
    zero batch size, an unknown dtype, a device this machine lacks, a base URL that is not one),
    checked without loading a model or opening a connection; None when nothing. Unknown or
    mistyped options are :func:`option_problems`' to report and are left out here."""
    flagged = {key[0] for key, _ in option_problems(backend, options)}
    opts = {k: v for k, v in options.items() if k not in flagged}
    registered = _registered(backend)
    if registered is None or registered.check_options is None:
        return None
    try:
        registered.check_options(model, opts)
    except ImportError:
        return None
    except (ValueError, TypeError, RuntimeError) as exc:
        return str(exc)
    return None


def loads_hub_models(backend: str) -> bool:
    """Whether ``backend`` was registered with ``hub_models=True`` (it loads hub ids from the
    local hub cache); False for an unknown backend."""
    registered = _registered(backend)
    return registered is not None and registered.hub_models


def _factory(backend: str) -> Callable[..., Target] | None:
    registered = _registered(backend)
    return None if registered is None else registered.factory


def _registered(backend: str) -> _Backend | None:
    _import_builtin_backends()
    return _BACKENDS.get(backend)


#: the modules that register the built-in backends (each with its own ``@register_backend``);
#: imported on first use, not here, so that ``import calibdcd`` never needs torch
BUILTIN_BACKEND_MODULES = ("calibdcd.targets.hf", "calibdcd.targets.openai")


def _import_builtin_backends() -> None:
    import importlib

    for mod in BUILTIN_BACKEND_MODULES:
        try:
            importlib.import_module(mod)
        except ImportError:  # optional extra not installed, or module not written yet
            pass
