"""The experiment config: YAML validated by one pydantic model, every problem reported at once.

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

One schema, validated once: :class:`ExperimentConfig` (a frozen pydantic model; its entries are
pydantic dataclasses) is both what the YAML validates into and what the code reads, and
:meth:`ExperimentConfig.as_dict` writes it back through the same model (``config.yaml``). Loading
a file is its validation with a context (the file and its directory) plus two fields set after:
validators make relative paths absolute against the config's directory, put ``split.subsample``
into every benchmark entry (with or without a file) and default ``name`` to the file's stem;
then ``source`` (the file) and ``labs`` (every lab the config names, resolved without building;
a lab that cannot be resolved is a problem at its entry's key) are set with ``model_copy``.
Neither is a key of the file. The data protocol's sizes live under ``split:`` and are also read
as properties (``cfg.n_supervised_per_class``, ...).
Every problem of a file is collected (unknown keys with the closest known one, wrong types and
ranges, cross references, unknown or mistyped target and detector ``options``) and raised as one
:class:`ConfigError` whose lines name the key path and the line in the YAML file, e.g.
``exp.yaml:7: targets[1].backend: ...`` (docs/config.md); :func:`read_yaml`,
:func:`expand_variables`, :func:`problems_at` and :func:`target_checks` do the same for the fit
command's config (:mod:`calibdcd.experiment.fit_config`).

``${VAR}`` and ``${VAR:-default}`` in strings are expanded from the environment
(``CALIBDCD_SHARED`` defaults to a directory named ``shared`` beside the repository or one of its
parents).
The value of a variable whose name contains KEY, TOKEN, SECRET or PASSWORD, or that is listed in
``secrets: [VAR, ...]``, is secret: it is redacted (``***``) in every file and message the run
writes (see :mod:`calibdcd.redact`), as are credentials in URLs.
Relative paths are resolved against the config file's directory. Lab references (``lab: micro``)
are resolved once, here, into :class:`LabRef` values (preset, seed and the lab's cache identity),
without building any lab.
"""

from __future__ import annotations

import dataclasses
import functools
import os
import re
import typing
from collections.abc import Callable, Iterable, Iterator, Mapping
from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    StrictBool,
    StrictInt,
    ValidationError,
    ValidationInfo,
    ValidatorFunctionWrapHandler,
    field_validator,
    model_validator,
)
from pydantic.dataclasses import dataclass as pydantic_dataclass

from calibdcd.calibration import CalibrationConfig
from calibdcd.keys import added_field
from calibdcd.options import suggestion
from calibdcd.redact import register_secret
from calibdcd.variables import expand_variables

__all__ = [
    "AnalysisSpec",
    "BenchmarkEntry",
    "ConfigError",
    "ConfigProblem",
    "DetectorEntry",
    "EvaluationSpec",
    "ExperimentConfig",
    "LabRef",
    "SplitSpec",
    "TargetEntry",
    "expand_variables",
    "key_path",
    "lab_spec",
    "labs_of",
    "line_of",
    "load_config",
    "local_target_paths",
    "option_strings",
    "parse_config",
    "problems_at",
    "read_config",
    "read_yaml",
    "register_entry_check",
    "register_listed_secrets",
    "target_checks",
]

_LABEL = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.+-]*$")

Loc = tuple[str | int, ...]


# --------------------------------------------------------------------------------------------
# Problems and the error
# --------------------------------------------------------------------------------------------


def key_path(loc: Loc) -> str:
    """``("targets", 1, "backend")`` -> ``targets[1].backend``."""
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            out += f".{part}" if out else str(part)
    return out


@dataclasses.dataclass(frozen=True)
class ConfigProblem:
    """One problem of a config: its key path, what is wrong, and its line in the YAML file (None
    when the config did not come from a file). ``blocking``: the config cannot be built at all
    (False for an option problem: a dry run still checks everything else)."""

    path: str
    problem: str
    line: int | None = None
    blocking: bool = True

    def render(self, source: str | None = None) -> str:
        where = source or ""
        if self.line is not None:
            where = f"{where}:{self.line}" if where else f"line {self.line}"
        return f"{where + ': ' if where else ''}{self.path or '<root>'}: {self.problem}"


class ConfigError(ValueError):
    """Config problems. ``problems``: every problem found (in file order); ``path``, ``problem``
    and ``line``: the first one; ``source``: the file."""

    def __init__(
        self,
        path: str,
        problem: str,
        source: str | None = None,
        *,
        line: int | None = None,
        problems: list[ConfigProblem] | None = None,
    ):
        self.problems = problems or [ConfigProblem(path, problem, line)]
        first = self.problems[0]
        self.path, self.problem, self.line = first.path, first.problem, first.line
        self.source = source
        if len(self.problems) == 1:
            msg = first.render(source)
        else:
            head = f"{source}: " if source else ""
            msg = f"{head}{len(self.problems)} problems:\n" + "\n".join(
                "  " + p.render(source) for p in self.problems
            )
        super().__init__(msg)


# --------------------------------------------------------------------------------------------
# Value types (the messages are the ones the errors show)
# --------------------------------------------------------------------------------------------


def _text(v: str) -> str:
    if not v.strip():
        raise ValueError(f"must be a non-empty string, got {v!r}")
    return v


def _label(v: str) -> str:
    if v and not _LABEL.match(v):
        raise ValueError(f"{v!r} is not a usable label (letters, digits, '_', '.', '+', '-')")
    return v


def _in_range(low: float, high: float) -> Callable[[float], float]:
    def check(v: float) -> float:
        if not (low <= v <= high):
            raise ValueError(f"must lie in [{low}, {high}], got {v}")
        return v

    return check


def _at_least(low: int) -> Callable[[int], int]:
    def check(v: int) -> int:
        if v < low:
            raise ValueError(f"must be >= {low}, got {v}")
        return v

    return check


def _number(v: Any) -> Any:
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        raise ValueError(f"must be a number, got {v!r}")
    return float(v)


def _none_to_empty(v: Any) -> Any:
    return {} if v is None else v


