"""What a run's settings share, loaded from its plan on first need (:class:`RunContext`): the
benchmarks, the built detectors, (at most) one loaded target with its views, the feature and
model caches; and what one setting reads of them (:class:`SettingInputs`), with its inputs hash.
Nothing here resolves a config: every method takes the plan's resolved object."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

from calibdcd.experiment.benchmark_entries import load_benchmark_file
from calibdcd.experiment.caches import ArrayCache
from calibdcd.experiment.detector_entries import PlannedDetector, detector_fingerprint
from calibdcd.experiment.plan import PlannedBenchmark, PlannedSetting, PlannedTarget, RunPlan
from calibdcd.experiment.target_entries import cached_target, target_identity, views_of
from calibdcd.keys import digest

__all__ = ["RunContext", "SettingInputs", "inputs_hash"]


@dataclasses.dataclass(frozen=True)
class SettingInputs:
    """What one setting reads, loaded from its plan by the run (:meth:`RunContext.inputs`)
    before :func:`~calibdcd.experiment.setting.run_setting` computes it: the benchmark, the
    built detector, their and the target's identities and the inputs hash they make, the
    target and its views (loaded on first call: a setting whose features are all cached loads
    no model), and the run's caches and records."""

    benchmark: Any
    detector: Any
    detector_key: str
    target_key: str
    benchmark_digest: str
    #: the setting's inputs hash (:func:`inputs_hash`)
    inputs_hash: str
    target: Callable[[], Any]
    views: Callable[[], list[Any]]
    #: (completions served, empty ones) so far by the target, when it is loaded
    completion_counts: Callable[[], tuple[int, int]]
    #: the run's feature and model caches (:class:`~calibdcd.experiment.caches.ArrayCache`)
    arrays: Any = None
    #: keep every completion the features used (``samples.jsonl``)
    log_samples: bool = False
    #: the run start that computes it (commit, dirty flag, host), recorded in its result
    provenance: dict[str, Any] | None = None


def _inputs_digest(setting_hash: str, detector_key: str, target_key: str, bench: str) -> str:
    return digest(setting_hash, detector_key, target_key, bench)[:16]


def inputs_hash(planned: PlannedSetting, ctx: RunContext) -> str:
    """What the config does not pin down: the resolved detector (e.g. the path of a lab's clean
    reference LM, whose cache key carries its build format), the target's checkpoint files and
    the benchmark's texts and labels. A stored result is reused only when these match too, so a
    rebuilt lab or reference model is never hidden behind an old result.

    Never builds anything: while a lab or a lab's clean reference LM (DPDLLM) the setting uses
    is not built here (the plan's ``awaiting``), no stored result can be current and the hash
    names what is missing."""
    if planned.awaiting is not None:
        return planned.awaiting
    return ctx.inputs(planned).inputs_hash


