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
        --readme docs/results.md --name lab-v2-pooled   # rewrites that block from the runs

The three runs behind those numbers are committed, trimmed to what this needs, in
``benchmarks/results/runs/`` (its README says how to unpack and re-run them).

Settings are matched by (detector, benchmark, target) names, which ``lab_bands.py`` keeps when it
rebuilds a config's labs at another seed. The pooling is the run report's own
(``calibdcd.report.aggregate.paired_cells``) over the settings of all runs; only comparisons
every pooled setting can make are reported.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

import yaml

from calibdcd.atomic import atomic_write_text
from calibdcd.report.aggregate import (
    COMPARISONS,
    load_results,
    paired_cell_settings,
    paired_cells,
)
from calibdcd.report.readme import replace_block

#: the issue's power criterion on the half-width of "X + CalibDCD vs X", in AUC points
POWER_HALF_WIDTH = 1.5


def pooled(
    runs: list[Path], *, comparisons: tuple[str, ...] = ("calibdcd",)
) -> list[dict[str, Any]]:
    """One row per (detector, target, comparison) over the settings of every run: the run
    report's own :func:`~calibdcd.report.aggregate.paired_cells`, fed the results of all runs.
    A comparison is made where every pooled setting has both methods' scores (a ``--bands-only``
    run has no placebo, so a placebo comparison is left to the full study's own report)."""
    results, names = [], {}
    for run in runs:
        for r in load_results(run):
            results.append(r)
            names[id(r)] = f"{run.name}/s{r.seed}"
    settings = paired_cell_settings(results)
    labels = {key: label for key, label, _, _ in COMPARISONS}
    rows = []
    for (detector, benchmark, target), cell in sorted(paired_cells(results).items()):
        used = settings[(detector, benchmark, target)]  # the cell's pools, in their order
        for key in comparisons:
            if key not in cell:
                continue
            delta = cell[key]["auc"]
            half = 100 * delta.half_width
            # every pool's Δ exactly 0 and no spread: the two methods scored alike everywhere
            # (CalibDCD corrected no pool), so a zero half-width is no resolution at all
            identical = half == 0 and all(x == 0 for x in delta.per_seed)
            rows.append(
                {
                    "detector": detector,
                    "benchmark": benchmark,
                    "target": target,
                    "comparison": labels[key].format(d=detector),
                    "pools": [names[id(r)] for r in used],
                    "n_texts": int(sum(len(r.pool["label"]) for r in used)),
                    "delta_auc": round(100 * delta.estimate, 2),
                    "low": round(100 * delta.low, 2),
                    "high": round(100 * delta.high, 2),
                    "half_width": round(half, 2),
                    "per_pool": [round(100 * x, 2) for x in delta.per_seed],
                    "p_value": delta.p_value,
                    "level": delta.level,
                    "n_boot": delta.n_boot,
                    "verdict": {1: "better", -1: "worse", 0: "not resolved"}[delta.verdict],
                    "identical": identical,
                    "meets_power": key == "calibdcd" and half <= POWER_HALF_WIDTH and not identical,
                }
            )
    return rows


def provenance(runs: list[Path]) -> str:
    """Which runs the rows pool: each run's config name, commit, seeds, lab(s) and machine
    (a lab build's weights depend on the CPU's kernel level: docs/reproducibility.md)."""
    parts = []
    for run in runs:
        env = json.loads((run / "environment.json").read_text())
        commit = ((env.get("git") or {}).get("commit") or "unknown")[:12]
        config = yaml.safe_load((run / "config.yaml").read_text()) or {}
        labs = sorted({t["lab"] for t in config.get("targets") or [] if t.get("lab")})
        lab = f", lab {', '.join(labs)}" if labs else ""
        machine = env.get("cpu") or env.get("machine") or "unknown CPU"
        started = str(env.get("started") or "?")[:10]
        parts.append(
            f"`{env.get('config', run.name)}` (commit {commit}, seeds {env.get('seeds')}{lab}; "
            f"{machine}, {started})"
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
        if r["identical"]:
            mark = " (identical scores in every pool: nothing to resolve)"
        elif r["meets_power"]:
            mark = " (≤ 1.5: meets the power criterion)"
        else:
            mark = ""
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
    ap.add_argument("--name", default="lab-v2-pooled", help="the results block's name")
    args = ap.parse_args()
    rows = pooled(args.runs)
    where = provenance(args.runs)
    text = where + "\n\n" + table(rows)
    if args.out:
        args.out.write_text(json.dumps({"provenance": where, "rows": rows}, indent=2) + "\n")
    if args.readme:
        old = args.readme.read_text(encoding="utf-8")
        atomic_write_text(args.readme, replace_block(old, args.name, text, source=str(args.readme)))
    print(text)


if __name__ == "__main__":
    main()