def _subsample(v: Any) -> Any:
    """A protocol subsample size as written: "paper", "all", an integer >= 2, or None (all)."""
    if not (
        v in (None, "paper", "all") or (isinstance(v, int) and not isinstance(v, bool) and v >= 2)
    ):
        raise ValueError(f"must be 'paper', 'all' or an integer >= 2, got {v!r}")
    return v


Text = Annotated[str, AfterValidator(_text)]
Label = Annotated[str, AfterValidator(_text), AfterValidator(_label)]
Number = Annotated[float, BeforeValidator(_number)]
Options = Annotated[dict[str, Any], BeforeValidator(_none_to_empty)]

_ENTRY = ConfigDict(extra="forbid", coerce_numbers_to_str=True)


# --------------------------------------------------------------------------------------------
# Entries (pydantic dataclasses: validated from YAML, plain frozen dataclasses everywhere else)
# --------------------------------------------------------------------------------------------


@pydantic_dataclass(frozen=True, config=_ENTRY)
class BenchmarkEntry:
    """One benchmark: a known name (see ``calibdcd data list``) or any jsonl/csv/parquet file.

    ``label`` names it in tables (default: the name, plus the subset when given). ``lab``: the
    file lives in the contamination lab of that preset (``path`` is relative to the lab
    directory; the lab is built on first use).
    """

    name: Text
    path: Text | None = None
    split: Text | None = None
    label: Label = ""
    lab: Text | None = None
    #: any Hugging Face hub dataset (``owner/name``), read with ``datasets`` from its snapshot
    #: in the local hub cache: ``config`` and ``split`` (default ``train``) as its card defines
    #: them, at ``revision``; ``text_field``/``label_field`` name its columns
    #: (added fields: left out of setting hashes while unset, so stored runs stay complete)
    hub: Text | None = added_field(None, legacy=None)
    config: Text | None = added_field(None, legacy=None)
    revision: Text | None = added_field(None, legacy=None)
    #: a hub dataset with one member and one non-member text per row (MIMIR): the two columns
    member_field: Text | None = added_field(None, legacy=None)
    nonmember_field: Text | None = added_field(None, legacy=None)
    text_field: Text | None = None
    label_field: Text | None = None
    id_field: Text | None = None
    dedupe: StrictBool = False
    #: the protocol's subsample size for this benchmark ("paper", an int, or None = all;
    #: "all" in the file)
    subsample: Any = "paper"

    @model_validator(mode="after")
    def _defaults(self) -> BenchmarkEntry:
        try:
            sub = _subsample(self.subsample)
        except ValueError as exc:
            raise ValueError(f"subsample: {exc}") from None
        if sub == "all":
            object.__setattr__(self, "subsample", None)
        if not self.label:
            default = self.name if self.split is None else f"{self.name}-{self.split}"
            object.__setattr__(self, "label", re.sub(r"[^A-Za-z0-9_.+-]", "-", default))
        return self


@pydantic_dataclass(frozen=True, config=_ENTRY)
class TargetEntry:
    """One black-box target. ``backend``: hf | openai | any registered backend; ``model``: a local
    path, a hub id (GPU machines) or, with ``lab``, a checkpoint directory inside the lab
    (``base``, ``chat-qwen``, ...). ``base``: the label of this model's pre-trained counterpart
    in the same config (for the base-vs-post-trained comparison); ``post_trained`` marks targets
    that enter the paper's main tables."""

    name: Label
    backend: Text
    model: Text
    family: Text | None = None
    lab: Text | None = None
    base: Text | None = None
    post_trained: StrictBool = True
    options: Options = dataclasses.field(default_factory=dict)
    #: where CalibDCD's two boundary views come from when ``family`` has no built-in ones: a
    #: local tokenizer directory (or hub id) whose chat template is the served model's, or
    #: ``server`` (the server renders its own template: vLLM's ``/tokenize``). Default: the
    #: family's, else the checkpoint's own (an in-process or hub model), else a family told by
    #: the model's name, else (a served model) the server's
    #: (:func:`calibdcd.experiment.target_entries.target_views`)
    tokenizer: Text | None = added_field(None, legacy=None)


@pydantic_dataclass(frozen=True, config=_ENTRY)
class DetectorEntry:
    """One detector: ``name`` in the detector registry (veilprobe, dpdllm, overlap, the
    attacks), ``preset`` (detector-specific, e.g. VeilProbe ``paper``/``cpu``), ``options``
    (config overrides).
    In the file a bare name (``- overlap``) is ``{name: overlap}``."""

    name: Text
    label: Label = ""
    preset: Text | None = None
    options: Options = dataclasses.field(default_factory=dict)

    @model_validator(mode="before")
    @classmethod
    def _bare_name(cls, data: Any) -> Any:
        return {"name": data} if isinstance(data, str) else data

    @model_validator(mode="after")
    def _default_label(self) -> DetectorEntry:
        if not self.label:
            _label(self.name)  # the name is the label: it must be usable as one
            object.__setattr__(self, "label", self.name)
        return self


@pydantic_dataclass(frozen=True, config=_ENTRY)
class EvaluationSpec:
    fpr: Annotated[Number, AfterValidator(_in_range(1e-6, 1.0))] = 0.05
    n_boot: Annotated[StrictInt, AfterValidator(_at_least(0))] = 1000
    level: Annotated[Number, AfterValidator(_in_range(0.5, 0.999))] = 0.95


@pydantic_dataclass(frozen=True, config=_ENTRY)
class AnalysisSpec:
    """Which analyses run inside each setting (all from the setting's cached features)."""

    ablations: StrictBool = True
    adaptive_vs_fixed: StrictBool = True
    fixed_rank: Annotated[StrictInt, AfterValidator(_at_least(1))] = 3
    fixed_strength: Annotated[Number, AfterValidator(_in_range(0.0, 1.0))] = 0.9
    fp_recovery: StrictBool = True
    #: also run the complete method in the other calibration space (raw <-> normalised) where the
    #: classifier has both; the paper does not say which one it means (see README)
    space_comparison: StrictBool = True
    #: the controls beside CalibDCD: placebo basis, noise floor, centred variant (analyses.py)
    controls: StrictBool = True
    #: the noise floor's method (analyses.py): ``half_sample``, an interval around the detector
    #: from retraining on stratified halves (the classifier's spread at the training set's
    #: size); ``bootstrap``, the earlier retrain on one bootstrap resample (a smaller training
    #: set, one-sided). The setting hash holds it only when not the default (plan.py)
    noise_floor: Literal["half_sample", "bootstrap"] = "half_sample"
    #: the blind baseline (TF-IDF + logistic regression on the texts alone; calibdcd.blind)
    blind: StrictBool = True


