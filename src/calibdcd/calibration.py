"""CalibDCD: multi-view shift detection and bounded feature correction (paper Section 3, Alg. 1).

Pure numpy: arrays and a score function in, a :class:`Calibration` out. No torch, no I/O.

Notation follows the paper. For the n calibration non-members, ``z0`` holds the original-query
features z_{s,e0} and ``view_features[e]`` the features z_{s,e} under controlled view e, all in the
space the detector's classifier q consumes. Then, per view,

    Δz = z_e − z0 (restricted to the correctable ``block`` columns),  Δq = q(z_e) − q(z0),
    u = max(Δq, 0),  FPP(e) = mean(u)

and for the ``n_views`` views with the largest FPP,

    c_e = percentile_{clip}(u[u > 0]),  w = min(u, c_e),  H_e = rows sqrt(w)·Δz,
    U_{e,r} = top-r right singular vectors of H_e,
    G_r = mean_e U_{e,r} U_{e,r}ᵀ,  B_r = eigenvectors of G_r with eigenvalue γ ≥ τ,
    A_{r,λ} = I − λ B_r B_rᵀ,  J(r, λ) = mean(q(z0) − q(z0 A_{r,λ})),

and the correction with the largest J is kept: the paper's argmax over R × Λ, applied whatever
its sign (Eq. 12-13; the paper has no abstention rule). It is still the identity when the argmax
falls on a rank whose consensus basis is empty (A = I, J = 0) because every non-empty candidate
has J < 0; :func:`no_correction_reason` says which of these happened.

Scaling: detector features can be wide (VeilProbe: d ≈ 14,000). No d×d matrix is ever formed.
The SVDs are economy SVDs of the (n_pos × d_block) matrices H_e, and the consensus operator
G_r = W Wᵀ / m (W = [U_{1,r} | … | U_{m,r}], at most m·r columns) is diagonalised inside the span
of W: with W = Q R (thin QR), G_r = Q (R Rᵀ / m) Qᵀ, so its non-zero eigenpairs come from a
(m·r × m·r) symmetric eigenproblem. Eigenvalues outside that span are exactly 0 and never pass
τ > 0.

Choices where the paper is silent (each is a documented setting or constant here):
- A selected view with no positive score increase contributes an empty subspace but still counts
  in the projector average (the paper averages over |E_sel|), so it lowers every γ.
- The numerical rank of H_e is the number of singular values above
  ``max(H.shape) · eps · σ_max``; U_{e,r} has fewer than r columns when H_e has lower rank (e.g.
  fewer positive samples than r).
- γ ≥ τ is tested with a tolerance of 1e-10 so that directions shared exactly by all views
  (γ = 1 up to rounding) are never lost to floating-point noise when τ = 1.
- Ties of J keep the first maximum in (ranks outer, strengths inner) order, so among
  equal objectives the smaller rank and the smaller strength win. J values within
  1e-12 · max(1, mean |q(z0)|) of each other are ties, so a J that is 0 in exact arithmetic
  (e.g. a correction that cannot change a linear score's mean) never wins through
  floating-point noise.

Beyond the paper (options, off by default; each is reported as its own variant):

- ``guard=True`` (the *abstention* variant): no correction when the best J ≤ 0, the original
  detector kept (J ≤ 0 up to the same rounding tolerance).
  An earlier version of this module made it the default and called it the paper's rule; the
  paper has no such rule.
- ``centering="nonmembers"`` (the *centred* variant) applies the correction
around the calibration non-members' mean m (block columns) instead of the feature origin,
z -> m + (z − m) A = z − λ ((z − m) B) Bᵀ, with B estimated exactly as above (the shifts Δz do
not depend on the centre) and J computed the same way on the corrected z0. The paper's
correction is linear and pulls features towards the origin along B, so where the origin lies
(raw features vs a z-scored space) decides whether J can be positive; the centred variant makes
the correction invariant to that. ``centering="origin"`` is the paper's method.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Literal

import numpy as np

__all__ = [
    "Calibration",
    "CalibrationConfig",
    "apply_correction",
    "calibrate",
    "consensus_basis",
    "false_positive_pressure",
    "no_correction_reason",
    "score_weights",
    "selection_diagnostics",
    "settings_problems",
    "top_right_singular_vectors",
]

ViewSelection = Literal["fpp", "random", "top1"]
Weighting = Literal["score", "binary"]
Centering = Literal["origin", "nonmembers"]
ScoreFn = Callable[[np.ndarray], np.ndarray]

_GAMMA_TOL = 1e-10
_J_TOL = 1e-12  #: relative rounding tolerance of J comparisons (ties; the abstention variant)


# --------------------------------------------------------------------------------------------
# Configuration
# --------------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class CalibrationConfig:
    """CalibDCD's settings with the paper's defaults (Appendix, "Full configuration").

    ``calibrate(z0, views, score, **config.kwargs())`` runs with these settings; the keyword
    defaults of :func:`calibrate` are the same values.
    """

    ranks: tuple[int, ...] = (3, 4, 5, 6)
    strengths: tuple[float, ...] = (0.7, 0.8, 0.9, 1.0)
    tau: float = 0.95
    n_views: int = 3
    clip_percentile: float = 95.0
    view_selection: ViewSelection = "fpp"
    weighting: Weighting = "score"
    consensus: bool = True
    #: beyond the paper (the abstention variant): no correction when the best J ≤ 0
    guard: bool = False
    seed: int = 0
    #: "origin" (paper) or "nonmembers" (beyond the paper: around the calibration mean)
    centering: Centering = "origin"

    def __post_init__(self) -> None:
        object.__setattr__(self, "ranks", tuple(self.ranks))
        object.__setattr__(self, "strengths", tuple(self.strengths))
        _check_settings(self)

    def kwargs(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def _positive_int(v: Any) -> bool:
    return not isinstance(v, bool) and isinstance(v, (int, np.integer)) and v >= 1


def _real(v: Any) -> bool:
    return not isinstance(v, bool) and isinstance(v, (int, float, np.integer, np.floating))


def _ranks_problem(v: Any) -> str | None:
    if not v:
        return "must contain at least one rank"
    bad = [r for r in v if not _positive_int(r)]
    return f"must be positive integers, got {bad[0]!r}" if bad else None


def _strengths_problem(v: Any) -> str | None:
    if not v:
        return "must contain at least one strength"
    bad = [x for x in v if not (_real(x) and 0.0 <= float(x) <= 1.0)]
    return f"must lie in [0, 1], got {bad[0]!r}" if bad else None


def _choice(*allowed: str) -> Callable[[Any], str | None]:
    def check(v: Any) -> str | None:
        if v in allowed:
            return None
        return f"must be {', '.join(map(repr, allowed[:-1]))} or {allowed[-1]!r}, got {v!r}"

    return check


#: each setting's value check (None = fine); :func:`settings_problems` runs all of them
_SETTING_CHECKS: dict[str, Callable[[Any], str | None]] = {
    "ranks": _ranks_problem,
    "strengths": _strengths_problem,
    "tau": lambda v: (
        None if _real(v) and 0.0 < float(v) <= 1.0 else f"must lie in (0, 1], got {v!r}"
    ),
    "n_views": lambda v: None if _positive_int(v) else f"must be a positive integer, got {v!r}",
    "clip_percentile": lambda v: (
        None if _real(v) and 0.0 < float(v) <= 100.0 else f"must lie in (0, 100], got {v!r}"
    ),
    "view_selection": _choice("fpp", "random", "top1"),
    "weighting": _choice("score", "binary"),
    "centering": _choice("origin", "nonmembers"),
}


def settings_problems(values: Mapping[str, Any]) -> list[tuple[str, str]]:
    """Every range problem of CalibDCD settings (``(field, problem)`` pairs, all at once, so a
    config reports each of them); fields not given are not checked."""
    return [
        (k, problem)
        for k, check in _SETTING_CHECKS.items()
        if k in values and (problem := check(values[k])) is not None
    ]


def _check_settings(cfg: CalibrationConfig) -> None:
    problems = settings_problems(dataclasses.asdict(cfg))
    if problems:
        raise ValueError("; ".join(f"{k} {m}" for k, m in problems))


# --------------------------------------------------------------------------------------------
# Result
# --------------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class ViewShift:
    """Diagnostics of one selected view's score-guided shift matrix H_e."""

    name: str
    n_positive: int  #: calibration texts whose score the view raised (u > 0)
    cap: float  #: clipping cap c_e (nan when no positive u)
    singular_values: np.ndarray  #: of H_e, descending, numerically non-zero only


