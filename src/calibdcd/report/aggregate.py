"""Cross-setting aggregation of a run's results: the numbers behind the paper's tables/figures.

All functions take the list of per-setting results (``settings/<id>/result.json``, typed by
:mod:`calibdcd.results`) and
return plain Python structures. Metrics are fractions in [0, 1]; tables print percentages.
Several seeds of one (benchmark, target, detector) cell are averaged where a table has one cell
per setting.

Seeds are an axis: main cells carry the mean and the spread (SD) over seeds of every method
(original, + CalibDCD, the controls, the blind baseline), and :func:`paired_cells` pools the
seeds' per-text pool scores (``scores.csv``, attached by :func:`load_results` as ``pool``) into
the hierarchical paired bootstrap of :mod:`calibdcd.stats` for every comparison of
:data:`COMPARISONS`.
"""

from __future__ import annotations

import csv
import warnings
from collections import Counter, defaultdict
from collections.abc import Callable, Hashable, Iterable
from pathlib import Path
from typing import Any

import numpy as np

from calibdcd.results import SettingResult, read_result

__all__ = [
    "ABLATIONS",
    "COMPARISONS",
    "METHODS",
    "PAPER_SELECTIONS",
    "ablation_summary",
    "adaptive_vs_fixed",
    "base_vs_post",
    "calibdcd_method",
    "consensus_diagnostics",
    "fp_recovery_summary",
    "grid_ids",
    "load_results",
    "main_cells",
    "noise_interval",
    "paired_cell_settings",
    "paired_cells",
    "paired_cells_by_build",
    "score_only",
    "selection_distribution",
    "space_comparison",
    "stale_settings",
    "variant_pairs",
]

#: (key in result.analyses["ablations"], display name), in the paper's order
ABLATIONS = (
    ("random3", "Random-3 Views"),
    ("top1", "Top-1 View"),
    ("no_consensus", "No Cross-View Consensus"),
    ("binary", "Binary Positive Weight"),
)


#: method -> (scores.csv column, display suffix after the detector's name; None = own row
#: label). ``noise_floor`` is the bootstrap-retrain floor (a result whose noise floor has no
#: ``method``, written before the half-sample floor existed, is one); ``noise_interval`` the
#: half-sample floor: an interval around the detector, no column (:func:`noise_interval`)
METHODS = {
    "original": ("score_before", ""),
    "calibdcd": ("score_after", " + CalibDCD"),
    "placebo": ("score_placebo", " + placebo (random basis)"),
    "noise_floor": ("score_noise_floor", " noise floor (bootstrap retrain)"),
    "noise_interval": (None, " noise floor (half-sample interval)"),
    "centred": ("score_centred", " + centred CalibDCD (beyond the paper)"),
    "abstain": ("score_abstain", " + abstaining CalibDCD (beyond the paper)"),
    "normalized": ("score_normalized", " + CalibDCD, normalised space (beyond the paper)"),
    "blind": ("score_blind", None),
}

#: (key, label with {d} = detector, method A, method B): the report's paired comparisons, A − B
COMPARISONS = (
    ("calibdcd", "{d} + CalibDCD vs {d}", "calibdcd", "original"),
    ("placebo", "{d} + placebo vs {d}", "placebo", "original"),
    ("noise_floor", "{d} noise floor vs {d}", "noise_floor", "original"),
    ("centred", "{d} + centred CalibDCD (beyond the paper) vs {d}", "centred", "original"),
    ("abstain", "{d} + abstaining CalibDCD (beyond the paper) vs {d}", "abstain", "original"),
    (
        "normalized",
        "{d} + CalibDCD, normalised space (beyond the paper) vs {d}",
        "normalized",
        "original",
    ),
    ("calibdcd_vs_placebo", "{d} + CalibDCD vs {d} + placebo", "calibdcd", "placebo"),
    ("vs_blind", "{d} vs blind baseline", "original", "blind"),
)


def read_pool(path: Path) -> dict[str, np.ndarray] | None:
    """The evaluation pool's labels and per-method scores of one setting (None when absent)."""
    if not path.is_file():
        return None
    with path.open(newline="", encoding="utf-8") as fh:
        rows = [r for r in csv.DictReader(fh) if r.get("in_pool") == "1"]
    if not rows:
        return None
    out = {
        "label": np.array([int(r["label"]) for r in rows]),
        "id": np.array([r["id"] for r in rows]),
    }
    for method, (col, _) in METHODS.items():
        if col is not None and col in rows[0]:
            out[method] = np.array([float(r[col]) for r in rows])
    return out


