"""Detectors from config entries: built by name through the registry of
:func:`calibdcd.detectors.registry.register_detector` (:data:`DETECTORS` is a live view of it;
each registration knows its module, checked without importing it in dry runs) from a preset
and nested option overrides (``options: {sampling: {max_new_tokens: 64}}`` replaces that field
of the preset's nested dataclass); their fingerprint (the feature cache's key); and the config
check of a ``detectors`` entry (registered with the config reader on import)."""

from __future__ import annotations

import dataclasses
import hashlib
import importlib.util
import json
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from calibdcd.detectors.registry import (
    DetectorRegistration,
    create_detector_config,
    detector_registration,
    registered_detectors,
)
from calibdcd.experiment.config import DetectorEntry, register_entry_check
from calibdcd.experiment.labs import resolve_lab_refs
from calibdcd.keys import key_dict
from calibdcd.options import OptionsError, option_problems, suggestion
from calibdcd.paths import cache_root, strip_locations

__all__ = [
    "DETECTORS",
    "PlannedDetector",
    "detector_available",
    "detector_entry_problems",
    "detector_fingerprint",
    "plan_detector",
    "seed_offsets",
]


class _Registered(Mapping[str, DetectorRegistration]):
    """The registered detectors by name (a live view of the registry)."""

    def __getitem__(self, name: str) -> DetectorRegistration:
        return registered_detectors()[name]

    def __iter__(self) -> Iterator[str]:
        return iter(registered_detectors())

    def __len__(self) -> int:
        return len(registered_detectors())


DETECTORS: Mapping[str, DetectorRegistration] = _Registered()


def detector_available(name: str) -> bool:
    module = DETECTORS[name].module
    if module is None:
        return True
    try:
        return importlib.util.find_spec(module) is not None
    except ModuleNotFoundError:
        return False


def _resolved_config(entry: DetectorEntry, benchmark: str, cache_dir: str) -> Any:
    """The parameters ``entry``'s detector is built with (its config dataclass) for
    ``benchmark`` under the cache root ``cache_dir``; lab references resolved, none built."""
    options = resolve_lab_refs(dict(entry.options), build=False, root=cache_dir)
    return create_detector_config(
        entry.name, preset=entry.preset, options=options, benchmark=benchmark,
        cache_dir=cache_dir,
    )  # fmt: skip


def seed_offsets(config: Any, seed: int) -> dict[str, Any]:
    """Nested options that add ``seed`` to every ``seed`` field of a detector config tree."""
    if config is None or not dataclasses.is_dataclass(config):
        return {}
    out: dict[str, Any] = {}
    for f in dataclasses.fields(config):
        v = getattr(config, f.name)
        if f.name == "seed" and isinstance(v, int) and not isinstance(v, bool):
            out["seed"] = v + seed
        elif dataclasses.is_dataclass(v):
            sub = seed_offsets(v, seed)
            if sub:
                out[f.name] = sub
    return out


