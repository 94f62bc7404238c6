"""The schema of a setting's ``result.json``: typed, versioned, written and read only here.

``settings/<id>/result.json`` is one :class:`SettingResult` (pydantic). The headline numbers
(``before``/``after`` AUC and TPR with their bootstrap intervals), the identity of the setting
(ids, labels, hashes, seed) and the split sizes are typed fields. The analyses, controls and
paired comparisons are typed by :class:`TypedSettingResult` (every result is checked against it
when written; ``docs/result.schema.json`` is its JSON Schema) and read as mappings (their keys
are the analyses' names, see :mod:`calibdcd.experiment.analyses`), as is the calibration
summary.

``schema_version`` (:data:`RESULT_SCHEMA_VERSION`) is written first. Version history:

* 0 — results written before the field existed. The content is the same as version 1, so they
  are read as they are (their ``schema_version`` reads as 0); no re-run is needed.
* 1 — the field ``schema_version``. Later, within version 1: the optional ``provenance`` (the
  commit, dirty flag, host and start time of the run start that computed the setting,
  :class:`Provenance`); a result without it (every one written before) is valid as it is, and
  an older calibdcd keeps it as an unknown key. It is written only when known and is in no
  hash (``setting_hash``/``inputs_hash`` are computed before it, ``digests.json`` from the
  file as written).

A file whose version is newer than this code's is refused with a message naming the file (a
result of a newer calibdcd). Unknown keys are kept (``extra="allow"``) and written back, so a
result is never silently shortened.

The objects also answer ``result["key"]`` and ``result.get("key")`` like the dicts they replace
(for callers not yet moved to attributes).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from calibdcd.atomic import read_json, write_json

__all__ = [
    "RESULT_SCHEMA_VERSION",
    "Analyses",
    "Estimate",
    "Headline",
    "MethodOutcome",
    "PairedComparison",
    "PairedEstimate",
    "Provenance",
    "ResultError",
    "SettingResult",
    "Sizes",
    "TypedSettingResult",
    "holds_setting",
    "read_result",
    "result_json_schema",
    "write_result",
]

RESULT_SCHEMA_VERSION = 1
#: a setting's result file in its directory (``settings/<id>/``)
RESULT_FILE = "result.json"


class ResultError(ValueError):
    """A ``result.json`` that is not a readable result (the message names the file)."""


class _Record(BaseModel):
    """A typed record that still reads like the dict it replaces."""

    model_config = ConfigDict(extra="allow")

    def __getitem__(self, key: str) -> Any:
        try:
            return getattr(self, key)
        except AttributeError:
            raise KeyError(key) from None

    def get(self, key: str, default: Any = None) -> Any:
        return getattr(self, key, default)

    def __contains__(self, key: str) -> bool:
        return key in type(self).model_fields or key in (self.__pydantic_extra__ or {})


class Estimate(_Record):
    """A point estimate with its bootstrap interval (:class:`calibdcd.metrics.Interval`)."""

    estimate: float
    low: float | None = None
    high: float | None = None
    level: float | None = None
    n_boot: int | None = None


class Headline(_Record):
    auc: Estimate
    tpr: Estimate


class Sizes(_Record):
    """[texts, members] of each part; ``dropped``: texts without a usable feature vector."""

    supervised: list[int]
    calibration: list[int]
    evaluation: list[int]
    dropped: int = 0
    excluded_by_group: int = 0


class MethodOutcome(_Record):
    """One method's outcome on the evaluation pool (a control, a variant, an ablation): its AUC
    and TPR, and for a CalibDCD-like method the selected correction."""

    auc: float | None = None
    tpr: float | None = None
    label: str | None = None
    corrected: bool | None = None
    rank: int | None = None
    strength: float | None = None
    basis_dim: int | None = None
    selected_views: list[str] | None = None
    best_objective: float | None = None
    #: why no correction was applied (CalibDCD-like methods that left the detector unchanged)
    reason: str | None = None
    #: a variant beyond the paper
    beyond_paper: bool | None = None
    #: the space the correction worked in ("raw" = φ's output, "normalized")
    space: str | None = None


class PairedEstimate(_Record):
    """A paired difference A − B on the same texts (:mod:`calibdcd.stats`): the estimate, its
    hierarchical bootstrap interval, the smallest difference the setting resolves
    (``half_width``), a DeLong p-value (AUC only) and ``verdict`` (+1 better, −1 worse, 0:
    the interval holds 0)."""

    metric: str
    estimate: float | None = None
    low: float | None = None
    high: float | None = None
    level: float | None = None
    n_boot: int | None = None
    n_seeds: int | None = None
    per_seed: list[float | None] | None = None
    p_value: float | None = None
    z: float | None = None
    half_width: float | None = None
    verdict: int | None = None


class PairedComparison(_Record):
    auc: PairedEstimate
    tpr: PairedEstimate


class FpRecoveryPool(_Record):
    threshold_before: float | None = None
    threshold_after: float | None = None
    fp_before: int
    fp_after: int
    recovered: int
    new_fp: int
    tp_before: int
    tp_after: int
    members_lost: int
    members_gained: int


class FpRecoveryAffected(_Record):
    view: str | None = None
    cases: int = 0
    recovered: int = 0
    rate: float | None = None


class FpRecovery(_Record):
    fpr: float
    pool: FpRecoveryPool
    affected: FpRecoveryAffected


class FixedOutcome(MethodOutcome):
    #: the (r, λ) applied whatever its objective
    config: dict[str, float] | None = None


class Analyses(_Record):
    """The analyses of a setting (each absent when turned off in the config)."""

    ablations: dict[str, MethodOutcome | None] | None = None
    fixed: FixedOutcome | None = None
    fp_recovery: FpRecovery | None = None
    space: MethodOutcome | None = None


class Provenance(_Record):
    """Which code on which machine computed a setting (:func:`calibdcd.provenance.
    setting_provenance`): the git commit and dirty flag, the host and the run start's time
    (None where unknown). A resumed run's settings can carry different ones."""

    commit: str | None = None
    dirty: bool | None = None
    host: str | None = None
    started: str | None = None