def _method_value(r: dict[str, Any], method: str, metric: str) -> float | None:
    if method == "original":
        return getattr(r.before, metric).estimate
    if method == "calibdcd":
        return getattr(r.after, metric).estimate
    c = r.controls.get(method)
    if method == "noise_floor" and c is not None and c.get("method", "bootstrap") != "bootstrap":
        return None  # the half-sample floor: an interval, read by noise_interval
    return None if c is None else c.get(metric)


def noise_interval(rs: list[SettingResult], metric: str) -> dict[str, Any] | None:
    """The half-sample noise floor of a cell's settings (those that have one): ``mean`` = the
    detector's seed mean of ``metric``, ``low``/``high`` = that mean ∓ the settings' root mean
    square half-width (each setting's interval is its detector ± z·SD at the training set's
    size, :func:`calibdcd.experiment.analyses.half_sample_floor`), ``sd`` None (no spread over
    seeds is shown: the interval is the spread), ``n`` settings, ``shift`` = the mean shift of
    the halves (the learning curve from n/2 to n). None when no setting has one."""
    fl = [
        c for r in rs if (c := r.controls.get("noise_floor")) and c.get("method") == "half_sample"
    ]
    if not fl:
        return None
    centre = float(np.mean([c[metric] for c in fl]))
    hw = float(
        np.sqrt(np.mean([((c[f"{metric}_high"] - c[f"{metric}_low"]) / 2) ** 2 for c in fl]))
    )
    shift = float(np.mean([c[f"{metric}_shift"] for c in fl]))
    return {"mean": centre, "sd": None, "n": len(fl), "low": centre - hw, "high": centre + hw,
            "shift": shift}  # fmt: skip


def load_results(run_dir: str | Path) -> list[SettingResult]:
    """The completed settings of a run directory's grid (``grid.json``), in grid order; each with
    its pool's per-text scores as ``pool`` (from ``scores.csv``; None if absent). Each is a typed
    :class:`~calibdcd.results.SettingResult` (results without a schema version
    are read as version 0, the same content).

    Which results are read is what :func:`calibdcd.run_results.grid_status` counts as done,
    the check a resume and a merge make: a result edited after the run wrote it is an
    error naming it (its ``digests.json`` no longer vouches for it), and one of another config
    (its setting hash is not the grid's: "outdated", recomputed by the next run) is left out
    with a warning naming it. Settings in ``settings/`` that are not in the grid (left by an
    earlier config) are not read: :func:`stale_settings` lists them. A run directory without
    ``grid.json`` (older runs) reads every setting. A ``result.json`` that cannot be parsed is
    skipped with a warning naming it."""
    from calibdcd.run_results import grid_status

    run = Path(run_dir)
    if not run.is_dir():
        raise FileNotFoundError(f"{run}: no such run directory")
    progress = grid_status(run)
    if progress.outdated:
        warnings.warn(
            f"{run}: {len(progress.outdated)} outdated result(s) left out (of another config; "
            f"the next run recomputes them): {', '.join(progress.outdated[:5])}"
            + (" ..." if len(progress.outdated) > 5 else ""),
            stacklevel=2,
        )
    if not progress.done:
        raise ValueError(f"{run}: no completed setting of its grid (settings/*/result.json)")
    out = []
    for i in progress.done:
        path = run / "settings" / i / "result.json"
        try:
            r = read_result(path)
        except (OSError, ValueError) as exc:
            warnings.warn(f"{path}: unreadable result skipped ({exc})", stacklevel=2)
            continue
        r.pool = read_pool(path.parent / "scores.csv")
        if score_only(r.detector_name):
            # its classifier learns nothing: a noise floor a run stored before runs left it out
            # retrained nothing and measured nothing (a zero-width interval), so none is shown
            r.controls.pop("noise_floor", None)
            r.paired.pop("noise_floor_vs_original", None)  # a bootstrap floor's (unread today)
            if r.pool is not None:
                r.pool.pop("noise_floor", None)
        out.append(r)
    if not out:
        raise ValueError(f"{run}: no readable result (settings/*/result.json)")
    return out


