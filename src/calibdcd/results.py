"""The schema of a setting's ``result.json``: typed, versioned, written and read only here.

``settings/<id>/result.json`` is one :class:`SettingResult` (pydantic). The headline numbers
(``before``/``after`` AUC and TPR with their bootstrap intervals), the identity of the setting
(ids, labels, hashes, seed) and the split sizes are typed fields; the analyses, controls and
paired comparisons stay mappings (their keys are the analyses' names, see
:mod:`calibdcd.experiment.analyses`), as does the calibration summary.

``schema_version`` (:data:`RESULT_SCHEMA_VERSION`) is written first. Version history:

* 0 — results written before the field existed. The content is the same as version 1, so they
  are read as they are (their ``schema_version`` reads as 0); no re-run is needed.
* 1 — the field ``schema_version``.

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
    "Estimate",
    "Headline",
    "ResultError",
    "SettingResult",
    "Sizes",
    "read_result",
    "write_result",
]

RESULT_SCHEMA_VERSION = 1


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
    #: the evaluation pool's labels and per-method scores (from ``scores.csv``), attached by the
    #: report when it reads a run; never written
    pool: Any = Field(default=None, exclude=True)

    def to_json(self) -> dict[str, Any]:
        """The mapping ``result.json`` holds (floats as they are: NaN stays NaN)."""
        return self.model_dump(exclude={"pool"})


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


def write_result(path: str | Path, result: SettingResult) -> None:
    """Write ``result.json`` atomically."""
    write_json(Path(path), result.to_json())
