"""Report figures (matplotlib, Agg backend, PNG): per-setting ROC curves and score histograms
before/after CalibDCD, view and (r, λ) selection frequencies, the applied correction's J against
the AUC change, ablation deltas, adaptive vs fixed, false-positive recovery and base vs
post-trained."""

from __future__ import annotations

import textwrap
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

import calibdcd.report.aggregate as agg
from calibdcd.metrics import roc_curve
from calibdcd.results import SettingResult

__all__ = ["make_figures"]

_BEFORE, _AFTER = "#7f7f7f", "#d95f02"
_MEMBER, _NONMEMBER = "#1b9e77", "#7570b3"


def _plt() -> Any:
    import matplotlib

    matplotlib.use("Agg", force=True)
    import matplotlib.pyplot as plt

    plt.rcParams.update({"font.size": 9, "axes.titlesize": 9, "figure.dpi": 110})
    return plt


def _read_scores(path: Path) -> dict[str, np.ndarray] | None:
    """The pool's labels and scores before and after CalibDCD, read by the report's one reader
    of ``scores.csv`` (:func:`calibdcd.report.aggregate.read_pool`); None without them."""
    pool = agg.read_pool(path)
    if pool is None or "original" not in pool or "calibdcd" not in pool:
        return None
    return {"label": pool["label"], "before": pool["original"], "after": pool["calibdcd"]}


def _save(fig: Any, path: Path, rect: tuple[float, float, float, float] | None = None) -> Path:
    import io

    from calibdcd.atomic import atomic_write_bytes

    fig.tight_layout(rect=rect)
    buf = io.BytesIO()  # rendered whole, then published: a killed report leaves no half PNG
    fig.savefig(buf, format="png")
    atomic_write_bytes(path, buf.getvalue())
    import matplotlib.pyplot as plt

    plt.close(fig)
    return path


def setting_figure(result: SettingResult, scores: dict[str, np.ndarray], path: Path) -> Path:
    """ROC before/after and the pool's score histograms before and after, for one setting."""
    plt = _plt()
    fig, axes = plt.subplots(1, 3, figsize=(10.5, 3.0))
    y = scores["label"]
    for stage, color, name in (("before", _BEFORE, "original"), ("after", _AFTER, "+ CalibDCD")):
        f, t, _ = roc_curve(y, scores[stage])
        a = getattr(result, stage).auc.estimate
        axes[0].plot(f, t, color=color, lw=1.5, label=f"{name} (AUC {a:.3f})")
    fpr = result.fpr
    axes[0].axvline(fpr, color="k", ls=":", lw=0.8)
    axes[0].plot([0, 1], [0, 1], color="#cccccc", lw=0.8)
    axes[0].set(xlabel="FPR", ylabel="TPR", title="ROC on the evaluation pool")
    axes[0].legend(loc="lower right", fontsize=7)
    for ax, stage, title in ((axes[1], "before", "original"), (axes[2], "after", "+ CalibDCD")):
        s = scores[stage]
        lo, hi = np.percentile(s, [0.5, 99.5]) if len(s) > 10 else (s.min(), s.max())
        if not np.isfinite(lo) or hi <= lo:
            lo, hi = float(s.min()), float(s.max()) + 1e-9
        bins = np.linspace(lo, hi, 31)
        ax.hist(
            np.clip(s[y == 0], lo, hi), bins=bins, alpha=0.6, color=_NONMEMBER, label="non-members"
        )
        ax.hist(np.clip(s[y == 1], lo, hi), bins=bins, alpha=0.6, color=_MEMBER, label="members")
        tpr = getattr(result, stage).tpr.estimate
        ax.set(
            ylabel="texts",
            xlabel="score (higher = member)",
            title=f"{title}: TPR@{100 * fpr:g}%FPR {tpr:.3f}",
        )
        ax.legend(fontsize=7)
    fig.suptitle(result.id, fontsize=9)
    return _save(fig, path)


def selection_figure(results: list[SettingResult], path: Path) -> Path:
    s = agg.selection_distribution(results)
    plt = _plt()
    fig, (a, b) = plt.subplots(1, 2, figsize=(10, 3.4), gridspec_kw={"width_ratios": [1.6, 1]})
    codes = sorted(s["by_code"], key=lambda c: (not c.startswith("U"), c))
    vals = [s["by_code"][c] for c in codes]
    colors = ["#1f78b4" if c.startswith("U") else "#e31a1c" for c in codes]
    a.bar(codes, vals, color=colors)
    a.set(
        title=f"(a) view selections over {s['positions']} top-k positions", ylabel="times selected"
    )
    a.tick_params(axis="x", rotation=45)
    from matplotlib.ticker import MaxNLocator

    a.yaxis.set_major_locator(MaxNLocator(integer=True))
    m = np.array(s["matrix"], dtype=float) if s["matrix"] else np.zeros((1, 1))
    im = b.imshow(m, cmap="Oranges", aspect="auto")
    b.set_xticks(range(len(s["strengths"])), [f"{x:g}" for x in s["strengths"]])
    b.set_yticks(range(len(s["ranks"])), [str(r) for r in s["ranks"]])
    b.set(xlabel="λ", ylabel="r", title=f"(b) selected (r, λ); none: {s['no_correction']}")
    for i in range(m.shape[0]):
        for j in range(m.shape[1]):
            b.text(j, i, int(m[i, j]), ha="center", va="center", fontsize=8)
    fig.colorbar(im, ax=b, fraction=0.046)
    return _save(fig, path)


