"""Paired "X + CalibDCD vs X" intervals pooled over several runs of one lab recipe, the lab
build as the top level (builds → split seeds → texts), the pool-level interval beside it.

A run pools its own split seeds (``calibdcd report``); this pools the settings of several run
directories, one lab build each, e.g. the full study on lab seed 0 and
``benchmarks/lab_bands.py`` runs on lab seeds 1 and 2. Two intervals per cell:

* **build level** (the verdict, wherever a cell has two or more builds):
  :func:`calibdcd.stats.compare_builds` through
  :func:`calibdcd.report.aggregate.paired_cells_by_build`: each build's estimate is the run
  report's own hierarchical paired bootstrap over that build's split seeds and texts, and the
  interval is a t-interval over the build means (n_builds − 1 degrees of freedom), with the
  number of builds at which the observed mean and between-build SD would resolve. The three lab
  builds differ far more than the split seeds, and a bootstrap over three builds (ten distinct
  resamples) spans about the range of the build means, so the t-interval it is
  (docs/statistics.md).
* **pool level** (kept, labelled, not the verdict): every (build, split seed) setting one pool
  of :func:`calibdcd.stats.compare`, the nine pools resampled as one level, then texts
  (:func:`calibdcd.report.aggregate.paired_cells` over the settings of all runs). It treats the
  pools as exchangeable, so it is too narrow when the builds differ.

A cell with one build (the overlap baseline, run on lab seed 0 only) has no build level: its
interval is that build's own (split seeds, then texts), and says so.

    python benchmarks/lab_pooled.py runs/lab-v2 runs/lab-v2-bands/lab1 --out pooled.json \\
        --readme docs/results.md --name lab-v2-pooled   # rewrites that block from the runs
        [--detectors VeilProbe DPDLLM Overlap]          # only these (default: every detector)

The three runs behind those numbers are committed, trimmed to what this needs, in
``benchmarks/results/runs/`` (its README says how to unpack and re-run them).

Settings are matched by (detector, benchmark, target) names, which ``lab_bands.py`` keeps when it
rebuilds a config's labs at another seed. Each run directory given is one lab build (merge the
shards of one run with ``calibdcd report`` first). Only comparisons every pooled setting can
make are reported. A single run never holds two builds of one cell (each benchmark and target
names one lab), so a run's own report has only the pool level, which is then its build's.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

import yaml

from calibdcd.provenance import resumed_phrase, save_measurement
from calibdcd.report.aggregate import (
    COMPARISONS,
    load_results,
    paired_cell_settings,
    paired_cells,
    paired_cells_by_build,
)
from calibdcd.report.readme import setting_provenances, write_block

#: the issue's power criterion on the half-width of "X + CalibDCD vs X", in AUC points
POWER_HALF_WIDTH = 1.5
#: the verdict interval of a row, as the JSON's ``interval`` names it
BUILD_LEVEL = "build level: t-interval over the build means ({n} builds, {df} df)"
ONE_BUILD = "one lab build: its own hierarchical bootstrap (split seeds, then texts)"
VERDICTS = {1: "better", -1: "worse", 0: "not resolved"}


def _pts(x: float) -> float:
    return round(100 * x, 2)


def pooled(
    runs: list[Path],
    *,
    comparisons: tuple[str, ...] = ("calibdcd",),
    detectors: tuple[str, ...] | None = None,
) -> list[dict[str, Any]]:
    """One row per (detector, target, comparison) over the settings of every run (each run one
    lab build). ``low``, ``high``, ``half_width`` and ``verdict`` are the verdict's interval, the
    one ``interval`` names: the build level where the cell has two or more builds
    (``build_level``: the t-interval over the build means, each build's own bootstrap interval,
    the between-build SD and the builds a resolved claim would need), else the one build's own
    interval. ``pool_level`` is the run report's own
    :func:`~calibdcd.report.aggregate.paired_cells` over all the cell's settings as one level.
    A comparison is made where every pooled setting has both methods' scores (a
    ``--bands-only`` run has no placebo, so a placebo comparison is left to the full study's own
    report). ``detectors``: only these detector labels (None: every one in the runs)."""
    results, names, build = [], {}, {}
    for i, run in enumerate(runs):
        for r in load_results(run):
            if detectors is not None and r.detector not in detectors:
                continue
            results.append(r)
            names[id(r)] = f"{run.name}/s{r.seed}"
            build[id(r)] = i
    settings = paired_cell_settings(results)
    labels = {key: label for key, label, _, _ in COMPARISONS}
    pools_cells = paired_cells(results)
    build_cells = paired_cells_by_build(results, lambda r: build[id(r)])
    rows = []
    for (detector, benchmark, target), cell in sorted(pools_cells.items()):
        used = settings[(detector, benchmark, target)]  # the cell's pools, in their order
        builds = sorted({build[id(r)] for r in used})
        for key in comparisons:
            if key not in cell:
                continue
            delta = cell[key]["auc"]
            # every pool's Δ exactly 0 and no spread: the two methods scored alike everywhere
            # (CalibDCD corrected no pool), so a zero half-width is no resolution at all
            identical = delta.half_width == 0 and all(x == 0 for x in delta.per_seed)
            pool_level = {
                "what": "the pools (build x split seed) resampled as one level, then texts",
                "estimate": _pts(delta.estimate),
                "low": _pts(delta.low),
                "high": _pts(delta.high),
                "half_width": _pts(delta.half_width),
                "verdict": VERDICTS[delta.verdict],
                "per_pool": [_pts(x) for x in delta.per_seed],
                "p_value": delta.p_value,
                "level": delta.level,
                "n_boot": delta.n_boot,
            }
            by_build = build_cells.get((detector, benchmark, target), {}).get(key)
            if by_build is not None:
                b = by_build["auc"]
                build_level = {
                    "what": "t-interval over the build means (each the mean over its split "
                    "seeds), n_builds - 1 df; per build its own hierarchical bootstrap",
                    "estimate": _pts(b.estimate),
                    "low": _pts(b.low),
                    "high": _pts(b.high),
                    "half_width": _pts(b.half_width),
                    "verdict": VERDICTS[b.verdict],
                    "n_builds": b.n_builds,
                    "df": b.df,
                    "t_quantile": round(b.t_quantile, 4),
                    "per_build": [_pts(p.estimate) for p in b.per_build],
                    "per_build_interval": [[_pts(p.low), _pts(p.high)] for p in b.per_build],
                    "sd_between": _pts(b.sd_between),
                    "se": _pts(b.se),
                    "floored": b.floored,
                    "p_value": b.p_value,
                    "builds_needed": b.builds_needed,
                    "level": b.level,
                    "n_boot": b.per_build[0].n_boot,
                }
                head, interval = build_level, BUILD_LEVEL.format(n=b.n_builds, df=b.df)
            else:
                build_level, head, interval = None, pool_level, ONE_BUILD
            rows.append(
                {
                    "detector": detector,
                    "benchmark": benchmark,
                    "target": target,
                    "comparison": labels[key].format(d=detector),
                    "pools": [names[id(r)] for r in used],
                    "builds": [runs[i].name for i in builds],
                    "n_texts": int(sum(len(r.pool["label"]) for r in used)),
                    "delta_auc": head["estimate"],
                    "interval": interval,
                    "low": head["low"],
                    "high": head["high"],
                    "half_width": head["half_width"],
                    "verdict": head["verdict"],
                    "identical": identical,
                    "meets_power": key == "calibdcd"
                    and head["half_width"] <= POWER_HALF_WIDTH
                    and not identical,
                    "build_level": build_level,
                    "pool_level": pool_level,
                }
            )
    return rows


def provenance(runs: list[Path]) -> str:
    """Which runs the rows pool: each run's config name, commit, seeds, lab(s) and machine
    (a lab build's weights depend on the CPU's kernel level: docs/reproducibility.md), and,
    for a run whose settings were not all computed at its latest start's commit, the run
    report's own "resumed across N commits: ..." clause (from each setting's record)."""
    parts = []
    for run in runs:
        env = json.loads((run / "environment.json").read_text())
        commit = ((env.get("git") or {}).get("commit") or "unknown")[:12]
        resumed = resumed_phrase(env, setting_provenances(load_results(run)))
        if resumed:
            commit += f", {resumed}"
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


def _ci(estimate: float, low: float, high: float) -> str:
    return f"{estimate:+.1f} [{low:+.1f}, {high:+.1f}]"


def table(rows: list[dict[str, Any]]) -> str:
    """The rows as a Markdown table (AUC points) and its legend."""
    lines = [
        "| comparison | target | pools | builds | ΔAUC [95% CI] | half-width | verdict | "
        "Δ per build | pool level: ΔAUC [95% CI] (not the verdict) | builds for a resolved "
        "claim |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        if r["identical"]:
            mark = " (identical scores in every pool: nothing to resolve)"
        elif r["meets_power"]:
            mark = " (≤ 1.5: meets the power criterion)"
        else:
            mark = ""
        b, p = r.get("build_level"), r["pool_level"]
        if b is not None:
            per_build = " / ".join(f"{x:+.1f}" for x in b["per_build"])
            need = b["builds_needed"]
            if r["identical"]:
                need_txt = "– (identical scores)"
            elif need is None:
                near0 = abs(r["delta_auc"]) < 0.05
                need_txt = "none up to 10,000 (mean ≈ 0)" if near0 else "more than 10,000"
            elif b["floored"]:
                sd = b["se"] * len(b["per_build"]) ** 0.5
                need_txt = f"{need} (SD {sd:.1f}: the builds' own noise, above their spread)"
            else:
                need_txt = f"{need} (SD {b['sd_between']:.1f} between builds)"
            pool_txt = f"{_ci(p['estimate'], p['low'], p['high'])}, {p['verdict']}"
        else:
            per_build = f"{r['delta_auc']:+.1f}"
            need_txt = "– (one build)"
            pool_txt = "– (one build: the interval is its own)"
        lines.append(
            f"| {r['comparison']} | {r['target']} | {len(r['pools'])} | {len(r['builds'])} | "
            f"{_ci(r['delta_auc'], r['low'], r['high'])} | "
            f"{r['half_width']:.1f}{mark} | {r['verdict']} | {per_build} | {pool_txt} | "
            f"{need_txt} |"
        )
    return "\n".join(lines)


LEGEND = (
    "AUC points, (X + CalibDCD) − X on the same texts. **ΔAUC [95% CI] and the verdict: the lab "
    "build as the top level** wherever a row has several builds: each build's Δ is the mean over "
    "its split seeds (the run report's own hierarchical paired bootstrap gives its interval, in "
    "the JSON), and the interval is a t-interval over the build means with n_builds − 1 degrees "
    "of freedom (three builds: 2 df, t = 4.30), its standard error never below the builds' own "
    "noise (Knapp–Hartung with the ad hoc correction); a row with one build (the overlap "
    "baseline, lab seed 0 only) has that build's own interval (its split seeds, then texts). "
    "Δ per build: in the order of the runs named above. Better/worse only where the interval "
    "excludes 0. The pool-level interval resamples the pools (build × split seed) as one level, "
    "then texts: it treats the builds as exchangeable with the split seeds, which they are not, "
    "and is kept for comparison only. Builds for a resolved claim: the fewest builds n at which "
    "a t-interval with the observed mean and the SD of one build's Δ would exclude 0 "
    "(t_{0.975, n−1} · SD / √n < |mean|). Why a t-interval, not a bootstrap over three builds: "
    "docs/statistics.md."
)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("runs", nargs="+", type=Path, help="run directories of one lab recipe")
    ap.add_argument("--out", type=Path, default=None, help="write the rows as JSON here")
    ap.add_argument("--readme", type=Path, default=None, help="rewrite a results block here")
    ap.add_argument("--name", default="lab-v2-pooled", help="the results block's name")
    ap.add_argument(
        "--detectors",
        nargs="+",
        default=None,
        help="only these detector labels (default: every one; lab seed 0's run also holds the "
        "gray-box attacks, one build each, which its own report shows)",
    )
    args = ap.parse_args()
    rows = pooled(args.runs, detectors=None if args.detectors is None else tuple(args.detectors))
    where = provenance(args.runs)
    text = where + "\n\n" + table(rows) + "\n\n" + LEGEND
    save_measurement(args.out, {"provenance": where, "rows": rows})
    if args.readme:
        write_block(args.readme, args.name, text)
    print(text)


if __name__ == "__main__":
    main()
