"""The blind baseline (TF-IDF + logistic regression on the texts alone) on the shared benchmark
copies, with the paper's split by text and with the group-aware split (by book / paper).

Usage: CALIBDCD_SHARED=../shared python benchmarks/blind_baseline.py [--seeds 0 1 2]
Prints one line per benchmark and split: the pool size and the blind AUC per seed.
"""

from __future__ import annotations

import argparse
import os
import warnings
from pathlib import Path

import numpy as np

from calibdcd.blind import blind_scores
from calibdcd.data import SplitConfig, load_benchmark, split_benchmark
from calibdcd.metrics import auc

BENCHMARKS = (("booktection", "BookTection"), ("arxivtection", "arXivTection"),
              ("bookmia", "BookMIA"))  # fmt: skip


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    args = ap.parse_args()
    data = Path(os.environ.get("CALIBDCD_SHARED", "../shared")) / "data"
    for name, folder in BENCHMARKS:
        if not (data / folder).is_dir():
            print(f"{name}: no copy under {data / folder}; skipped")
            continue
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            bench = load_benchmark(name, path=data / folder)
        texts, y = bench.texts, np.asarray(bench.labels)
        for group in (None, "group"):
            aucs, pool = [], 0
            for seed in args.seeds:
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore")
                    sp = split_benchmark(bench, SplitConfig(group_by=group), seed=seed)
                s = blind_scores([texts[i] for i in sp.supervised], y[sp.supervised],
                                 [texts[i] for i in sp.evaluation], seed=seed)  # fmt: skip
                aucs.append(auc(y[sp.evaluation], s))
                pool = len(sp.evaluation)
            per = ", ".join(f"{a:.3f}" for a in aucs)
            print(f"{name:13s} split by {'group' if group else 'text '}  pool {pool:5d}  "
                  f"blind AUC {per} (mean {np.mean(aucs):.3f})")  # fmt: skip


if __name__ == "__main__":
    main()