def ablation_figure(results: list[SettingResult], path: Path) -> Path | None:
    rows = [r for r in agg.ablation_summary(results) if r["d_auc"] is not None]
    if not rows:
        return None
    plt = _plt()
    fig, ax = plt.subplots(figsize=(max(7.5, 1.6 * len(rows)), 3.4))
    x = np.arange(len(rows))
    w = 0.38
    ax.bar(x - w / 2, [100 * r["d_auc"] for r in rows], w, label="Δ AUC", color="#1f78b4")
    ax.bar(x + w / 2, [100 * r["d_tpr"] for r in rows], w, label="Δ TPR@5%FPR", color="#e66101")
    ax.set_xticks(
        x,
        [
            "\n".join(
                [
                    *textwrap.wrap(r["name"], 16),
                    "complete better:",
                    f"{r['wins_auc']}/{r['n']} (AUC)",
                ]
            )
            for r in rows
        ],
        fontsize=7,
    )
    ax.axhline(0, color="k", lw=0.8)
    ax.set(ylabel="change from the complete method (points)", title="Ablations: mean change")
    ax.legend(fontsize=7)
    return _save(fig, path)


def adaptive_figure(results: list[SettingResult], path: Path) -> Path | None:
    a = agg.adaptive_vs_fixed(results)
    per = a["settings"]
    if not per:
        return None
    plt = _plt()
    fig, axes = plt.subplots(1, 2, figsize=(10, 3.2))
    x = np.arange(len(per))
    w = 0.27
    labels = [f"{p['benchmark']}/{p['target']}/{p['detector']}" for p in per]
    f = a["fixed"] or {}
    fixed = f"fixed (r={f.get('rank')}, λ={f.get('strength')})"
    for ax, m, title in ((axes[0], "auc", "AUC"), (axes[1], "tpr", "TPR@5%FPR")):
        ax.bar(x - w, [p[f"{m}_original"] for p in per], w, label="original", color="#cccccc")
        ax.bar(x, [p[f"{m}_fixed"] for p in per], w, label=fixed, color=_BEFORE)
        ax.bar(x + w, [p[f"{m}_adaptive"] for p in per], w, label="adaptive", color=_AFTER)
        ax.set_xticks(x, labels, rotation=60, ha="right", fontsize=6)
        ax.set(title=f"{title}: adaptive vs fixed")
        ax.legend(fontsize=7)
        vals = [p[f"{m}_{k}"] for p in per for k in ("original", "fixed", "adaptive")]
        ax.set_ylim(max(0.0, min(vals) - 0.05), min(1.0, max(vals) + 0.05))
    return _save(fig, path)


def fp_figure(results: list[SettingResult], path: Path) -> Path | None:
    s = agg.fp_recovery_summary(results)
    groups = [
        ("all", s["overall"]),
        *list(s["by_benchmark"].items()),
        *list(s["by_detector"].items()),
    ]
    groups = [(k, v) for k, v in groups if v["cases"]]
    if not groups:
        return None
    plt = _plt()
    fig, ax = plt.subplots(figsize=(7, 0.45 * len(groups) + 1.6))
    y = np.arange(len(groups))[::-1]
    rec = [v["recovered"] for _, v in groups]
    rest = [v["cases"] - v["recovered"] for _, v in groups]
    ax.barh(y, rec, color=_AFTER, label="recovered")
    ax.barh(y, rest, left=rec, color="#cccccc", label="still false positive")
    for yi, (_, v) in zip(y, groups, strict=True):
        ax.text(
            v["cases"],
            yi,
            f" {v['recovered']}/{v['cases']} ({100 * v['rate']:.0f}%)",
            va="center",
            fontsize=7,
        )
    ax.set_yticks(y, [k for k, _ in groups])
    ax.set_xlim(0, 1.3 * max(v["cases"] for _, v in groups))
    from matplotlib.ticker import MaxNLocator

    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set(xlabel="affected false positives", title="Recovery of shift-associated false positives")
    ax.legend(fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.3), ncol=2, frameon=False)
    return _save(fig, path)


def base_figure(results: list[SettingResult], path: Path) -> Path | None:
    rows = agg.base_vs_post(results)
    if not rows:
        return None
    plt = _plt()
    fig, axes = plt.subplots(1, 2, figsize=(10, 3.2))
    x = np.arange(len(rows))
    w = 0.27
    labels = [f"{r['benchmark']}/{r['target']}/{r['detector']}" for r in rows]
    for ax, m, title in ((axes[0], "auc", "AUC"), (axes[1], "tpr", "TPR@5%FPR")):
        ax.bar(x - w, [r[f"{m}_base"] for r in rows], w, label="base", color="#1b9e77")
        ax.bar(x, [r[f"{m}_post"] for r in rows], w, label="post-trained", color=_BEFORE)
        ax.bar(
            x + w,
            [r[f"{m}_post_calibrated"] for r in rows],
            w,
            label="post + CalibDCD",
            color=_AFTER,
        )
        ax.set_xticks(x, labels, rotation=45, ha="right", fontsize=6)
        ax.set(title=f"{title}: base vs post-trained")
        ax.legend(fontsize=7)
    return _save(fig, path)


