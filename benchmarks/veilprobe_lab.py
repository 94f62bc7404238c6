"""VeilProbe on the contamination lab: AUC, TPR@5%FPR and the cost of every step, per model.

For each lab model (the base model and each post-trained variant) the detector is run on the
whole ground-truth pool: suffixes of every text and of its key-token-perturbed copy, one mapping
model trained on the pool (no labels), features, then the ProtoNet-IB classifier trained on a
seeded supervised split (``--per-class`` members + as many non-members) and evaluated on the rest.
The split is the experiments' (``calibdcd.data.make_split``); the numbers in docs/veilprobe.md
were measured with this script's earlier hand-written split (a seeded permutation per class), so
a re-run draws other supervised texts for the same seed.

Run with nothing else on the CPU, e.g.::

    python benchmarks/veilprobe_lab.py --preset micro \
        --out results/veilprobe_lab_micro.json

Generations are cached in ``<cache>/generations.sqlite`` and every VeilProbe artefact
(perturbations, tiny masked LM/proxy, mapping models, features) under ``<cache>/veilprobe``, so a
second run only re-measures the classifier; pass a fresh ``--cache-dir`` to re-measure everything.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import time
from pathlib import Path

import numpy as np

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

MODELS = ("base", "chat-qwen", "chat-llama", "chat-reasoning")


def load_ground_truth(lab: Path) -> tuple[list[str], np.ndarray]:
    from calibdcd.lab import load_ground_truth as lab_ground_truth

    items = lab_ground_truth(lab)
    return [x.text for x in items], np.asarray([x.label for x in items])


def supervised_split(labels: np.ndarray, per_class: int, seed: int):
    """The experiments' own split (``calibdcd.data.make_split``, paper protocol, no subsample):
    ``per_class`` members + as many non-members supervised, every other text evaluated."""
    from calibdcd.data import SplitConfig, make_split

    sp = make_split(labels, SplitConfig(n_supervised_per_class=per_class), seed=seed)
    return sp.supervised, sp.evaluation


def build_config(args):
    from calibdcd.detectors.veilprobe import VeilProbeConfig

    cfg = VeilProbeConfig.paper() if args.config == "paper" else VeilProbeConfig.cpu()
    sampling = cfg.sampling
    if args.max_new_tokens:
        sampling = dataclasses.replace(sampling, max_new_tokens=args.max_new_tokens)
    if args.n_suffixes:
        sampling = dataclasses.replace(sampling, n_suffixes=args.n_suffixes)
    sampling = dataclasses.replace(sampling, prompt_fraction=args.prompt_fraction)
    perturb = cfg.perturb
    if args.attribution:
        perturb = dataclasses.replace(
            perturb, attribution=dataclasses.replace(perturb.attribution, method=args.attribution)
        )
    return dataclasses.replace(
        cfg,
        sampling=sampling,
        perturb=perturb,
        cache_dir=str(Path(args.cache_dir) / "veilprobe"),
        progress=not args.quiet,
    )


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--lab", type=Path, help="a built lab directory")
    src.add_argument("--preset", choices=("micro", "small"), help="build/reuse the cached lab")
    p.add_argument("--models", default=",".join(MODELS))
    p.add_argument("--config", choices=("cpu", "paper"), default="cpu")
    p.add_argument("--attribution", choices=("loo", "gilot"), default=None)
    p.add_argument("--max-new-tokens", type=int, default=None)
    p.add_argument("--n-suffixes", type=int, default=None)
    p.add_argument(
        "--prompt-fraction",
        type=float,
        default=1.0,
        help="1.0 = VeilProbe (whole text as prompt); <1 = first words only (extension)",
    )
    p.add_argument("--per-class", type=int, default=50)
    p.add_argument("--seeds", default="0,1,2", help="supervised-split/classifier seeds")
    p.add_argument("--cache-dir", default=os.path.expanduser("~/.cache/calibdcd/bench-veilprobe"))
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--out", type=Path, default=None)
    p.add_argument("--quiet", action="store_true")
    args = p.parse_args(argv)

    import torch

    from calibdcd.detectors.veilprobe import VeilProbe
    from calibdcd.metrics import auc, tpr_at_fpr
    from calibdcd.provenance import measured_on, save_measurement
    from calibdcd.targets.cache import CachedTarget
    from calibdcd.targets.hf import HFTarget

    torch.set_num_threads(args.threads)
    if args.lab:
        lab = args.lab
    else:
        from calibdcd.lab import ensure_lab

        lab = ensure_lab(args.preset, progress=not args.quiet)
    texts, labels = load_ground_truth(lab)
    cfg = build_config(args)
    seeds = [int(s) for s in args.seeds.split(",")]
    det = VeilProbe(cfg)
    results: dict = {
        "lab": Path(lab).name,  # no machine path in a committed result
        "n_texts": len(texts),
        "n_members": int(labels.sum()),
        "per_class": args.per_class,
        "seeds": seeds,
        "config": {**cfg.as_dict(), "cache_dir": None},  # a machine path, not a setting
        "torch_threads": args.threads,
        **measured_on(torch=True),
        "models": {},
    }
    gen_cache = Path(args.cache_dir) / "generations.sqlite"
    for model in args.models.split(","):
        before = dict(det.timings)
        target = CachedTarget(HFTarget(str(lab / model), batch_size=32), gen_cache)
        det.prepare(texts, target)
        feats = det.extract(texts, target)
        steps = {k: det.timings[k] - before.get(k, 0.0) for k in det.timings}
        runs = []
        for seed in seeds:
            train, test = supervised_split(labels, args.per_class, seed)
            t0 = time.perf_counter()
            clf = det.new_classifier(seed).fit(feats.values[train], labels[train])
            scores = clf.score(feats.values[test])
            runs.append(
                {
                    "seed": seed,
                    "auc": auc(labels[test], scores),
                    "tpr_at_5fpr": tpr_at_fpr(labels[test], scores, 0.05),
                    "classifier_seconds": time.perf_counter() - t0,
                    "n_eval": int(test.size),
                }
            )
        suffixes = det.suffixes([det.query(t) for t in texts], target)
        empty = np.array([np.mean([s.strip() == "" for s in ss]) for ss in suffixes])
        res = {
            "auc_mean": float(np.mean([r["auc"] for r in runs])),
            "auc_std": float(np.std([r["auc"] for r in runs])),
            "tpr_at_5fpr_mean": float(np.mean([r["tpr_at_5fpr"] for r in runs])),
            "tpr_at_5fpr_std": float(np.std([r["tpr_at_5fpr"] for r in runs])),
            "runs": runs,
            "seconds": {
                **steps,
                "classifier": float(np.mean([r["classifier_seconds"] for r in runs])),
            },
            "empty_suffix_rate": {
                "members": float(empty[labels == 1].mean()),
                "non_members": float(empty[labels == 0].mean()),
            },
            "feature_dim": feats.dim,
        }
        results["models"][model] = res
        print(
            f"{model:15s} AUC {res['auc_mean']:.3f}±{res['auc_std']:.3f}  "
            f"TPR@5%FPR {res['tpr_at_5fpr_mean']:.3f}±{res['tpr_at_5fpr_std']:.3f}  "
            + "  ".join(f"{k} {v:.1f}s" for k, v in res["seconds"].items()),
            flush=True,
        )
    save_measurement(args.out, results)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