def _deep_merge(base: Mapping[str, Any], over: Mapping[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for k, v in over.items():
        if isinstance(v, Mapping) and isinstance(out.get(k), Mapping):
            out[k] = _deep_merge(out[k], v)
        else:
            out[k] = v
    return out


def _shifted(entry: DetectorEntry, offsets: Mapping[str, Any]) -> DetectorEntry:
    """``entry`` with a seed's offsets merged into its options."""
    return dataclasses.replace(entry, options=_deep_merge(entry.options, offsets))


@dataclasses.dataclass(frozen=True)
class PlannedDetector:
    """A detector as a run's plan holds it: for one benchmark (the name it is configured for)
    and detector seed, resolved and not built. ``entry``: the config entry with the seed's
    offsets merged into its options (every ``seed`` field of the preset's config shifted by the
    seed; seed 0 leaves the entry as written); ``seed``: the seed it was resolved for (the
    plan's :func:`~calibdcd.experiment.plan.detector_seed`); ``config``: the parameters it will
    be built with, or None with ``problem`` when they cannot be resolved here (a detector whose
    package is not installed, a bad option, a lab file that is not built yet: the plan's
    ``materialize`` resolves it again once built); ``cache_dir``: the cache root it was
    resolved under."""

    entry: DetectorEntry
    benchmark: str
    seed: int
    config: Any | None
    problem: str | None = None
    #: the options the seed set (merged into ``entry``; empty for seed 0)
    offsets: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    cache_dir: str | None = None
    #: the exception ``problem`` says (raised again by :meth:`build`)
    error: Exception | None = dataclasses.field(default=None, compare=False, repr=False)

    @property
    def key(self) -> tuple[str, str, int]:
        return (self.entry.label, self.benchmark, self.seed)

    def describe(self) -> str:
        bench = f" for {self.benchmark}" if self.benchmark else ""
        head = f"detector {self.entry.label}{bench}, seed {self.seed}"
        if self.problem is not None:
            return f"{head}: not resolved here ({self.problem})"
        flat = _flat(self.offsets)
        shifted = ", ".join(f"{k}={v}" for k, v in flat.items())
        return f"{head}: " + (f"options {shifted}" if shifted else "as configured")

    @property
    def logprobs(self) -> int | None:
        """The top-k alternatives per position it asks of the target's token log-probabilities
        (0: the tokens' own only); None when it reads none (not gray-box), or when its
        parameters could not be resolved here."""
        if self.config is None or not detector_registration(self.entry.name).needs_logprobs:
            return None
        return int(getattr(self.config, "alternatives", 0) or 0)

    def build_config(self) -> Any:
        """The resolved parameters; one that could not be resolved raises its ``problem``."""
        if self.config is None:
            raise self.error or ValueError(f"detector {self.entry.label}: {self.problem}")
        return self.config

    def build(self, *, progress: bool | None = None) -> Any:
        """The detector, built once from the resolved parameters (``progress``, when not None
        and the detector takes it, unless its options set it: its inner bars). One that could
        not be resolved raises its ``problem``."""
        config = self.build_config()
        reg = detector_registration(self.entry.name)
        take = progress is not None and reg.progress and "progress" not in self.entry.options
        if reg.construct is None:  # registered with a factory only
            options = dict(self.entry.options)
            if take:
                options["progress"] = progress
            return reg.factory(self.entry.preset, options, self.benchmark, str(self.cache_dir))
        if take:
            config = dataclasses.replace(config, progress=progress)
        return reg.construct(config)


def _flat(tree: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in tree.items():
        if isinstance(v, Mapping):
            out.update(_flat(v, f"{prefix}{k}."))
        else:
            out[f"{prefix}{k}"] = v
    return out


def plan_detector(
    entry: DetectorEntry, benchmark: str, seed: int, cache_dir: str | None
) -> PlannedDetector:
    """``entry``'s detector for ``benchmark`` and detector seed ``seed``, resolved without
    building any lab (the one place a seed becomes detector options): its preset's parameters
    give the seed fields, shifted by ``seed``. What cannot be resolved is the plan's
    ``problem``, not an error: a run meets it when it builds."""
    cache_dir = str(cache_root(cache_dir))
    try:
        base = _resolved_config(entry, benchmark, cache_dir)
    except Exception as exc:  # the build reports it, in the setting that needs it
        return PlannedDetector(entry, benchmark, seed, None, str(exc), {}, cache_dir, exc)
    if seed == 0:
        return PlannedDetector(entry, benchmark, 0, base, cache_dir=cache_dir)
    offsets = seed_offsets(base, seed)
    shifted = _shifted(entry, offsets)
    try:
        config = _resolved_config(shifted, benchmark, cache_dir)
    except Exception as exc:
        return PlannedDetector(shifted, benchmark, seed, None, str(exc), offsets, cache_dir, exc)
    return PlannedDetector(shifted, benchmark, seed, config, None, offsets, cache_dir)


def _without_locations(value: Any, root: str | Path | None = None) -> Any:
    """A detector config without where things live: ``progress``/``cache_dir`` keys dropped at
    every level, a local model path replaced by its name and content hash (e.g. a lab's clean
    reference LM in the cache; digests memoised under the cache root ``root``), any other
    absolute path by its name."""

    def located(value: str) -> Any:
        p = Path(value)
        if p.is_dir():
            from calibdcd.model_refs import checkpoint_identity

            try:
                return {"name": p.name, "content": checkpoint_identity(p, root)}
            except ValueError:  # no checkpoint files in it
                pass
        return p.name

    return strip_locations(value, drop_keys=("progress", "cache_dir"), path=located)


def detector_fingerprint(detector: Any, root: str | Path | None = None) -> str:
    """A stable description of a detector's configuration, for cache keys (``root``: the run's
    cache root, where checkpoint digests are memoised)."""
    cfg = detector.config
    if not (dataclasses.is_dataclass(cfg) and not isinstance(cfg, type)):
        # a repr would give every option variant one feature-cache key (or a new one per run)
        raise TypeError(
            f"detector {detector.name!r}: its config must be a dataclass instance (the feature "
            f"cache's key is its fingerprint), got {type(cfg).__name__}"
        )
    d = _without_locations(key_dict(cfg), root)  # added fields at old values: old keys
    body = json.dumps(d, sort_keys=True, default=str)
    version = detector.cache_version
    if version is not None:  # a detector's artefact recipe changed: its old features are stale
        body += f"\x1ecache_version={version}"
    return f"{detector.name}:{hashlib.sha256(body.encode()).hexdigest()[:16]}"


def _check_context(data: Mapping[str, Any]) -> tuple[str, str]:
    """(the name the config's first benchmark loads under, the config's cache root) for a
    detector entry's check, from the file's raw mapping ("" and the default root where the
    file does not say)."""
    from calibdcd.experiment.benchmark_entries import entry_benchmark_name
    from calibdcd.experiment.config import BenchmarkEntry

    benches = data.get("benchmarks")
    first = benches[0] if isinstance(benches, list) and benches else None
    try:
        bench = entry_benchmark_name(BenchmarkEntry(**first)) if isinstance(first, Mapping) else ""
    except (TypeError, ValueError):  # the benchmark's own problems are reported with it
        bench = ""
    where = data.get("cache_dir")
    return bench, str(cache_root(where if isinstance(where, str) else None))


def detector_entry_problems(entry: DetectorEntry, data: Mapping[str, Any]) -> list[Any]:
    """A config check (:func:`calibdcd.experiment.config.register_entry_check`): the entry's
    preset and every option against the detector's typed config, without building models."""
    if entry.name not in DETECTORS:
        known = sorted(DETECTORS)
        return [
            (
                ("name",),
                f"unknown detector {entry.name!r}{suggestion(entry.name, known)}",
            )
        ]
    if not detector_available(entry.name):
        return []  # the dry run names detectors whose module is not installed
    bench, root = _check_context(data)
    preset = plan_detector(dataclasses.replace(entry, options={}), bench, 0, root)
    if isinstance(preset.error, ImportError):
        return []
    if isinstance(preset.error, (ValueError, TypeError)):
        field, sep, rest = str(preset.error).partition(": ")
        return [(("preset",), rest)] if sep and field == "preset" else [((), str(preset.error))]
    problems = option_problems(preset.build_config(), entry.options)
    if not problems:
        try:  # resolved and built as a run builds it: a constructor's own checks of the values
            plan_detector(entry, bench, 0, root).build()
        except ImportError:  # a build that imports what is not installed: the dry run says
            pass
        except OptionsError as exc:
            problems = exc.problems
        except (ValueError, TypeError) as exc:
            problems = [("options", str(exc))]
    return [(tuple(k.split(".")), m) for k, m in problems]


register_entry_check("detectors", detector_entry_problems)