def score_only(detector_name: str | None) -> bool:
    """Whether the registered detector ``detector_name`` is score-only (False when it is not
    registered here)."""
    from calibdcd.detectors.registry import registered_detectors

    reg = registered_detectors().get(detector_name or "")
    return reg is not None and reg.score_only


def grid_ids(run_dir: str | Path) -> list[str] | None:
    """The setting ids of the run's grid (``grid.json``), None when the file is absent."""
    from calibdcd.run_results import grid_entries

    grid = grid_entries(run_dir)
    return None if grid is None else [sid for sid, _ in grid]


def stale_settings(run_dir: str | Path) -> list[str]:
    """Settings in the run directory that are not in its grid (moved aside to
    ``settings/.stale/`` by the runner, or left in ``settings/``): never part of the report."""
    run = Path(run_dir)
    ids = grid_ids(run)
    settings = run / "settings"
    if ids is None or not settings.is_dir():
        return []
    here = {d.name for d in settings.iterdir() if d.is_dir() and not d.name.startswith(".")}
    aside = settings / ".stale"
    moved = {d.name for d in aside.iterdir() if d.is_dir()} if aside.is_dir() else set()
    return sorted((here | moved) - set(ids))


def post_trained(results: list[SettingResult]) -> list[dict[str, Any]]:
    """The settings on post-trained targets (the paper's tables and analyses are over these);
    all settings when the run has none (e.g. a base-model-only run)."""
    keep = [r for r in results if r.post_trained]
    return keep or results


def main_targets(results: list[SettingResult]) -> set[str]:
    """The targets of the main and paired tables: every post-trained target, and every base
    model that is no post-trained target's ``base`` in the run (a base model run on its own,
    e.g. as a control, has no base-vs-post-trained row to appear in). All targets when the run
    has no post-trained one."""
    bases = {r.base for r in results if r.post_trained and r.base}
    return {r.target for r in results if r.post_trained or r.target not in bases}


def _mean(xs: Iterable[float]) -> float:
    xs = [x for x in xs if x is not None]
    return float(np.mean(xs)) if xs else float("nan")


def _spread(xs: list[float]) -> float | None:
    return float(np.std(xs, ddof=1)) if len(xs) > 1 else None


def main_cells(results: list[SettingResult]) -> dict[str, Any]:
    """``{(detector, benchmark, target): {auc_before, auc_after, tpr_before, tpr_after, n,
    methods}}`` over the :func:`main_targets` (seed means; ``methods[m][metric]`` = {mean, sd,
    n} over seeds for every method of :data:`METHODS` present) plus the ordered benchmark /
    target / detector labels."""
    shown = main_targets(results)
    keep = [r for r in results if r.target in shown]
    cells: dict[tuple[str, str, str], list[SettingResult]] = defaultdict(list)
    for r in keep:
        cells[(r.detector, r.benchmark, r.target)].append(r)
    out = {}
    for k, rs in cells.items():
        out[k] = {
            "auc_before": _mean(r.before.auc.estimate for r in rs),
            "auc_after": _mean(r.after.auc.estimate for r in rs),
            "tpr_before": _mean(r.before.tpr.estimate for r in rs),
            "tpr_after": _mean(r.after.tpr.estimate for r in rs),
            "n": len(rs),
            "methods": {},
        }
        for method in METHODS:
            for metric in ("auc", "tpr"):
                if method == "noise_interval":
                    if (iv := noise_interval(rs, metric)) is not None:
                        out[k]["methods"].setdefault(method, {})[metric] = iv
                    continue
                xs = [_method_value(r, method, metric) for r in rs]
                xs = [x for x in xs if x is not None]
                if xs:
                    out[k]["methods"].setdefault(method, {})[metric] = {
                        "mean": float(np.mean(xs)), "sd": _spread(xs), "n": len(xs),
                    }  # fmt: skip
    return {
        "cells": out,
        "detectors": list(dict.fromkeys(r.detector for r in keep)),
        "benchmarks": list(dict.fromkeys(r.benchmark for r in keep)),
        "targets": list(dict.fromkeys(r.target for r in keep)),
    }


def _boot_settings(r: SettingResult, n_boot: int | None, level: float | None) -> tuple[int, float]:
    """The paired bootstrap's replicates and level: as given, else the run's
    ``evaluation.n_boot`` (read from ``r``) but at least :data:`~calibdcd.stats.MIN_PAIRED_BOOT`
    (the tables' marks rest on these intervals, and the vectorised bootstrap is cheap), and the
    run's ``evaluation.level``."""
    from calibdcd.stats import MIN_PAIRED_BOOT

    ev = r.before.auc
    nb = n_boot if n_boot is not None else max(ev.n_boot or 0, MIN_PAIRED_BOOT)
    return nb, level if level is not None else (ev.level or 0.95)


