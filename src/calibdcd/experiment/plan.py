"""resolve → materialize → execute: what a run will do, decided once.

:func:`resolve` turns a checked :class:`~calibdcd.experiment.config.ExperimentConfig` into a
frozen :class:`RunPlan` and builds nothing: the run directory and cache root, the grid of
settings with their hashes and output directories (the shard's part of it), and every artefact
the settings need that a run builds (a contamination lab, DPDLLM's clean reference LM of a lab):
its identity, where it lives, whether it is built. ``calibdcd run --dry-run`` prints the plan.

:func:`materialize` is the only code that builds those artefacts, each under its own file lock
(two processes that need the same lab build it once), and returns the plan as it then stands.
Execution (:func:`calibdcd.experiment.runner.run_experiment`) runs the plan's settings with the
hashes the plan computed, so no setting is hashed again to decide what to run.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from pathlib import Path

from calibdcd.data.benchmarks import benchmark_spec
from calibdcd.experiment.benchmarks import entry_benchmark_name
from calibdcd.experiment.config import (
    BenchmarkEntry,
    ExperimentConfig,
    LabRef,
    TargetEntry,
    entry_labs,
    option_strings,
)
from calibdcd.experiment.detectors import PlannedDetector, plan_detector
from calibdcd.experiment.labs import resolve_lab, resolve_lab_refs, unbuilt_clean_references
from calibdcd.experiment.setting import Setting, setting_hash
from calibdcd.experiment.targets import describe_views
from calibdcd.paths import cache_root

__all__ = [
    "Artefact",
    "PlannedBenchmark",
    "PlannedDetector",
    "PlannedSetting",
    "PlannedTarget",
    "RunPlan",
    "grid",
    "materialize",
    "resolve",
    "shard_of",
]

_CLEAN_REFERENCE = "lab-clean-reference:"


def grid(cfg: ExperimentConfig) -> list[Setting]:
    """All settings, target-major (one model load per target), then benchmark, detector, seed."""
    return [
        Setting(b, t, d, s)
        for t in cfg.targets
        for b in cfg.benchmarks
        for d in cfg.detectors
        for s in cfg.seeds
    ]


def shard_of(settings: list, shard: tuple[int, int] | None) -> list:
    """Shard ``i`` of ``n``: the i-th of n contiguous, nearly equal blocks of the grid (target-
    major, so a shard loads few models). Deterministic: the same config gives the same parts
    on every machine, and the n parts are the whole grid."""
    if shard is None:
        return list(settings)
    i, n = shard
    size = len(settings)
    return list(settings[i * size // n : (i + 1) * size // n])


@dataclasses.dataclass(frozen=True)
class Artefact:
    """Something a run builds before its settings can run: a lab (``kind="lab"``) or a lab's
    clean reference LM for DPDLLM (``kind="clean reference"``). ``key``: its identity (a lab's
    content key; a reference's option string); ``directory``: where it is or will be (None for
    a reference whose lab is not built yet); ``used_by``: the config entries that need it."""

    kind: str
    spec: str
    key: str
    directory: str | None
    built: bool
    used_by: tuple[str, ...]

    def describe(self) -> str:
        state = "built" if self.built else "to build"
        where = f" at {self.directory}" if self.directory else ""
        users = ", ".join(self.used_by)
        return f"{self.kind} {self.spec} ({self.key}): {state}{where}; used by {users}"


@dataclasses.dataclass(frozen=True)
class PlannedBenchmark:
    """A benchmark of the plan: its entry and the name it loads under (what its detectors are
    configured for, e.g. DPDLLM's per-benchmark settings), known before any file is read."""

    entry: BenchmarkEntry
    name: str

    def describe(self) -> str:
        e = self.entry
        if e.hub is not None:
            where = f"hub {e.hub}"
        elif e.lab is not None:
            where = f"lab {e.lab}/{e.path or 'ground_truth.jsonl'}"
        elif e.path:
            where = e.path
        else:
            where = e.name if benchmark_spec(e.name) is None else "its known source"
        return f"benchmark {e.label}: {self.name} from {where}"


@dataclasses.dataclass(frozen=True)
class PlannedTarget:
    """A target of the plan: its entry and its model as resolved without building anything (a
    path inside its lab once the lab is built; ``packaged:`` models are assembled on first
    use); ``built``: False while its lab is not built yet."""

    entry: TargetEntry
    model: str
    built: bool
    #: where CalibDCD's views for it come from (:func:`~calibdcd.experiment.targets.view_rule`)
    views: str = ""

    def describe(self) -> str:
        e = self.entry
        state = "" if self.built else " (its lab is built first)"
        views = f"; views: {self.views}" if self.views else ""
        return f"target {e.name}: {e.backend} {self.model}{state}{views}"


def _planned_target(entry: TargetEntry, root: Path) -> PlannedTarget:
    views = describe_views(entry, root)
    if entry.lab is not None:
        lab = resolve_lab(entry.lab, build=False, root=root)
        if lab is None:
            return PlannedTarget(entry, f"lab {entry.lab}/{entry.model}", False, views)
        return PlannedTarget(entry, str(lab / entry.model), True, views)
    return PlannedTarget(entry, entry.model, True, views)


@dataclasses.dataclass(frozen=True)
class PlannedSetting:
    """One setting of the grid, with its hash (what its result depends on) and directory."""

    setting: Setting
    setting_hash: str
    directory: Path

    @property
    def id(self) -> str:
        return self.setting.id


@dataclasses.dataclass(frozen=True)
class RunPlan:
    """A run, resolved (see the module doc). ``grid``: every setting of the config;
    ``settings``: those this process runs (its shard's part, else all)."""

    config: ExperimentConfig
    run_dir: Path
    cache_root: Path
    artefacts: tuple[Artefact, ...]
    grid: tuple[PlannedSetting, ...]
    settings: tuple[PlannedSetting, ...]
    shard: tuple[int, int] | None = None
    #: every benchmark and target of the config, resolved (nothing read or built)
    benchmarks: tuple[PlannedBenchmark, ...] = ()
    targets: tuple[PlannedTarget, ...] = ()
    #: the detector of each (detector label, benchmark name, seed) this process's settings use
    detectors: Mapping[tuple[str, str, int], PlannedDetector] = dataclasses.field(
        default_factory=dict
    )

    @property
    def to_build(self) -> tuple[Artefact, ...]:
        return tuple(a for a in self.artefacts if not a.built)

    def benchmark_name(self, entry: BenchmarkEntry) -> str:
        for b in self.benchmarks:
            if b.entry.label == entry.label:
                return b.name
        return entry_benchmark_name(entry)  # an entry of another config: resolved as the plan

    def detector(self, planned: PlannedSetting) -> PlannedDetector:
        """The resolved detector of one of the settings this process runs (``settings``; a
        setting of another shard has none here: KeyError)."""
        s = planned.setting
        seed = 0 if self.config.detector_seed == "fixed" else s.seed
        return self.detectors[(s.detector.label, self.benchmark_name(s.benchmark), seed)]

    def describe(self) -> list[str]:
        """The plan as the dry run prints it: its settings, what it builds first, and every
        benchmark, target and detector (per benchmark and seed) as resolved."""
        part = "" if self.shard is None else f" (shard {self.shard[0]}/{self.shard[1]})"
        lines = [
            f"plan: {len(self.settings)} of {len(self.grid)} setting(s){part} into {self.run_dir}"
        ]
        lines += [f"  {a.describe()}" for a in self.artefacts]
        lines += [f"  {b.describe()}" for b in self.benchmarks]
        lines += [f"  {t.describe()}" for t in self.targets]
        lines += [f"  {d.describe()}" for d in self.detectors.values()]
        return lines


def _lab_users(cfg: ExperimentConfig, spec: str) -> tuple[str, ...]:
    users = [f"benchmarks[{i}]" for i, b in enumerate(cfg.benchmarks) if b.lab == spec]
    users += [f"targets[{i}]" for i, t in enumerate(cfg.targets) if t.lab == spec]
    for i, d in enumerate(cfg.detectors):
        if any(
            v.startswith((f"lab:{spec}/", f"{_CLEAN_REFERENCE}{spec}"))
            for v in option_strings(d.options)
        ):
            users.append(f"detectors[{i}]")
    return tuple(users)


def _artefacts(cfg: ExperimentConfig, root: Path) -> tuple[Artefact, ...]:
    out: list[Artefact] = []
    for spec, ref in cfg.labs.items():
        if isinstance(ref, LabRef):
            out.append(
                Artefact("lab", spec, ref.key, ref.directory, ref.built, _lab_users(cfg, spec))
            )
    seen: set[str] = set()
    for d in cfg.detectors:
        for v in option_strings(d.options):
            if not v.startswith(_CLEAN_REFERENCE) or v in seen:
                continue
            seen.add(v)
            spec = v[len(_CLEAN_REFERENCE) :]
            lab = resolve_lab(spec, build=False, root=root)
            unbuilt = unbuilt_clean_references(v, root=root)
            directory = None
            if lab is not None:
                from calibdcd.lab.clean_reference import clean_reference_dir

                directory = str(clean_reference_dir(lab, cache_dir=root))
            users = tuple(
                f"detectors[{j}]"
                for j, e in enumerate(cfg.detectors)
                if v in option_strings(e.options)
            )
            out.append(
                Artefact(
                    "clean reference", spec, v, directory, lab is not None and not unbuilt, users
                )
            )
    return tuple(out)


def resolve(
    cfg: ExperimentConfig,
    out: str | Path | None = None,
    *,
    shard: tuple[int, int] | None = None,
) -> RunPlan:
    """The plan of a run of ``cfg`` into ``out`` (default: the config's ``output``, else
    ``runs/<name>``), building nothing."""
    run_dir = (
        Path(out)
        if out is not None
        else (Path(cfg.output) if cfg.output else Path("runs") / cfg.name)
    )
    root = cache_root(cfg.cache_dir)
    planned = tuple(
        PlannedSetting(s, setting_hash(s, cfg), run_dir / "settings" / s.id) for s in grid(cfg)
    )
    mine = tuple(shard_of(list(planned), shard))
    # only what this process's settings use (a shard builds no lab of another shard's targets)
    used = {
        spec
        for p in mine
        for spec in entry_labs(p.setting.benchmark, p.setting.target, p.setting.detector)
    }
    benchmarks = tuple(PlannedBenchmark(b, entry_benchmark_name(b)) for b in cfg.benchmarks)
    names = {b.entry.label: b.name for b in benchmarks}
    detectors: dict[tuple[str, str, int], PlannedDetector] = {}
    for p in mine:
        s = p.setting
        seed = 0 if cfg.detector_seed == "fixed" else s.seed
        key = (s.detector.label, names[s.benchmark.label], seed)
        if key not in detectors:
            detectors[key] = plan_detector(
                s.detector, key[1], seed, str(root), detector_seed=cfg.detector_seed
            )
    return RunPlan(
        config=cfg,
        run_dir=run_dir,
        cache_root=root,
        artefacts=tuple(a for a in _artefacts(cfg, root) if a.spec in used),
        grid=planned,
        settings=mine,
        shard=shard,
        benchmarks=benchmarks,
        targets=tuple(_planned_target(t, root) for t in cfg.targets),
        detectors=detectors,
    )


def materialize(
    plan: RunPlan, *, progress: bool = True, log: Callable[[str], None] | None = None
) -> RunPlan:
    """Build every artefact of ``plan`` that is not built (labs first: a clean reference is
    trained from its lab), each under its lock; returns the plan resolved again (all built)."""
    if not plan.to_build:
        return plan
    say = log or (lambda s: None)
    for a in plan.to_build:
        if a.kind == "lab":
            say(f"building {a.describe()}")
            resolve_lab(a.spec, build=True, root=plan.cache_root, progress=progress)
    for a in plan.to_build:
        if a.kind == "clean reference":
            say(f"training {a.describe()}")
            resolve_lab_refs(a.key, build=True, root=plan.cache_root, progress=progress)
    return resolve(plan.config, plan.run_dir, shard=plan.shard)