@dataclasses.dataclass(frozen=True)
class LabRef:
    """A lab a config uses, resolved once at load time without building it: the preset, the
    build seed and ``key``, the lab's cache identity (``<preset>-s<seed>-<config hash>``, a
    content key that changes whenever the built lab would; no path). ``directory``: where a
    build is (or will be) found here; not part of the identity."""

    preset: str
    seed: int
    key: str
    directory: str | None = dataclasses.field(default=None, compare=False, repr=False)
    #: a copy under ``$CALIBDCD_LAB_ROOT`` (used as it is, never built)
    prebuilt: bool = dataclasses.field(default=False, compare=False, repr=False)

    @property
    def built(self) -> bool:
        """Whether a complete build is present now (a run builds it on first use)."""
        if self.directory is None:
            return False
        d = Path(self.directory)
        try:
            from calibdcd.lab.build import is_complete_lab  # type: ignore
        except ImportError:
            return (d / "ground_truth.jsonl").is_file()
        return is_complete_lab(d) or (
            (d / "ground_truth.jsonl").is_file() and not (d / "lab.json").is_file()
        )


# --------------------------------------------------------------------------------------------
# The config (one schema: the file as validated, and what the code reads)
# --------------------------------------------------------------------------------------------


def _seeds(v: Any) -> Any:
    if isinstance(v, int) and not isinstance(v, bool):
        return [v]
    if not isinstance(v, (list, tuple)) or not v:
        raise ValueError(f"must be an integer or a non-empty list of integers, got {v!r}")
    return v


def _unique_seeds(v: tuple[int, ...]) -> tuple[int, ...]:
    if len(set(v)) != len(v):
        raise ValueError(f"repeats a seed: {list(v)}")
    return v


def _non_empty(v: tuple[Any, ...]) -> tuple[Any, ...]:
    if not v:
        raise ValueError("must be a non-empty list, got []")
    return v


def _secret_names(v: Any) -> Any:
    if isinstance(v, str):
        v = [v]
    if not isinstance(v, list) or not all(isinstance(n, str) for n in v):
        raise ValueError(f"must be a list of environment variable names, got {v!r}")
    return v


def register_listed_secrets(data: Mapping[str, Any]) -> None:
    """Register the values of the variables a config lists under ``secrets:`` for redaction,
    before anything is expanded (run and fit configs alike)."""
    secrets = data.get("secrets")
    names = [secrets] if isinstance(secrets, str) else secrets
    for n in names if isinstance(names, list) else []:  # another type: the schema says so
        if isinstance(n, str):
            register_secret(os.environ.get(n))


def calibration_problems(v: Any) -> list[tuple[Loc, str]]:
    """Every problem of a ``calibration:`` mapping at once (unknown keys, types, ranges), each
    with its key path; the values are checked as written (``strengths: [1]`` stays an int)."""
    if not isinstance(v, Mapping):
        return []  # None is the default; anything else pydantic reports as "must be a mapping"
    from calibdcd.calibration import settings_problems
    from calibdcd.options import type_hints, type_problem

    hints = type_hints(CalibrationConfig)
    out: list[tuple[Loc, str]] = []
    typed: dict[str, Any] = {}
    for k, x in v.items():
        if k not in hints:
            out.append((("calibration", k), f"unknown key{suggestion(str(k), sorted(hints))}"))
        elif (problem := type_problem(hints[k], x)) is not None:
            out.append((("calibration", k), problem))
        else:
            typed[k] = x
    out += [(("calibration", k), m) for k, m in settings_problems(typed)]
    return out


def _calibration(v: Any) -> Any:
    """``calibration:`` -> :class:`CalibrationConfig`, built from the values as written (so that
    ``strengths: [1]`` stays the integer it was, and setting hashes with it); its problems are
    :func:`calibration_problems`, reported with the file's before this runs."""
    if v is None:
        return CalibrationConfig()
    if not isinstance(v, Mapping):
        return v  # pydantic reports the type
    return CalibrationConfig(**{k: tuple(x) if isinstance(x, list) else x for k, x in v.items()})


class SplitSpec(BaseModel):
    """``split:``: the data protocol's sizes (``subsample`` sets every benchmark's)."""

    model_config = ConfigDict(extra="forbid", frozen=True, coerce_numbers_to_str=True)

    n_supervised_per_class: Annotated[StrictInt, AfterValidator(_at_least(1))] = 50
    calibration_fraction: Annotated[Number, AfterValidator(_in_range(1e-6, 0.999999))] = 0.5
    balance: Literal["equal", "stratified"] = "equal"
    n_calibration: Annotated[StrictInt, AfterValidator(_at_least(1))] | None = None
    #: group-aware split: the sample meta field holding a text's group (``group``: book/paper of
    #: the known benchmarks; the lab's ``source``); None = split by text (the paper)
    group_by: Text | None = None
    #: when given, every benchmark's ``subsample`` (applied when the config is validated)
    subsample: Annotated[Any, AfterValidator(_subsample)] = None
    #: one subsample for every seed (its seed), or None: each seed its own (the paper)
    subsample_seed: StrictInt | None = None


@dataclasses.dataclass(frozen=True)
class _Loading:
    """The validation context of a config being loaded: the file it comes from and the
    directory its relative paths are read against."""

    source: str | None
    base: Path | None


def _loading(info: ValidationInfo) -> _Loading | None:
    return info.context if isinstance(info.context, _Loading) else None


def local_target_paths(
    backend: str, model: str, lab: str | None, tokenizer: str | None, base: Path | None
) -> dict[str, str]:
    """A target's local paths (a tokenizer directory; an hf model given as a path or a GGUF
    file) made absolute against ``base`` (the config's directory), as changed fields; a lab's
    checkpoint names and hub ids stay as written. Run and fit configs alike."""
    changes: dict[str, str] = {}
    if isinstance(tokenizer, str) and tokenizer.startswith((".", "/", "~")):
        changes["tokenizer"] = _resolve_path(tokenizer, base) or tokenizer
    if (
        lab is None
        and backend == "hf"
        and (model.startswith((".", "/", "~")) or Path(model).suffix == ".gguf")
    ):
        changes["model"] = _resolve_path(model, base) or model
    return changes