def paired_cell_settings(
    results: list[SettingResult],
) -> dict[tuple[str, str, str], list[SettingResult]]:
    """``{(detector, benchmark, target): settings}``: the settings whose per-text scores
    :func:`paired_cells` pools for each cell, in its pool order (by seed, stable), over the
    :func:`main_targets`."""
    shown = main_targets(results)
    cells: dict[tuple[str, str, str], list[SettingResult]] = defaultdict(list)
    for r in results:
        if r.target in shown and r.pool is not None:
            cells[(r.detector, r.benchmark, r.target)].append(r)
    return {k: sorted(rs, key=lambda r: r.seed) for k, rs in cells.items()}


def paired_cells(
    results: list[SettingResult],
    *,
    n_boot: int | None = None,
    level: float | None = None,
    seed: int = 0,
) -> dict[tuple[str, str, str], dict[str, dict[str, Any]]]:
    """``{(detector, benchmark, target): {comparison: {"auc": PairedDelta, "tpr": ...}}}`` over
    the cell's seeds (hierarchical paired bootstrap + combined DeLong p, :func:`stats.compare`),
    for every comparison of :data:`COMPARISONS` whose two methods have per-text scores in every
    seed. ``n_boot`` defaults to the run's ``evaluation.n_boot`` but at least
    :data:`~calibdcd.stats.MIN_PAIRED_BOOT` (the marks of the tables rest on these intervals, and
    the vectorised bootstrap is cheap); ``level`` to the run's ``evaluation.level``. Over the
    :func:`main_targets`."""
    from calibdcd.stats import compare

    out: dict[tuple[str, str, str], dict[str, dict[str, Any]]] = {}
    for k, rs in paired_cell_settings(results).items():
        nb, lv = _boot_settings(rs[0], n_boot, level)
        fpr = rs[0].fpr
        res: dict[str, dict[str, Any]] = {}
        for key, _, a, b in COMPARISONS:
            if not all(a in r.pool and b in r.pool for r in rs):
                continue
            pools = [(r.pool["label"], r.pool[a], r.pool[b]) for r in rs]
            res[key] = compare(pools, fpr=fpr, n_boot=nb, level=lv, seed=seed)
        out[k] = res
    return out


def variant_pairs(
    results: list[SettingResult],
    *,
    n_boot: int | None = None,
    level: float | None = None,
    seed: int = 0,
) -> dict[tuple[str, str, str, str], dict[str, Any]]:
    """``{(a, b, benchmark, target): {"auc": PairedDelta, "tpr": ..., "detector": family,
    "n_texts": joined texts over the seeds}}``: every two variants of one detector (the same
    ``detector_name`` under two labels, e.g. VeilProbe's ``cpu`` preset and a stronger one) run
    on one benchmark and target, compared uncalibrated, A − B with A the later in ``results``'
    order (a run's grid order: the config's detector order; alphabetical by label for an older
    run without ``grid.json``), on the texts both scored in each split seed both ran (joined by
    text id), pooled over those seeds as :func:`paired_cells` pools its comparisons; seeds
    whose joined texts hold one class are left out. Every target (a variant's question is
    whether it reads more, on the base model too). Bootstrap defaults as :func:`paired_cells`."""
    from calibdcd.stats import compare

    cells: dict[tuple[str, str, str], dict[str, dict[int, SettingResult]]] = defaultdict(dict)
    for r in results:
        if r.detector_name is None or r.pool is None or not {"id", "original"} <= set(r.pool):
            continue
        family = cells[(r.detector_name, r.benchmark, r.target)].setdefault(r.detector, {})
        if r.seed in family:
            raise ValueError(
                f"{r.detector} on {r.benchmark}/{r.target}: two settings of seed {r.seed}"
            )
        family[r.seed] = r
    out: dict[tuple[str, str, str, str], dict[str, Any]] = {}
    for (name, bench, tgt), variants in cells.items():
        labels = list(variants)
        for i, b in enumerate(labels):
            for a in labels[i + 1 :]:
                seeds = sorted(set(variants[a]) & set(variants[b]))
                pools = []
                for s in seeds:
                    pa, pb = variants[a][s].pool, variants[b][s].pool
                    _, ia, ib = np.intersect1d(pa["id"], pb["id"], return_indices=True)
                    if not np.array_equal(pa["label"][ia], pb["label"][ib]):
                        raise ValueError(
                            f"{a} and {b} on {bench}/{tgt}, seed {s}: one text id with two "
                            "labels (the settings did not read the same benchmark)"
                        )
                    if len(set(pa["label"][ia].tolist())) == 2:
                        pools.append((pa["label"][ia], pa["original"][ia], pb["original"][ib]))
                if not pools:
                    continue
                first = variants[a][seeds[0]]
                nb, lv = _boot_settings(first, n_boot, level)
                res: dict[str, Any] = dict(
                    compare(pools, fpr=first.fpr, n_boot=nb, level=lv, seed=seed)
                )
                res["detector"] = name
                res["n_texts"] = int(sum(len(p[0]) for p in pools))
                out[(a, b, bench, tgt)] = res
    return out