@dataclasses.dataclass(frozen=True)
class Calibration:
    """The outcome of :func:`calibrate`: the selected correction and every diagnostic.

    ``transform(z) = z − λ ((z − c) B) Bᵀ`` with c = ``center`` (0, the paper's correction, unless
    ``centering="nonmembers"``); it is the identity when no correction was selected.
    """

    fpp: dict[str, float]  #: false-positive pressure of every candidate view (mapping order)
    selected_views: tuple[str, ...]  #: views used for the shift estimate, in selection order
    shifts: tuple[ViewShift, ...]  #: per selected view: positives, cap, singular values
    #: rank r -> the non-zero-span eigenvalues γ of G_r, descending (with ``consensus=False``:
    #: the squared top-r singular values of the pooled shift matrix)
    consensus: dict[int, np.ndarray]
    basis_dims: dict[int, int]  #: rank r -> number of consensus directions (columns of B_r)
    objective: dict[tuple[int, float], float]  #: (r, λ) -> J(r, λ)
    rank: int | None  #: selected r (None when no correction)
    strength: float  #: selected λ (0.0 when no correction)
    basis: np.ndarray  #: (d, k) orthonormal columns, zero outside ``block``; k = 0 if none
    block: np.ndarray  #: the correctable column indices
    dim: int  #: feature dimension d
    config: CalibrationConfig
    baseline_score: float  #: mean q(z0) over the calibration non-members
    #: (d,) centre of the correction (zero outside ``block``); None = the origin (paper)
    center: np.ndarray | None = None

    @property
    def corrected(self) -> bool:
        return self.basis.shape[1] > 0 and self.strength > 0.0

    @property
    def best_objective(self) -> float:
        return max(self.objective.values()) if self.objective else 0.0

    def transform(self, z: np.ndarray) -> np.ndarray:
        """Apply the selected correction A* to features ``z`` of shape (m, d) (or (d,))."""
        arr = np.asarray(z, dtype=np.float64)
        single = arr.ndim == 1
        if single:
            arr = arr[None, :]
        if arr.ndim != 2 or arr.shape[1] != self.dim:
            raise ValueError(f"z must have shape (m, {self.dim}), got {np.shape(z)}")
        if not self.corrected:
            out = arr.copy()
        else:
            out = apply_correction(
                arr, self.basis[self.block], self.strength, self.block, center=self.center
            )
        return out[0] if single else out

    def summary(self) -> dict[str, Any]:
        """A JSON-friendly summary (no arrays larger than the eigenvalue lists)."""
        return {
            "corrected": self.corrected,
            "rank": self.rank,
            "strength": self.strength,
            "basis_dim": int(self.basis.shape[1]),
            "selected_views": list(self.selected_views),
            "fpp": {k: float(v) for k, v in self.fpp.items()},
            "caps": {s.name: float(s.cap) for s in self.shifts},
            "n_positive": {s.name: s.n_positive for s in self.shifts},
            "consensus": {str(r): [float(g) for g in gam] for r, gam in self.consensus.items()},
            "basis_dims": {str(r): k for r, k in self.basis_dims.items()},
            "objective": {f"{r}/{lam:g}": float(j) for (r, lam), j in self.objective.items()},
            "best_objective": self.best_objective,
            "baseline_score": self.baseline_score,
            "centered": self.center is not None,
            "diagnostics": selection_diagnostics(self),
            "config": self.config.kwargs(),
        }