def _local_paths(t: TargetEntry, base: Path | None) -> TargetEntry:
    changes = local_target_paths(t.backend, t.model, t.lab, t.tokenizer, base)
    return dataclasses.replace(t, **changes) if changes else t


#: fields a config gets when it is loaded, never written in a file
_SET_WHEN_LOADED = ("source", "labs")


class ExperimentConfig(BaseModel):
    """The experiment config: the YAML file as validated (field order = the order
    ``config.yaml`` is written in) and what the code reads. Loaded (:func:`load_config`,
    :func:`parse_config`), its relative paths are absolute, ``name`` defaults to the file's
    stem, ``split.subsample`` is in every benchmark, and ``source`` and ``labs`` are set."""

    model_config = ConfigDict(extra="forbid", frozen=True, coerce_numbers_to_str=True)

    #: unset: the config file's stem (``experiment`` for a config built in code)
    name: Label = Field(default=None, validate_default=True)
    seeds: Annotated[
        tuple[Annotated[StrictInt, AfterValidator(_at_least(0))], ...],
        BeforeValidator(_seeds),
        AfterValidator(_unique_seeds),
    ] = (0,)
    protocol: Literal["paper", "strict"] = "paper"
    split: Annotated[SplitSpec, BeforeValidator(_none_to_empty)] = SplitSpec()
    benchmarks: Annotated[tuple[BenchmarkEntry, ...], AfterValidator(_non_empty)]
    targets: Annotated[tuple[TargetEntry, ...], AfterValidator(_non_empty)]
    detectors: Annotated[tuple[DetectorEntry, ...], AfterValidator(_non_empty)]
    calibration: Annotated[CalibrationConfig, BeforeValidator(_calibration)] = Field(
        default_factory=CalibrationConfig
    )
    evaluation: Annotated[EvaluationSpec, BeforeValidator(_none_to_empty)] = EvaluationSpec()
    analyses: Annotated[AnalysisSpec, BeforeValidator(_none_to_empty)] = AnalysisSpec()
    #: "official" (default) or "none": the system turn of the model-specific boundary views
    view_system: Literal["official", "none"] = "official"
    #: "raw" (the paper): CalibDCD corrects the extractor's output and the detector's whole
    #: training procedure (its normalisation included) is refitted on the corrected features;
    #: "normalized" (a variant beyond the paper): after the classifier's own normalisation;
    #: "auto": normalized when the classifier exposes such a space, else raw (the default of
    #: runs made before the paper's method became the default)
    calibration_space: Literal["auto", "raw", "normalized"] = "raw"
    #: "offset" (default): a setting's seed is added to every ``seed`` of its detector's config
    #: (generation sampling, perturbations, trained parts), so seeds vary the detector's random
    #: state as well as the split and the classifier; "fixed": only split and classifier vary
    detector_seed: Literal["offset", "fixed"] = "offset"
    #: the run's cache root (labs included); None = ``$CALIBDCD_CACHE``, else the user cache
    #: (:func:`calibdcd.paths.cache_root`)
    cache_dir: Text | None = None
    output: Text | None = None
    #: environment variables whose values are secret whatever their names (read first)
    secrets: Annotated[tuple[str, ...], BeforeValidator(_secret_names)] | None = Field(
        default=None, exclude=True
    )
    #: the YAML file it came from (set when loaded)
    source: str | None = Field(default=None, exclude=True)
    #: every lab the config names (benchmarks, targets, ``lab-clean-reference:``/``lab:``
    #: references in detector options), resolved once when loaded (never built here)
    labs: Mapping[str, LabRef] = Field(default_factory=dict, exclude=True)

    @field_validator("name", mode="wrap")
    @classmethod
    def _default_name(cls, v: Any, handler: ValidatorFunctionWrapHandler, info: ValidationInfo):
        if v is not None:
            return handler(v)
        load = _loading(info)
        return Path(load.source).stem if load and load.source else "experiment"

    @field_validator("benchmarks")
    @classmethod
    def _resolve_benchmarks(
        cls, v: tuple[BenchmarkEntry, ...], info: ValidationInfo
    ) -> tuple[BenchmarkEntry, ...]:
        """``split.subsample`` in every benchmark; a loaded file's paths absolute (a lab's
        stay relative to the lab)."""
        load, split = _loading(info), info.data.get("split")
        common = (
            {"subsample": split.subsample}
            if split and "subsample" in split.model_fields_set
            else {}
        )
        out = []
        for b in v:
            changes = dict(common)
            if load is not None and b.lab is None:
                changes["path"] = _resolve_path(b.path, load.base)
            out.append(dataclasses.replace(b, **changes) if changes else b)
        return tuple(out)

    @field_validator("targets")
    @classmethod
    def _resolve_targets(
        cls, v: tuple[TargetEntry, ...], info: ValidationInfo
    ) -> tuple[TargetEntry, ...]:
        load = _loading(info)
        return v if load is None else tuple(_local_paths(t, load.base) for t in v)

    @field_validator("cache_dir", "output")
    @classmethod
    def _resolve_dir(cls, v: str | None, info: ValidationInfo) -> str | None:
        load = _loading(info)
        return v if load is None else _resolve_path(v, load.base)

    # the data protocol's sizes, read where the code reads the config
    @property
    def n_supervised_per_class(self) -> int:
        return self.split.n_supervised_per_class

    @property
    def calibration_fraction(self) -> float:
        return self.split.calibration_fraction

    @property
    def n_calibration(self) -> int | None:
        return self.split.n_calibration

    @property
    def balance(self) -> Literal["equal", "stratified"]:
        return self.split.balance

    @property
    def group_by(self) -> str | None:
        return self.split.group_by

    @property
    def subsample_seed(self) -> int | None:
        return self.split.subsample_seed

    @property
    def grid_size(self) -> int:
        return len(self.benchmarks) * len(self.targets) * len(self.detectors) * len(self.seeds)

    def as_dict(self) -> dict[str, Any]:
        """The config in the YAML schema (``load_config`` reads it back unchanged), without
        unset optional values and empty options; ``split.subsample`` is in each benchmark."""
        d = self.model_dump(mode="json", exclude_none=True, exclude={"split": {"subsample"}})
        for section in ("benchmarks", "targets", "detectors"):
            d[section] = [{k: v for k, v in e.items() if v not in ({}, "")} for e in d[section]]
        for b, entry in zip(d["benchmarks"], self.benchmarks, strict=True):
            b["subsample"] = "all" if entry.subsample is None else entry.subsample
        return d

    def target(self, name: str) -> TargetEntry:
        for t in self.targets:
            if t.name == name:
                return t
        raise KeyError(name)