class SettingResult(_Record):
    """One setting's result (``settings/<id>/result.json``)."""

    schema_version: int = RESULT_SCHEMA_VERSION
    id: str
    setting_hash: str
    inputs_hash: str
    benchmark: str
    benchmark_name: str | None = None
    target: str
    target_family: str | None = None
    post_trained: bool = True
    base: str | None = None
    detector: str
    detector_name: str | None = None
    seed: int
    protocol: str | None = None
    sizes: Sizes
    feature_dim: int | None = None
    block_dim: int | None = None
    space: str | None = None
    fpr: float = 0.05
    before: Headline
    after: Headline
    calibration: dict[str, Any] = Field(default_factory=dict)
    analyses: dict[str, Any] = Field(default_factory=dict)
    controls: dict[str, Any] = Field(default_factory=dict)
    paired: dict[str, Any] = Field(default_factory=dict)
    views: dict[str, str] = Field(default_factory=dict)
    timings: dict[str, Any] = Field(default_factory=dict)
    feature_extractions: Any = None
    warnings: list[str] = Field(default_factory=list)
    generation: Any = None
    skipped: bool = False
    #: the commit, dirty flag and host that computed this setting; None (and not written) for a
    #: result written before calibdcd recorded it, or computed outside a run
    provenance: Provenance | None = None
    #: the evaluation pool's labels and per-method scores (from ``scores.csv``), attached by the
    #: report when it reads a run; never written
    pool: Any = Field(default=None, exclude=True)

    def to_json(self) -> dict[str, Any]:
        """The mapping ``result.json`` holds (floats as they are: NaN stays NaN). An unknown
        ``provenance`` is left out, so a result written before it existed reads back and is
        written back with the keys it had."""
        drop = {"pool"} if self.provenance is not None else {"pool", "provenance"}
        return self.model_dump(exclude=drop)


class TypedSettingResult(SettingResult):
    """:class:`SettingResult` with its ``analyses``, ``controls`` and ``paired`` sections typed:
    what :func:`result_json_schema` exports and :func:`write_result` checks every result
    against. (:class:`SettingResult` keeps them as mappings for the code that reads them.)"""

    analyses: Analyses = Field(default_factory=Analyses)  # type: ignore[assignment]
    controls: dict[str, MethodOutcome | None] = Field(default_factory=dict)  # type: ignore[assignment]
    paired: dict[str, PairedComparison] = Field(default_factory=dict)  # type: ignore[assignment]


def result_json_schema() -> dict[str, Any]:
    """The JSON Schema of ``result.json`` (``calibdcd schema result``; the file
    ``docs/result.schema.json`` is this, tested to be current)."""
    schema = TypedSettingResult.model_json_schema(mode="serialization")
    schema["title"] = "calibdcd setting result (settings/<id>/result.json)"
    schema["$comment"] = f"schema_version {RESULT_SCHEMA_VERSION}"
    return schema


def parse_result(data: Any, source: str = "result") -> SettingResult:
    """A result from its JSON mapping (``schema_version`` absent: version 0)."""
    if not isinstance(data, dict):
        raise ResultError(f"{source}: not a result (expected a mapping)")
    version = data.get("schema_version", 0)
    if not isinstance(version, int) or version > RESULT_SCHEMA_VERSION:
        raise ResultError(
            f"{source}: result schema version {version!r} is newer than this calibdcd's "
            f"({RESULT_SCHEMA_VERSION}); read it with a newer calibdcd or re-run the setting"
        )
    try:
        return SettingResult.model_validate({**data, "schema_version": version})
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"])
        raise ResultError(f"{source}: not a valid result ({where}: {first['msg']})") from None


def read_result(path: str | Path) -> SettingResult:
    """Read ``result.json``; :class:`ResultError` (naming the file) when it is not one."""
    try:
        data = read_json(Path(path))
    except ValueError as exc:
        raise ResultError(str(exc)) from None
    return parse_result(data, str(path))


def holds_setting(path: str | Path, setting_hash: str) -> bool:
    """Whether ``path`` is a readable ``result.json`` of the setting of ``setting_hash`` (False
    for a missing or damaged file, or another setting's). Whether that result is current for
    the run's inputs is decided when the setting runs (its inputs hash and digests)."""
    try:
        return read_result(path).setting_hash == setting_hash
    except (OSError, ValueError):
        return False


def write_result(path: str | Path, result: SettingResult) -> None:
    """Write ``result.json`` atomically, after checking it against the typed schema (a result
    the schema does not describe is a bug here, not a file to write)."""
    data = result.to_json()
    try:
        TypedSettingResult.model_validate(data)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"])
        raise ResultError(
            f"{path}: result does not fit its schema ({where}: {first['msg']})"
        ) from None
    write_json(Path(path), data)