class RunContext:
    """What a run's settings share, loaded from its plan on first need: benchmarks, built
    detectors and (at most one) target, the feature and model caches. Resolves nothing: every
    method takes the plan's resolved object."""

    def __init__(self, plan: RunPlan, *, progress: bool = True, log_samples: bool = False):
        self.plan = plan
        #: keep every completion a setting's features used (``settings/<id>/samples.jsonl``)
        self.log_samples = log_samples
        #: the run start's commit, dirty flag and host (:func:`calibdcd.provenance.
        #: setting_provenance`), recorded in each result computed here; None outside a run
        self.provenance: dict[str, Any] | None = None
        self.cache_root = plan.cache_root  # labs and everything built live here
        self.arrays = ArrayCache(self.cache_root)
        self.progress = progress
        self._benchmarks: dict[str, Any] = {}
        self._benchmark_digests: dict[str, str] = {}
        self._detectors: dict[tuple[str, str, int], Any] = {}
        self._target: tuple[str, Any] | None = None
        self._views: dict[str, list[Any]] = {}
        self._target_keys: dict[str, str] = {}
        self._detector_keys: dict[int, tuple[Any, str]] = {}
        self.target_loads = 0

    def inputs(self, planned: PlannedSetting) -> SettingInputs:
        """What setting ``planned`` reads, loaded (the target and its views on first call)."""
        detector = self.detector(planned.detector)
        target = planned.target
        keys = (
            self.detector_key(detector),
            self.target_key(target),
            self.benchmark_digest(planned.benchmark),
        )
        return SettingInputs(
            benchmark=self.benchmark(planned.benchmark),
            detector=detector,
            detector_key=keys[0],
            target_key=keys[1],
            benchmark_digest=keys[2],
            inputs_hash=_inputs_digest(planned.setting_hash, *keys),
            target=lambda: self.target(target),
            views=lambda: self.views(target),
            completion_counts=lambda: self.completion_counts(target),
            arrays=self.arrays,
            log_samples=self.log_samples,
            provenance=self.provenance,
        )

    def target_key(self, planned: PlannedTarget) -> str:
        """The feature cache's identity of a target (its checkpoint's content, not where it
        lives), computed once per run: the setting's ``inputs_hash`` and its feature keys use
        this one value."""
        name = planned.entry.name
        if name not in self._target_keys:
            self._target_keys[name] = target_identity(planned.entry, planned.path, self.cache_root)
        return self._target_keys[name]

    def detector_key(self, detector: Any) -> str:
        """A detector's fingerprint (:func:`~calibdcd.experiment.detector_entries.
        detector_fingerprint`), computed once per detector object of this run."""
        hit = self._detector_keys.get(id(detector))
        if hit is None or hit[0] is not detector:
            hit = (detector, detector_fingerprint(detector, self.cache_root))
            self._detector_keys[id(detector)] = hit
        return hit[1]

    def benchmark(self, planned: PlannedBenchmark) -> Any:
        label = planned.entry.label
        if label not in self._benchmarks:
            self._benchmarks[label] = load_benchmark_file(
                planned.entry, planned.path, planned.id_field
            )
        return self._benchmarks[label]

    def benchmark_digest(self, planned: PlannedBenchmark) -> str:
        """A digest of the benchmark's texts, labels and text ids (computed once per run): a
        renamed id changes it, so ``scores.csv`` never keeps an old id."""
        label = planned.entry.label
        if label not in self._benchmark_digests:
            bench = self.benchmark(planned)
            self._benchmark_digests[label] = digest(
                list(bench.texts), [int(y) for y in bench.labels], [s.id for s in bench.samples]
            )
        return self._benchmark_digests[label]

    def detector(self, planned: PlannedDetector) -> Any:
        """The plan's detector for one benchmark and seed, built once per run."""
        if planned.key not in self._detectors:
            self._detectors[planned.key] = planned.build(progress=self.progress)
        return self._detectors[planned.key]

    def target(self, planned: PlannedTarget) -> Any:
        """The cached target (built on first need; the previous one is released)."""
        entry = planned.entry
        if self._target is not None and self._target[0] == entry.name:
            return self._target[1]
        self.release_target()
        if planned.path is None:  # (a plan a run materialised has every lab built)
            raise ValueError(planned.problem or f"targets ({entry.name}): its lab is not built")
        t = cached_target(
            entry, planned.path, self.cache_root / "generations.sqlite", self.cache_root,
            progress=self.progress,
        )  # fmt: skip
        self.target_loads += 1
        self._target = (entry.name, t)
        return t

    def release_target(self) -> None:
        if self._target is not None:
            close = getattr(self._target[1], "close", None)
            if callable(close):
                close()
            self._target = None
            import gc

            gc.collect()

    def completion_counts(self, planned: PlannedTarget) -> tuple[int, int]:
        """(completions served, empty ones) so far by the target when it is loaded."""
        if self._target is None or self._target[0] != planned.entry.name:
            return 0, 0
        st = getattr(self._target[1], "stats", None)
        return (st.served, st.empty) if st is not None and hasattr(st, "served") else (0, 0)

    def views(self, planned: PlannedTarget) -> list[Any]:
        entry = planned.entry
        if entry.name not in self._views:
            self._views[entry.name] = views_of(
                planned.view_source,
                entry,
                self.plan.procedure.view_system,
                loaded_family=lambda: getattr(self.target(planned), "family", None),
            )
        return self._views[entry.name]

    # what the run used, for its records (benchmarks.json, inputs.json)
    def loaded_benchmarks(self) -> dict[str, Any]:
        """label -> benchmark, for those this run (or shard) loaded."""
        return dict(self._benchmarks)

    def target_keys(self) -> dict[str, str]:
        """target name -> identity, for the targets this run (or shard) used."""
        return dict(self._target_keys)

    def detector_keys(self) -> dict[str, str]:
        """ "<label> on <benchmark> seed <seed>" -> fingerprint, for the detectors built here."""
        out = {}
        for (label, bench, seed), det in self._detectors.items():
            hit = self._detector_keys.get(id(det))
            if hit is not None and hit[0] is det:
                out[f"{label} on {bench} seed {seed}"] = hit[1]
        return out