# --------------------------------------------------------------------------------------------
# Environment variables, paths, lines
# --------------------------------------------------------------------------------------------


def _resolve_path(p: str | None, base: Path | None) -> str | None:
    if p is None:
        return None
    path = Path(p).expanduser()
    if not path.is_absolute() and base is not None:
        path = base / path
    return os.path.normpath(str(path))


def yaml_lines(text: str) -> dict[Loc, int]:
    """The line (1-based) of every key and list item of a YAML document, by key path."""
    lines: dict[Loc, int] = {}
    root = yaml.compose(text, Loader=yaml.SafeLoader)

    def walk(node: Any, loc: Loc) -> None:
        lines.setdefault(loc, node.start_mark.line + 1)
        if isinstance(node, yaml.MappingNode):
            for k, v in node.value:
                key = (*loc, str(k.value))
                lines[key] = k.start_mark.line + 1
                walk(v, key)
        elif isinstance(node, yaml.SequenceNode):
            for i, item in enumerate(node.value):
                walk(item, (*loc, i))

    if root is not None:
        walk(root, ())
    return lines


def line_of(loc: Loc, lines: Mapping[Loc, int] | None) -> int | None:
    """The line of a key path in the YAML file (None without lines)."""
    if not lines:
        return None
    for n in range(len(loc), -1, -1):  # the key itself, else its nearest written parent
        if loc[:n] in lines:
            return lines[loc[:n]]
    return None


_PROBLEM_KEY = re.compile(
    r"^(?P<section>[a-z_]+)(?:\[(?P<index>\d+)\])?(?: \([^)]*\))?(?P<rest>(?:\.[A-Za-z_]+)*)"
)


def locate(problem: str, source: str | Path) -> str:
    """A dry run's problem (``"targets[0] (served).family: ..."``) prefixed with the file and the
    line of its key (or of the nearest key written above it), as the config's own problems are;
    unchanged when it names no key of the file."""
    m = _PROBLEM_KEY.match(problem)
    if m is None:
        return problem
    try:
        lines = yaml_lines(Path(source).read_text(encoding="utf-8"))
    except (OSError, yaml.YAMLError):
        return problem
    loc: Loc = (m["section"],)
    if m["index"] is not None:
        loc += (int(m["index"]),)
    loc += tuple(x for x in m["rest"].split(".") if x)
    if loc[:1] not in lines:
        return problem
    return f"{source}:{line_of(loc, lines)}: {problem}"


# --------------------------------------------------------------------------------------------
# pydantic's errors as key paths and plain messages
# --------------------------------------------------------------------------------------------


def _fields_of(tp: Any) -> dict[str, Any]:
    """Field name -> annotation of a model or dataclass type (resolved hints)."""
    if isinstance(tp, type) and issubclass(tp, BaseModel):
        return {k: f.annotation for k, f in tp.model_fields.items()}
    if dataclasses.is_dataclass(tp):
        hints = typing.get_type_hints(tp, include_extras=True)
        return {f.name: hints.get(f.name) for f in dataclasses.fields(tp)}
    return {}


def _unwrap(tp: Any) -> Any:
    """The model/dataclass inside ``Annotated``, ``Optional`` and ``list`` annotations."""
    while True:
        origin = typing.get_origin(tp)
        if origin is Annotated:
            tp = typing.get_args(tp)[0]
        elif origin in (list, tuple) or (origin is not None and type(None) in typing.get_args(tp)):
            args = [a for a in typing.get_args(tp) if a is not type(None) and a is not Ellipsis]
            if not args:
                return tp
            tp = args[0]
        else:
            return tp


def _known_keys(loc: Loc) -> list[str]:
    """The keys a file may write in the mapping at ``loc`` (of the :class:`ExperimentConfig`
    schema)."""
    tp: Any = ExperimentConfig
    for part in loc:
        if isinstance(part, int):
            continue
        tp = _unwrap(_fields_of(tp).get(part))
        if tp is None:
            return []
    return sorted(
        k for k in _fields_of(tp) if tp is not ExperimentConfig or k not in _SET_WHEN_LOADED
    )


def _message(err: Any) -> tuple[Loc, str]:
    """One pydantic error -> (YAML key path, plain message)."""
    loc: Loc = tuple(p for p in err["loc"] if not (isinstance(p, str) and "[" in p))
    kind, value = err["type"], err.get("input")
    if kind in ("extra_forbidden", "unexpected_keyword_argument"):
        return loc, f"unknown key{suggestion(str(loc[-1]), _known_keys(loc[:-1]))}"
    if kind in ("missing", "missing_argument"):
        if loc and loc[-1] in ("benchmarks", "targets", "detectors"):
            return loc, "is required (a non-empty list)"
        return loc, "is required"
    if kind == "literal_error":
        expected = re.findall(r"'([^']*)'", err["msg"].split("should be", 1)[-1])
        return loc, f"must be one of {expected}, got {value!r}"
    if kind in ("int_type", "int_parsing", "int_from_float"):
        return loc, f"must be an integer, got {value!r}"
    if kind in ("bool_type", "bool_parsing"):
        return loc, f"must be true or false, got {value!r}"
    if kind in ("float_type", "float_parsing"):
        return loc, f"must be a number, got {value!r}"
    if kind == "string_type":
        return loc, f"must be a non-empty string, got {value!r}"
    if kind in ("list_type", "tuple_type"):
        return loc, f"must be a non-empty list, got {value!r}"
    if kind in ("dict_type", "model_type", "dataclass_type", "model_attributes_type"):
        return loc, f"must be a mapping, got {type(value).__name__}"
    msg = str(err["msg"]).removeprefix("Value error, ")
    # a problem a validator found in one field of its object: "field: problem"
    field, sep, rest = msg.partition(": ")
    if sep and re.fullmatch(r"[a-z_]+", field):
        return (*loc, field), rest
    # CalibrationConfig's own checks name the field first ("strengths must lie in [0, 1]")
    if loc and loc[-1] == "calibration":
        first = msg.split(" ", 1)[0]
        if first in _fields_of(CalibrationConfig):
            return (*loc, first), msg
    return loc, msg


