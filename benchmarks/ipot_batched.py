"""GiLOT's IPOT distances of a text: one numpy solve a position (the reference, what a CPU
proxy runs) against one float64 torch batch (``ot.ot_distances``, what a CUDA proxy runs), in
the same invocation on the same supports, so the ratio is measured, not assumed.

    python benchmarks/ipot_batched.py --device cpu \\
        --json benchmarks/results/ipot_batched_cpu_zen3.json
    python benchmarks/ipot_batched.py --device cuda --positions 64  # where a GPU is at hand

Supports of ``--bins`` token ids (the paper preset's cap, ``max_support``, is 1,000 a
distribution), drawn from a random embedding table of ``--vocab`` x ``--hidden`` (SmolLM2's
width by default); distributions drawn from a Dirichlet. Settings: GiLOT's (beta 2, 1,000
iterations, 1 inner step, official marginals). The two must agree to 1e-12 (checked here too,
on the positions numpy solves). On a GPU a batch's time does not grow in proportion to its size,
so time it on a text's worth of positions (``--positions 64``).
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--positions", type=int, default=4, help="positions of one text (batched)")
    ap.add_argument(
        "--numpy-positions", type=int, default=4,
        help="how many of them numpy solves (one at a time: its time a position is constant)",
    )  # fmt: skip
    ap.add_argument("--bins", type=int, default=1000)
    ap.add_argument("--vocab", type=int, default=5000)
    ap.add_argument("--hidden", type=int, default=576)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", type=Path, help="write the figures there")
    args = ap.parse_args()

    import torch

    from calibdcd.detectors.veilprobe.ot import cosine_cost, ot_distance, ot_distances
    from calibdcd.provenance import measured_on, save_measurement

    rng = np.random.default_rng(args.seed)
    emb = rng.normal(size=(args.vocab, args.hidden)).astype(np.float32)
    pairs = []
    for _ in range(args.positions):
        support = np.sort(rng.choice(args.vocab, size=args.bins, replace=False))
        pairs.append(
            (rng.dirichlet(np.ones(args.bins)), rng.dirichlet(np.ones(args.bins)), support)
        )
    n_np = min(args.numpy_positions, args.positions)
    t0 = time.perf_counter()
    want = np.array([ot_distance(p, q, cosine_cost(emb[s])) for p, q, s in pairs[:n_np]])
    numpy_s = (time.perf_counter() - t0) / n_np
    ot_distances(pairs[:1], emb, device=args.device, iterations=2)  # the device's start-up
    if args.device.startswith("cuda"):
        torch.cuda.synchronize()
    t0 = time.perf_counter()
    got = ot_distances(pairs, emb, device=args.device)
    batched_s = (time.perf_counter() - t0) / args.positions
    rel = float(np.max(np.abs(got[:n_np] - want) / np.abs(want)))
    if rel > 1e-12:
        raise SystemExit(f"the batched distances differ from numpy's by {rel:.2e} (> 1e-12)")
    result = {
        **measured_on(torch=True),
        "device": args.device,
        "threads": torch.get_num_threads(),
        "positions": args.positions,
        "numpy_positions": n_np,
        "bins": args.bins,
        "hidden": args.hidden,
        "seed": args.seed,
        "numpy_s_per_position": round(numpy_s, 3),
        "batched_s_per_position": round(batched_s, 4),
        "ratio": round(numpy_s / batched_s, 2),
        "max_relative_difference": rel,
    }
    print(json.dumps(result, indent=2))
    save_measurement(args.json, result)


if __name__ == "__main__":
    main()