def _rho_text(c: dict[str, Any]) -> str:
    if c["rho"] is None:
        return f"ρ: {c['note']} (n={c['n']})"
    iv = "" if c["low"] is None else f" [{c['low']:+.2f}, {c['high']:+.2f}]"
    return f"ρ = {c['rho']:+.2f}{iv} (n={c['n']})"


def j_vs_auc_figure(results: list[SettingResult], path: Path) -> Path | None:
    """One panel per detector x target: each setting's applied J (x) against its evaluation
    ΔAUC in points (y), filled when a correction was applied, hollow when not; the panel's
    title gives Spearman's ρ over its settings with the bootstrap interval
    (:mod:`calibdcd.report.j_vs_auc`)."""
    from calibdcd.report.j_vs_auc import ALL_TARGETS, j_vs_auc

    data = j_vs_auc(results)
    cells = [c for c in data["cells"] if c["target"] != ALL_TARGETS]
    if not cells:
        return None
    dets = list(dict.fromkeys(c["detector"] for c in cells))
    tgts = list(dict.fromkeys(c["target"] for c in cells))
    by_cell: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for p in data["points"]:
        by_cell.setdefault((p["detector"], p["target"]), []).append(p)
    plt = _plt()
    fig, axes = plt.subplots(
        len(dets), len(tgts), figsize=(3.1 * len(tgts), 2.7 * len(dets)), squeeze=False
    )
    for i, det in enumerate(dets):
        for k, tgt in enumerate(tgts):
            ax = axes[i][k]
            cell = next((c for c in cells if (c["detector"], c["target"]) == (det, tgt)), None)
            if cell is None:
                ax.set_axis_off()
                continue
            pts = by_cell.get((det, tgt), [])
            for corrected, style in (
                (True, {"color": _AFTER, "marker": "o", "label": "corrected"}),
                (False, {"facecolors": "none", "edgecolors": _BEFORE, "marker": "o",
                         "label": "no correction"}),
            ):  # fmt: skip
                sel = [p for p in pts if p["corrected"] is corrected]
                if sel:
                    ax.scatter(
                        [p["j"] for p in sel], [100 * p["d_auc"] for p in sel], s=26, **style
                    )
            # settings on the same point (uncorrected ones all sit at (0, 0)): their count
            same = Counter((p["j"], 100 * p["d_auc"]) for p in pts)
            for (x, y), n in same.items():
                if n > 1:
                    ax.annotate(f"×{n}", (x, y), xytext=(4, 4), textcoords="offset points",
                                fontsize=7)  # fmt: skip
            ax.axhline(0, color="k", lw=0.6)
            ax.axvline(0, color="k", lw=0.6, ls=":")
            ax.set_title(f"{det} · {tgt}\n{_rho_text(cell['all'])}", fontsize=8)
            if i == len(dets) - 1:
                ax.set_xlabel("J of the applied correction")
            if k == 0:
                ax.set_ylabel("ΔAUC (points)")
            ax.tick_params(labelsize=7)
    handles, labels = [], []
    for ax in axes.flat:
        for h, lab in zip(*ax.get_legend_handles_labels(), strict=True):
            if lab not in labels:
                handles.append(h)
                labels.append(lab)
    if handles:
        fig.legend(handles, labels, loc="lower center", ncol=len(handles), fontsize=8,
                   frameon=False)  # fmt: skip
    fig.suptitle(
        "J of the applied correction vs the evaluation ΔAUC (CalibDCD − detector), one point "
        "per setting; ρ: Spearman over settings",
        fontsize=9,
    )
    return _save(fig, path, rect=(0, 0.06 if handles else 0, 1, 1))


def make_figures(
    run_dir: Path, results: Sequence[dict[str, Any]], out_dir: Path
) -> dict[str, list[Path]]:
    """Write every figure into ``out_dir``; returns {"summary": [...], "settings": [...]}."""
    out_dir.mkdir(parents=True, exist_ok=True)
    results = list(results)
    summary: list[Path] = []
    for name, fn in (
        ("selection.png", selection_figure),
        ("j_vs_auc.png", j_vs_auc_figure),
        ("ablation.png", ablation_figure),
        ("adaptive_vs_fixed.png", adaptive_figure),
        ("fp_recovery.png", fp_figure),
        ("base_vs_post.png", base_figure),
    ):
        p = fn(results, out_dir / name)
        if p is not None:
            summary.append(p)
    per: list[Path] = []
    for r in results:
        scores = _read_scores(run_dir / "settings" / r.id / "scores.csv")
        if scores is not None:
            per.append(setting_figure(r, scores, out_dir / f"setting_{r['id']}.png"))
    return {"summary": summary, "settings": per}