# --------------------------------------------------------------------------------------------
# Checks across entries, and of the components' options
# --------------------------------------------------------------------------------------------


def _cross_checks(data: Mapping[str, Any]) -> list[tuple[Loc, str]]:
    """Labels unique, ``base`` names a target, ``lab`` needs ``path``: checked on the raw
    mapping, so that they are reported beside every other problem of the file."""
    out: list[tuple[Loc, str]] = []

    def items(section: str) -> list[tuple[int, dict[str, Any]]]:
        v = data.get(section)
        if not isinstance(v, list):
            return []
        return [
            (i, {"name": e} if isinstance(e, str) else e)
            for i, e in enumerate(v)
            if isinstance(e, (str, Mapping))
        ]

    for i, b in items("benchmarks"):
        if b.get("hub") is not None:
            for key in ("path", "lab"):
                if b.get(key) is not None:
                    out.append(
                        (
                            ("benchmarks", i, key),
                            "cannot be given with hub (one source per benchmark)",
                        )
                    )
        else:
            for key in ("config", "revision", "member_field", "nonmember_field"):
                if b.get(key) is not None:
                    out.append(
                        (("benchmarks", i, key), "applies to a hub dataset (give hub: owner/name)")
                    )
        if (b.get("member_field") is None) != (b.get("nonmember_field") is None):
            key = "nonmember_field" if b.get("member_field") is not None else "member_field"
            out.append(
                (
                    ("benchmarks", i, key),
                    "is required with its pair (member_field and nonmember_field)",
                )
            )
        if b.get("lab") is not None and b.get("path") is None:
            out.append(
                (
                    ("benchmarks", i, "path"),
                    "is required with lab (the file inside the lab, e.g. ground_truth.jsonl)",
                )
            )

    def label(section: str, e: Mapping[str, Any]) -> Any:
        if section == "targets":
            return e.get("name")
        if e.get("label"):
            return e["label"]
        if section == "benchmarks" and e.get("split") is not None:
            return re.sub(r"[^A-Za-z0-9_.+-]", "-", f"{e.get('name')}-{e['split']}")
        name = e.get("name")
        if section == "benchmarks" and isinstance(name, str):
            return re.sub(r"[^A-Za-z0-9_.+-]", "-", name)
        return name

    for section in ("benchmarks", "targets", "detectors"):
        seen: dict[Any, int] = {}
        key = "name" if section == "targets" else "label"
        for i, e in items(section):
            lab = label(section, e)
            if not isinstance(lab, (str, int)):
                continue
            if lab in seen:
                out.append(
                    (
                        (section, i, key),
                        f"{lab!r} is already used by {section}[{seen[lab]}]; labels must be unique",
                    )
                )
            else:
                seen[lab] = i
    names = {e.get("name") for _, e in items("targets")}
    for i, t in items("targets"):
        base = t.get("base")
        if base is None:
            continue
        if base not in names:
            out.append((("targets", i, "base"), f"no target named {base!r} in this config"))
        elif base == t.get("name"):
            out.append((("targets", i, "base"), "a target cannot be its own base"))
    return out


def _benchmark_file_checks(data: Mapping[str, Any], base: Path | None) -> list[tuple[Loc, str]]:
    """Each benchmark's file exists (``path`` resolved as the run resolves it), and a benchmark
    without ``path`` or ``lab`` is a known one (read from the hub) or itself a file."""
    from calibdcd.data.benchmarks import BENCHMARKS, benchmark_spec

    out: list[tuple[Loc, str]] = []
    raw = data.get("benchmarks")
    for i, b in enumerate(raw if isinstance(raw, list) else []):
        if not isinstance(b, Mapping) or b.get("lab") is not None or b.get("hub") is not None:
            continue
        name, path = b.get("name"), b.get("path")
        if isinstance(path, str) and path:
            p = Path(_resolve_path(path, base) or path)
            if not p.exists():
                out.append((("benchmarks", i, "path"), f"no such file or directory: {p}"))
        elif path is None and isinstance(name, str) and name and benchmark_spec(name) is None:
            if not Path(name).exists():
                known = sorted(BENCHMARKS)
                out.append(
                    (
                        ("benchmarks", i, "name"),
                        f"unknown benchmark {name!r}{suggestion(name, known)} and no such file; "
                        "give path: (a jsonl/csv/parquet file) for a dataset of your own",
                    )
                )
    return out


#: checks of one validated entry, by section ("targets", "detectors"): ``check(entry, cfg)``
#: returns (key path below the entry, problem) pairs. The experiment's `experiment.detector_entries`
#: registers the detectors' check (it knows each detector's typed config).
_ENTRY_CHECKS: dict[str, list[Callable[[Any, Mapping[str, Any]], list[tuple[Loc, str]]]]] = {}


def register_entry_check(
    section: str, check: Callable[[Any, Mapping[str, Any]], list[tuple[Loc, str]]]
) -> None:
    """Add a check of every entry of ``section`` (``check(entry, file_data)`` -> problems)."""
    checks = _ENTRY_CHECKS.setdefault(section, [])
    if check not in checks:
        checks.append(check)


