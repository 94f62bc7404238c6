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
    "create_detector",
    "detector_factory",
    "register_detector",
    "registered_detectors",
]

#: (preset or None, options mapping, benchmark name or None, cache dir) -> detector
DetectorFactory = Callable[[str | None, Mapping[str, Any], str | None, str], Detector]


@dataclasses.dataclass(frozen=True)
class DetectorRegistration:
    """One registered detector: how to build it and what a dry run may know without importing
    it (its module, a description, the config fields naming models)."""

    name: str
    factory: DetectorFactory
    description: str = ""
    module: str | None = None
    #: (dotted field of the detector's config, "model" | "tokenizer") naming models
    #: (:func:`calibdcd.models.models_in_config` lists them, defaults included)
    model_fields: tuple[tuple[str, str], ...] = ()
    #: its options take ``progress`` (bool): the experiment passes its own setting down
    progress: bool = False
    #: it runs torch models (a run whose targets and detectors run none never imports torch)
    uses_torch: bool = True

    def build(self, entry: Any, benchmark: str | None, cache_dir: str) -> Detector:
        """The detector of a config entry (anything with ``preset`` and ``options``)."""
        return self.factory(entry.preset, dict(entry.options), benchmark, cache_dir)


_FACTORIES: dict[str, DetectorRegistration] = {}


def register_detector(
    name: str,
    factory: DetectorFactory,
    *,
    description: str = "",
    module: str | None = None,
    model_fields: tuple[tuple[str, str], ...] = (),
    progress: bool = False,
    uses_torch: bool = True,
    replace: bool = False,
) -> None:
    """Make detector ``name`` buildable by configs and :func:`create_detector`.

    ``factory(preset, options, benchmark, cache_dir)`` returns the detector; ``module`` names
    the module that implements it (a dry run checks it is importable without importing it);
    ``progress``: its options take a ``progress`` flag (inner bars), which runs set to their own
    unless a config sets it; ``uses_torch``: it runs torch models (False lets a run with no
    torch model leave torch unimported).
    """
    if not name or not isinstance(name, str):
        raise ValueError("a detector name must be a non-empty string")
    if name in _FACTORIES and not replace:
        raise ValueError(f"detector {name!r} is already registered (pass replace=True)")
    _FACTORIES[name] = DetectorRegistration(
        name, factory, description, module, model_fields, progress, uses_torch
    )


def registered_detectors() -> dict[str, DetectorRegistration]:
    """name -> registration of every registered detector (built-ins included)."""
    _ensure_builtins()
    return dict(sorted(_FACTORIES.items()))


def detector_factory(name: str) -> DetectorFactory:
    _ensure_builtins()
    try:
        return _FACTORIES[name].factory
    except KeyError:
        raise ValueError(
            f"unknown detector {name!r}; known: {', '.join(sorted(_FACTORIES))}"
        ) from None


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


def _ensure_builtins() -> None:
    from calibdcd.detectors import builtin  # noqa: F401  (registers veilprobe, dpdllm, overlap)
