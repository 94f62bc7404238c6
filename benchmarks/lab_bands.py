"""Measure a lab recipe against the lab v2 bands on several lab seeds (the "Lab v2" issue).

For each lab seed ``s`` it runs a lab config with every lab reference rebuilt at that seed
(``lab: v2`` becomes ``lab: v2@s``: another split, initialisation and data order), sequentially,
into ``<out>/lab<s>``, then tabulates the *uncalibrated* AUC of each detector on each target per
lab seed (mean over the config's split seeds) against the bands:

* base model: VeilProbe >= 0.90, DPDLLM >= 0.80;
* every post-trained model: VeilProbe and DPDLLM in [0.70, 0.90].

CalibDCD's numbers are not looked at here: the lab is tuned only against these ranges.

    python benchmarks/lab_bands.py configs/lab-v2.yaml --lab-seeds 0 1 2 --out runs/lab-v2-bands
    python benchmarks/lab_bands.py configs/lab-v2.yaml --lab-seeds 0 1 2 --out runs/lab-v2-bands \\
        --summary   # only the table, from the runs already there
    python benchmarks/lab_bands.py configs/lab-v2.yaml --lab-seeds 1 2 --out runs/lab-v2-bands \\
        --bands-only   # only what the bands read: VeilProbe and DPDLLM, no analyses or controls

``--bands-only`` keeps the config's VeilProbe and DPDLLM entries and turns every analysis off
(ablations, controls, the blind baseline, ...). CalibDCD itself still runs in each setting (a
run always calibrates), but the bands never read it. It is the cheap way to put a recipe on more
lab seeds once one full study has shown the rest. ``--split-seeds 0`` runs one split seed per lab
seed: about 10 min per target instead of about 17 on 2 CPU cores (the lab v2 study's per-setting
timings), at the cost of the split-seed mean (the classifier's spread over split seeds is several
points on this lab).
"""

from __future__ import annotations

import argparse
import csv
import dataclasses
import os
import re
import subprocess
import sys
from pathlib import Path
from statistics import mean
from typing import Any

import yaml

from calibdcd.experiment.config import AnalysisSpec

BANDS = {
    ("base", "VeilProbe"): (0.90, 1.0),
    ("base", "DPDLLM"): (0.80, 1.0),
    ("post", "VeilProbe"): (0.70, 0.90),
    ("post", "DPDLLM"): (0.70, 0.90),
}


def _reseed(value: Any, seed: int) -> Any:
    """Every lab reference of a parsed config, rebuilt at ``seed``."""
    if isinstance(value, dict):
        return {
            k: (f"{v}@{seed}" if k == "lab" and isinstance(v, str) else _reseed(v, seed))
            for k, v in value.items()
        }
    if isinstance(value, list):
        return [_reseed(v, seed) for v in value]
    if isinstance(value, str):
        return re.sub(
            r"^(lab(?:-clean-reference)?:)([A-Za-z0-9_.-]+)", rf"\g<1>\g<2>@{seed}", value
        )
    return value


#: the detectors the bands are about (``DetectorEntry.name``)
BAND_DETECTORS = ("veilprobe", "dpdllm")
#: every analysis of ``AnalysisSpec`` switched off (its boolean fields, so a new one is too)
_ANALYSES_OFF = {
    f.name: False for f in dataclasses.fields(AnalysisSpec) if isinstance(f.default, bool)
}


def seeded_config(
    config: Path,
    seed: int,
    out: Path,
    *,
    bands_only: bool = False,
    split_seeds: list[int] | None = None,
) -> Path:
    data = yaml.safe_load(config.read_text())
    data = _reseed(data, seed)
    if split_seeds:
        data["seeds"] = list(split_seeds)
    if bands_only:
        data["detectors"] = [d for d in data["detectors"] if d["name"] in BAND_DETECTORS]
        data["analyses"] = {**(data.get("analyses") or {}), **_ANALYSES_OFF}
    data["name"] = f"{data.get('name', config.stem)}-lab{seed}"
    data["output"] = str((out / f"lab{seed}").resolve())
    # relative paths in the config stay relative to the original's directory
    data.setdefault("cache_dir", None)
    if data["cache_dir"] is None:
        data.pop("cache_dir")
    path = out / f"{config.stem}-lab{seed}.yaml"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(f"# {config} with every lab built at seed {seed}\n" + yaml.safe_dump(data))
    return path


def summary(out: Path, seeds: list[int]) -> list[dict[str, Any]]:
    rows = []
    for s in seeds:
        run = out / f"lab{s}"
        cfg = yaml.safe_load((run / "config.yaml").read_text())
        post = {t["name"]: t.get("post_trained", True) for t in cfg["targets"]}
        by: dict[tuple[str, str], list[float]] = {}
        with (run / "results.csv").open() as fh:
            for r in csv.DictReader(fh):
                by.setdefault((r["target"], r["detector"]), []).append(float(r["auc_before"]))
        for (target, det), aucs in sorted(by.items()):
            kind = "post" if post.get(target, True) else "base"
            band = BANDS.get((kind, det))
            auc = mean(aucs)
            rows.append(
                {
                    "lab_seed": s,
                    "target": target,
                    "detector": det,
                    "auc_before": round(auc, 4),
                    "split_seeds": len(aucs),
                    "band": band,
                    "in_band": None if band is None else band[0] <= auc <= band[1],
                }
            )
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("config", type=Path)
    ap.add_argument("--lab-seeds", nargs="+", type=int, default=[0, 1, 2])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--summary", action="store_true", help="only tabulate existing runs")
    ap.add_argument(
        "--bands-only",
        action="store_true",
        help="only VeilProbe and DPDLLM, every analysis and control off",
    )
    ap.add_argument(
        "--split-seeds",
        nargs="+",
        type=int,
        default=None,
        help="the split seeds of each lab seed's run (default: the config's `seeds`)",
    )
    args = ap.parse_args()
    if not args.summary:
        for s in args.lab_seeds:
            cfg = seeded_config(
                args.config, s, args.out, bands_only=args.bands_only, split_seeds=args.split_seeds
            )
            cmd = [sys.executable, "-m", "calibdcd", "run", str(cfg), "--no-report"]
            print("$", " ".join(cmd), flush=True)
            subprocess.run(cmd, check=True, env={**os.environ, "HF_HUB_OFFLINE": "1"})
    rows = summary(args.out, args.lab_seeds)
    from calibdcd.provenance import save_measurement

    save_measurement(args.out / "bands.json", rows)
    print("| lab seed | target | detector | AUC (uncalibrated, split-seed mean) | band | in band |")
    print("|---|---|---|---|---|---|")
    for r in rows:
        band = "" if r["band"] is None else f"{r['band'][0]:.2f}–{r['band'][1]:.2f}"
        mark = "" if r["in_band"] is None else ("yes" if r["in_band"] else "**no**")
        print(
            f"| {r['lab_seed']} | {r['target']} | {r['detector']} | {100 * r['auc_before']:.1f} "
            f"| {band} | {mark} |"
        )


if __name__ == "__main__":
    main()