def target_checks(entry: TargetEntry, data: Mapping[str, Any]) -> list[tuple[Loc, str]]:
    """A target's backend and family are known ones, its options are the backend's, and their
    values are ones its constructor takes (a base URL is a URL), all without building it."""
    from calibdcd.targets.base import available_backends, option_problems, value_problem_of
    from calibdcd.views import FAMILIES, known_family

    out: list[tuple[Loc, str]] = []
    if entry.family is not None and not known_family(entry.family):
        out.append(
            (
                ("family",),
                f"unknown chat family {entry.family!r}{suggestion(entry.family, list(FAMILIES))}"
                "; leave it out to take CalibDCD's boundary views from the checkpoint's chat "
                "template",
            )
        )
    backends = available_backends()
    if entry.backend not in backends:
        return [
            *out,
            (
                ("backend",),
                f"unknown backend {entry.backend!r}{suggestion(entry.backend, backends)}",
            ),
        ]
    named = [(("options", *k), m) for k, m in option_problems(entry.backend, entry.options)]
    if named:  # a misspelt option would also read as a required one missing: say it once
        return out + named
    value = value_problem_of(entry.backend, entry.model, entry.options)
    if value is not None:
        field, sep, rest = value.partition(" ")
        in_options = sep and field in entry.options
        out.append(
            (("options", field) if in_options else ("options",), rest if in_options else value)
        )
    return out


register_entry_check("targets", target_checks)

_ENTRY_TYPES = {"benchmarks": BenchmarkEntry, "targets": TargetEntry, "detectors": DetectorEntry}


def _option_checks(data: Mapping[str, Any]) -> list[tuple[Loc, str]]:
    """The registered checks of every entry that is valid on its own."""
    from pydantic import TypeAdapter

    out: list[tuple[Loc, str]] = []
    for section, checks in _ENTRY_CHECKS.items():
        raw = data.get(section)
        if not isinstance(raw, list):
            continue
        adapter = TypeAdapter(_ENTRY_TYPES[section])
        for i, e in enumerate(raw):
            try:
                entry = adapter.validate_python(e)
            except ValidationError:
                continue  # its own problems are reported with the file's
            for check in checks:
                out.extend(((section, i, *k), m) for k, m in check(entry, data))
    return out


# --------------------------------------------------------------------------------------------
# Labs
# --------------------------------------------------------------------------------------------

_LAB_REF = re.compile(r"^lab(?:-clean-reference)?:([A-Za-z0-9_.@-]+)")
_LAB_SPEC = re.compile(r"^(?P<preset>[A-Za-z0-9_.-]+)(?:@(?P<seed>\d+))?$")


def lab_spec(spec: str) -> tuple[str, int]:
    """``(preset, build seed)`` of a lab reference: ``micro`` is the preset built with seed 0,
    ``micro@2`` the same preset built with seed 2 (another split, initialisation and data
    order: the lab-seed axis of a study)."""
    m = _LAB_SPEC.match(spec)
    if m is None:
        raise ValueError(f"lab {spec!r}: expected <preset> or <preset>@<seed>")
    return m["preset"], int(m["seed"] or 0)


def option_strings(value: Any) -> Iterator[str]:
    """Every string in nested detector options (mappings, lists, tuples), in order."""
    if isinstance(value, str):
        yield value
    elif isinstance(value, Mapping):
        for x in value.values():
            yield from option_strings(x)
    elif isinstance(value, (list, tuple)):
        for x in value:
            yield from option_strings(x)


def entry_labs(*entries: BenchmarkEntry | TargetEntry | DetectorEntry) -> list[str]:
    """The lab presets these entries use (``lab:`` of benchmarks and targets, ``lab:<preset>/``
    and ``lab-clean-reference:<preset>`` strings in detector options), in order."""
    found: list[str] = []
    for e in entries:
        if isinstance(e, DetectorEntry):
            for v in option_strings(e.options):
                m = _LAB_REF.match(v)
                if m:
                    found.append(m.group(1).split("/")[0])
        elif e.lab is not None:
            found.append(e.lab)
    return list(dict.fromkeys(found))


def lab_presets(cfg: ExperimentConfig) -> list[str]:
    """Every lab preset the config names, in order of appearance."""
    return entry_labs(*cfg.benchmarks, *cfg.targets, *cfg.detectors)


def labs_of(cfg: ExperimentConfig, *entries: Any) -> list[LabRef]:
    """The :class:`LabRef` of every lab ``entries`` use (as resolved when ``cfg`` was loaded;
    resolved now, without building, for a config built in code)."""
    out = []
    for preset in entry_labs(*entries):
        ref = cfg.labs.get(preset) or resolve_lab_ref(preset, cache_dir=cfg.cache_dir)
        if isinstance(ref, LabRef):
            out.append(ref)
    return out


def resolve_lab_ref(spec: str, cache_dir: str | Path | None = None) -> LabRef | str:
    """The :class:`LabRef` of a lab (``<preset>[@<seed>]``, :func:`lab_spec`), or why it cannot
    be resolved; nothing is built. The one place a lab spec becomes a directory: a prebuilt
    ``$CALIBDCD_LAB_ROOT/lab-<spec>`` holding its ground truth (looked for at each call,
    identified by its ``lab.json``), else the lab's cache directory under the run's cache root
    (``cache_dir``, else :func:`calibdcd.paths.cache_root`'s default), computed once per
    process (the lab's key hashes its text pool)."""
    from calibdcd.paths import cache_root

    try:
        preset, seed = lab_spec(spec)
    except ValueError as exc:
        return str(exc)
    labs = os.environ.get("CALIBDCD_LAB_ROOT")
    prebuilt = Path(labs) / f"lab-{spec}" if labs else None
    if prebuilt is not None and (prebuilt / "ground_truth.jsonl").is_file():
        try:
            import hashlib

            key = hashlib.sha256((prebuilt / "lab.json").read_bytes()).hexdigest()[:12]
        except OSError:
            key = "unidentified"
        return LabRef(preset, seed, f"{preset}-prebuilt-{key}", str(prebuilt), prebuilt=True)
    return _cached_lab_ref(spec, preset, seed, str(cache_root(cache_dir)))


