"""The experiment config: typed dataclasses parsed from YAML with errors that name the key path.

A config describes the grid benchmarks x targets x detectors x seeds and every setting shared by
its cells (the data protocol, CalibDCD's grids, the evaluation, the analyses, the caches)::

    name: lab-small
    seeds: [0]
    protocol: paper                  # paper | strict
    split: {subsample: paper, n_supervised_per_class: 50, calibration_fraction: 0.5}
    benchmarks:
      - {name: wikimia, path: "${CALIBDCD_SHARED}/data/WikiMIA", split: 64}
      - {name: lab, lab: small, path: ground_truth.jsonl}     # path inside the built lab
    targets:
      - {name: qwen, backend: hf, model: Qwen/Qwen2.5-7B-Instruct, family: qwen2.5,
         base: qwen-base, options: {dtype: bfloat16, batch_size: 32}}
    detectors:
      - {name: veilprobe, preset: paper}
      - {name: dpdllm}
    calibration: {ranks: [3, 4, 5, 6], strengths: [0.7, 0.8, 0.9, 1.0], tau: 0.95, n_views: 3}
    evaluation: {fpr: 0.05, n_boot: 1000, level: 0.95}
    analyses: {ablations: true, fixed_rank: 3, fixed_strength: 0.9}
    cache_dir: .calibdcd-cache

``${VAR}`` and ``${VAR:-default}`` in strings are expanded from the environment
(``CALIBDCD_SHARED`` defaults to a directory named ``shared`` beside the repository or one of its
parents).
The value of a variable whose name contains KEY, TOKEN, SECRET or PASSWORD, or that is listed in
``secrets: [VAR, ...]``, is secret: it is redacted (``***``) in every file and message the run
writes (see :mod:`calibdcd.redact`), as are credentials in URLs.
Relative paths are resolved against the config file's directory. Every problem is reported as a
:class:`ConfigError` whose message starts with the key path, e.g. ``targets[1].backend: ...``.
"""

from __future__ import annotations

import dataclasses
import os
import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Literal

import yaml

from calibdcd.calibration import CalibrationConfig
from calibdcd.redact import is_secret_var, register_secret

__all__ = [
    "AnalysisSpec",
    "BenchmarkEntry",
    "ConfigError",
    "DetectorEntry",
    "EvaluationSpec",
    "ExperimentConfig",
    "TargetEntry",
    "load_config",
    "parse_config",
]

_LABEL = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.+-]*$")
_ENV = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)(?::-([^}]*))?\}")


class ConfigError(ValueError):
    """A config problem: ``path`` is the key path (``targets[0].backend``), ``source`` the file."""

    def __init__(self, path: str, problem: str, source: str | None = None):
        self.path = path
        self.problem = problem
        self.source = source
        where = f"{source}: " if source else ""
        super().__init__(f"{where}{path or '<root>'}: {problem}")


# --------------------------------------------------------------------------------------------
# Entries
# --------------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class BenchmarkEntry:
    """One benchmark: a known name (see ``calibdcd data list``) or any jsonl/csv/parquet file.

    ``label`` names it in tables (default: the name, plus the subset when given). ``lab``: the
    file lives in the contamination lab of that preset (``path`` is relative to the lab
    directory; the lab is built on first use).
    """

    name: str
    path: str | None = None
    split: str | None = None
    label: str = ""
    lab: str | None = None
    text_field: str | None = None
    label_field: str | None = None
    id_field: str | None = None
    dedupe: bool = False
    #: the protocol's subsample size for this benchmark ("paper", an int, or None = all)
    subsample: int | str | None = "paper"


@dataclasses.dataclass(frozen=True)
class TargetEntry:
    """One black-box target. ``backend``: hf | openai | any registered backend; ``model``: a local
    path, a hub id (GPU machines) or, with ``lab``, a checkpoint directory inside the lab
    (``base``, ``chat-qwen``, ...). ``base``: the label of this model's pre-trained counterpart
    in the same config (for the base-vs-post-trained comparison); ``post_trained`` marks targets
    that enter the paper's main tables."""

    name: str
    backend: str
    model: str
    family: str | None = None
    lab: str | None = None
    base: str | None = None
    post_trained: bool = True
    options: Mapping[str, Any] = dataclasses.field(default_factory=dict)