def selection_diagnostics(cal: Calibration) -> dict[str, Any]:
    """Why the selection came out as it did, in JSON-friendly form.

    ``empty_ranks``: the candidate ranks whose consensus basis is empty (no γ ≥ τ);
    ``max_gamma`` / ``max_gamma_rank``: the largest consensus eigenvalue over all ranks and its
    rank (None with ``consensus=False``, whose eigenvalues are squared singular values);
    ``nonempty_nonpositive``: every candidate with a non-empty basis and λ > 0 has J ≤ 0 (so
    the argmax can only be a no-op or a score-raising correction); ``reason``: one line, or None
    when a correction was applied (:func:`no_correction_reason`).
    """
    empty = [int(r) for r, k in cal.basis_dims.items() if k == 0]
    top: tuple[float, int] | None = None
    if cal.config.consensus:
        for r, gam in cal.consensus.items():
            if len(gam) and (top is None or float(gam[0]) > top[0]):
                top = (float(gam[0]), int(r))
    live = [j for (r, lam), j in cal.objective.items() if cal.basis_dims.get(r, 0) > 0 and lam > 0]
    return {
        "empty_ranks": empty,
        "max_gamma": None if top is None else top[0],
        "max_gamma_rank": None if top is None else top[1],
        "nonempty_nonpositive": bool(live) and max(live) <= 0.0,
        "reason": no_correction_reason(cal),
    }


