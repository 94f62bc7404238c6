"""The detector registry: ``register_detector(name, factory)`` makes a detector buildable by
configs, :func:`create_detector` and the experiment (as ``register_backend`` does for targets).

Kept apart from :mod:`calibdcd.detectors.base` (the contract every detector imports) because
the registry imports the built-in registrations, which import every detector: a detector that
imported the registry would depend on all the others (the import-linter independence contract).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from typing import Any

from calibdcd.detectors.base import Detector

__all__ = [
    "DetectorFactory",
    "DetectorRegistration",
    "ParamsFactory",
    "create_detector",
    "create_detector_config",
    "detector_factory",
    "detector_registration",
    "register_detector",
    "registered_detectors",
]

#: (preset or None, options mapping, benchmark name or None, cache dir) -> detector
DetectorFactory = Callable[[str | None, Mapping[str, Any], str | None, str], Detector]
#: the same arguments -> the detector's parameters (its config dataclass), nothing built
ParamsFactory = Callable[[str | None, Mapping[str, Any], str | None, str], Any]


@dataclasses.dataclass(frozen=True)
class DetectorRegistration:
    """One registered detector: how to build it and what a dry run may know without importing
    it (its module, a description, the config fields naming models)."""

    name: str
    factory: DetectorFactory
    description: str = ""
    module: str | None = None
    #: (dotted field of the detector's config, "model" | "tokenizer") naming models
    #: (:func:`calibdcd.model_refs.models_in_config` lists them, defaults included)
    model_fields: tuple[tuple[str, str], ...] = ()
    #: its options take ``progress`` (bool): the experiment passes its own setting down
    progress: bool = False
    #: it runs torch models (a run whose targets and detectors run none never imports torch)
    uses_torch: bool = True
    #: its parameters apart from construction (as scikit-learn's ``get_params`` is apart from
    #: ``__init__`` and ``fit``); None: registered with a factory only
    params: ParamsFactory | None = None
    #: the detector from its parameters (given with ``params``); None: factory only
    construct: Callable[[Any], Detector] | None = None
    #: it reads the target's token log-probabilities (gray-box): a served target is asked
    #: before any work whether its server returns them (``logprob_preflight``)
    needs_logprobs: bool = False
    #: its classifier learns nothing from the training set (a score-only attack: the score is
    #: its statistic), so retraining it measures nothing: no noise floor is computed or shown
    score_only: bool = False

    def build(self, entry: Any, benchmark: str | None, cache_dir: str) -> Detector:
        """The detector of a config entry (anything with ``preset`` and ``options``)."""
        return self.factory(entry.preset, dict(entry.options), benchmark, cache_dir)

    def resolve_params(
        self, preset: str | None, options: Mapping[str, Any], benchmark: str | None, cache_dir: str
    ) -> Any:
        """The detector's config for these arguments without building the detector (a detector
        registered with a factory only is built to read it)."""
        if self.params is not None:
            return self.params(preset, dict(options), benchmark, cache_dir)
        return self.factory(preset, dict(options), benchmark, cache_dir).config


_FACTORIES: dict[str, DetectorRegistration] = {}


def register_detector(
    name: str,
    factory: DetectorFactory | None = None,
    *,
    params: ParamsFactory | None = None,
    build: Callable[[Any], Detector] | None = None,
    description: str = "",
    module: str | None = None,
    model_fields: tuple[tuple[str, str], ...] = (),
    progress: bool = False,
    uses_torch: bool = True,
    needs_logprobs: bool = False,
    score_only: bool = False,
    replace: bool = False,
) -> None:
    """Make detector ``name`` buildable by configs and :func:`create_detector`.

    ``factory(preset, options, benchmark, cache_dir)`` returns the detector. Or, parameters
    apart from construction: ``params(preset, options, benchmark, cache_dir)`` returns its
    config (checked and fingerprinted without building anything) and ``build(config)`` the
    detector (``factory`` is then their composition). ``module`` names
    the module that implements it (a dry run checks it is importable without importing it);
    ``progress``: its options take a ``progress`` flag (inner bars), which runs set to their own
    unless a config sets it; ``uses_torch``: it runs torch models (False lets a run with no
    torch model leave torch unimported); ``needs_logprobs``: it reads the target's token
    log-probabilities (a served target's server is checked for them before any work);
    ``score_only``: its classifier learns nothing (the score is the detector's statistic), so
    runs compute no noise floor for it and reports show none.
    """
    if not name or not isinstance(name, str):
        raise ValueError("a detector name must be a non-empty string")
    if name in _FACTORIES and not replace:
        raise ValueError(f"detector {name!r} is already registered (pass replace=True)")
    if factory is None:
        if params is None or build is None:
            raise ValueError(f"detector {name!r}: give a factory, or both params and build")
        factory = _composed(params, build)
    elif build is not None or params is not None:
        raise ValueError(f"detector {name!r}: give a factory or params + build, not both")
    _FACTORIES[name] = DetectorRegistration(
        name,
        factory,
        description,
        module,
        model_fields,
        progress,
        uses_torch,
        params,
        build,
        needs_logprobs,
        score_only,
    )


def _composed(params: ParamsFactory, build: Callable[[Any], Detector]) -> DetectorFactory:
    def factory(
        preset: str | None, options: Mapping[str, Any], benchmark: str | None, cache_dir: str
    ) -> Detector:
        return build(params(preset, options, benchmark, cache_dir))

    return factory


def registered_detectors() -> dict[str, DetectorRegistration]:
    """name -> registration of every registered detector (built-ins included)."""
    _ensure_builtins()
    return dict(sorted(_FACTORIES.items()))


def _registration(name: str) -> DetectorRegistration:
    _ensure_builtins()
    try:
        return _FACTORIES[name]
    except KeyError:
        raise ValueError(
            f"unknown detector {name!r}; known: {', '.join(sorted(_FACTORIES))}"
        ) from None


def detector_factory(name: str) -> DetectorFactory:
    return _registration(name).factory


def detector_registration(name: str) -> DetectorRegistration:
    """The registration of detector ``name`` (ValueError naming the known ones)."""
    return _registration(name)


def create_detector(
    name: str,
    *,
    preset: str | None = None,
    options: Mapping[str, Any] | None = None,
    benchmark: str | None = None,
    cache_dir: str = ".",
) -> Detector:
    """The registered detector ``name`` built from a preset and nested option overrides."""
    return detector_factory(name)(preset, dict(options or {}), benchmark, cache_dir)


def create_detector_config(
    name: str,
    *,
    preset: str | None = None,
    options: Mapping[str, Any] | None = None,
    benchmark: str | None = None,
    cache_dir: str = ".",
) -> Any:
    """The config (parameters) :func:`create_detector` would build detector ``name`` with, the
    detector itself not built: ``create_detector(...).config`` equals it."""
    return _registration(name).resolve_params(preset, dict(options or {}), benchmark, cache_dir)


def _ensure_builtins() -> None:
    from calibdcd.detectors import builtin  # noqa: F401  (the built-in registrations)
