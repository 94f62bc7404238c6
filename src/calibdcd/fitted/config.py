"""The typed config of ``calibdcd fit`` (pydantic: unknown keys rejected, every error at once).

Example (``configs/fit-micro.yaml``)::

    target: {name: chat-qwen, backend: hf, lab: micro, model: chat-qwen,
             options: {device: cpu, dtype: float32}}
    detector: {name: overlap, options: {max_new_tokens: 16}}
    data: {lab: micro, max_members: 100, max_nonmembers: 100}
    split: {heldout_fraction: 0.4, calibration_fraction: 0.3}
    calibdcd: true
    fpr: 0.05
    mode: inductive

``cache_dir`` (optional; relative to the config file): the cache root; without it, the rule of
every command (``$CALIBDCD_CACHE``, else the user cache), so ``score`` run from anywhere finds
``fit``'s generations. ``${VAR}`` is expanded as in run configs.

``data`` is one of: ``lab`` (its ``ground_truth.jsonl``), ``path`` (a labelled file),
``members`` + ``nonmembers`` (lists of texts), or the explicit parts ``supervised`` (labelled) +
``calibration`` + ``heldout`` (+ ``pool``). Every file is read by the one reader of benchmarks
(:func:`calibdcd.data.load_table`, :func:`calibdcd.data.load_texts`): jsonl, json, csv, tsv,
parquet, their ``.gz`` forms, and for lists of texts ``.txt`` (one text per line); the text
column is ``text_field`` (by default the first of ``text``, ``input``, ``snippet`` present, as
for ``score``'s texts), an ``id`` column is kept. Relative paths are relative to the config
file.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from calibdcd.data.assemble import DEFAULT_LABEL_FIELDS, DEFAULT_TEXT_FIELDS

__all__ = ["FitConfig", "parse_target_spec"]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class TargetSection(_Strict):
    name: str = "target"
    backend: str = "hf"
    model: str
    lab: str | None = None
    family: str | None = None
    options: dict[str, Any] = Field(default_factory=dict)
    #: where CalibDCD's boundary views come from for a family without built-in ones (a local
    #: tokenizer directory or hub id with the served model's chat template)
    tokenizer: str | None = None


class DetectorSection(_Strict):
    name: str
    preset: str | None = None
    options: dict[str, Any] = Field(default_factory=dict)
    #: the benchmark name some detectors choose settings by (DPDLLM's L: WikiMIA 64, else 128)
    benchmark: str | None = None


class DataSection(_Strict):
    lab: str | None = None
    path: str | None = None
    #: the text / label column (a name or candidates, the first present wins); by default the
    #: candidates every reader of texts tries (``text``, ``input``, ``snippet``; ``label``,
    #: ``Label``), so fit reads a file as ``score`` and a run's benchmark do
    text_field: str | list[str] = Field(default_factory=lambda: list(DEFAULT_TEXT_FIELDS))
    label_field: str | list[str] = Field(default_factory=lambda: list(DEFAULT_LABEL_FIELDS))
    members: str | None = None
    nonmembers: str | None = None
    supervised: str | None = None
    calibration: str | None = None
    heldout: str | None = None
    pool: str | None = None
    #: seeded subsample of the known members / non-members (None = all)
    max_members: int | None = Field(default=None, ge=1)
    max_nonmembers: int | None = Field(default=None, ge=1)

    @model_validator(mode="after")
    def _one_source(self) -> DataSection:
        sources = {
            "lab": self.lab is not None,
            "path": self.path is not None,
            "members/nonmembers": self.members is not None or self.nonmembers is not None,
            "supervised/calibration/heldout": self.supervised is not None
            or self.heldout is not None,
        }
        given = [k for k, v in sources.items() if v]
        if len(given) != 1:
            raise ValueError(f"give exactly one data source of {', '.join(sources)}; got {given}")
        if given[0] == "members/nonmembers" and not (self.members and self.nonmembers):
            raise ValueError("members and nonmembers go together")
        if given[0].startswith("supervised") and not (self.supervised and self.heldout):
            raise ValueError(
                "explicit parts need supervised and heldout (calibration for CalibDCD)"
            )
        return self


class SplitSection(_Strict):
    heldout_fraction: float = Field(default=0.3, gt=0, lt=1)
    calibration_fraction: float = Field(default=0.3, ge=0, lt=1)
    n_supervised_per_class: int | None = Field(default=None, ge=2)


class FitConfig(_Strict):
    name: str = "fit"
    target: TargetSection
    detector: DetectorSection
    data: DataSection
    split: SplitSection = SplitSection()
    #: CalibDCD: false, true (the paper's settings) or CalibrationConfig fields
    calibdcd: bool | dict[str, Any] = True
    #: where CalibDCD corrects: "raw" (the paper: φ's output), "normalized" (beyond the paper)
    space: Literal["auto", "raw", "normalized"] = "raw"
    fpr: float = Field(default=0.05, gt=0, lt=1)
    mode: Literal["inductive", "transductive"] = "inductive"
    seed: int = 0
    view_system: Literal["official", "none"] = "official"
    #: the cache root (generations, learnt parts, labs); None = the rule of every command:
    #: ``$CALIBDCD_CACHE``, else the user cache (:func:`calibdcd.paths.cache_root`)
    cache_dir: str | None = None
    #: the directory relative paths are read against (the config file's)
    base_dir: str = "."
    #: environment variables whose values are secret whatever their names (as a run config's
    #: ``secrets:``): masked in the bundle and in every message
    secrets: list[str] | None = None

    @field_validator("secrets", mode="before")
    @classmethod
    def _one_name_is_a_list(cls, v: Any) -> Any:
        return [v] if isinstance(v, str) else v

    def cache_root(self) -> Path:
        """The cache root: ``cache_dir`` read against the config's directory, else the shared
        rule (``$CALIBDCD_CACHE``, else the user cache), as ``run`` and ``score`` use."""
        from calibdcd.paths import cache_root

        return cache_root(self.resolve(self.cache_dir) if self.cache_dir else None)

    def resolve(self, rel: str) -> Path:
        p = Path(rel).expanduser()
        return p if p.is_absolute() else Path(self.base_dir) / p

    def calibration_config(self) -> Any:
        from calibdcd.calibration import CalibrationConfig

        if self.calibdcd is False:
            return None
        if self.calibdcd is True:
            return CalibrationConfig()
        return CalibrationConfig(**self.calibdcd)


#: ``--target`` keys that are fields of the target section (the rest are backend options)
TARGET_FIELDS = ("model", "family", "name", "lab", "tokenizer")


def parse_target_spec(spec: str) -> dict[str, Any]:
    """``BACKEND:key=value,key=value`` (``--target``, in the style of lm-eval's
    ``--model_args``) -> a fit config's ``target`` section: ``model``, ``name``, ``family`` and
    ``lab`` are its fields, every other key a backend option; values are read as YAML scalars
    (``concurrency=32`` is a number). E.g. ``openai:base_url=http://127.0.0.1:8000/v1,model=m``.
    """
    import yaml

    backend, sep, rest = spec.partition(":")
    if not sep or not backend or "=" in backend:
        raise ValueError(
            f"--target {spec!r}: expected BACKEND:key=value,... "
            "(e.g. openai:base_url=http://127.0.0.1:8000/v1,model=my-model)"
        )
    out: dict[str, Any] = {"backend": backend, "options": {}}
    for item in filter(None, rest.split(",")):
        key, eq, value = item.partition("=")
        if not eq or not key:
            raise ValueError(f"--target {spec!r}: {item!r} is not key=value")
        parsed = yaml.safe_load(value) if value else ""
        if not isinstance(parsed, (str, int, float, bool)) or parsed is None:
            parsed = value
        if key in TARGET_FIELDS:
            out[key] = str(parsed)
        else:
            out["options"][key] = parsed
    return out
