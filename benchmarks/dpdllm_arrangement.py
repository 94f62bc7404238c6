"""DPDLLM's reference-LM arrangement on a lab: ``per_split`` (official) vs ``shared`` (default).

Both arrangements run through the experiment runner on the same grid (each lab model as the
target, the given seeds, the paper protocol), so they share every split, every target
continuation (one generation cache) and CalibDCD's settings; only the texts the reference LM is
fine-tuned on differ. Per (target, seed) the script reports AUC before and after CalibDCD for
both, and the paired difference shared - per_split of the AUC before CalibDCD with a paired
bootstrap interval over the evaluation texts (both arrangements score the same texts). The last
table pools the seeds per target (mean difference, and how many seeds favour shared).

    python benchmarks/dpdllm_arrangement.py --lab micro --seeds 0 1 2
    python benchmarks/dpdllm_arrangement.py --lab small --seeds 0 1 2

Cost: a smoke run (``--lab micro --models base --seeds 0 --epochs 1 --length 32``) took 6 min on
2 cores shared with other jobs; the official 15 epochs cost about 15x more reference fine-tuning.

Everything is cached (run directory, features, reference LMs, generations): a rerun prints the
tables at once. Writes ``arrangement.json`` with every number into the run directory.
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import sys
import time
from pathlib import Path

import numpy as np

os.environ.setdefault("HF_HUB_OFFLINE", "1")

ARRANGEMENTS = ("per_split", "shared")


def build_config(args: argparse.Namespace) -> dict:
    """The experiment config (as parsed YAML) of the comparison."""
    targets = [
        {"name": m, "backend": "hf", "lab": args.lab, "model": m,
         "options": {"device": args.device, "batch_size": 64},
         **({"post_trained": False} if m == "base"
            else {"base": "base"} if "base" in args.models else {})}
        for m in args.models
    ]  # fmt: skip
    reference = {
        "model_path": f"lab-clean-reference:{args.lab}",
        "learning_rate": args.lr,
        "epochs": args.epochs,
    }
    detectors = [
        {"name": "dpdllm", "label": f"DPDLLM-{a}",
         "options": {"length": args.length, "reference": {**reference, "arrangement": a}}}
        for a in ARRANGEMENTS
    ]  # fmt: skip
    return {
        "name": f"dpdllm-arrangement-{args.lab}",
        "seeds": list(args.seeds),
        "protocol": "paper",
        "split": {"subsample": "all", "n_supervised_per_class": args.n_per_class},
        "benchmarks": [{"name": "lab", "lab": args.lab, "path": "ground_truth.jsonl"}],
        "targets": targets,
        "detectors": detectors,
        "analyses": {"ablations": False, "adaptive_vs_fixed": False, "fp_recovery": False},
        "evaluation": {"fpr": 0.05, "n_boot": args.n_boot, "level": 0.95},
        "cache_dir": str(args.cache),
    }


def _eval_scores(path: Path) -> dict[str, tuple[int, float]]:
    with path.open(newline="") as fh:
        return {
            r["id"]: (int(r["label"]), float(r["score_before"]))
            for r in csv.DictReader(fh)
            if r["part"] == "evaluation"
        }


def seed_pool(a: Path, b: Path) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(labels, scores b, scores a) before CalibDCD on the evaluation texts both kept."""
    sa, sb = _eval_scores(a), _eval_scores(b)
    ids = sorted(set(sa) & set(sb))
    return (
        np.array([sa[i][0] for i in ids]),
        np.array([sb[i][1] for i in ids]),
        np.array([sa[i][1] for i in ids]),
    )


