"""Paired "X + CalibDCD vs X" intervals pooled over several runs of one lab recipe (the "Lab v2"
issue's power criterion: half-width <= 1.5 AUC points per detector x chat model, pooled over
seeds).

A run pools its own split seeds (``calibdcd report``); this pools the settings of several run
directories as well, e.g. the full study on lab seed 0 and ``benchmarks/lab_bands.py`` runs on
lab seeds 1 and 2. Every (lab seed, split seed) setting is one pool of the hierarchical paired
bootstrap of :func:`calibdcd.stats.compare`, as a run's own seeds are: each replicate draws
pools, then texts within them, so the spread between lab builds enters through the pools drawn.
Lab seeds are not a level of their own (with two or three of them a separate level would be
mostly noise); the per-pool Δ in the output shows the lab seeds side by side.

    python benchmarks/lab_pooled.py runs/lab-v2 runs/lab-v2-bands/lab1 --out pooled.json \\
        --readme README.md --name lab-v2-pooled   # rewrites that README block from the runs

The two runs behind the README's numbers are committed, trimmed to what this needs, in
``benchmarks/results/runs/`` (its README says how to unpack and re-run them).

Settings are matched by (detector, benchmark, target) names, which ``lab_bands.py`` keeps when it
rebuilds a config's labs at another seed. Only the comparisons every pooled setting can make are
reported (a ``--bands-only`` run has no placebo, so the placebo row pools the full study only and
says so through its ``pools`` count).
"""

from __future__ import annotations

import argparse
import json
from collections import defaultdict
from pathlib import Path
from typing import Any

import yaml

from calibdcd.report.aggregate import COMPARISONS, load_results, main_targets
from calibdcd.report.readme import replace_block
from calibdcd.results import SettingResult
from calibdcd.stats import MIN_PAIRED_BOOT, compare

#: the issue's power criterion on the half-width of "X + CalibDCD vs X", in AUC points
POWER_HALF_WIDTH = 1.5


def pooled(
    runs: list[Path], *, comparisons: tuple[str, ...] = ("calibdcd", "calibdcd_vs_placebo")
) -> list[dict[str, Any]]:
    """One row per (detector, target, comparison) over every run's post-trained settings."""
    cells: dict[tuple[str, str, str], list[tuple[str, SettingResult]]] = defaultdict(list)
    for run in runs:
        results = load_results(run)
        shown = main_targets(results)
        for r in results:
            if r.pool is not None and r.target in shown and r.post_trained:
                cells[(r.detector, r.benchmark, r.target)].append((run.name, r))
    rows = []
    for (detector, benchmark, target), members in sorted(cells.items()):
        for key, label, a, b in COMPARISONS:
            if key not in comparisons:
                continue
            usable = [(name, r) for name, r in members if a in r.pool and b in r.pool]
            if not usable:
                continue
            first = usable[0][1]
            pools = [(r.pool["label"], r.pool[a], r.pool[b]) for _, r in usable]
            n_boot = max(first.before.auc.n_boot or 0, MIN_PAIRED_BOOT)
            level = first.before.auc.level or 0.95
            delta = compare(pools, fpr=first.fpr, n_boot=n_boot, level=level, seed=0)["auc"]
            half = 100 * delta.half_width
            rows.append(
                {
                    "detector": detector,
                    "benchmark": benchmark,
                    "target": target,
                    "comparison": label.format(d=detector),
                    "pools": [f"{name}/s{r.seed}" for name, r in usable],
                    "n_texts": int(sum(len(p[0]) for p in pools)),
                    "delta_auc": round(100 * delta.estimate, 2),
                    "low": round(100 * delta.low, 2),
                    "high": round(100 * delta.high, 2),
                    "half_width": round(half, 2),
                    "per_pool": [round(100 * x, 2) for x in delta.per_seed],
                    "p_value": delta.p_value,
                    "level": level,
                    "n_boot": n_boot,
                    "verdict": {1: "better", -1: "worse", 0: "not resolved"}[delta.verdict],
                    "meets_power": key == "calibdcd" and half <= POWER_HALF_WIDTH,
                }
            )
    return rows


def provenance(runs: list[Path]) -> str:
    """Which runs the rows pool: each run's config name, commit, seeds and lab(s)."""
    parts = []
    for run in runs:
        env = json.loads((run / "environment.json").read_text())
        commit = ((env.get("git") or {}).get("commit") or "unknown")[:12]
        config = yaml.safe_load((run / "config.yaml").read_text()) or {}
        labs = sorted({t["lab"] for t in config.get("targets") or [] if t.get("lab")})
        lab = f", lab {', '.join(labs)}" if labs else ""
        parts.append(
            f"`{env.get('config', run.name)}` (commit {commit}, seeds {env.get('seeds')}{lab})"
        )
    return (
        "Written by `benchmarks/lab_pooled.py` from the run directories " + "; ".join(parts) + "."
    )


def table(rows: list[dict[str, Any]]) -> str:
    """The rows as a Markdown table (AUC points)."""
    lines = [
        "| comparison | target | pools | ΔAUC [95% CI] | half-width | verdict |",
        "|---|---|---|---|---|---|",
    ]
    for r in rows:
        mark = " (≤ 1.5: meets the power criterion)" if r["meets_power"] else ""
        lines.append(
            f"| {r['comparison']} | {r['target']} | {len(r['pools'])} | "
            f"{r['delta_auc']:+.1f} [{r['low']:+.1f}, {r['high']:+.1f}] | "
            f"{r['half_width']:.1f}{mark} | {r['verdict']} |"
        )
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("runs", nargs="+", type=Path, help="run directories of one lab recipe")
    ap.add_argument("--out", type=Path, default=None, help="write the rows as JSON here")
    ap.add_argument("--readme", type=Path, default=None, help="rewrite a results block here")
    ap.add_argument("--name", default="lab-v2-pooled", help="the README block's name")
    args = ap.parse_args()
    rows = pooled(args.runs)
    text = provenance(args.runs) + "\n\n" + table(rows)
    if args.out:
        args.out.write_text(
            json.dumps({"provenance": provenance(args.runs), "rows": rows}, indent=2) + "\n"
        )
    if args.readme:
        old = args.readme.read_text(encoding="utf-8")
        args.readme.write_text(
            replace_block(old, args.name, text, source=str(args.readme)), encoding="utf-8"
        )
    print(text)


if __name__ == "__main__":
    main()
