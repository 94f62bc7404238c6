"""Would VeilProbe's independent classifier fits gain from both cores? (issue 47 item 2)

    python benchmarks/protonet_parallel.py [--splits 10] [--dim 768] [--workers 2]

A cold demo spends about 150 s in ProtoNet fits (docs/development.md, "Where a cold demo's time
goes"), most of them the half-sample noise-floor retrains of each VeilProbe setting (both halves
of ``HALF_SAMPLE_SPLITS`` = 10 splits: 20 fits). Each fit runs on one intra-op thread by design
(a small MLP: one thread is fastest and deterministic), so a 2-core machine leaves a core idle
through them. This script fits a ProtoNet (the paper's classifier config, the cpu preset's) on
each half the noise floor draws (``half_sample_indices``) from a synthetic 50 + 50 training set
of VeilProbe's feature width, once one after another in this process and once on a pool of
``--workers`` spawned processes (their start-up and torch import inside the timed span), and
reports both times, the ratio, and whether every fit's prototypes and scores are bitwise equal.
It changes nothing in calibdcd; it measures what such a change would buy.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from multiprocessing import get_context
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

import numpy as np

from calibdcd.experiment.analyses import HALF_SAMPLE_SPLITS, half_sample_indices
from calibdcd.provenance import measured_on, save_measurement


def _data(dim: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    y = np.repeat([0, 1], 50)
    z = rng.normal(size=(100, dim)).astype(np.float32) + 0.3 * y[:, None]
    return z, y


def _fit(args: tuple[np.ndarray, np.ndarray, int]) -> tuple[np.ndarray, np.ndarray]:
    """One ProtoNet fit (on one thread: ``ProtoNetIB.fit`` limits itself) and its outputs."""
    from calibdcd.detectors.veilprobe.config import ProtoNetConfig
    from calibdcd.detectors.veilprobe.protonet import ProtoNetIB

    z, y, seed = args
    clf = ProtoNetIB(ProtoNetConfig(), seed=seed).fit(z, y)
    return clf.prototypes_.numpy(), clf.score(z)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--splits", type=int, default=HALF_SAMPLE_SPLITS, help="2 fits per split")
    ap.add_argument("--dim", type=int, default=768)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--json", type=Path, default=None, help="write the figures here")
    a = ap.parse_args()
    z, y = _data(a.dim)
    jobs = [(z[h], y[h], 0) for h in half_sample_indices(y, a.splits)]
    t0 = time.perf_counter()
    seq = [_fit(j) for j in jobs]
    t_seq = time.perf_counter() - t0
    t0 = time.perf_counter()
    with ProcessPoolExecutor(a.workers, get_context("spawn")) as pool:
        par = list(pool.map(_fit, jobs))
    t_par = time.perf_counter() - t0
    same = all(
        np.array_equal(p0, p1) and np.array_equal(s0, s1)
        for (p0, s0), (p1, s1) in zip(seq, par, strict=True)
    )
    out = {
        "fits": len(jobs),
        "dim": a.dim,
        "workers": a.workers,
        "cpus": os.cpu_count(),
        "sequential_s": round(t_seq, 2),
        "pool_s": round(t_par, 2),
        "speedup": round(t_seq / t_par, 2),
        "bitwise_equal": same,
        **measured_on(torch=True),
    }
    print(json.dumps(out, indent=2))
    save_measurement(a.json, out)


if __name__ == "__main__":
    main()
