"""Inductive vs transductive learnt parts of a fitted detector, on texts outside the fit pool.

Per seed, the lab's texts are split (seeded) into a fit pool and texts the fit never sees:

* fit: ``--sup`` members and ``--sup`` non-members (supervised), ``--cal`` calibration and
  ``--held`` held-out non-members;
* outside: every other lab text (members and non-members), scored with the fitted detector in
  ``inductive`` mode (learnt parts frozen at fit time) and ``transductive`` mode (learnt parts,
  features, classifier, CalibDCD and null refitted with the outside texts added, no labels).

Reports per seed and mode: AUC on the outside texts and the FPR at the fitted threshold on the
outside non-members; pooled over seeds: the paired ΔAUC / ΔTPR (transductive − inductive) with
:func:`calibdcd.stats.compare` (hierarchical paired bootstrap + combined DeLong p).

    python benchmarks/fitted_modes.py run --seed 0 --out results/fitted-modes/s0.json
    python benchmarks/fitted_modes.py summary results/fitted-modes/s*.json

One seed is one process (DPDLLM on the micro lab with 3 reference epochs: a few minutes on
2 shared cores); a rerun reuses the generation and reference caches of ``--cache``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import numpy as np

os.environ.setdefault("HF_HUB_OFFLINE", "1")


def _detector(args: argparse.Namespace, cache: Path):
    from calibdcd.experiment.config import DetectorEntry
    from calibdcd.experiment.detector_entries import plan_detector
    from calibdcd.experiment.labs import resolve_lab_refs

    if args.detector == "dpdllm":
        opts = {
            "length": args.length,
            "reference": {
                "model_path": f"lab-clean-reference:{args.lab}",
                "learning_rate": 0.001,
                "epochs": args.epochs,
            },
        }
        preset = None
    elif args.detector == "veilprobe":
        opts = {"sampling": {"prompt_fraction": 0.5}}
        preset = "cpu"
    else:
        opts, preset = {}, None
    spec = {"name": args.detector, "preset": preset, "options": opts, "benchmark": "lab"}
    options = resolve_lab_refs(opts, build=True, root=str(cache))
    entry = DetectorEntry(name=args.detector, preset=preset, options=options)
    det = plan_detector(entry, "lab", 0, str(cache)).build()
    return det, spec


def run(args: argparse.Namespace) -> None:
    from calibdcd.calibration import CalibrationConfig
    from calibdcd.experiment.config import TargetEntry
    from calibdcd.experiment.labs import resolve_lab
    from calibdcd.experiment.target_entries import build_target
    from calibdcd.fitted import FitTexts, fit_detector, target_record
    from calibdcd.fitted.audit import threshold_at
    from calibdcd.lab import load_ground_truth
    from calibdcd.metrics import auc, tpr_at_fpr
    from calibdcd.views import view_bank

    cache = Path(args.cache)
    lab = resolve_lab(args.lab)
    assert lab is not None
    gt = load_ground_truth(lab)
    rng = np.random.default_rng([args.seed, 0xF17ED])
    mem = [g.text for g in gt if g.label == 1]
    non = [g.text for g in gt if g.label == 0]
    mem = [mem[i] for i in rng.permutation(len(mem))]
    non = [non[i] for i in rng.permutation(len(non))]
    s, c, h = args.sup, args.cal, args.held
    sup = mem[:s] + non[:s]
    order = rng.permutation(len(sup))
    texts = FitTexts(
        supervised=tuple(sup[i] for i in order),
        labels=tuple(([1] * s + [0] * s)[i] for i in order),
        calibration=tuple(non[s : s + c]),
        heldout=tuple(non[s + c : s + c + h]),
    )
    outside = mem[s:] + non[s + c + h :]
    y_out = np.r_[np.ones(len(mem) - s, dtype=int), np.zeros(len(non) - s - c - h, dtype=int)]

    entry = TargetEntry(
        name=args.model, backend="hf", model=args.model, lab=args.lab,
        options={"device": "cpu", "dtype": "float32", "batch_size": 64},
    )  # fmt: skip
    target = build_target(entry, cache / "generations.sqlite")
    record = target_record("hf", args.model, model_dir=lab / args.model, lab=args.lab)
    views = view_bank(None, str(lab / args.model), system="official")
    from calibdcd.provenance import measured_on

    out: dict = {
        "seed": args.seed,
        "detector": args.detector,
        "n_outside": len(outside),
        "n_outside_nonmembers": int((y_out == 0).sum()),
        "settings": vars(args),
        **measured_on(torch=True),
    }
    for mode in ("inductive", "transductive"):
        t0 = time.perf_counter()
        det, spec = _detector(args, cache)
        fitted = fit_detector(
            det, target, texts, views=views,
            calibration=CalibrationConfig() if args.calibdcd else None, fpr=args.fpr,
            mode=mode, seed=args.seed, detector_spec=spec, target_record=record,
            status=lambda m, mode=mode: print(f"[{mode}] {m}", file=sys.stderr, flush=True),
        )  # fmt: skip
        det2, _ = _detector(args, cache)
        res = fitted.score(outside, target, det2, check_distribution=False)
        sc = res.scores
        ok = np.isfinite(sc)
        nm = (y_out == 0) & ok
        out[mode] = {
            "scores": [None if not np.isfinite(v) else float(v) for v in sc],
            "auc": auc(y_out[ok], sc[ok]),
            "tpr_at_fpr_oracle": tpr_at_fpr(y_out[ok], sc[ok], args.fpr),
            "threshold": res.threshold,
            "fit_threshold": threshold_at(fitted.null, args.fpr),
            "fpr_at_threshold": float(np.mean(sc[nm] > res.threshold)),
            "tpr_at_threshold": float(np.mean(sc[(y_out == 1) & ok] > res.threshold)),
            "corrected": bool(fitted.scorer.corrected),
            "seconds": time.perf_counter() - t0,
        }
        print(
            f"seed {args.seed} {mode}: AUC {out[mode]['auc']:.3f} FPR@thr "
            f"{out[mode]['fpr_at_threshold']:.3f} TPR@thr {out[mode]['tpr_at_threshold']:.3f} "
            f"({out[mode]['seconds']:.0f} s)",
            flush=True,
        )
    out["labels"] = y_out.tolist()
    from calibdcd.provenance import save_measurement

    save_measurement(args.out, out)


def summary(args: argparse.Namespace) -> None:
    from calibdcd.stats import compare

    runs = [json.loads(Path(p).read_text()) for p in args.files]
    pools = []
    print("seed  mode          AUC    FPR@thr  TPR@thr  corrected")
    for r in runs:
        y = np.asarray(r["labels"])
        a = np.array([np.nan if v is None else v for v in r["transductive"]["scores"]])
        b = np.array([np.nan if v is None else v for v in r["inductive"]["scores"]])
        ok = np.isfinite(a) & np.isfinite(b)
        pools.append((y[ok], a[ok], b[ok]))
        for mode in ("inductive", "transductive"):
            m = r[mode]
            print(
                f"{r['seed']:>4}  {mode:<12}  {m['auc']:.3f}  {m['fpr_at_threshold']:.3f}    "
                f"{m['tpr_at_threshold']:.3f}    {m['corrected']}"
            )
    for mode in ("inductive", "transductive"):
        f = [r[mode]["fpr_at_threshold"] for r in runs]
        n = sum(r["n_outside_nonmembers"] for r in runs)
        print(f"{mode}: mean FPR at the threshold {np.mean(f):.3f} over {n} outside non-members")
    res = compare(pools, fpr=runs[0]["settings"]["fpr"], n_boot=2000, seed=0)
    for k, d in res.items():
        p = f", p = {d.p_value:.3g}" if d.p_value is not None else ""
        per = ", ".join(f"{x:+.3f}" for x in d.per_seed)
        print(
            f"transductive - inductive Δ{k.upper()}: {d.estimate:+.3f} "
            f"[{d.low:+.3f}, {d.high:+.3f}]{p} (per seed {per})"
        )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("run")
    r.add_argument("--seed", type=int, default=0)
    r.add_argument("--out", required=True)
    r.add_argument("--lab", default="micro")
    r.add_argument("--model", default="chat-qwen")
    r.add_argument("--detector", default="dpdllm", choices=("dpdllm", "veilprobe", "overlap"))
    r.add_argument("--epochs", type=int, default=3)
    r.add_argument("--length", type=int, default=64)
    r.add_argument("--sup", type=int, default=40)
    r.add_argument("--cal", type=int, default=20)
    r.add_argument("--held", type=int, default=40)
    r.add_argument("--fpr", type=float, default=0.05)
    r.add_argument("--cache", default=".calibdcd-cache")
    r.add_argument(
        "--calibdcd", action=argparse.BooleanOptionalAction, default=True,
        help="fit CalibDCD too (its ten views on the calibration texts dominate the cost)",
    )  # fmt: skip
    s = sub.add_parser("summary")
    s.add_argument("files", nargs="+")
    args = ap.parse_args()
    run(args) if args.cmd == "run" else summary(args)


if __name__ == "__main__":
    main()
