"""VeilProbe option toggles on the contamination lab: what each official behaviour changes.

The ``official`` and ``paper`` presets need GPT-2 S/M/L, BERT and a GPU. On the lab, each
official option is therefore switched on alone (or in the named groups below), on top of a base
preset at ``cpu`` scale, with local models. For every lab model, toggle and seed the script
records:

* the base detector's AUC and TPR@5%FPR on the evaluation pool (seeded 50 + 50 supervised
  split; the same splits for every toggle, so the differences are paired by seed);
* ``view_shift``: how much the first ``--views`` universal CalibDCD views move each feature block
  (mean squared change under a view / total variance of the block over the pool, averaged over
  the views). For the constant decoder input, D and dD must give 0.

Generations are cached in ``<cache>/generations.sqlite`` and all VeilProbe artefacts under
``<cache>/veilprobe``, so toggles that only change the classifier cost seconds. A toggle that
changes the mapping model retrains it: about 30 s per model on the micro lab with 2 cores.

Prepared for the coordinator, who runs it; build no lab other than ``micro`` here::

    python benchmarks/veilprobe_options.py --lab micro --models chat-qwen --seeds 0 1 2 \\
        --out benchmarks/results/veilprobe_options_micro.json

``--toggles`` picks a subset of toggles (names below); ``--list`` prints them. The paired
statistics of the report (hierarchical bootstrap, p-values) can be run on the per-seed numbers in
the output file.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import time
from pathlib import Path
from typing import Any

import numpy as np

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

MODELS = ("base", "chat-qwen", "chat-llama", "chat-reasoning")

#: name -> {sub-config: {field: value}}, each applied on top of the base preset
#: the official mapping-model training (HF Trainer + DataCollatorForSeq2Seq), at cpu scale
#: the official ProtoNet (VeilProbeConfig.official().protonet's values that differ from cpu's)
OFFICIAL_PROTONET = {
    "episodes": 500,
    "n_support": 5,
    "n_query": 5,
    "hidden": 64,
    "latent": 16,
    "beta": 1e-3,
    "distance": "euclidean",
}

OFFICIAL_MAPPING_TRAINING = {
    "train_pad_to_max": True,
    "train_attend_pads": True,
    "labels_ignore_pad": False,
    "target_format": "official",
    "max_grad_norm": 1.0,
    "decay_bias_and_norm": False,
}

TOGGLES: dict[str, dict[str, dict[str, Any]]] = {
    "base": {},
    # feature read-out (module B')
    "decoder_input=constant": {"features": {"decoder_input": "constant"}},
    "pooling=all": {"features": {"pooling": "all"}},
    "attention=official": {"features": {"attention": "official"}},
    "readout=official": {"features": {"pooling": "all", "attention": "official"}},
    "encoder_input=view": {"features": {"encoder_input": "view"}},
    "normalize=false": {"features": {"normalize": False}},
    # mapping-model training (module B)
    "train=official": {
        "mapping": {
            "train_pad_to_max": True,
            "train_attend_pads": True,
            "labels_ignore_pad": False,
            "target_format": "official",
        }
    },
    "labels_ignore_pad=false": {"mapping": {"labels_ignore_pad": False}},
    "target_format=official": {"mapping": {"target_format": "official"}},
    "max_grad_norm=1": {"mapping": {"max_grad_norm": 1.0}},
    "decay_bias_and_norm=false": {"mapping": {"decay_bias_and_norm": False}},
    "shared_model=false": {"mapping": {"shared_model": False}},
    # key tokens (module A')
    "n_key=13": {"perturb": {"n_key": 13}},
    # classifier (module C)
    "protonet=official": {"protonet": OFFICIAL_PROTONET},
    "distance=euclidean": {"protonet": {"distance": "euclidean"}},
    # everything official that runs with local models at cpu scale
    "official-local": {
        "features": {
            "decoder_input": "constant",
            "pooling": "all",
            "attention": "official",
            "normalize": False,
        },
        "mapping": OFFICIAL_MAPPING_TRAINING,
        "perturb": {"n_key": 13},
        "protonet": OFFICIAL_PROTONET,
    },
    # the paper's read-out (suffix decoder input) at cpu scale
    "paper-local": {
        "features": {"pooling": "all", "attention": "official"},
        "mapping": OFFICIAL_MAPPING_TRAINING,
        "perturb": {"n_key": 13},
    },
}


def apply_toggle(cfg, toggle: dict[str, dict[str, Any]]):
    """``cfg`` with the toggle's fields replaced (sub-configs by name)."""
    out = cfg
    for sub, fields in toggle.items():
        out = dataclasses.replace(out, **{sub: dataclasses.replace(getattr(out, sub), **fields)})
    return out


def supervised_split(labels: np.ndarray, per_class: int, seed: int):
    rng = np.random.default_rng(seed)
    train = []
    for c in (1, 0):
        idx = rng.permutation(np.flatnonzero(labels == c))
        if idx.size <= per_class:
            raise ValueError(f"label {c} has only {idx.size} texts; --per-class too big")
        train.append(idx[:per_class])
    train = np.sort(np.concatenate(train))
    return train, np.setdiff1d(np.arange(labels.size), train)