@dataclasses.dataclass(frozen=True)
class DetectorEntry:
    """One detector: ``name`` in the detector registry (veilprobe, dpdllm, overlap), ``preset``
    (detector-specific, e.g. VeilProbe ``paper``/``cpu``), ``options`` (config overrides)."""

    name: str
    label: str = ""
    preset: str | None = None
    options: Mapping[str, Any] = dataclasses.field(default_factory=dict)


@dataclasses.dataclass(frozen=True)
class EvaluationSpec:
    fpr: float = 0.05
    n_boot: int = 1000
    level: float = 0.95


@dataclasses.dataclass(frozen=True)
class AnalysisSpec:
    """Which analyses run inside each setting (all from the setting's cached features)."""

    ablations: bool = True
    adaptive_vs_fixed: bool = True
    fixed_rank: int = 3
    fixed_strength: float = 0.9
    fp_recovery: bool = True
    #: also run the complete method in the other calibration space (raw <-> normalised) where the
    #: classifier has both; the paper does not say which one it means (see README)
    space_comparison: bool = True
    #: the controls beside CalibDCD: placebo basis, noise floor, centred variant (analyses.py)
    controls: bool = True
    #: the blind baseline (TF-IDF + logistic regression on the texts alone; calibdcd.blind)
    blind: bool = True


@dataclasses.dataclass(frozen=True)
class ExperimentConfig:
    name: str
    benchmarks: tuple[BenchmarkEntry, ...]
    targets: tuple[TargetEntry, ...]
    detectors: tuple[DetectorEntry, ...]
    seeds: tuple[int, ...] = (0,)
    protocol: Literal["paper", "strict"] = "paper"
    n_supervised_per_class: int = 50
    calibration_fraction: float = 0.5
    n_calibration: int | None = None
    balance: Literal["equal", "stratified"] = "equal"
    #: group-aware split: the sample meta field holding a text's group (``group``: book/paper of
    #: the known benchmarks; the lab's ``source``); None = split by text (the paper)
    group_by: str | None = None
    #: "offset" (default): a setting's seed is added to every ``seed`` of its detector's config
    #: (generation sampling, perturbations, trained parts), so seeds vary the detector's random
    #: state as well as the split and the classifier; "fixed": only split and classifier vary
    detector_seed: Literal["offset", "fixed"] = "offset"
    calibration: CalibrationConfig = dataclasses.field(default_factory=CalibrationConfig)
    evaluation: EvaluationSpec = dataclasses.field(default_factory=EvaluationSpec)
    analyses: AnalysisSpec = dataclasses.field(default_factory=AnalysisSpec)
    #: "official" (default) or "none": the system turn of the model-specific boundary views
    view_system: Literal["official", "none"] = "official"
    #: "auto": calibrate in the classifier's normalised space when it exposes one, else "raw"
    calibration_space: Literal["auto", "raw", "normalized"] = "auto"
    #: the run's cache root (labs included); None = ``$CALIBDCD_CACHE``, else the user cache
    #: (:func:`calibdcd.paths.cache_root`)
    cache_dir: str | None = None
    output: str | None = None
    source: str | None = None  #: the YAML file it came from

    @property
    def grid_size(self) -> int:
        return len(self.benchmarks) * len(self.targets) * len(self.detectors) * len(self.seeds)

    def as_dict(self) -> dict[str, Any]:
        """The resolved config in the YAML schema (``load_config`` reads it back unchanged)."""

        def entry(e: Any, drop: tuple[str, ...] = ()) -> dict[str, Any]:
            d = _plain(dataclasses.asdict(e))
            return {k: v for k, v in d.items() if k not in drop and v not in (None, {}, "")}

        benches = []
        for b in self.benchmarks:
            d = entry(b, ("subsample",))
            d["subsample"] = "all" if b.subsample is None else b.subsample
            benches.append(d)
        split: dict[str, Any] = {
            "n_supervised_per_class": self.n_supervised_per_class,
            "calibration_fraction": self.calibration_fraction,
            "balance": self.balance,
        }
        if self.n_calibration is not None:
            split["n_calibration"] = self.n_calibration
        if self.group_by is not None:
            split["group_by"] = self.group_by
        out: dict[str, Any] = {
            "name": self.name,
            "seeds": list(self.seeds),
            "protocol": self.protocol,
            "split": split,
            "benchmarks": benches,
            "targets": [entry(t) for t in self.targets],
            "detectors": [entry(d) for d in self.detectors],
            "calibration": _plain(self.calibration.kwargs()),
            "evaluation": dataclasses.asdict(self.evaluation),
            "analyses": dataclasses.asdict(self.analyses),
            "view_system": self.view_system,
            "calibration_space": self.calibration_space,
            "detector_seed": self.detector_seed,
            "cache_dir": self.cache_dir,
        }
        if self.output is not None:
            out["output"] = self.output
        return out

    def target(self, name: str) -> TargetEntry:
        for t in self.targets:
            if t.name == name:
                return t
        raise KeyError(name)


