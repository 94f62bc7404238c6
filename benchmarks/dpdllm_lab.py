"""DPDLLM on the contamination lab: AUC and TPR@5%FPR per target model, and the cost of each step.

Protocol: the lab's ground truth is split (seeded) into a supervised split of 50 members + 50
non-members and an evaluation pool with all remaining texts. One reference LM is fine-tuned on
the supervised texts and one on the evaluation pool (official DPDLLM: one per split, no labels;
the detector's default in experiments is one shared reference LM, compared with this arrangement
by benchmarks/dpdllm_arrangement.py), starting from a copy of the lab's base model; they do not
depend on the target, so they are trained once and reused for every target. For each target (the
base model and each post-trained model) DPDLLM samples continuations of e0, extracts the
reference-LM probability vectors, fits Gaussian NB on the supervised split and scores the pool by
its log-odds.

    python benchmarks/dpdllm_lab.py            # the lab small (built once if missing)

Prints a markdown table and writes a JSON with every number to ``--out``.

Measured on 2 shared CPU cores (L=64, reference lr 1e-3, clean reference, seed 0), AUC / TPR@5%FPR
on the evaluation pool (gaps = empty continuations, dropped), with this script's earlier
hand-written split (a seeded shuffle per class; it now uses the experiments' ``make_split``, so a
re-run draws other supervised texts for the same seed):

* lab small (250 m + 250 nm, eval 400): base .671/.056, chat-llama .551/.026,
  chat-qwen .549/.048, chat-reasoning .444/.032. Reference LMs 25 s (100 texts) and 88 s (400),
  clean reference pre-training 29 s, generation 4-7 s per model (500 texts), features 1.5 s,
  Gaussian NB < 1 ms.
* lab micro (preset 05d5d, eval 200): base .733/.140, chat-llama .636/.100, chat-qwen .690/.050,
  chat-reasoning .587/.060.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

import numpy as np

os.environ.setdefault("HF_HUB_OFFLINE", "1")

from calibdcd.detectors.dpdllm import DPDLLM, DPDLLMConfig, ReferenceLMConfig
from calibdcd.lab import load_ground_truth
from calibdcd.lab.clean_reference import CleanReferenceConfig, ensure_clean_reference
from calibdcd.lab.evaluate import EvalItem
from calibdcd.metrics import auc, tpr_at_fpr
from calibdcd.paths import cache_root
from calibdcd.provenance import measured_on, save_measurement
from calibdcd.targets.cache import CachedTarget
from calibdcd.targets.hf import HFTarget


def make_target(path: Path, cache_dir: Path) -> CachedTarget:
    """The lab model as a black-box HFTarget behind the persistent generation cache."""
    target = HFTarget(str(path), device="auto", cache_dir=cache_dir / "hf")
    return CachedTarget(target, cache_dir / "generations.sqlite")


def split_lab(rows: list[EvalItem], n_per_class: int, seed: int):
    """The experiments' own split (``calibdcd.data.make_split``, paper protocol, no subsample):
    ``n_per_class`` members + as many non-members supervised, every other text in the pool."""
    from calibdcd.data import SplitConfig, make_split

    labels = np.array([r.label for r in rows])
    sp = make_split(labels, SplitConfig(n_supervised_per_class=n_per_class), seed=seed)
    return [rows[i] for i in sp.supervised], [rows[i] for i in sp.evaluation]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument(
        "--lab", type=Path, default=None, help="a built lab (default: lab small, built if missing)"
    )
    ap.add_argument("--models", nargs="*", default=None, help="sub-directories (default: all)")
    ap.add_argument("--length", type=int, default=64, help="L (lab texts are WikiMIA-sized)")
    ap.add_argument(
        "--window", type=int, default=None, help="reference LM window in tokens (default: L)"
    )
    ap.add_argument("--n-per-class", type=int, default=50)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--epochs", type=int, default=15)
    ap.add_argument(
        "--lr",
        type=float,
        default=1e-3,
        help="reference LM learning rate (official 5e-5 is for GPT-2 124M; the lab's small "
        "models need ~1e-3 to memorise their split in 15 epochs)",
    )
    ap.add_argument(
        "--reference-model",
        default="clean",
        help="'clean' (the lab architecture pre-trained on non-candidate texts only, default), "
        "'base' (the lab's base model: it memorised the members, so this leaks), or a path",
    )
    ap.add_argument("--clean-texts", type=int, default=600)
    ap.add_argument("--clean-epochs", type=int, default=2)
    ap.add_argument("--clean-hidden-size", type=int, default=None, help="default: the lab's")
    ap.add_argument("--clean-layers", type=int, default=None, help="default: the lab's")
    ap.add_argument(
        "--cache",
        type=Path,
        default=None,
        help="generation cache dir (default: <calibdcd cache>/dpdllm-bench); reference LMs "
        "always go to the calibdcd cache, shared with the tests",
    )
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args(argv)

    import torch

    torch.set_num_threads(args.threads)
    if args.lab is None:
        from calibdcd.experiment.labs import resolve_lab

        args.lab = resolve_lab("small")
    lab = args.lab
    if args.cache is None:
        args.cache = cache_root() / "dpdllm-bench"
    train, pool = split_lab(load_ground_truth(lab), args.n_per_class, args.seed)
    tr_texts, ytr = [r.text for r in train], np.array([r.label for r in train])
    ev_texts, yev = [r.text for r in pool], np.array([r.label for r in pool])
    models = args.models or sorted(
        p.name for p in lab.iterdir() if (p / "config.json").exists() and p.name != "reference"
    )
    t_clean = time.perf_counter()
    if args.reference_model == "clean":
        ref_base = ensure_clean_reference(
            lab,
            CleanReferenceConfig(
                n_texts=args.clean_texts,
                epochs=args.clean_epochs,
                hidden_size=args.clean_hidden_size,
                num_layers=args.clean_layers,
            ),
        )  # in the calibdcd cache, shared with the tests
    elif args.reference_model == "base":
        ref_base = lab / "base"
    else:
        ref_base = Path(args.reference_model)
    t_clean = time.perf_counter() - t_clean
    ref_cfg = ReferenceLMConfig(
        model_path=str(ref_base),
        epochs=args.epochs,
        learning_rate=args.lr,
        window=args.window,
        seed=args.seed,
    )
    det = DPDLLM(
        DPDLLMConfig(length=args.length, reference=ref_cfg, seed=args.seed, on_failure="gap")
    )

    t0 = time.perf_counter()
    ref_tr = det.reference(tr_texts)
    t1 = time.perf_counter()
    ref_ev = det.reference(ev_texts)
    t2 = time.perf_counter()
    ref_info = {
        "train_split": {**ref_tr.meta, "seconds_this_run": t1 - t0},
        "eval_pool": {**ref_ev.meta, "seconds_this_run": t2 - t1},
    }
    results = []
    for m in models:
        target = make_target(lab / m, args.cache)
        g0 = time.perf_counter()
        _, gen_tr = det.generate(tr_texts, target)
        _, gen_ev = det.generate(ev_texts, target)
        g1 = time.perf_counter()
        z_tr = det.featurize(gen_tr, ref_tr)
        z_ev = det.featurize(gen_ev, ref_ev)
        g2 = time.perf_counter()
        ok_tr, ok_ev = np.isfinite(z_tr).all(1), np.isfinite(z_ev).all(1)
        clf = det.new_classifier(args.seed).fit(z_tr[ok_tr], ytr[ok_tr])
        s = clf.score(z_ev[ok_ev])
        g3 = time.perf_counter()
        y = yev[ok_ev]
        res = {
            "model": m,
            "target": target.name,
            "auc": auc(y, s),
            "tpr@5%fpr": tpr_at_fpr(y, s),
            "n_eval": int(ok_ev.sum()),
            "gaps": int((~ok_tr).sum() + (~ok_ev).sum()),
            "seconds": {"generation": g1 - g0, "features": g2 - g1, "classifier": g3 - g2},
            "example": gen_ev[0],
        }
        results.append(res)
        print(json.dumps({k: v for k, v in res.items() if k != "example"}), flush=True)

    print(f"\nlab {lab} | L={args.length} | supervised {len(tr_texts)} | eval pool {len(ev_texts)}")
    clean_json = Path(ref_base) / "reference.json"
    if clean_json.exists():
        info = json.loads(clean_json.read_text())
        print(
            f"clean reference base: {ref_base} ({info['n_texts']} background texts, "
            f"pre-trained in {info['seconds']:.1f} s; this run {t_clean:.1f} s)"
        )
    else:
        print(f"reference base: {ref_base}")
    print(
        "reference LM fine-tuning (s): train split "
        f"{ref_tr.meta.get('seconds', float('nan')):.1f}, eval pool "
        f"{ref_ev.meta.get('seconds', float('nan')):.1f}; best train ppl "
        f"{ref_tr.meta.get('best_train_ppl', float('nan')):.2f} / "
        f"{ref_ev.meta.get('best_train_ppl', float('nan')):.2f} (epoch 1: "
        f"{ref_tr.meta['train_ppl_per_epoch'][0]:.2f} / "
        f"{ref_ev.meta['train_ppl_per_epoch'][0]:.2f})"
    )
    print("\n| model | AUC | TPR@5%FPR | generation s | features s | classifier s |")
    print("|---|---|---|---|---|---|")
    for r in results:
        sec = r["seconds"]
        print(
            f"| {r['model']} | {r['auc']:.3f} | {r['tpr@5%fpr']:.3f} | {sec['generation']:.1f} | "
            f"{sec['features']:.2f} | {sec['classifier']:.4f} |"
        )
    record = {
        "args": {k: str(v) for k, v in vars(args).items()},
        "config": repr(det.config),
        **measured_on(torch=True),
        "reference_base": str(ref_base),
        "reference": ref_info,
        "results": results,
    }
    save_measurement(args.out, record)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
