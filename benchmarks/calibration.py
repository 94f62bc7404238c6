"""How fast is `calibrate` at VeilProbe scale?

Reports, in one run (so machine load affects all numbers alike):
1. n = 500 calibration texts, d = 14,336 features, 10 views, the paper's 16 (r, λ) candidates:
   the time of `calibrate` as a ratio to the irreducible cost, the economy SVDs of the three
   selected views' shift matrices H_e (goal: ≤ 3×);
2. at a d where a literal dense implementation (d×d projectors, eigh, A = I − λBBᵀ) still runs,
   the time of that implementation as a ratio to `calibrate` at the same d.

Usage: python benchmarks/calibration.py [--n 500] [--d 14336] [--dense-d 2048] [--repeats 3]
"""

from __future__ import annotations

import argparse
import json
import time

import numpy as np

from calibdcd.calibration import calibrate, score_weights


def make_problem(n: int, d: int, n_views: int = 10, seed: int = 0):
    rng = np.random.default_rng(seed)
    z0 = rng.normal(size=(n, d))
    w = rng.normal(size=d) / np.sqrt(d)
    shared = np.linalg.qr(rng.normal(size=(d, 4)))[0]
    w += shared.sum(axis=1) * 0.5
    z0 += shared.sum(axis=1) * 2.0  # a post-training offset along the shared directions
    views = {}
    for k in range(n_views):
        own = np.linalg.qr(rng.normal(size=(d, 8)))[0]
        shift = rng.normal(size=(n, 4)) @ shared.T * (0.5 + 0.1 * k)
        shift += rng.normal(size=(n, 8)) @ own.T * 0.5
        shift += rng.normal(size=(n, d)) * 0.01  # full-rank noise: H_e is n × d dense
        views[f"U{k + 1}"] = z0 + shift
    score = lambda z: z @ w  # noqa: E731  a linear detector score (cheap, like a GNB/protonet)
    return z0, views, score


def best_of(fn, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return min(times)


def three_svds(z0, views, score, selected) -> None:
    q0 = score(z0)
    for name in selected:
        w, _ = score_weights(score(views[name]) - q0)
        rows = w > 0
        h = np.sqrt(w[rows])[:, None] * (views[name][rows] - z0[rows])
        np.linalg.svd(h, full_matrices=False)


def dense_calibdcd(z0, views, score, ranks, strengths, tau=0.95, n_views=3) -> None:
    """Algorithm 1 written literally with d×d matrices (what the paper's notation suggests)."""
    d = z0.shape[1]
    q0 = score(z0)
    fpp = {e: np.maximum(score(z) - q0, 0).mean() for e, z in views.items()}
    selected = sorted(views, key=lambda e: -fpp[e])[:n_views]
    hs = []
    for e in selected:
        w, _ = score_weights(score(views[e]) - q0)
        hs.append(np.sqrt(w)[:, None] * (views[e] - z0))
    svds = [np.linalg.svd(h, full_matrices=False)[2] for h in hs]
    for r in ranks:
        g = np.zeros((d, d))
        for vt in svds:
            g += vt[:r].T @ vt[:r]
        g /= len(selected)
        gam, v = np.linalg.eigh(g)
        b = v[:, gam >= tau]
        for lam in strengths:
            a = np.eye(d) - lam * b @ b.T
            np.mean(q0 - score(z0 @ a))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=500)
    ap.add_argument("--d", type=int, default=14_336)
    ap.add_argument("--dense-d", type=int, default=2048)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--json", action="store_true", help="print the results as JSON")
    args = ap.parse_args()
    ranks, strengths = (3, 4, 5, 6), (0.7, 0.8, 0.9, 1.0)

    z0, views, score = make_problem(args.n, args.d)
    cal = calibrate(z0, views, score)
    t_cal = best_of(lambda: calibrate(z0, views, score), args.repeats)
    t_svd = best_of(lambda: three_svds(z0, views, score, cal.selected_views), args.repeats)

    z0s, views_s, score_s = make_problem(args.n, args.dense_d)
    t_cal_s = best_of(lambda: calibrate(z0s, views_s, score_s), args.repeats)
    t_dense = best_of(lambda: dense_calibdcd(z0s, views_s, score_s, ranks, strengths), 1)

    res = {
        "n": args.n,
        "d": args.d,
        "views": len(views),
        "candidates": len(ranks) * len(strengths),
        "calibrate_s": round(t_cal, 3),
        "three_svds_s": round(t_svd, 3),
        "ratio_calibrate_to_svds": round(t_cal / t_svd, 2),
        "goal_ratio_max": 3.0,
        "dense_d": args.dense_d,
        "calibrate_at_dense_d_s": round(t_cal_s, 3),
        "dense_literal_s": round(t_dense, 3),
        "speedup_vs_dense": round(t_dense / t_cal_s, 1),
        "selected": list(cal.selected_views),
        "rank": cal.rank,
        "strength": cal.strength,
    }
    if args.json:
        print(json.dumps(res, indent=2))
        return
    print(f"n={args.n} d={args.d} views={len(views)} candidates=16")
    print(
        f"  calibrate            {t_cal:8.3f} s  (selected {cal.selected_views}, "
        f"r={cal.rank}, λ={cal.strength})"
    )
    print(f"  3 economy SVDs       {t_svd:8.3f} s")
    print(f"  ratio                {t_cal / t_svd:8.2f} ×  (goal ≤ 3)")
    print(
        f"d={args.dense_d}: calibrate {t_cal_s:.3f} s vs literal dense {t_dense:.3f} s "
        f"-> {t_dense / t_cal_s:.1f}× faster"
    )


if __name__ == "__main__":
    main()
