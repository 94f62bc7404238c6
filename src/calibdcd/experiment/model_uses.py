"""The models an experiment config uses: :func:`models_in_config` lists every one
(:class:`~calibdcd.model_refs.ModelUse`, with where it is used), including detector defaults the
config does not spell out; lab models (``lab:`` targets, ``lab:...`` and
``lab-clean-reference:...`` options) and remotely served targets (``backend: openai``) are not
hub models and are left out. :func:`check_models` resolves them all (no download) and raises one
:class:`~calibdcd.model_refs.MissingModelsError` naming every missing one.

It lives in the experiment layer because it reads an experiment config's plan;
:mod:`calibdcd.model_refs` below it only resolves and fetches references.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from calibdcd.experiment.config import ExperimentConfig
from calibdcd.experiment.detector_entries import DETECTORS
from calibdcd.model_refs import (
    LAB_PREFIXES,
    MissingModelError,
    MissingModelsError,
    ModelUse,
    ResolvedModel,
    resolve_model,
)

__all__ = [
    "check_models",
    "hub_dataset_of",
    "models_in_config",
    "models_in_fit_config",
    "models_in_plan",
    "resolve_uses",
]


def hub_dataset_of(entry: Any) -> str | None:
    """The hub dataset repository a benchmark entry is read from (no ``path``, no ``lab``, a
    known benchmark), else None."""
    from calibdcd.data.benchmarks import benchmark_spec

    hub = getattr(entry, "hub", None)  # fit configs' data entries have no hub field
    if hub is not None:
        revision = getattr(entry, "revision", None)
        return hub + (f"@{revision}" if revision else "")
    if entry.path is not None or entry.lab is not None:
        return None
    spec = benchmark_spec(entry.name)
    return None if spec is None else spec.hf_repo


def _get_path(obj: Any, dotted: str) -> tuple[bool, Any]:
    for part in dotted.split("."):
        if isinstance(obj, dict):
            if part not in obj:
                return False, None
            obj = obj[part]
        elif dataclasses.is_dataclass(obj) and hasattr(obj, part):
            obj = getattr(obj, part)
        else:
            return False, None
    return True, obj


def _skip(ref: str) -> bool:
    # (a packaged model is resolved as any other: its package must be installed)
    return not ref or ref.startswith(LAB_PREFIXES)


def _packaged(ref: str) -> bool:
    return ref.startswith("packaged:")


def models_in_config(cfg: ExperimentConfig) -> list[ModelUse]:
    """Every model ``cfg`` uses, with where (:func:`models_in_plan` of its plan)."""
    from calibdcd.experiment.plan import resolve

    return models_in_plan(resolve(cfg))


def models_in_plan(plan: Any) -> list[ModelUse]:
    """Every model a run's plan (:class:`~calibdcd.experiment.plan.RunPlan`) uses, with where:
    ``hf`` targets (not lab ones), the hub datasets of benchmarks named without a path, and the
    model fields of every detector's parameters as the plan resolved them (its preset and
    defaults with the config's options), nothing loaded or built. Lab references and remote
    (``backend: openai``) targets are left out."""
    cfg = plan.config
    uses: list[ModelUse] = []
    for i, t in enumerate(cfg.targets):
        uses += _target_uses(t, f"targets[{i}] ({t.name})")
    for i, b in enumerate(cfg.benchmarks):  # benchmarks read from the hub: their datasets
        repo = hub_dataset_of(b)
        if repo is not None:
            uses.append(ModelUse(f"benchmarks[{i}] ({b.label})", repo, "dataset"))
    for i, d in enumerate(cfg.detectors):
        planned = sorted(
            (p for key, p in plan.detectors.items() if key[0] == d.label),
            key=lambda p: (p.benchmark, p.seed),
        )
        uses += _detector_uses(d, planned, f"detectors[{i}] ({d.label})")
    return uses


def models_in_fit_config(cfg: Any, cache: str | Path | None = None) -> list[ModelUse]:
    """The same for a fit config (:class:`calibdcd.fitted.config.FitConfig`): its target and
    its detector (``target.model``, ``detector.options.<field>``) as a one-setting plan
    resolves it (:func:`~calibdcd.experiment.detector_entries.plan_detector`, seed 0) under the
    command's cache root ``cache`` (default: the config's)."""
    from calibdcd.experiment.config import DetectorEntry
    from calibdcd.experiment.detector_entries import plan_detector
    from calibdcd.experiment.fit_config import target_entry

    d = cfg.detector
    target = target_entry(cfg.target)
    entry = DetectorEntry(name=d.name, preset=d.preset, options=dict(d.options))
    planned = plan_detector(entry, d.benchmark or "", 0, str(cache or cfg.cache_root()))
    return _target_uses(target, "target") + _detector_uses(entry, [planned], "detector")


def _target_uses(t: Any, where: str) -> list[ModelUse]:
    uses = []
    # (a packaged target model: the plan's target check names a missing package)
    if t.backend == "hf" and t.lab is None and not _skip(t.model) and not _packaged(t.model):
        uses.append(ModelUse(f"{where}.model", t.model))
    tokenizer = getattr(t, "tokenizer", None)
    # a hub id: the chat template's source ("server": the served model renders its own)
    if tokenizer is not None and tokenizer != "server" and not _skip(tokenizer):
        uses.append(ModelUse(f"{where}.tokenizer", tokenizer, "tokenizer"))
    return uses


def _detector_uses(entry: Any, planned: Sequence[Any], label: str) -> list[ModelUse]:
    """The model fields of a config entry's planned detectors (one per benchmark and seed):
    each model once per field, a lab reference the entry spells (resolved by the plan when its
    lab is built) left out."""
    spec = DETECTORS.get(entry.name)
    if spec is None or not spec.model_fields:
        return []
    uses: list[ModelUse] = []
    seen: set[tuple[str, str]] = set()
    for p in planned:
        if p.config is None:
            raise ValueError(f"{label}: {p.problem}")
        for field, need in spec.model_fields:
            found, value = _get_path(p.config, field)
            if not found or value is None:
                continue
            spelled, written = _get_path(dict(entry.options), field)
            values = [value] if isinstance(value, str) else list(value)
            as_written = [written] if isinstance(written, str) else list(written or [])
            for k, ref in enumerate(values):
                ref = str(ref)
                where = f"{label}.options.{field}"
                if not isinstance(value, str):
                    where += f"[{k}]"
                mine = str(as_written[k]) if k < len(as_written) else ref
                if _skip(ref) or _skip(mine) or (where, ref) in seen:
                    continue
                seen.add((where, ref))
                uses.append(ModelUse(where, ref, need, default=not spelled))
    return uses


def check_models(
    cfg: ExperimentConfig, uses: Sequence[ModelUse] | None = None
) -> list[tuple[ModelUse, ResolvedModel]]:
    """Resolve every model of ``cfg`` (no download, no weights loaded); raise one
    :class:`MissingModelsError` that names every missing model and where it is used."""
    return resolve_uses(models_in_config(cfg) if uses is None else uses, cfg.source or "CONFIG")


def resolve_uses(uses: Sequence[ModelUse], source: str) -> list[tuple[ModelUse, ResolvedModel]]:
    """Resolve every use (no download); one :class:`MissingModelsError` naming every missing
    one, where it is used and the command that fetches them all (``source``: the config)."""
    ok: list[tuple[ModelUse, ResolvedModel]] = []
    missing: list[tuple[ModelUse, MissingModelError]] = []
    for use in uses:
        try:
            ok.append((use, resolve_model(use.ref, need=use.need)))
        except MissingModelError as e:
            missing.append((use, e))
    if missing:
        raise MissingModelsError(missing, source)
    return ok
