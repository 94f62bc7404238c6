"""Optimal-transport pieces of GiLOT attribution, as pure numpy functions.

IPOT (Xie et al., 2019, "A Fast Proximal Point Method for Computing Exact Wasserstein Distance")
solves min_T <T, C> s.t. T 1 = a, T^T 1 = b by proximal-point iterations: each outer step solves a
Sinkhorn-like problem with kernel exp(-C / beta) re-weighted by the previous plan, so (unlike plain
entropic Sinkhorn) it converges to the exact transport plan as iterations grow, even for a large
``beta``. GiLOT's settings: beta = 2, 1000 outer iterations, 1 inner Sinkhorn step.
"""

from __future__ import annotations

import numpy as np

__all__ = ["cosine_cost", "ipot", "ot_distance", "top_p_support"]


def ipot(
    a: np.ndarray,
    b: np.ndarray,
    cost: np.ndarray,
    *,
    beta: float = 2.0,
    iterations: int = 1000,
    inner: int = 1,
) -> np.ndarray:
    """The IPOT transport plan between histograms ``a`` (n,) and ``b`` (m,) for ``cost`` (n, m).

    ``a`` and ``b`` must be non-negative with equal positive sums.
    """
    a = np.asarray(a, dtype=np.float64)
    b = np.asarray(b, dtype=np.float64)
    cost = np.asarray(cost, dtype=np.float64)
    if a.ndim != 1 or b.ndim != 1:
        raise ValueError(f"a and b must be 1-D, got shapes {a.shape} and {b.shape}")
    if cost.shape != (a.size, b.size):
        raise ValueError(f"cost must have shape {(a.size, b.size)}, got {cost.shape}")
    if np.any(a < 0) or np.any(b < 0):
        raise ValueError("a and b must be non-negative")
    if not np.isclose(a.sum(), b.sum(), rtol=1e-6) or a.sum() <= 0:
        raise ValueError(f"a and b must have equal positive mass, got {a.sum()} and {b.sum()}")
    if beta <= 0:
        raise ValueError(f"beta must be > 0, got {beta!r}")
    kernel = np.exp(-cost / beta)
    plan = np.ones_like(cost)
    sigma = np.full(b.size, 1.0 / b.size)
    tiny = 1e-300
    for _ in range(iterations):
        q = kernel * plan
        for _ in range(inner):
            delta = a / np.maximum(q @ sigma, tiny)
            sigma = b / np.maximum(q.T @ delta, tiny)
        plan = delta[:, None] * q * sigma[None, :]
    return plan


def ot_distance(
    p: np.ndarray,
    q: np.ndarray,
    cost: np.ndarray,
    *,
    beta: float = 2.0,
    iterations: int = 1000,
    inner: int = 1,
    eps: float = 1e-4,
    marginals: str = "official",
) -> float:
    """GiLOT's distance <T, C> between two distributions on a common support.

    ``marginals="official"``: each distribution restricted to the support is normalised to sum
    to 1 and ``eps`` is then added to every bin, as the official code does (both masses are
    1 + k·eps, so IPOT's equal-mass condition holds and the distance carries that factor).
    ``"renormalized"``: ``eps`` added to the raw restricted values, then both renormalised to 1.
    """
    p = np.asarray(p, dtype=np.float64)
    q = np.asarray(q, dtype=np.float64)
    if marginals == "official":
        p = p / p.sum() + eps
        q = q / q.sum() + eps
    elif marginals == "renormalized":
        p, q = p + eps, q + eps
        p = p / p.sum()
        q = q / q.sum()
    else:
        raise ValueError(f"marginals must be 'official' or 'renormalized', got {marginals!r}")
    plan = ipot(p, q, cost, beta=beta, iterations=iterations, inner=inner)
    return float(np.sum(plan * cost))


def cosine_cost(embeddings: np.ndarray) -> np.ndarray:
    """C_ij = 1 - cos(e_i, e_j) for the rows of ``embeddings`` (k, h)."""
    e = np.asarray(embeddings, dtype=np.float64)
    norms = np.linalg.norm(e, axis=1, keepdims=True)
    e = e / np.maximum(norms, 1e-12)
    return np.clip(1.0 - e @ e.T, 0.0, 2.0)


def top_p_support(p: np.ndarray, q: np.ndarray, *, top_p: float, cap: int) -> np.ndarray:
    """Sorted union of the top-p token sets of two distributions (each capped at ``cap`` ids)."""

    def nucleus(d: np.ndarray) -> np.ndarray:
        order = np.argsort(-d, kind="stable")
        cum = np.cumsum(d[order])
        k = int(np.searchsorted(cum, top_p * cum[-1]) + 1)
        return order[: min(k, cap, d.size)]

    return np.union1d(nucleus(np.asarray(p)), nucleus(np.asarray(q)))