def paired_cells_by_build(
    results: list[SettingResult],
    build: Callable[[SettingResult], Hashable],
    *,
    n_boot: int | None = None,
    level: float | None = None,
    seed: int = 0,
) -> dict[tuple[str, str, str], dict[str, dict[str, Any]]]:
    """:func:`paired_cells` with the lab build as the top level (builds → split seeds → texts):
    ``{(detector, benchmark, target): {comparison: {"auc": BuildDelta, "tpr": ...}}}`` from
    :func:`calibdcd.stats.compare_builds`, each build's pools being the cell's settings for which
    ``build(setting)`` is that build (builds in their first appearance's order, pools by seed),
    for the cells with at least two builds. Same bootstrap defaults as :func:`paired_cells`.

    No run directory holds two builds of one cell (a cell is one benchmark x target, and each
    names one lab), so a run's report never calls this; ``benchmarks/lab_pooled.py`` does, over
    the settings of several runs, one lab build each."""
    from calibdcd.stats import compare_builds

    out: dict[tuple[str, str, str], dict[str, dict[str, Any]]] = {}
    for k, rs in paired_cell_settings(results).items():
        groups: dict[Hashable, list[SettingResult]] = defaultdict(list)
        for r in rs:
            groups[build(r)].append(r)
        if len(groups) < 2:
            continue
        nb, lv = _boot_settings(rs[0], n_boot, level)
        res: dict[str, dict[str, Any]] = {}
        for key, _, a, b in COMPARISONS:
            if not all(a in r.pool and b in r.pool for r in rs):
                continue
            builds = [[(r.pool["label"], r.pool[a], r.pool[b]) for r in g] for g in groups.values()]
            res[key] = compare_builds(builds, fpr=rs[0].fpr, n_boot=nb, level=lv, seed=seed)
        out[k] = res
    return out


def ablation_summary(results: list[SettingResult]) -> list[dict[str, Any]]:
    """Rows of the ablation table: complete method, each variant (mean AUC/TPR, mean change from
    the complete method on the same settings, settings where the complete method is better),
    then the λ<1 subset against fixed full correction."""
    rs = [r for r in post_trained(results) if r.analyses.get("ablations")]
    rows: list[dict[str, Any]] = []
    if not rs:
        return rows

    def row(name: str, subset: list[dict[str, Any]], key: str | None) -> dict[str, Any]:
        full_auc = [r.after.auc.estimate for r in subset]
        full_tpr = [r.after.tpr.estimate for r in subset]
        if key is None:
            return {"name": name, "key": "complete", "n": len(subset), "auc": _mean(full_auc),
                    "tpr": _mean(full_tpr), "d_auc": None, "d_tpr": None,
                    "wins_auc": None, "wins_tpr": None}  # fmt: skip
        a = [r.analyses["ablations"][key]["auc"] for r in subset]
        t = [r.analyses["ablations"][key]["tpr"] for r in subset]
        return {
            "name": name,
            "key": key,
            "n": len(subset),
            "auc": _mean(a),
            "tpr": _mean(t),
            "d_auc": _mean(np.subtract(a, full_auc)),
            "d_tpr": _mean(np.subtract(t, full_tpr)),
            "wins_auc": int(np.sum(np.array(full_auc) > np.array(a))),
            "wins_tpr": int(np.sum(np.array(full_tpr) > np.array(t))),
        }

    rows.append(row("CalibDCD", rs, None))
    for key, name in ABLATIONS:
        sub = [r for r in rs if r.analyses["ablations"].get(key)]
        if sub:
            rows.append(row(name, sub, key))
    partial = [r for r in rs if r.analyses["ablations"].get("fixed_full")]
    if partial:
        head = row("CalibDCD (λ<1)", partial, None)
        head["key"] = "complete_partial"
        rows.append(head)
        rows.append(row("Fixed Full Correction", partial, "fixed_full"))
    return rows