def _plain(x: Any) -> Any:
    if isinstance(x, Mapping):
        return {str(k): _plain(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_plain(v) for v in x]
    return x


# --------------------------------------------------------------------------------------------
# Parsing helpers
# --------------------------------------------------------------------------------------------


def default_shared() -> str | None:
    """``$CALIBDCD_SHARED``, else the nearest directory named ``shared`` beside the repository
    or beside one of its parent directories (a worktree's ``../../shared``), else None."""
    env = os.environ.get("CALIBDCD_SHARED")
    if env:
        return env
    for parent in Path(__file__).resolve().parents[3].parents:
        if (parent / "shared").is_dir():
            return str(parent / "shared")
    return None


def _expand(value: str, path: str, source: str | None) -> str:
    def sub(m: re.Match[str]) -> str:
        var, default = m.group(1), m.group(2)
        if var in os.environ:
            if is_secret_var(var):
                register_secret(os.environ[var])
            return os.environ[var]
        if var == "CALIBDCD_SHARED" and default_shared() is not None:
            return default_shared()  # type: ignore[return-value]
        if default is not None:
            return default
        raise ConfigError(path, f"environment variable {var} is not set", source)

    return _ENV.sub(sub, value)


class _Reader:
    """Typed access to one mapping of the YAML, tracking the key path and unknown keys."""

    def __init__(self, data: Any, path: str, source: str | None):
        if not isinstance(data, Mapping):
            raise ConfigError(path, f"expected a mapping, got {type(data).__name__}", source)
        self.data = dict(data)
        self.path = path
        self.source = source
        self.used: set[str] = set()

    def key(self, k: str) -> str:
        return f"{self.path}.{k}" if self.path else k

    def err(self, k: str, problem: str) -> ConfigError:
        return ConfigError(self.key(k), problem, self.source)

    def has(self, k: str) -> bool:
        return k in self.data

    def raw(self, k: str, default: Any = None) -> Any:
        self.used.add(k)
        return self.data.get(k, default)

    def str(self, k: str, default: Any = ..., *, choices: Sequence[str] | None = None) -> Any:
        if k not in self.data:
            if default is ...:
                raise self.err(k, "is required")
            return default
        v = self.raw(k)
        if v is None and default is None:
            return None
        if isinstance(v, (int, float)) and not isinstance(v, bool):
            v = str(v)
        if not isinstance(v, str) or not v.strip():
            raise self.err(k, f"must be a non-empty string, got {v!r}")
        v = _expand(v, self.key(k), self.source)
        if choices is not None and v not in choices:
            raise self.err(k, f"must be one of {list(choices)}, got {v!r}")
        return v

    def int(self, k: str, default: Any = ..., *, minimum: int | None = None) -> Any:
        if k not in self.data:
            if default is ...:
                raise self.err(k, "is required")
            return default
        v = self.raw(k)
        if v is None and default is None:
            return None
        if isinstance(v, bool) or not isinstance(v, int):
            raise self.err(k, f"must be an integer, got {v!r}")
        if minimum is not None and v < minimum:
            raise self.err(k, f"must be >= {minimum}, got {v}")
        return v

    def float(self, k: str, default: Any = ..., *, low: float, high: float) -> float:
        if k not in self.data:
            if default is ...:
                raise self.err(k, "is required")
            return default
        v = self.raw(k)
        if isinstance(v, bool) or not isinstance(v, (int, float)):
            raise self.err(k, f"must be a number, got {v!r}")
        if not (low <= float(v) <= high):
            raise self.err(k, f"must lie in [{low}, {high}], got {v}")
        return float(v)

    def bool(self, k: str, default: bool) -> bool:
        if k not in self.data:
            return default
        v = self.raw(k)
        if not isinstance(v, bool):
            raise self.err(k, f"must be true or false, got {v!r}")
        return v

    def mapping(self, k: str) -> dict[str, Any]:
        v = self.raw(k, {})
        if v is None:
            return {}
        if not isinstance(v, Mapping):
            raise self.err(k, f"must be a mapping, got {type(v).__name__}")
        return {
            str(kk): _expand_tree(vv, f"{self.key(k)}.{kk}", self.source) for kk, vv in v.items()
        }

    def list(self, k: str, *, required: bool = True) -> list[Any]:
        if k not in self.data:
            if required:
                raise self.err(k, "is required (a non-empty list)")
            return []
        v = self.raw(k)
        if not isinstance(v, list) or (required and not v):
            raise self.err(k, f"must be a non-empty list, got {v!r}")
        return v

    def finish(self) -> None:
        unknown = sorted(set(self.data) - self.used)
        if unknown:
            raise self.err(unknown[0], f"unknown key (known here: {', '.join(sorted(self.used))})")


def _expand_tree(v: Any, path: str, source: str | None) -> Any:
    if isinstance(v, str):
        return _expand(v, path, source)
    if isinstance(v, Mapping):
        return {str(k): _expand_tree(x, f"{path}.{k}", source) for k, x in v.items()}
    if isinstance(v, list):
        return [_expand_tree(x, f"{path}[{i}]", source) for i, x in enumerate(v)]
    return v


def _label(r: _Reader, k: str, default: str) -> str:
    v = r.str(k, default)
    if not _LABEL.match(v):
        raise r.err(k, f"{v!r} is not a usable label (letters, digits, '_', '.', '+', '-')")
    return v


def _resolve_path(p: str | None, base: Path | None) -> str | None:
    if p is None:
        return None
    path = Path(p).expanduser()
    if not path.is_absolute() and base is not None:
        path = base / path
    return os.path.normpath(str(path))


# --------------------------------------------------------------------------------------------
# Sections
# --------------------------------------------------------------------------------------------

_BENCH_KEYS = "name path split label lab text_field label_field id_field dedupe subsample".split()


def _benchmark(data: Any, path: str, source: str | None, base: Path | None) -> BenchmarkEntry:
    r = _Reader(data, path, source)
    name = r.str("name")
    lab = r.str("lab", None)
    raw_path = r.str("path", None)
    split = r.str("split", None)
    sub = r.raw("subsample", "paper")
    if not (
        sub in (None, "paper", "all")
        or (isinstance(sub, int) and not isinstance(sub, bool) and sub >= 2)
    ):
        raise r.err("subsample", f"must be 'paper', 'all' or an integer >= 2, got {sub!r}")
    default_label = name if split is None else f"{name}-{split}"
    if raw_path is None and lab is not None:
        raise r.err(
            "path", "is required with lab (the file inside the lab, e.g. ground_truth.jsonl)"
        )
    entry = BenchmarkEntry(
        name=name,
        path=raw_path if lab is not None else _resolve_path(raw_path, base),
        split=split,
        label=_label(r, "label", re.sub(r"[^A-Za-z0-9_.+-]", "-", default_label)),
        lab=lab,
        text_field=r.str("text_field", None),
        label_field=r.str("label_field", None),
        id_field=r.str("id_field", None),
        dedupe=r.bool("dedupe", False),
        subsample=None if sub == "all" else sub,
    )
    r.finish()
    return entry


def _target(data: Any, path: str, source: str | None, base: Path | None) -> TargetEntry:
    r = _Reader(data, path, source)
    name = _label(r, "name", ...)
    backend = r.str("backend")
    model = r.str("model")
    lab = r.str("lab", None)
    if (
        lab is None
        and backend == "hf"
        and (model.startswith((".", "/", "~")) or Path(model).suffix == ".gguf")
    ):
        model = _resolve_path(model, base) or model
    entry = TargetEntry(
        name=name,
        backend=backend,
        model=model,
        family=r.str("family", None),
        lab=lab,
        base=r.str("base", None),
        post_trained=r.bool("post_trained", True),
        options=r.mapping("options"),
    )
    r.finish()
    return entry


def _detector(data: Any, path: str, source: str | None) -> DetectorEntry:
    if isinstance(data, str):
        data = {"name": data}
    r = _Reader(data, path, source)
    name = r.str("name")
    entry = DetectorEntry(
        name=name,
        label=_label(r, "label", name),
        preset=r.str("preset", None),
        options=r.mapping("options"),
    )
    r.finish()
    return entry


def _calibration(data: Any, path: str, source: str | None) -> CalibrationConfig:
    r = _Reader(data if data is not None else {}, path, source)
    fields = {f.name for f in dataclasses.fields(CalibrationConfig)}
    kw: dict[str, Any] = {}
    for k in list(r.data):
        if k not in fields:
            raise r.err(k, f"unknown key (known: {', '.join(sorted(fields))})")
        v = r.raw(k)
        kw[k] = tuple(v) if isinstance(v, list) else v
    try:
        return CalibrationConfig(**kw)
    except (ValueError, TypeError) as exc:
        bad = next((k for k in kw if k in str(exc)), "")
        raise ConfigError(f"{path}.{bad}" if bad else path, str(exc), source) from None


def _evaluation(data: Any, path: str, source: str | None) -> EvaluationSpec:
    r = _Reader(data if data is not None else {}, path, source)
    spec = EvaluationSpec(
        fpr=r.float("fpr", 0.05, low=1e-6, high=1.0),
        n_boot=r.int("n_boot", 1000, minimum=0),
        level=r.float("level", 0.95, low=0.5, high=0.999),
    )
    r.finish()
    return spec


def _analyses(data: Any, path: str, source: str | None) -> AnalysisSpec:
    r = _Reader(data if data is not None else {}, path, source)
    spec = AnalysisSpec(
        ablations=r.bool("ablations", True),
        adaptive_vs_fixed=r.bool("adaptive_vs_fixed", True),
        fixed_rank=r.int("fixed_rank", 3, minimum=1),
        fixed_strength=r.float("fixed_strength", 0.9, low=0.0, high=1.0),
        fp_recovery=r.bool("fp_recovery", True),
        space_comparison=r.bool("space_comparison", True),
        controls=r.bool("controls", True),
        blind=r.bool("blind", True),
    )
    r.finish()
    return spec


def parse_config(
    data: Any, source: str | None = None, base_dir: str | Path | None = None
) -> ExperimentConfig:
    """Build an :class:`ExperimentConfig` from parsed YAML (a mapping); ``base_dir`` resolves
    relative paths (default: the directory of ``source``)."""
    base = (
        Path(base_dir)
        if base_dir is not None
        else (Path(source).resolve().parent if source else None)
    )
    r = _Reader(data, "", source)
    _register_listed_secrets(r, source)
    name = _label(r, "name", Path(source).stem if source else "experiment")
    benchmarks = tuple(
        _benchmark(b, f"benchmarks[{i}]", source, base) for i, b in enumerate(r.list("benchmarks"))
    )
    targets = tuple(
        _target(t, f"targets[{i}]", source, base) for i, t in enumerate(r.list("targets"))
    )
    detectors = tuple(
        _detector(d, f"detectors[{i}]", source) for i, d in enumerate(r.list("detectors"))
    )
    seeds_raw = r.raw("seeds", [0])
    if isinstance(seeds_raw, int) and not isinstance(seeds_raw, bool):
        seeds_raw = [seeds_raw]
    if not isinstance(seeds_raw, list) or not seeds_raw:
        raise r.err(
            "seeds", f"must be an integer or a non-empty list of integers, got {seeds_raw!r}"
        )
    for i, s in enumerate(seeds_raw):
        if isinstance(s, bool) or not isinstance(s, int) or s < 0:
            raise ConfigError(f"seeds[{i}]", f"must be an integer >= 0, got {s!r}", source)
    if len(set(seeds_raw)) != len(seeds_raw):
        raise r.err("seeds", f"repeats a seed: {seeds_raw}")

    split = _Reader(r.raw("split", {}) or {}, "split", source)
    n_sup = split.int("n_supervised_per_class", 50, minimum=1)
    frac = split.float("calibration_fraction", 0.5, low=1e-6, high=0.999999)
    n_cal = split.int("n_calibration", None, minimum=1)
    balance = split.str("balance", "equal", choices=("equal", "stratified"))
    group_by = split.str("group_by", None)
    if split.has("subsample"):
        sub = split.raw("subsample")
        benchmarks = tuple(
            dataclasses.replace(b, subsample=None if sub == "all" else sub) for b in benchmarks
        )
    split.finish()

    cfg = ExperimentConfig(
        name=name,
        benchmarks=benchmarks,
        targets=targets,
        detectors=detectors,
        seeds=tuple(seeds_raw),
        protocol=r.str("protocol", "paper", choices=("paper", "strict")),
        n_supervised_per_class=n_sup,
        calibration_fraction=frac,
        n_calibration=n_cal,
        balance=balance,
        group_by=group_by,
        calibration=_calibration(r.raw("calibration", {}), "calibration", source),
        evaluation=_evaluation(r.raw("evaluation", {}), "evaluation", source),
        analyses=_analyses(r.raw("analyses", {}), "analyses", source),
        view_system=r.str("view_system", "official", choices=("official", "none")),
        calibration_space=r.str("calibration_space", "auto", choices=("auto", "raw", "normalized")),
        detector_seed=r.str("detector_seed", "offset", choices=("offset", "fixed")),
        cache_dir=_resolve_path(r.str("cache_dir", None), base),
        output=_resolve_path(r.str("output", None), base),
        source=source,
    )
    r.finish()
    _check_unique(cfg, source)
    return cfg


def _register_listed_secrets(r: _Reader, source: str | None) -> None:
    """``secrets: [VAR, ...]``: environment variables whose values are secret whatever their
    names (read first, so that every expansion after it is redacted)."""
    names = r.raw("secrets", [])
    if isinstance(names, str):
        names = [names]
    if not isinstance(names, list) or not all(isinstance(n, str) for n in names):
        raise r.err("secrets", f"must be a list of environment variable names, got {names!r}")
    for n in names:
        register_secret(os.environ.get(n))


def _check_unique(cfg: ExperimentConfig, source: str | None) -> None:
    for section, labels in (
        ("benchmarks", [b.label for b in cfg.benchmarks]),
        ("targets", [t.name for t in cfg.targets]),
        ("detectors", [d.label for d in cfg.detectors]),
    ):
        seen: dict[str, int] = {}
        for i, lab in enumerate(labels):
            if lab in seen:
                key = "label" if section != "targets" else "name"
                raise ConfigError(
                    f"{section}[{i}].{key}",
                    f"{lab!r} is already used by {section}[{seen[lab]}]; labels must be unique",
                    source,
                )
            seen[lab] = i
    names = {t.name for t in cfg.targets}
    for i, t in enumerate(cfg.targets):
        if t.base is not None:
            if t.base not in names:
                raise ConfigError(
                    f"targets[{i}].base", f"no target named {t.base!r} in this config", source
                )
            if t.base == t.name:
                raise ConfigError(f"targets[{i}].base", "a target cannot be its own base", source)


def load_config(path: str | Path) -> ExperimentConfig:
    """Read and validate a YAML experiment config."""
    p = Path(path)
    if not p.is_file():
        raise ConfigError("", "no such config file", str(p))
    try:
        data = yaml.safe_load(p.read_text(encoding="utf-8"))
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"line {mark.line + 1}, column {mark.column + 1}: " if mark else ""
        raise ConfigError(
            "", f"{where}invalid YAML ({getattr(exc, 'problem', exc)})", str(p)
        ) from None
    if data is None:
        raise ConfigError("", "the file is empty", str(p))
    return parse_config(data, source=str(p))