@functools.lru_cache(maxsize=32)
def _cached_lab_ref(spec: str, preset: str, seed: int, cache: str) -> LabRef | str:
    from calibdcd.lab import KNOWN_PRESETS
    from calibdcd.lab.build import lab_cache_dir

    if preset not in KNOWN_PRESETS:
        return f"unknown lab preset {preset!r}; known: {list(KNOWN_PRESETS)}"
    try:
        d = lab_cache_dir(preset, seed=seed, root=cache)
    except ValueError as exc:  # e.g. the real-model lab's pool file is missing
        return f"lab {spec!r}: {exc}"
    return LabRef(preset, seed, d.name, str(d))


# --------------------------------------------------------------------------------------------
# Parsing
# --------------------------------------------------------------------------------------------


def problems_at(
    found: Iterable[tuple[Loc, str] | tuple[Loc, str, bool]], lines: Mapping[Loc, int] | None
) -> list[ConfigProblem]:
    """``(key path, problem[, blocking])`` pairs as :class:`ConfigProblem` values with their lines
    in the YAML file, repeats dropped, in file order (run and fit configs alike)."""
    return sorted(
        (
            ConfigProblem(key_path(loc), m, line_of(loc, lines), *rest)
            for loc, m, *rest in dict.fromkeys(found)
        ),
        key=lambda p: p.line or 0,
    )


def _build(
    data: Any, source: str | None, base: Path | None, lines: Mapping[Loc, int] | None, options: bool
) -> tuple[ExperimentConfig | None, list[ConfigProblem]]:
    found: list[tuple[Loc, str, bool]] = []
    if not isinstance(data, Mapping):
        p = ConfigProblem("", f"expected a mapping, got {type(data).__name__}", line_of((), lines))
        return None, [p]
    register_listed_secrets(data)
    env_problems: list[tuple[Loc, str]] = []
    data = expand_variables(dict(data), (), env_problems)
    found += [(loc, m, True) for loc, m in env_problems]
    cfg: ExperimentConfig | None = None
    calibration = calibration_problems(data.get("calibration"))
    found += [(loc, m, True) for loc, m in calibration]
    skip = {*_SET_WHEN_LOADED, *(["calibration"] if calibration else [])}
    try:  # with a bad calibration section, the rest of the file is still checked
        cfg = ExperimentConfig.model_validate(
            {k: v for k, v in data.items() if k not in skip}, context=_Loading(source, base)
        )
    except ValidationError as exc:
        found += [(*_message(e), True) for e in exc.errors()]
    found += [
        ((k,), f"unknown key{suggestion(k, _known_keys(()))}", True)
        for k in _SET_WHEN_LOADED
        if k in data
    ]
    found += [(loc, m, True) for loc, m in _cross_checks(data)]
    if lines is not None:  # a file a run or dry run is about to use (not a mapping in code)
        found += [(loc, m, True) for loc, m in _benchmark_file_checks(data, base)]
    if options:
        # a bad name, family or preset stops the config (the dry run would repeat it); an
        # option problem does not (the dry run reports the rest of the file beside it)
        found += [(loc, m, loc[2:3] != ("options",)) for loc, m in _option_checks(data)]
    labs: dict[str, LabRef] = {}
    if cfg is not None:
        for preset in lab_presets(cfg):
            ref = resolve_lab_ref(preset, cache_dir=cfg.cache_dir)
            if isinstance(ref, str):
                where = next(
                    (
                        (s, i, "lab")
                        for s in ("benchmarks", "targets")
                        for i, e in enumerate(getattr(cfg, s))
                        if e.lab == preset
                    ),
                    ("detectors",),
                )
                found.append((where, ref, True))
            else:
                labs[preset] = ref
    problems = problems_at(found, lines)
    if cfg is None or any(p.blocking for p in problems):
        return None, problems
    return cfg.model_copy(update={"source": source, "labs": labs}), problems


def _base_dir(source: str | None, base_dir: str | Path | None) -> Path | None:
    if base_dir is not None:
        return Path(base_dir)
    return Path(source).resolve().parent if source else None


def parse_config(
    data: Any,
    source: str | None = None,
    base_dir: str | Path | None = None,
    *,
    check_options: bool = True,
) -> ExperimentConfig:
    """Build an :class:`ExperimentConfig` from parsed YAML (a mapping); ``base_dir`` resolves
    relative paths (default: the directory of ``source``). Raises one :class:`ConfigError` with
    every problem; ``check_options=False`` leaves the targets' and detectors' ``options`` to the
    dry run (which reports them beside the problems that need the files)."""
    cfg, problems = _build(data, source, _base_dir(source, base_dir), None, check_options)
    if problems:
        raise ConfigError("", "", source, problems=problems)
    assert cfg is not None
    return cfg


def read_yaml(p: Path) -> tuple[Any, dict[Loc, int]]:
    """A YAML file's data and the line of each key path (:func:`yaml_lines`); one
    :class:`ConfigError` when it is missing, empty or not YAML."""
    if not p.is_file():
        raise ConfigError("", "no such config file", str(p))
    text = p.read_text(encoding="utf-8")
    try:
        data = yaml.safe_load(text)
        lines = yaml_lines(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"line {mark.line + 1}, column {mark.column + 1}: " if mark else ""
        raise ConfigError(
            "", f"{where}invalid YAML ({getattr(exc, 'problem', exc)})", str(p)
        ) from None
    if data is None:
        raise ConfigError("", "the file is empty", str(p))
    return data, lines


def read_config(
    path: str | Path, *, cache_dir: str | Path | None = None
) -> tuple[ExperimentConfig | None, list[ConfigProblem]]:
    """Read a YAML config and return it with every problem found (the config is None when a
    problem prevents building it; option problems do not). Raises :class:`ConfigError` only
    when the file cannot be read as YAML. ``cache_dir`` (``--cache-dir``) replaces the file's
    ``cache_dir`` (an absolute path)."""
    p = Path(path)
    data, lines = read_yaml(p)
    if cache_dir is not None and isinstance(data, dict):
        data = {**data, "cache_dir": str(Path(cache_dir).expanduser().resolve())}
    return _build(data, str(p), _base_dir(str(p), None), lines, True)


def load_config(path: str | Path) -> ExperimentConfig:
    """Read and validate a YAML experiment config (one :class:`ConfigError` with every problem,
    each with its key path and line)."""
    cfg, problems = read_config(path)
    if problems:
        raise ConfigError("", "", str(path), problems=problems)
    assert cfg is not None
    return cfg