def adaptive_vs_fixed(results: list[SettingResult]) -> dict[str, Any]:
    """Per setting and per detector: adaptive (selected r, λ) vs the fixed configuration."""
    rs = [r for r in post_trained(results) if r.analyses.get("fixed")]
    per = [
        {
            "id": r.id,
            "detector": r.detector,
            "benchmark": r.benchmark,
            "target": r.target,
            "auc_adaptive": r.after.auc.estimate,
            "auc_fixed": r.analyses["fixed"]["auc"],
            "tpr_adaptive": r.after.tpr.estimate,
            "tpr_fixed": r.analyses["fixed"]["tpr"],
            "auc_original": r.before.auc.estimate,
            "tpr_original": r.before.tpr.estimate,
        }
        for r in rs
    ]
    by_det: dict[str, dict[str, float]] = {}
    for det in dict.fromkeys(p["detector"] for p in per):
        sub = [p for p in per if p["detector"] == det]
        by_det[det] = {
            k: _mean(p[k] for p in sub)
            for k in (
                "auc_original",
                "auc_fixed",
                "auc_adaptive",
                "tpr_original",
                "tpr_fixed",
                "tpr_adaptive",
            )
        }
        by_det[det]["n"] = len(sub)
    fixed = rs[0].analyses["fixed"].get("config") if rs else None
    return {"settings": per, "by_detector": by_det, "fixed": fixed}


def fp_recovery_summary(results: list[SettingResult]) -> dict[str, Any]:
    """The paper's affected-false-positive recovery, overall and by benchmark and detector, plus
    the pool-level decision changes at the same FPR."""
    rs = [r for r in post_trained(results) if r.analyses.get("fp_recovery")]

    def agg(sub: list[dict[str, Any]]) -> dict[str, Any]:
        cases = sum(r.analyses["fp_recovery"]["affected"]["cases"] for r in sub)
        rec = sum(r.analyses["fp_recovery"]["affected"]["recovered"] for r in sub)
        pool = Counter()
        for r in sub:
            pool.update(
                {k: v for k, v in r.analyses["fp_recovery"]["pool"].items() if isinstance(v, int)}
            )
        return {"settings": len(sub), "cases": cases, "recovered": rec,
                "rate": rec / cases if cases else None, "pool": dict(pool)}  # fmt: skip

    return {
        "overall": agg(rs),
        "by_benchmark": {
            b: agg([r for r in rs if r.benchmark == b])
            for b in dict.fromkeys(r.benchmark for r in rs)
        },
        "by_detector": {
            d: agg([r for r in rs if r.detector == d])
            for d in dict.fromkeys(r.detector for r in rs)
        },
    }


def _slot(code: str) -> str:
    """Universal views keep their code (U1..U8); family boundary views map to slots B1/B2."""
    if code.startswith("U"):
        return code
    return f"B{code[-1]}" if code[-1:].isdigit() else code


def selection_distribution(results: list[SettingResult]) -> dict[str, Any]:
    """View-selection counts over all top-k positions (by code and by slot: the model-specific
    views of different families share slots B1/B2), the joint (r, λ) counts, and how often no
    correction was selected."""
    by_code: Counter[str] = Counter()
    by_slot: Counter[str] = Counter()
    joint: Counter[tuple[int, float]] = Counter()
    none = 0
    settings_with_specific = 0
    results = post_trained(results)
    for r in results:
        views = r.calibration["selected_views"]
        by_code.update(views)
        by_slot.update(_slot(v) for v in views)
        if any(not v.startswith("U") for v in views):
            settings_with_specific += 1
        c = r.calibration
        if c["rank"] is None:
            none += 1
        else:
            joint[(int(c["rank"]), float(c["strength"]))] += 1
    ranks = (
        sorted({k[0] for k in joint} | set(results[0].calibration["config"]["ranks"]))
        if results
        else []
    )
    strengths = (
        sorted({k[1] for k in joint} | set(results[0].calibration["config"]["strengths"]))
        if results
        else []
    )
    return {
        "by_code": dict(by_code.most_common()),
        "by_slot": dict(sorted(by_slot.items())),
        "joint": {f"{r}/{s:g}": n for (r, s), n in sorted(joint.items())},
        "ranks": ranks,
        "strengths": strengths,
        "matrix": [[joint.get((r, s), 0) for s in strengths] for r in ranks],
        "no_correction": none,
        "positions": sum(by_code.values()),
        "settings_with_model_specific": settings_with_specific,
        "partial": sum(n for (_, s), n in joint.items() if s < 1.0),
    }


