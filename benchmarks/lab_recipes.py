"""Screen lab recipes against the lab v2 bands with the cheap ``lab check`` signals.

Each recipe is a lab preset plus overrides (``section__field``); recipes that differ only in
post-training share one pre-trained base (``<cache>/lab-base``), so an SFT sweep costs one
pre-training. For every recipe and lab seed it builds the lab into the cache root (``ensure_lab``,
built once), runs ``lab check`` in raw mode (greedy continuation of each text's first half:
ROUGE-L and exact-prefix AUC; gray-box loss AUC) on every model, and appends one JSON record per
(recipe, seed) to ``--out``. The detectors' AUCs, which the bands are about, are measured after
screening on the recipes worth it (``calibdcd run`` on the built lab); this only finds them.

    python benchmarks/lab_recipes.py --recipes R2a R2b --seeds 0 --out results/lab_recipes.jsonl

Every recipe tried is kept in ``RECIPES`` (and its results in the output), failures included:
docs/lab.md logs them against the bands.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")

_POOL_1000 = {"pretrain__n_members": 500}  # 500 members + 500 non-members: a 1,000-text pool

#: name -> (preset, overrides, what it tests)
RECIPES: dict[str, tuple[str, dict[str, Any], str]] = {
    "R2a": (
        "micro",
        {**_POOL_1000, "pretrain__n_background": 600},
        "micro's model and exposures (16 x 3 = 48), 1,000-text pool; micro's SFT (960 ex., 5e-4)",
    ),
    "R2b": (
        "micro",
        {**_POOL_1000, "pretrain__n_background": 600, "sft__n_examples": 1600},
        "R2a with small's SFT length (1,600 examples)",
    ),
    "R2c": (
        "micro",
        {**_POOL_1000, "pretrain__n_background": 600, "sft__lr": 1e-3},
        "R2a with SFT lr 1e-3",
    ),
    "R2d": (
        "micro",
        {**_POOL_1000, "pretrain__n_background": 600, "sft__n_examples": 1600, "sft__lr": 1e-3},
        "R2a with 1,600 SFT examples at lr 1e-3",
    ),
    # R2b on the detectors (lab seed 0, split seeds 0-2): chat-qwen VeilProbe 0.64-0.69, DPDLLM
    # 0.50-0.53 (chance), Overlap 0.86-0.88: DPDLLM reads *sampled* continuations (T = 0.7),
    # which a partly forgotten member no longer reproduces. R3: a stronger memorisation (72
    # exposures) so that sampling reproduces members too, with the SFT strengths of R2.
    "R3a": (
        "micro",
        {**_POOL_1000, "pretrain__n_background": 600, "pretrain__repeats": 24},
        "72 exposures (16 -> 24 repeats x 3 epochs); SFT as R2a (960 ex., 5e-4)",
    ),
    "R3b": (
        "micro",
        {
            **_POOL_1000,
            "pretrain__n_background": 600,
            "pretrain__repeats": 24,
            "sft__n_examples": 1600,
        },
        "72 exposures; SFT as R2b (1,600 ex., 5e-4)",
    ),
    "R3c": (
        "micro",
        {
            **_POOL_1000,
            "pretrain__n_background": 600,
            "pretrain__repeats": 24,
            "sft__n_examples": 1600,
            "sft__lr": 1e-3,
        },
        "72 exposures; SFT as R2d (1,600 ex., 1e-3)",
    ),
}


def run_recipe(name: str, seed: int, styles: tuple[str, ...] | None) -> dict[str, Any]:
    from calibdcd.lab.build import ensure_lab
    from calibdcd.lab.evaluate import check_lab
    from calibdcd.provenance import measured_on

    preset, overrides, what = RECIPES[name]
    kw = dict(overrides)
    if styles:
        kw["styles"] = styles
    t0 = time.perf_counter()
    lab = ensure_lab(preset, seed=seed, check=False, device="cpu", **kw)
    built = time.perf_counter() - t0
    meta = json.loads((lab / "lab.json").read_text())
    t1 = time.perf_counter()
    report = check_lab(lab, modes=("raw",), device="cpu", progress=True)
    models = {
        m: {
            "loss_auc": r["loss_auc"],
            "rougeL_auc": round(r["raw"]["rougeL_auc"], 4),
            "prefix_auc": round(r["raw"]["prefix_auc"], 4),
            "exact_rate_members": r["raw"]["exact_rate"]["member"],
            "n": [r["n_members"], r["n_nonmembers"]],
        }
        for m, r in report["models"].items()
    }
    return {
        "recipe": name,
        "preset": preset,
        "overrides": {k: list(v) if isinstance(v, tuple) else v for k, v in kw.items()},
        "what": what,
        "seed": seed,
        "lab": lab.name,
        "base_reused": meta.get("base_reused"),
        "build_timings": meta["timings"],
        "wall_build_s": round(built, 1),
        "wall_check_s": round(time.perf_counter() - t1, 1),
        "models": models,
        **measured_on(torch=True),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--recipes", nargs="+", required=True, choices=sorted(RECIPES))
    ap.add_argument("--seeds", nargs="+", type=int, default=[0])
    ap.add_argument("--styles", nargs="*", default=None, help="only these chat styles")
    ap.add_argument("--out", type=Path, required=True, help="JSON lines, appended")
    args = ap.parse_args()
    args.out.parent.mkdir(parents=True, exist_ok=True)
    for seed in args.seeds:
        for name in args.recipes:
            rec = run_recipe(name, seed, tuple(args.styles) if args.styles else None)
            with args.out.open("a") as fh:
                fh.write(json.dumps(rec) + "\n")
            summary = {m: (v["rougeL_auc"], v["prefix_auc"]) for m, v in rec["models"].items()}
            print(f"{name} seed {seed}: {summary}", flush=True)


if __name__ == "__main__":
    main()
