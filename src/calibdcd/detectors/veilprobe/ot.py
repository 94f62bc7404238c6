"""Optimal-transport pieces of GiLOT attribution, as pure numpy functions.

IPOT (Xie et al., 2019, "A Fast Proximal Point Method for Computing Exact Wasserstein Distance")
solves min_T <T, C> s.t. T 1 = a, T^T 1 = b by proximal-point iterations: each outer step solves a
Sinkhorn-like problem with kernel exp(-C / beta) re-weighted by the previous plan, so (unlike plain
entropic Sinkhorn) it converges to the exact transport plan as iterations grow, even for a large
``beta``. GiLOT's settings: beta = 2, 1000 outer iterations, 1 inner Sinkhorn step.

:func:`ot_distances` solves the distances of a whole text (one per masked position) at once on
a torch device: the same iterations in float64 on a batch padded with zero-mass bins, which
leave every real bin's iterates as they are (see its docstring). On a GPU that replaces p numpy
solves of 7-11 s each (benchmarks/results/gilot_cost_real_regime_zen3.json) by a few batches
(each at most ``max_bytes``); the numpy :func:`ot_distance` stays the reference and the CPU path.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

__all__ = ["cosine_cost", "ipot", "ot_distance", "ot_distances", "top_p_support"]


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
    p, q = _marginals(p, q, eps, marginals)
    plan = ipot(p, q, cost, beta=beta, iterations=iterations, inner=inner)
    return float(np.sum(plan * cost))


def _marginals(p: np.ndarray, q: np.ndarray, eps: float, marginals: str) -> tuple[Any, Any]:
    """The two histograms :func:`ot_distance` hands to IPOT (see there)."""
    p = np.asarray(p, dtype=np.float64)
    q = np.asarray(q, dtype=np.float64)
    if marginals == "official":
        return p / p.sum() + eps, q / q.sum() + eps
    if marginals == "renormalized":
        p, q = p + eps, q + eps
        return p / p.sum(), q / q.sum()
    raise ValueError(f"marginals must be 'official' or 'renormalized', got {marginals!r}")


def ot_distances(
    pairs: Sequence[tuple[np.ndarray, np.ndarray, np.ndarray]],
    embeddings: Any,
    *,
    device: Any,
    beta: float = 2.0,
    iterations: int = 1000,
    inner: int = 1,
    eps: float = 1e-4,
    marginals: str = "official",
    max_bytes: int = 2**31,
) -> np.ndarray:
    """:func:`ot_distance` of every ``(p, q, support)`` in ``pairs`` (``p`` and ``q`` the two
    distributions restricted to ``support``, token ids into ``embeddings`` (vocab, h)), solved in
    batches on the torch ``device`` in float64, the cost :func:`cosine_cost` of the support's
    embeddings computed there too (only the embedding rows the supports use are moved there).

    A batch pads every support to its largest with bins of zero mass. IPOT's first half-step
    starts from sigma = 1/m on the m real bins and 0 on the padding, so a padded row gets
    delta = 0 and a padded column sigma = 0 from the first step on, and every real bin's
    iterates are those of the unpadded problem (sums that add exact zeros): the distances equal
    :func:`ot_distance`'s up to floating-point summation order (checked to 1e-12 in
    tests/test_veilprobe_ot.py). ``max_bytes`` bounds a batch's three (batch, k, k) float64
    arrays (cost, kernel, plan): 2 GiB holds about 89 positions of 1,000 bins, 22 at the
    2,000-bin union of two capped supports."""
    import torch

    if beta <= 0:
        raise ValueError(f"beta must be > 0, got {beta!r}")
    out = np.zeros(len(pairs), dtype=np.float64)
    if not pairs:
        return out
    # only the rows the supports use go to the device (a vocabulary's float64 table is GBs)
    used = np.unique(np.concatenate([np.asarray(sup, dtype=np.int64) for _, _, sup in pairs]))
    emb = torch.as_tensor(np.asarray(embeddings)[used], device=device).to(torch.float64)
    emb = emb / emb.norm(dim=1, keepdim=True).clamp_min(1e-12)
    hists = [_marginals(p, q, eps, marginals) for p, q, _ in pairs]
    sizes = [len(sup) for _, _, sup in pairs]
    order = np.argsort(sizes, kind="stable")  # similar sizes share a batch: less padding
    start = 0
    while start < len(order):
        end = start + 1
        while end < len(order) and 3 * 8 * (end + 1 - start) * sizes[order[end]] ** 2 <= max_bytes:
            end += 1
        idx = order[start:end]
        k = sizes[idx[-1]]  # the batch's largest (sizes ascend)
        n = len(idx)
        support = torch.zeros(n, k, dtype=torch.long)
        a = torch.zeros(n, k, dtype=torch.float64)
        b = torch.zeros(n, k, dtype=torch.float64)
        real = torch.zeros(n, k, dtype=torch.float64)
        for row, i in enumerate(idx):
            m = sizes[i]
            rows = np.searchsorted(used, np.asarray(pairs[i][2], dtype=np.int64))
            support[row, :m] = torch.as_tensor(rows)
            a[row, :m] = torch.as_tensor(hists[i][0])
            b[row, :m] = torch.as_tensor(hists[i][1])
            real[row, :m] = 1.0
        support, a, b, real = (x.to(device) for x in (support, a, b, real))
        e = emb[support]  # (n, k, h)
        cost = torch.bmm(e, e.transpose(1, 2)).neg_().add_(1.0).clamp_(0.0, 2.0)
        del e
        plan = _ipot_batched(a, b, cost, real, beta=beta, iterations=iterations, inner=inner)
        out[idx] = plan.mul_(cost).sum(dim=(1, 2)).cpu().numpy()
        del cost, plan
        start = end
    return out


def _ipot_batched(a: Any, b: Any, cost: Any, real: Any, *, beta: float, iterations: int,
                  inner: int) -> Any:  # fmt: skip
    """:func:`ipot` on a padded batch (``real``: 1 on the real bins, 0 on the padding)."""
    import torch

    kernel = torch.div(cost, -beta).exp_()  # one array, not two
    plan = torch.ones_like(cost)
    sigma = real / real.sum(dim=1, keepdim=True)
    tiny = 1e-300
    for _ in range(iterations):
        plan.mul_(kernel)  # q = kernel * plan
        for _ in range(inner):
            delta = a / torch.bmm(plan, sigma.unsqueeze(2)).squeeze(2).clamp_min(tiny)
            sigma = b / torch.bmm(plan.transpose(1, 2), delta.unsqueeze(2)).squeeze(2).clamp_min(
                tiny
            )
        plan.mul_(delta.unsqueeze(2)).mul_(sigma.unsqueeze(1))
    return plan


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