def no_correction_reason(cal: Calibration) -> str | None:
    """One line saying why ``cal`` applied no correction (None when it applied one)."""
    if cal.corrected:
        return None
    tau = cal.config.tau
    live = {
        (r, lam): j
        for (r, lam), j in cal.objective.items()
        if cal.basis_dims.get(r, 0) > 0 and lam > 0
    }
    if not live:
        gam = [(float(g[0]), int(r)) for r, g in cal.consensus.items() if len(g)]
        if not cal.config.consensus:
            gam = []
        top = f"; largest γ {max(gam)[0]:.3f} at r = {max(gam)[1]}" if gam else ""
        return f"the consensus is empty at every rank (no γ ≥ τ = {tau:g}{top})"
    best = max(live.values())
    if cal.config.guard:
        return f"abstained (abstention variant): the best J is {best:.3g} ≤ 0"
    return (
        f"every candidate with a non-empty consensus lowers no non-member score (best J "
        f"{best:.3g} ≤ 0), so the argmax is a rank whose consensus is empty (A = I, J = 0)"
    )


# --------------------------------------------------------------------------------------------
# Pure building blocks
# --------------------------------------------------------------------------------------------


def false_positive_pressure(delta_q: np.ndarray) -> float:
    """FPP(e) = mean over calibration non-members of max(Δq, 0) (paper Eq. fpp)."""
    return float(np.maximum(np.asarray(delta_q, dtype=np.float64), 0.0).mean())


def score_weights(
    delta_q: np.ndarray, *, clip_percentile: float = 95.0, weighting: Weighting = "score"
) -> tuple[np.ndarray, float]:
    """Per-sample weights w and the cap c_e of one view.

    ``weighting="score"``: u = max(Δq, 0), c = percentile(u[u > 0]) with numpy's default linear
    rule, w = min(u, c). ``"binary"`` (ablation): w = 1 where Δq > 0, else 0 (c = 1).
    Returns (w, c); c is nan when no sample has Δq > 0 (then w is all zero).
    """
    dq = np.asarray(delta_q, dtype=np.float64)
    u = np.maximum(dq, 0.0)
    positive = u > 0
    if not positive.any():
        return np.zeros_like(u), float("nan")
    if weighting == "binary":
        return positive.astype(np.float64), 1.0
    cap = float(np.percentile(u[positive], clip_percentile))
    return np.minimum(u, cap), cap


def top_right_singular_vectors(h: np.ndarray, r: int) -> tuple[np.ndarray, np.ndarray]:
    """Top-``r`` right singular vectors of ``h`` as columns (k × r'), r' ≤ r, and all non-zero
    singular values. r' is smaller than r when ``h`` has numerical rank below r."""
    vt, s = _right_singular(h)
    return vt[:r].T, s


