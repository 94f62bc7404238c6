"""Does CalibDCD's objective predict its effect? The selected candidate's J against the
evaluation ΔAUC, over the settings of each detector x target.

CalibDCD picks (r, λ) by J(r, λ), the mean drop of the detector's score over the calibration
non-members: its central assumption is that a correction which lowers the non-members' scores
raises the detector's AUC. Each setting gives one point:

* ``j``: J of the correction that was applied (``calibration.objective["r/λ"]``, in the
  detector's score units); 0 when none was applied (A = I: J = 0 by definition, and the
  abstaining variant's vetoed candidate changed nothing either);
* ``d_auc``: CalibDCD's evaluation AUC minus the original detector's (0 when uncorrected).

Per detector x target (and per detector over all its targets) the Spearman rank correlation of
the points (:func:`scipy.stats.spearmanr`, ties at average ranks), once over every setting and
once over the corrected settings only (the uncorrected ones all sit at (0, 0)), each with a
percentile bootstrap interval over settings: settings are drawn with replacement (seeded), a
draw whose J or ΔAUC is constant has no rank correlation and is left out (``usable`` counts the
rest). With fewer than :data:`MIN_SETTINGS` settings the correlation is not computed ("too few
settings"), nor with fewer than that many distinct points (two uncorrected settings at (0, 0)
and one corrected one give ρ = ±1 from the tie alone).

No helper of :mod:`calibdcd.stats` or :mod:`calibdcd.metrics` resamples pairs of values (theirs
resample texts within label strata), and :func:`scipy.stats.bootstrap` returns no interval when
one resample is degenerate (common here: several settings share J = 0), so the draws are one
vectorised index matrix here. With three settings (a lab build's three split seeds) ρ takes
only a few values and its interval is the whole [−1, 1] or close to it: the pooled row over a
detector's targets, or several builds, say more.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from typing import Any

import numpy as np
from scipy.stats import rankdata, spearmanr

from calibdcd.results import SettingResult

__all__ = [
    "MIN_SETTINGS",
    "JPoint",
    "j_vs_auc",
    "j_vs_auc_points",
    "rank_correlation",
    "selected_j",
]

#: below this many settings no rank correlation is reported ("too few settings")
MIN_SETTINGS = 3
#: bootstrap draws of the interval (seeded: the same run gives the same report)
N_BOOT = 2000
SEED = 0
TOO_FEW = "too few settings"
CONSTANT = "undefined: J or ΔAUC constant"
ALL_TARGETS = "all targets"


@dataclasses.dataclass(frozen=True)
class JPoint:
    """One setting: the applied correction's J and the evaluation ΔAUC (fractions)."""

    id: str
    detector: str
    target: str
    benchmark: str
    seed: int
    j: float
    d_auc: float
    corrected: bool

    def as_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def _corrected(cal: dict[str, Any]) -> bool:
    return bool(cal.get("corrected", cal.get("rank") is not None))


def selected_j(result: SettingResult) -> float | None:
    """J of the correction the setting applied (0.0 when none; None: no calibration record)."""
    cal = result.calibration or {}
    if not cal:
        return None
    if not _corrected(cal):
        return 0.0
    objective = cal.get("objective") or {}
    key = f"{cal.get('rank')}/{float(cal.get('strength') or 0.0):g}"
    if key in objective:
        return float(objective[key])
    best = cal.get("best_objective")  # the paper's argmax: the applied candidate's J
    return None if best is None else float(best)


def j_vs_auc_points(results: Sequence[SettingResult]) -> list[JPoint]:
    """Every setting with a calibration record, as a (J, ΔAUC) point."""
    out = []
    for r in results:
        j = selected_j(r)
        if j is None:
            continue
        out.append(
            JPoint(
                id=r.id,
                detector=r.detector,
                target=r.target,
                benchmark=r.benchmark,
                seed=r.seed,
                j=j,
                d_auc=float(r.after.auc.estimate) - float(r.before.auc.estimate),
                corrected=_corrected(r.calibration),
            )
        )
    return out


def _spearman(x: np.ndarray, y: np.ndarray) -> float | None:
    if np.ptp(x) == 0 or np.ptp(y) == 0:
        return None
    rho = float(spearmanr(x, y)[0])
    return None if math.isnan(rho) else rho