def view_shift(base, viewed: list) -> dict[str, float]:
    """Per block: mean over views of E||z_v - z_0||^2 / total variance of the block."""
    out = {}
    for name, sl in base.blocks.items():
        z0 = base.values[:, sl].astype(np.float64)
        total = float(z0.var(axis=0).sum())
        moved = [float(((f.values[:, sl] - z0) ** 2).sum(axis=1).mean()) for f in viewed]
        out[name] = float(np.mean(moved) / total) if total > 0 else 0.0
    return out


def summary_table(results: dict[str, Any]) -> str:
    """The docs' table of a results file: per model and toggle, AUC over seeds, the paired
    difference to ``base`` (hierarchical bootstrap over seeds and test texts, combined DeLong p),
    the views' share of each block's variance moved (E, dE, D, dD), and the time."""

    def ci(d: dict[str, Any]) -> str:
        mark = " ▲" if d["low"] > 0 else " ▼" if d["high"] < 0 else ""
        return f"{100 * d['estimate']:+.1f} [{100 * d['low']:+.1f}, {100 * d['high']:+.1f}]{mark}"

    seeds = ", ".join(map(str, results["seeds"]))
    lines = [
        f"Lab `{results['lab']}`, {results['n_texts']} texts, seeds {seeds} "
        f"({results['per_class']} + {results['per_class']} supervised per seed, the rest scored), "
        f"base preset `{results['base_preset']}`, views {', '.join(results['views'])}; "
        "Δ in AUC points vs `base`, ▲/▼ when the 95% interval excludes 0.",
        "",
        "| model | toggle | AUC mean ± SD | ΔAUC vs base [95% CI] | p | ΔTPR@5%FPR [95% CI] "
        "| view shift E / dE / D / dD | s |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for model, toggles in results["models"].items():
        for name, r in toggles.items():
            pv = r.get("paired_vs_base")
            d_auc = ci(pv["auc"]) if pv else "–"
            p = (
                f"{pv['auc']['p_value']:.3f}"
                if pv and pv["auc"].get("p_value") is not None
                else "–"
            )
            d_tpr = ci(pv["tpr"]) if pv else "–"
            shift = r["view_shift"]
            lines.append(
                f"| {model} | {name} | {100 * r['auc_mean']:.1f} ± {100 * r['auc_std']:.1f} "
                f"| {d_auc} | {p} | {d_tpr} | "
                f"{' / '.join(f'{shift[b]:.3f}' for b in ('E', 'dE', 'D', 'dD') if b in shift)} "
                f"| {r['seconds']:.0f} |"
            )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--lab", default="micro", help="lab preset (micro) or a built lab directory")
    p.add_argument("--models", nargs="+", default=list(MODELS))
    p.add_argument("--toggles", nargs="+", default=list(TOGGLES), choices=list(TOGGLES))
    p.add_argument("--list", action="store_true", help="print the toggles and exit")
    p.add_argument(
        "--summary", type=Path, default=None, help="print the Markdown table of a results file"
    )
    p.add_argument("--base-preset", choices=("cpu",), default="cpu")
    p.add_argument("--prompt-fraction", type=float, default=0.5)
    p.add_argument("--max-new-tokens", type=int, default=48)
    p.add_argument("--per-class", type=int, default=50)
    p.add_argument(
        "--limit", type=int, default=None, help="a seeded balanced subsample (smoke runs)"
    )
    p.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
    p.add_argument("--views", type=int, default=2, help="universal views for view_shift")
    p.add_argument("--cache-dir", default=os.path.expanduser("~/.cache/calibdcd/bench-veilprobe"))
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--out", type=Path, default=None)
    p.add_argument("--quiet", action="store_true")
    args = p.parse_args(argv)
    if args.list:
        for name, toggle in TOGGLES.items():
            print(f"{name:28s} {json.dumps(toggle)}")
        return 0
    if args.summary:
        print(summary_table(json.loads(args.summary.read_text())))
        return 0

    import torch

    from calibdcd.detectors.veilprobe import VeilProbe, VeilProbeConfig
    from calibdcd.lab import load_ground_truth
    from calibdcd.metrics import auc, tpr_at_fpr
    from calibdcd.provenance import measured_on, save_measurement
    from calibdcd.targets.cache import CachedTarget
    from calibdcd.targets.hf import HFTarget
    from calibdcd.views import universal_views

    torch.set_num_threads(args.threads)
    if Path(args.lab).is_dir():
        lab = Path(args.lab)
    else:
        if args.lab != "micro":
            raise SystemExit("only the micro lab is built by this script; pass a directory")
        from calibdcd.lab import ensure_lab

        lab = ensure_lab("micro", progress=not args.quiet)
    items = load_ground_truth(lab)
    texts, labels = [x.text for x in items], np.asarray([x.label for x in items])
    if args.limit:
        rng = np.random.default_rng(0)
        keep = np.sort(
            np.concatenate(
                [rng.permutation(np.flatnonzero(labels == c))[: args.limit // 2] for c in (0, 1)]
            )
        )
        texts, labels = [texts[i] for i in keep], labels[keep]
    views = universal_views()[: args.views]
    base_cfg = VeilProbeConfig.preset(args.base_preset)
    base_cfg = dataclasses.replace(
        base_cfg,
        sampling=dataclasses.replace(
            base_cfg.sampling,
            prompt_fraction=args.prompt_fraction,
            max_new_tokens=args.max_new_tokens,
        ),
        cache_dir=str(Path(args.cache_dir) / "veilprobe"),
        progress=not args.quiet,
    )
    results: dict[str, Any] = {
        "lab": lab.name,
        "base_preset": args.base_preset,
        "base_config": base_cfg.as_dict(),
        "seeds": args.seeds,
        "per_class": args.per_class,
        "n_texts": len(texts),
        "views": [v.code for v in views],
        "torch_threads": args.threads,
        **measured_on(torch=True),
        "toggles": {name: TOGGLES[name] for name in args.toggles},
        "models": {},
    }
    results["base_config"]["cache_dir"] = None  # no machine path in the results
    gen_cache = Path(args.cache_dir) / "generations.sqlite"
    from calibdcd.stats import compare

    previous: dict[str, Any] = {}
    if args.out and args.out.is_file():  # resume: toggles measured with the same settings stay
        old = json.loads(args.out.read_text())
        same = ("base_config", "seeds", "per_class", "n_texts", "views", "lab")
        now = json.loads(json.dumps({k: results[k] for k in same}))  # tuples as JSON lists
        if all(old.get(k) == now[k] for k in same):
            previous = old.get("models", {})

    def save() -> None:
        save_measurement(args.out, results)  # after every toggle: a cut run keeps its figures

    for model in args.models:
        target = CachedTarget(HFTarget(str(lab / model), batch_size=32), gen_cache)
        per_model: dict[str, Any] = {}
        results["models"][model] = per_model
        for name in args.toggles:
            if name in previous.get(model, {}):
                per_model[name] = previous[model][name]
                print(f"{model:14s} {name:28s} (measured before, kept)", flush=True)
                continue
            cfg = apply_toggle(base_cfg, TOGGLES[name])
            det = VeilProbe(cfg)
            t0 = time.perf_counter()
            det.prepare(texts, target)
            feats = det.extract(texts, target)
            shift = view_shift(feats, [det.extract(texts, target, view=v) for v in views])
            runs = []
            for seed in args.seeds:
                train, test = supervised_split(labels, args.per_class, seed)
                clf = det.new_classifier(seed).fit(feats.values[train], labels[train])
                s = clf.score(feats.values[test])
                runs.append(
                    {
                        "seed": seed,
                        "auc": auc(labels[test], s),
                        "tpr_at_5fpr": tpr_at_fpr(labels[test], s, 0.05),
                        # the same test texts for every toggle: the paired statistics below
                        "test": test.tolist(),
                        "scores": [float(x) for x in s],
                    }
                )
            per_model[name] = {
                "runs": runs,
                "auc_mean": float(np.mean([r["auc"] for r in runs])),
                "auc_std": float(np.std([r["auc"] for r in runs])),
                "tpr_at_5fpr_mean": float(np.mean([r["tpr_at_5fpr"] for r in runs])),
                "view_shift": shift,
                "seconds": time.perf_counter() - t0,
                "timings": dict(det.timings),
            }
            if "base" in per_model and name != "base":
                base_runs = {r["seed"]: r for r in per_model["base"]["runs"]}
                d = [r["auc"] - base_runs[r["seed"]]["auc"] for r in runs]
                per_model[name]["delta_auc_mean"] = float(np.mean(d))
                per_model[name]["delta_auc_std"] = float(np.std(d))
                # toggle - base over the seeds: hierarchical paired bootstrap + combined DeLong
                pools = [
                    (
                        labels[np.asarray(r["test"])],
                        np.asarray(r["scores"]),
                        np.asarray(base_runs[r["seed"]]["scores"]),
                    )
                    for r in runs
                ]
                per_model[name]["paired_vs_base"] = {
                    k: v.as_dict() for k, v in compare(pools, n_boot=1000, seed=0).items()
                }
            r = per_model[name]
            save()
            print(
                f"{model:14s} {name:28s} AUC {r['auc_mean']:.3f}±{r['auc_std']:.3f} "
                f"TPR@5% {r['tpr_at_5fpr_mean']:.3f}  "
                f"ΔAUC {r.get('delta_auc_mean', 0.0):+.3f}  "
                f"view shift D {shift['D']:.3f} dD {shift['dD']:.3f} E {shift['E']:.3f}  "
                f"{r['seconds']:.0f}s",
                flush=True,
            )
    save()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