def _right_singular(h: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Rows of Vᵀ and singular values for the numerically non-zero part of h (economy SVD)."""
    if h.size == 0:
        return np.zeros((0, h.shape[1])), np.zeros(0)
    _, s, vt = np.linalg.svd(h, full_matrices=False)
    if s.size == 0 or s[0] == 0.0:
        return np.zeros((0, h.shape[1])), np.zeros(0)
    keep = s > s[0] * max(h.shape) * np.finfo(np.float64).eps
    return vt[keep], s[keep]


def consensus_basis(
    view_bases: Sequence[np.ndarray], tau: float, n_views: int | None = None
) -> tuple[np.ndarray, np.ndarray]:
    """Eigen-decompose G = (1/m) Σ_e U_e U_eᵀ inside the span of the U_e and keep γ ≥ τ.

    ``view_bases``: (k × r_e) matrices with orthonormal columns (r_e may be 0). ``n_views`` is m
    (defaults to ``len(view_bases)``). Returns (B, γ): B (k × p) with the retained eigenvectors
    as columns, γ all non-zero-span eigenvalues, descending.
    """
    m = len(view_bases) if n_views is None else n_views
    if m < 1 or not view_bases:
        raise ValueError("consensus needs at least one view")
    k = view_bases[0].shape[0]
    nonempty = [u for u in view_bases if u.shape[1] > 0]
    if not nonempty:
        return np.zeros((k, 0)), np.zeros(0)
    w = np.concatenate(nonempty, axis=1)
    q, r = np.linalg.qr(w, mode="reduced")
    small = (r @ r.T) / m
    gam, y = np.linalg.eigh((small + small.T) / 2.0)
    order = np.argsort(gam)[::-1]
    gam, y = np.clip(gam[order], 0.0, 1.0), y[:, order]
    keep = gam >= tau - _GAMMA_TOL
    return q @ y[:, keep], gam


def apply_correction(
    z: np.ndarray,
    basis_block: np.ndarray,
    strength: float,
    block: np.ndarray | None = None,
    *,
    center: np.ndarray | None = None,
) -> np.ndarray:
    """z A with A = I − λ B Bᵀ acting on the ``block`` columns only (B given in block coordinates).

    With ``center`` c (a (d,) vector; beyond the paper): c + (z − c) A. Returns a new array;
    columns outside ``block`` are copied unchanged.
    """
    z = np.asarray(z, dtype=np.float64)
    if basis_block.shape[1] == 0 or strength == 0.0:
        return z.copy()
    sel = _column_selector(block, z.shape[1])
    zb = z[:, sel] if center is None else z[:, sel] - np.asarray(center)[sel]
    return _subtract_in_block(z, sel, strength * ((zb @ basis_block) @ basis_block.T))


def _column_selector(block: np.ndarray | None, d: int) -> slice | np.ndarray:
    """A slice when the block is one contiguous range (fast views instead of fancy indexing)."""
    if block is None:
        return slice(0, d)
    if block.size and block[-1] - block[0] + 1 == block.size:
        return slice(int(block[0]), int(block[-1]) + 1)
    return block


def _subtract_in_block(z: np.ndarray, sel: slice | np.ndarray, delta: np.ndarray) -> np.ndarray:
    out = z.copy()
    out[:, sel] -= delta
    return out


# --------------------------------------------------------------------------------------------
# The algorithm
# --------------------------------------------------------------------------------------------


def calibrate(
    z0: np.ndarray,
    view_features: Mapping[str, np.ndarray],
    score: ScoreFn,
    *,
    block: Sequence[int] | np.ndarray | slice | None = None,
    ranks: Sequence[int] = (3, 4, 5, 6),
    strengths: Sequence[float] = (0.7, 0.8, 0.9, 1.0),
    tau: float = 0.95,
    n_views: int = 3,
    clip_percentile: float = 95.0,
    view_selection: ViewSelection = "fpp",
    weighting: Weighting = "score",
    consensus: bool = True,
    guard: bool = False,
    seed: int = 0,
    centering: Centering = "origin",
) -> Calibration:
    """Estimate and select CalibDCD's bounded correction on known non-members (Algorithm 1).

    Args:
        z0: (n, d) original-query features of the n calibration non-members, as the feature
            extractor φ outputs them (the paper); ``score`` is then the whole fitted detector,
            its normalisation included.
        view_features: ordered mapping view name -> (n, d) features under that view; row i is
            the same text as ``z0[i]``.
        score: the fixed trained detector score, (m, d) -> (m,), higher = more member-like.
        block: column indices the correction may touch (VeilProbe: the output-derived block), as
            indices, a boolean mask or a slice; None = all columns.
        ranks, strengths: the candidate grids R and Λ (paper: {3,4,5,6} × {0.7,0.8,0.9,1.0}).
        tau: cross-view consensus threshold τ.
        n_views: number of views kept by FPP ranking.
        clip_percentile: per-view clipping percentile of the positive score increases.
        view_selection: "fpp" (paper), "random" (seeded ablation) or "top1" (one top-FPP view).
        weighting: "score" (paper) or "binary" (ablation: w = 1 where Δq > 0).
        consensus: True (paper: projector averaging + threshold) or False (ablation: top-r right
            singular vectors of the selected views' H_e stacked into one matrix).
        guard: False (paper): apply the argmax of J whatever its sign; True (the abstention
            variant, beyond the paper): no correction when the best J ≤ 0.
        seed: seed of the random view selection.
        centering: "origin" (paper: z A) or "nonmembers" (beyond the paper: m + (z − m) A with m
            the calibration non-members' mean on the block; B and J computed the same way).
    """
    cfg = CalibrationConfig(
        ranks=tuple(ranks),
        strengths=tuple(float(s) for s in strengths),
        tau=float(tau),
        n_views=n_views,
        clip_percentile=float(clip_percentile),
        view_selection=view_selection,
        weighting=weighting,
        consensus=consensus,
        guard=guard,
        seed=seed,
        centering=centering,
    )
    z0 = _as_features(z0, "z0")
    n, d = z0.shape
    if n < 2:
        raise ValueError(f"z0 has {n} calibration text(s); calibration needs at least 2")
    views = _check_views(view_features, z0.shape)
    cols = _block_indices(block, d)
    sel = _column_selector(cols, d)
    n_sel = 1 if cfg.view_selection == "top1" else cfg.n_views
    if n_sel > len(views):
        raise ValueError(
            f"n_views={n_sel} but only {len(views)} view(s) were given in view_features"
        )

    # Stage 1a: scores under e0 and every view; FPP ranking.
    q0 = _call_score(score, z0, "z0")
    delta_q = {name: _call_score(score, zv, f"view {name!r}") - q0 for name, zv in views.items()}
    fpp = {name: false_positive_pressure(dq) for name, dq in delta_q.items()}
    selected = _select_views(list(views), fpp, n_sel, cfg.view_selection, cfg.seed)
    # Stage 1b and 1c: the selected views' shifts, then a basis per candidate rank.
    shifts, directions = _view_shifts(z0, views, delta_q, selected, sel, cfg)
    bases, gammas = _candidate_bases(directions, len(selected), cfg)
    # Stage 2: J(r, λ) for every candidate and the first maximum.
    center: np.ndarray | None = None
    if cfg.centering == "nonmembers":
        center = np.zeros(d)
        center[cols] = z0[:, cols].mean(axis=0)
    objective, best, tol = _objective(z0, q0, score, bases, sel, center, cfg)
    apply_it = bases[best[0]].shape[1] > 0 and best[1] > 0.0
    if cfg.guard and objective[best] <= tol:  # the abstention variant (beyond the paper)
        apply_it = False
    basis = np.zeros((d, bases[best[0]].shape[1] if apply_it else 0))
    if apply_it:
        basis[cols] = bases[best[0]]
    return Calibration(
        fpp=fpp,
        selected_views=tuple(selected),
        shifts=tuple(shifts),
        consensus=gammas,
        basis_dims={r: int(b.shape[1]) for r, b in bases.items()},
        objective=objective,
        rank=best[0] if apply_it else None,
        strength=best[1] if apply_it else 0.0,
        basis=basis,
        block=cols,
        dim=d,
        config=cfg,
        baseline_score=float(q0.mean()),
        center=center,
    )


def _view_shifts(
    z0: np.ndarray,
    views: Mapping[str, np.ndarray],
    delta_q: Mapping[str, np.ndarray],
    selected: Sequence[str],
    sel: slice | np.ndarray,
    cfg: CalibrationConfig,
) -> tuple[list[ViewShift], list[np.ndarray]]:
    """Stage 1b: each selected view's score-guided shift matrix H_e on the block (its rows
    weighted by :func:`score_weights`) and its right singular vectors, once at the largest rank.

    Returns (the views' :class:`ViewShift` records, the directions each view contributes): with
    ``cfg.consensus`` the rows of Vᵀ (numerically non-zero part, at most max(ranks)), else H_e
    itself, to be stacked into one matrix (the ablation)."""
    r_max = max(cfg.ranks)
    shifts: list[ViewShift] = []
    directions: list[np.ndarray] = []
    for name in selected:
        w, cap = score_weights(
            delta_q[name], clip_percentile=cfg.clip_percentile, weighting=cfg.weighting
        )
        rows = np.flatnonzero(w > 0)
        h = (views[name][rows] - z0[rows])[:, sel]
        h *= np.sqrt(w[rows])[:, None]
        if cfg.consensus:
            vt, s = _right_singular(h)
            directions.append(vt[:r_max])
        else:
            s = _right_singular(h)[1]
            directions.append(h)
        shifts.append(ViewShift(name=name, n_positive=int(rows.size), cap=cap, singular_values=s))
    return shifts, directions


def _candidate_bases(
    directions: Sequence[np.ndarray], n_selected: int, cfg: CalibrationConfig
) -> tuple[dict[int, np.ndarray], dict[int, np.ndarray]]:
    """Stage 1c: (basis, γ) per candidate rank, in block coordinates: the cross-view consensus
    of the views' top-r right singular vectors (:func:`consensus_basis`), or without consensus
    the top-r right singular vectors of the stacked H_e (γ: their squared singular values)."""
    bases: dict[int, np.ndarray] = {}
    gammas: dict[int, np.ndarray] = {}
    if cfg.consensus:
        for r in dict.fromkeys(cfg.ranks):
            bases[r], gammas[r] = consensus_basis(
                [vt[:r].T for vt in directions], cfg.tau, n_views=n_selected
            )
    else:
        pooled = np.concatenate(list(directions), axis=0)
        vt_pooled, s_pooled = _right_singular(pooled)
        for r in dict.fromkeys(cfg.ranks):
            bases[r] = vt_pooled[:r].T
            gammas[r] = s_pooled[:r] ** 2
    return bases, gammas


def _objective(
    z0: np.ndarray,
    q0: np.ndarray,
    score: ScoreFn,
    bases: Mapping[int, np.ndarray],
    sel: slice | np.ndarray,
    center: np.ndarray | None,
    cfg: CalibrationConfig,
) -> tuple[dict[tuple[int, float], float], tuple[int, float], float]:
    """Stage 2: J(r, λ) = mean score decrease of the calibration non-members under the
    correction, for every candidate; (J per candidate, the first maximum in (ranks outer,
    strengths inner) order, the tolerance within which J values are ties)."""
    z0c = z0 if center is None else z0 - center  # the block columns are what B sees
    objective: dict[tuple[int, float], float] = {}
    best: tuple[int, float] | None = None
    # J values equal up to rounding are ties (the first candidate wins): a J that is 0 in exact
    # arithmetic never wins through floating-point noise
    tol = _J_TOL * max(1.0, float(np.abs(q0).mean()))
    for r in cfg.ranks:
        b = bases[r]
        shift = None  # (z0 B) Bᵀ on the block, shared by every λ of this rank
        for lam in cfg.strengths:
            if (r, lam) in objective:
                continue
            if b.shape[1] == 0 or lam == 0.0:
                j = 0.0  # A = I: the scores cannot change
            else:
                if shift is None:
                    shift = (z0c[:, sel] @ b) @ b.T
                z_corr = _subtract_in_block(z0, sel, lam * shift)
                j = float(np.mean(q0 - _call_score(score, z_corr, "corrected z0")))
            objective[(r, lam)] = j
            if best is None or j > objective[best] + tol:
                best = (r, lam)
    assert best is not None
    return objective, best, tol


# --------------------------------------------------------------------------------------------
# Validation and selection helpers
# --------------------------------------------------------------------------------------------


def _as_features(z: Any, what: str) -> np.ndarray:
    try:
        arr = np.asarray(z, dtype=np.float64)
    except (TypeError, ValueError) as exc:
        raise ValueError(f"{what} is not a numeric array: {exc}") from None
    if arr.ndim != 2:
        raise ValueError(f"{what} must be a 2-D array (n, d), got shape {arr.shape}")
    if arr.shape[1] == 0:
        raise ValueError(f"{what} has no feature columns")
    bad = ~np.isfinite(arr)
    if bad.any():
        i, j = np.argwhere(bad)[0]
        raise ValueError(
            f"{what} contains {int(bad.sum())} non-finite value(s) (NaN/inf), first at row {i}, "
            f"column {j}"
        )
    return arr


def _check_views(
    view_features: Mapping[str, np.ndarray], shape: tuple[int, int]
) -> dict[str, np.ndarray]:
    if not isinstance(view_features, Mapping):
        raise ValueError("view_features must be a mapping view name -> (n, d) array")
    if not view_features:
        raise ValueError("view_features is empty: calibration needs at least one controlled view")
    out: dict[str, np.ndarray] = {}
    for name, z in view_features.items():
        arr = _as_features(z, f"view {name!r}")
        if arr.shape != shape:
            raise ValueError(
                f"view {name!r} has shape {arr.shape}, but z0 has shape {shape}: each view must "
                "hold the same texts (rows) and feature columns as z0"
            )
        out[str(name)] = arr
    return out


def _block_indices(block: Any, d: int) -> np.ndarray:
    if block is None:
        return np.arange(d)
    if isinstance(block, slice):
        idx = np.arange(d)[block]
    else:
        arr = np.asarray(block)
        if arr.dtype == bool:
            if arr.shape != (d,):
                raise ValueError(f"block mask must have length d={d}, got shape {arr.shape}")
            idx = np.flatnonzero(arr)
        else:
            if arr.ndim != 1 or (arr.size and not np.issubdtype(arr.dtype, np.integer)):
                raise ValueError("block must be None, a slice, a boolean mask or integer indices")
            idx = arr.astype(np.intp)
            out_of_range = idx[(idx < 0) | (idx >= d)]
            if out_of_range.size:
                raise ValueError(
                    f"block index {int(out_of_range[0])} is out of range for d={d} "
                    f"({out_of_range.size} out-of-range index(es))"
                )
            if np.unique(idx).size != idx.size:
                raise ValueError("block contains duplicate column indices")
    if idx.size == 0:
        raise ValueError("block selects no columns")
    return np.sort(idx)


def _call_score(score: ScoreFn, z: np.ndarray, what: str) -> np.ndarray:
    q = np.asarray(score(z), dtype=np.float64)
    if q.ndim == 2 and q.shape[1] == 1:
        q = q[:, 0]
    if q.shape != (z.shape[0],):
        raise ValueError(
            f"score returned shape {q.shape} for {what} with {z.shape[0]} rows; "
            f"expected ({z.shape[0]},)"
        )
    if not np.all(np.isfinite(q)):
        raise ValueError(f"score returned non-finite values for {what}")
    return q


def _select_views(
    names: list[str], fpp: Mapping[str, float], k: int, how: ViewSelection, seed: int
) -> list[str]:
    if how == "random":
        rng = np.random.default_rng(seed)
        return [names[i] for i in rng.choice(len(names), size=k, replace=False)]
    # Largest FPP first; a stable sort keeps mapping order among ties.
    order = sorted(range(len(names)), key=lambda i: -fpp[names[i]])
    return [names[i] for i in order[:k]]