def paired_delta(a: Path, b: Path, n_boot: int, seed: int) -> dict[str, float]:
    """AUC(b) - AUC(a) on the evaluation texts both kept, with a paired percentile bootstrap."""
    from calibdcd.metrics import auc

    sa, sb = _eval_scores(a), _eval_scores(b)
    ids = sorted(set(sa) & set(sb))
    y = np.array([sa[i][0] for i in ids])
    xa, xb = np.array([sa[i][1] for i in ids]), np.array([sb[i][1] for i in ids])
    est = auc(y, xb) - auc(y, xa)
    rng = np.random.default_rng(seed)
    draws = []
    for _ in range(n_boot):
        k = rng.integers(0, len(ids), len(ids))
        if 0 < y[k].sum() < len(k):
            draws.append(auc(y[k], xb[k]) - auc(y[k], xa[k]))
    lo, hi = np.percentile(draws, [2.5, 97.5]) if draws else (float("nan"), float("nan"))
    return {"delta": float(est), "low": float(lo), "high": float(hi), "n": len(ids)}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--lab", default="micro", help="lab preset (micro is prebuilt in the cache)")
    ap.add_argument("--models", nargs="*", default=["base", "chat-qwen", "chat-llama"])
    ap.add_argument("--seeds", nargs="*", type=int, default=[0])
    ap.add_argument("--length", type=int, default=64)
    ap.add_argument("--epochs", type=int, default=15)
    ap.add_argument("--lr", type=float, default=1e-3, help="reference LM lr (lab models: 1e-3)")
    ap.add_argument("--n-per-class", type=int, default=50)
    ap.add_argument("--n-boot", type=int, default=200)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--cache", type=Path, default=None, help="default: <calibdcd cache>/bench")
    ap.add_argument("--out", type=Path, default=None, help="run directory")
    args = ap.parse_args(argv)

    import torch

    from calibdcd.experiment import run_experiment
    from calibdcd.experiment.config import parse_config
    from calibdcd.paths import cache_root

    torch.set_num_threads(args.threads)
    args.cache = args.cache or cache_root() / "bench"
    out = args.out or args.cache / "runs" / f"dpdllm-arrangement-{args.lab}"
    cfg = parse_config(build_config(args), base_dir=Path.cwd())
    t0 = time.perf_counter()
    run_dir = run_experiment(cfg, out, progress=sys.stderr.isatty())
    seconds = time.perf_counter() - t0

    from calibdcd.stats import compare

    rows, pooled, pools = [], {}, {}
    for m in args.models:
        for s in args.seeds:
            res = {}
            for a in ARRANGEMENTS:
                sid = f"lab__{m}__DPDLLM-{a}__s{s}"
                r = json.loads((run_dir / "settings" / sid / "result.json").read_text())
                res[a] = {
                    "dir": run_dir / "settings" / sid,
                    "before": r["before"]["auc"]["estimate"],
                    "after": r["after"]["auc"]["estimate"],
                    "seconds": r["timings"]["detector"],
                }
            d = paired_delta(
                res["per_split"]["dir"] / "scores.csv",
                res["shared"]["dir"] / "scores.csv",
                args.n_boot,
                s,
            )
            kept = {a: {k: v for k, v in res[a].items() if k != "dir"} for a in ARRANGEMENTS}
            rows.append({"model": m, "seed": s, **kept, "paired": d})
            pooled.setdefault(m, []).append(d["delta"])
            dirs = res["per_split"]["dir"], res["shared"]["dir"]
            pool = seed_pool(dirs[0] / "scores.csv", dirs[1] / "scores.csv")
            pools.setdefault(m, []).append(pool)
    # pooled over seeds: hierarchical paired bootstrap (seeds, then texts) + combined DeLong p
    over_seeds = {
        m: {k: v.as_dict() for k, v in compare(ps, n_boot=args.n_boot, seed=0).items()}
        for m, ps in pools.items()
    }

    print(f"\nlab {args.lab} | L={args.length} | seeds {args.seeds} | {seconds:.0f} s this run")
    print(
        "\n| target | seed | AUC per_split (before -> after) | AUC shared (before -> after) "
        "| shared - per_split, before [95% paired bootstrap] |"
    )
    print("|---|---|---|---|---|")
    for r in rows:
        p, sh, d = r["per_split"], r["shared"], r["paired"]
        print(
            f"| {r['model']} | {r['seed']} | {p['before']:.3f} -> {p['after']:.3f} "
            f"| {sh['before']:.3f} -> {sh['after']:.3f} "
            f"| {d['delta']:+.3f} [{d['low']:+.3f}, {d['high']:+.3f}] (n={d['n']}) |"
        )
    print(
        "\n| target | seeds | ΔAUC shared - per_split (before), 95% CI | p (DeLong, combined) "
        "| ΔTPR@5%FPR, 95% CI | seeds favouring shared |"
    )
    print("|---|---|---|---|---|---|")
    for m, ds in pooled.items():
        a, t = over_seeds[m]["auc"], over_seeds[m]["tpr"]
        print(
            f"| {m} | {len(ds)} | {a['estimate']:+.3f} [{a['low']:+.3f}, {a['high']:+.3f}] "
            f"| {a['p_value']:.3f} | {t['estimate']:+.3f} [{t['low']:+.3f}, {t['high']:+.3f}] "
            f"| {sum(x > 0 for x in ds)}/{len(ds)} |"
        )
    # no machine path in the results: the cache and the run directory by name only
    recorded = {k: (v.name if isinstance(v, Path) else str(v)) for k, v in vars(args).items()}
    from calibdcd.provenance import measured_on, save_measurement

    save_measurement(
        run_dir / "arrangement.json",
        {
            "args": recorded,
            "rows": rows,
            "over_seeds": over_seeds,
            "seconds": seconds,
            **measured_on(torch=True),
        },
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