def rank_correlation(
    x: Sequence[float],
    y: Sequence[float],
    *,
    n_boot: int = N_BOOT,
    level: float = 0.95,
    seed: int = SEED,
) -> dict[str, Any]:
    """Spearman's ρ of ``x`` and ``y`` with a percentile bootstrap interval over the pairs.

    Returns ``{"n", "rho", "low", "high", "level", "n_boot", "usable", "note"}``: ``note`` is
    ``"too few settings"`` (fewer than :data:`MIN_SETTINGS` pairs: nothing computed), ``"too
    few distinct points (k)"`` (fewer than that many distinct pairs) or says that ρ is
    undefined (x or y constant); ``usable``: the draws with a defined ρ (the
    interval's)."""
    xs, ys = np.asarray(x, dtype=np.float64), np.asarray(y, dtype=np.float64)
    n = int(xs.size)
    out: dict[str, Any] = {
        "n": n, "rho": None, "low": None, "high": None, "level": level,
        "n_boot": None, "usable": None, "note": None,
    }  # fmt: skip
    if n < MIN_SETTINGS:
        out["note"] = TOO_FEW
        return out
    distinct = len(set(zip(xs.tolist(), ys.tolist(), strict=True)))
    if distinct < MIN_SETTINGS:  # e.g. two uncorrected settings at (0, 0) and one corrected:
        # ρ is ±1 by the tie alone
        out["note"] = f"too few distinct points ({distinct})"
        return out
    rho = _spearman(xs, ys)
    if rho is None:
        out["note"] = CONSTANT
        return out
    draw = np.random.default_rng(seed).integers(0, n, size=(n_boot, n))
    rx = rankdata(xs[draw], axis=1)
    ry = rankdata(ys[draw], axis=1)
    rx -= rx.mean(axis=1, keepdims=True)
    ry -= ry.mean(axis=1, keepdims=True)
    den = np.sqrt((rx * rx).sum(axis=1) * (ry * ry).sum(axis=1))
    ok = den > 1e-12
    reps = (rx * ry).sum(axis=1)[ok] / den[ok]
    out.update(rho=rho, n_boot=n_boot, usable=int(ok.sum()))
    if reps.size:
        alpha = (1.0 - level) / 2.0
        low, high = np.quantile(np.clip(reps, -1.0, 1.0), [alpha, 1.0 - alpha])
        out.update(low=float(low), high=float(high))
    return out


def _groups(points: list[JPoint]) -> list[tuple[str, str, list[JPoint]]]:
    """(detector, target, points) per detector x target in the run's order, then per detector
    over all its targets when it has more than one."""
    cells: dict[tuple[str, str], list[JPoint]] = {}
    for p in points:
        cells.setdefault((p.detector, p.target), []).append(p)
    out: list[tuple[str, str, list[JPoint]]] = []
    for det in dict.fromkeys(p.detector for p in points):
        mine = [(t, ps) for (d, t), ps in cells.items() if d == det]
        out += [(det, t, ps) for t, ps in mine]
        if len(mine) > 1:
            out.append((det, ALL_TARGETS, [p for _, ps in mine for p in ps]))
    return out


def j_vs_auc(
    results: Sequence[SettingResult], *, n_boot: int = N_BOOT, seed: int = SEED
) -> dict[str, Any]:
    """``{"points": [...], "cells": [...]}``: every setting's point and, per detector x target
    (and per detector over its targets, target ``"all targets"``), the rank correlation over
    every setting and over the corrected ones, with the count of corrected settings whose J
    and ΔAUC have the same sign. The interval's level is the run's (its AUC intervals')."""
    points = j_vs_auc_points(results)
    level = next((r.before.auc.level for r in results if r.before.auc.level), None) or 0.95
    cells = []
    for det, tgt, ps in _groups(points):
        corr = [p for p in ps if p.corrected]
        cells.append(
            {
                "detector": det,
                "target": tgt,
                "settings": len(ps),
                "corrected": len(corr),
                "all": rank_correlation(
                    [p.j for p in ps], [p.d_auc for p in ps],
                    n_boot=n_boot, level=level, seed=seed,
                ),
                "corrected_only": rank_correlation(
                    [p.j for p in corr], [p.d_auc for p in corr],
                    n_boot=n_boot, level=level, seed=seed,
                ),
                "sign_agrees": sum(1 for p in corr if np.sign(p.j) == np.sign(p.d_auc)),
                "j_positive_auc_lost": sum(1 for p in corr if p.j > 0 and p.d_auc < 0),
                "j_nonpositive_auc_gained": sum(1 for p in corr if p.j <= 0 and p.d_auc > 0),
            }
        )  # fmt: skip
    return {"points": [p.as_dict() for p in points], "cells": cells}