def base_vs_post(results: list[SettingResult]) -> list[dict[str, Any]]:
    """For every post-trained target with a ``base`` in the run: the detector on the base model,
    on the post-trained model, and on the post-trained model with CalibDCD (seed means)."""
    index: dict[tuple[str, str, str], list[SettingResult]] = defaultdict(list)
    for r in results:
        index[(r.benchmark, r.detector, r.target)].append(r)
    rows = []
    for (bench, det, tgt), rs in index.items():
        base = rs[0].base
        if not base or (bench, det, base) not in index:
            continue
        bs = index[(bench, det, base)]
        rows.append(
            {
                "benchmark": bench,
                "detector": det,
                "target": tgt,
                "base": base,
                "auc_base": _mean(r.before.auc.estimate for r in bs),
                "tpr_base": _mean(r.before.tpr.estimate for r in bs),
                "auc_post": _mean(r.before.auc.estimate for r in rs),
                "tpr_post": _mean(r.before.tpr.estimate for r in rs),
                "auc_post_calibrated": _mean(r.after.auc.estimate for r in rs),
                "tpr_post_calibrated": _mean(r.after.tpr.estimate for r in rs),
                "auc_base_calibrated": _mean(r.after.auc.estimate for r in bs),
                "tpr_base_calibrated": _mean(r.after.tpr.estimate for r in bs),
            }
        )
    return rows


def space_comparison(results: list[SettingResult]) -> list[dict[str, Any]]:
    """Per setting: the complete method in the calibration space the run used and in the other
    one (``analyses.space``), with the original detector for reference."""
    out = []
    for r in results:
        alt = r.analyses.get("space")
        if not alt:
            continue
        c = r.calibration
        out.append(
            {
                "id": r.id,
                "detector": r.detector,
                "target": r.target,
                "auc_original": r.before.auc.estimate,
                "space": r.space,
                "auc": r.after.auc.estimate,
                "choice": None if c["rank"] is None else (c["rank"], c["strength"]),
                "other_space": alt["space"],
                "auc_other": alt["auc"],
                "choice_other": None if alt["rank"] is None else (alt["rank"], alt["strength"]),
            }
        )
    return out


# --------------------------------------------------------------------------------------------
# Which CalibDCD a run ran, and why it changed nothing where it did
# --------------------------------------------------------------------------------------------

#: the paper's selected (r, λ) of its 24 settings (Appendix "Selected calibration
#: configurations": 12 VeilProbe and 12 DPDLLM, four benchmarks x three post-trained models)
PAPER_SELECTIONS: tuple[tuple[int, float], ...] = (
    *((4, 1.0), (3, 0.7), (6, 0.9), (3, 0.9), (4, 0.9), (3, 0.7)),
    *((5, 0.8), (4, 0.9), (6, 0.8), (3, 1.0), (4, 1.0), (5, 0.7)),
    *((6, 0.9), (3, 0.9), (3, 0.9), (3, 1.0), (5, 0.7), (5, 1.0)),
    *((3, 0.8), (3, 1.0), (5, 0.9), (6, 0.7), (5, 0.9), (6, 0.9)),
)


def calibdcd_method(results: list[SettingResult]) -> str:
    """One sentence naming the CalibDCD a run's "+ CalibDCD" rows ran: the paper's method
    (argmax of J, no abstention, correction on the extractor's output, origin-centred) or the
    variant(s) it differs by. Runs made before the paper's method became the default read as
    the variant they ran (abstention; the normalised space for VeilProbe and the overlap
    baseline)."""
    guards, centres, spaces = set(), set(), {}
    for r in results:
        cfg = (r.calibration or {}).get("config") or {}
        guards.add(bool(cfg.get("guard", True)))  # absent: results older than the setting
        centres.add(cfg.get("centering", "origin"))
        if r.space:
            spaces.setdefault(r.space, set()).add(r.detector)
    diffs = []
    if True in guards:
        diffs.append("abstains when the best J ≤ 0 (abstention variant)")
    if "nonmembers" in centres:
        diffs.append("corrects around the non-members' mean (centred variant)")
    if "normalized" in spaces:
        dets = ", ".join(sorted(spaces["normalized"]))
        diffs.append(f"corrects after the classifier's normalisation for {dets}")
    if not diffs:
        return (
            "CalibDCD here is the paper's method: the argmax of J over R × Λ applied whatever "
            "its sign, the correction on the feature extractor's output, the detector's "
            "training (normalisation included) refitted on the corrected features."
        )
    return (
        "CalibDCD here is a variant beyond the paper: it "
        + "; ".join(diffs)
        + ". Its rows are not the paper's method."
    )


def _summary_diagnostics(c: dict[str, Any]) -> dict[str, Any]:
    """:func:`calibdcd.calibration.selection_diagnostics` from a stored calibration summary
    (results written before the summary carried them are read the same way)."""
    if c.get("diagnostics"):
        return c["diagnostics"]
    dims = {int(r): int(k) for r, k in (c.get("basis_dims") or {}).items()}
    cfg = c.get("config") or {}
    gam = (
        [(float(g[0]), int(r)) for r, g in (c.get("consensus") or {}).items() if g]
        if cfg.get("consensus", True)
        else []
    )
    live = []
    for key, j in (c.get("objective") or {}).items():
        r, lam = key.split("/")
        if dims.get(int(r), 0) > 0 and float(lam) > 0:
            live.append(float(j))
    top = max(gam) if gam else None
    return {
        "empty_ranks": [r for r, k in dims.items() if k == 0],
        "max_gamma": None if top is None else top[0],
        "max_gamma_rank": None if top is None else top[1],
        "nonempty_nonpositive": bool(live) and max(live) <= 0.0,
        "reason": None,
    }


def consensus_diagnostics(results: list[SettingResult]) -> list[dict[str, Any]]:
    """Per (detector, target) over benchmarks and seeds: how many settings CalibDCD corrected;
    of the others, how many had an empty consensus at every rank, how many had candidates but
    every one with J ≤ 0 (the paper's argmax then falls on an empty rank, or the abstention
    variant abstains); per rank, in how many settings its consensus was empty; the largest
    consensus eigenvalue γ seen (and the τ it had to reach); how often every non-empty
    candidate had J ≤ 0, corrected or not."""
    groups: dict[tuple[str, str], list[SettingResult]] = defaultdict(list)
    for r in results:
        if r.calibration:
            groups[(r.detector, r.target)].append(r)
    out = []
    for (det, tgt), rs in groups.items():
        ranks = [int(x) for x in (rs[0].calibration.get("config") or {}).get("ranks", [])]
        empty_at = Counter()
        n_corr = n_all_empty = n_nonpos_uncorr = n_nonpos = 0
        top: float | None = None
        for r in rs:
            c = r.calibration
            d = _summary_diagnostics(c)
            empty_at.update(int(x) for x in d["empty_ranks"])
            corrected = bool(c.get("corrected", c.get("rank") is not None))
            n_corr += corrected
            all_empty = len(set(d["empty_ranks"])) >= len(set(ranks)) > 0
            n_all_empty += (not corrected) and all_empty
            n_nonpos_uncorr += (not corrected) and (not all_empty) and d["nonempty_nonpositive"]
            n_nonpos += bool(d["nonempty_nonpositive"])
            if d["max_gamma"] is not None:
                top = d["max_gamma"] if top is None else max(top, d["max_gamma"])
        out.append(
            {
                "detector": det,
                "target": tgt,
                "post_trained": rs[0].post_trained,
                "settings": len(rs),
                "corrected": n_corr,
                "uncorrected_empty_consensus": n_all_empty,
                "uncorrected_nonpositive_j": n_nonpos_uncorr,
                "empty_at_rank": {r: empty_at.get(r, 0) for r in ranks},
                "max_gamma": top,
                "tau": (rs[0].calibration.get("config") or {}).get("tau"),
                "nonempty_nonpositive": n_nonpos,
            }
        )
    return out
