"""The paper's data protocol as a pure, seeded function: subsample, supervised split, calibration
non-members, evaluation pool.

Steps (all indices refer to positions in the benchmark's ``samples``):

1. **Subsample** to the paper's data-table size (:data:`~calibdcd.data.benchmarks.PAPER_SIZES`:
   BookTection 2,000, BookMIA 2,000, arXivTection 1,548, WikiMIA 542) or to a given size.
   ``balance="equal"`` (default) draws ``size // 2`` texts per class (the extra one of an odd size
   goes to the members); this is what the paper's table shows for BookTection and BookMIA
   (evaluation pool 950/950 after 50/50 supervised). ``balance="stratified"`` keeps the class
   proportions (members get ``round(size * p_member)``). When the benchmark has at most
   ``size`` texts, all are kept (arXivTection 1,548 and WikiMIA 542 are complete sets); if it has
   fewer than ``size`` a warning says so.
2. **Supervised split**: ``n_supervised_per_class`` members and as many non-members (50 + 50).
3. **Calibration non-members**: ``floor(calibration_fraction * R)`` of the ``R`` non-members left
   after step 2 ("approximately half of the remaining known non-members"; e.g. WikiMIA
   R = 258 - 50 = 208 -> 104, BookTection R = 950 -> 475, arXivTection R = 736 -> 368), or
   exactly ``n_calibration`` when given.
4. **Evaluation pool**: every subsampled text outside the supervised split. With
   ``protocol="paper"`` the calibration non-members stay in it, as in the paper (its table's pools
   are total minus supervised); with ``protocol="strict"`` they are removed, so no evaluation
   text was seen by the calibration.

**Group-aware split** (``group_by``, a setting; off by default, the paper splits by text): each
sample's group (``meta[group_by]``: the book of a BookTection/BookMIA passage, the paper of an
arXivTection passage; the loaders put it in ``meta["group"]``) decides whole-group membership of
the supervised split. Step 2 then draws groups in a seeded order, per class, until the chosen
groups hold ``n_supervised_per_class`` texts of that class, and takes exactly that many texts
from them; every other text of a chosen group is left out of the evaluation pool and the
calibration (``Split.excluded``), so no group sits in both the supervised split and the pool.
Steps 1, 3 and 4 are unchanged on the remaining texts; a split that cannot be made (a class
whose groups would all be consumed by the supervised split) fails with an error naming the
group counts.

Each step draws from its own random stream derived from ``seed`` (numpy ``SeedSequence`` with a
per-step key), so e.g. changing the calibration fraction does not change the supervised split.
Index arrays are sorted ascending.
"""

from __future__ import annotations

import dataclasses
import math
import warnings
from collections.abc import Sequence
from typing import Literal

import numpy as np

from calibdcd.data.benchmarks import PAPER_SIZES, benchmark_spec
from calibdcd.data.types import Benchmark

__all__ = [
    "ProtocolName",
    "Split",
    "SplitConfig",
    "make_split",
    "resolve_subsample_size",
    "split_benchmark",
    "stratified_draw",
    "subsample",
]

ProtocolName = Literal["paper", "strict"]
Balance = Literal["equal", "stratified"]

# stream keys of the steps
_SUBSAMPLE, _SUPERVISED, _CALIBRATION = 0, 1, 2


@dataclasses.dataclass(frozen=True)
class SplitConfig:
    """Settings of the data protocol (defaults = the paper's).

    ``subsample``: ``"paper"`` (the paper's size for the benchmark, all texts for others), an
    int, or None (no subsampling).
    """

    protocol: ProtocolName = "paper"
    subsample: int | Literal["paper"] | None = "paper"
    balance: Balance = "equal"
    n_supervised_per_class: int = 50
    calibration_fraction: float = 0.5
    n_calibration: int | None = None
    #: sample meta field whose value is the text's group (book, paper); None = split by text
    group_by: str | None = None
    #: the seed of step 1 (the subsample): None = the split's seed (the paper: each seed draws
    #: its own subsample); an int = one subsample for every seed, so seeds vary the supervised
    #: split, the calibration texts and the classifiers over the same texts (and share their
    #: generations: a real model's run costs one subsample's queries, not one per seed)
    subsample_seed: int | None = None

    def __post_init__(self) -> None:
        if self.protocol not in ("paper", "strict"):
            raise ValueError(f"protocol must be 'paper' or 'strict', got {self.protocol!r}")
        if self.balance not in ("equal", "stratified"):
            raise ValueError(f"balance must be 'equal' or 'stratified', got {self.balance!r}")
        if not (
            self.subsample is None
            or self.subsample == "paper"
            or (
                isinstance(self.subsample, int)
                and not isinstance(self.subsample, bool)
                and self.subsample >= 2
            )
        ):
            raise ValueError(
                f"subsample must be 'paper', None or an int >= 2, got {self.subsample!r}"
            )
        n = self.n_supervised_per_class
        if isinstance(n, bool) or not isinstance(n, int) or n < 1:
            raise ValueError(f"n_supervised_per_class must be an int >= 1, got {n!r}")
        if not (0.0 < self.calibration_fraction < 1.0):
            raise ValueError(
                f"calibration_fraction must be in (0, 1), got {self.calibration_fraction!r}"
            )
        c = self.n_calibration
        if c is not None and (isinstance(c, bool) or not isinstance(c, int) or c < 1):
            raise ValueError(f"n_calibration must be None or an int >= 1, got {c!r}")
        g = self.group_by
        if g is not None and (not isinstance(g, str) or not g):
            raise ValueError(f"group_by must be None or a meta field name, got {g!r}")
        s = self.subsample_seed
        if s is not None and (isinstance(s, bool) or not isinstance(s, int)):
            raise ValueError(f"subsample_seed must be None or an int, got {s!r}")


@dataclasses.dataclass(frozen=True)
class Split:
    """The protocol's result: sorted int64 index arrays into the benchmark's samples.

    Invariants (checked on construction): every part lies in ``subsample``; supervised is
    disjoint from calibration and evaluation; calibration holds non-members only; with
    ``protocol="paper"`` calibration lies inside evaluation, with ``"strict"`` it is disjoint
    from it; evaluation holds both classes.
    """

    subsample: np.ndarray
    supervised: np.ndarray
    calibration: np.ndarray
    evaluation: np.ndarray
    labels: np.ndarray  # labels of the whole benchmark, 1 = member
    protocol: ProtocolName
    seed: int
    ids: tuple[str, ...] | None = None  # sample ids of the whole benchmark, when known
    #: group-aware split: subsample texts left out of the pool because their group is in the
    #: supervised split (empty otherwise)
    excluded: np.ndarray = dataclasses.field(default_factory=lambda: np.zeros(0, np.int64))

    def __post_init__(self) -> None:
        for part in ("subsample", "supervised", "calibration", "evaluation", "labels", "excluded"):
            arr = np.asarray(getattr(self, part), dtype=np.int64)
            arr.setflags(write=False)
            object.__setattr__(self, part, arr)
        n = len(self.labels)
        sub = set(self.subsample.tolist())
        sup, cal, ev = (
            set(a.tolist()) for a in (self.supervised, self.calibration, self.evaluation)
        )
        for part, s in (("supervised", sup), ("calibration", cal), ("evaluation", ev)):
            arr = getattr(self, part)
            if len(s) != len(arr):
                raise ValueError(f"Split.{part} repeats indices")
            if not s <= sub:
                raise ValueError(f"Split.{part} has indices outside the subsample")
        if any(i < 0 or i >= n for i in sub):
            raise ValueError("Split.subsample has indices outside the benchmark")
        if sup & cal or sup & ev:
            raise ValueError("Split.supervised overlaps calibration or evaluation")
        exc = set(self.excluded.tolist())
        if exc & (sup | cal | ev) or not exc <= sub:
            raise ValueError("Split.excluded must be subsample texts outside every part")
        if cal and self.labels[self.calibration].any():
            raise ValueError("Split.calibration contains members")
        if self.protocol == "paper" and not cal <= ev:
            raise ValueError("protocol 'paper' keeps calibration texts in the evaluation pool")
        if self.protocol == "strict" and cal & ev:
            raise ValueError("protocol 'strict' removes calibration texts from the evaluation pool")
        if self.ids is not None and len(self.ids) != n:
            raise ValueError("Split.ids must have one id per benchmark sample")

    def part(self, name: str) -> np.ndarray:
        if name not in ("subsample", "supervised", "calibration", "evaluation"):
            raise ValueError(f"unknown split part {name!r}")
        return getattr(self, name)

    def part_ids(self, name: str) -> list[str]:
        """Sample ids of one part (needs ``ids``)."""
        if self.ids is None:
            raise ValueError("this Split was made from labels only; it has no ids")
        return [self.ids[i] for i in self.part(name)]

    def part_labels(self, name: str) -> np.ndarray:
        return self.labels[self.part(name)]

    def to_dict(self) -> dict[str, object]:
        """A JSON-ready record of the split (sample ids when known, else indices), for run
        directories."""
        out: dict[str, object] = {"protocol": self.protocol, "seed": self.seed}
        for name in ("subsample", "supervised", "calibration", "evaluation"):
            out[name] = self.part_ids(name) if self.ids is not None else self.part(name).tolist()
        if self.excluded.size:
            ex = self.excluded
            out["excluded"] = [self.ids[i] for i in ex] if self.ids is not None else ex.tolist()
        return out

    def sizes(self) -> dict[str, tuple[int, int, int]]:
        """``part -> (total, members, non-members)`` for the four parts."""
        out = {}
        for name in ("subsample", "supervised", "calibration", "evaluation"):
            lab = self.part_labels(name)
            n1 = int(lab.sum())
            out[name] = (len(lab), n1, len(lab) - n1)
        return out


def _rng(seed: int, step: int) -> np.random.Generator:
    return np.random.default_rng(np.random.SeedSequence([int(seed), step]))


def _choose(rng: np.random.Generator, pool: np.ndarray, k: int) -> np.ndarray:
    return np.sort(rng.choice(pool, size=k, replace=False)) if k < len(pool) else np.sort(pool)


def stratified_draw(
    rng: np.random.Generator, pools: Sequence[np.ndarray], counts: Sequence[int]
) -> np.ndarray:
    """The project's one splitting primitive: sorted indices of ``counts[c]`` items drawn
    without replacement from each ``pools[c]`` (e.g. members then non-members), in that order
    from the one generator ``rng`` (a pool no larger than its count is taken whole and uses no
    randomness). The subsample, the supervised split and the calibration split of the protocol
    are draws of this; benchmarks/ scripts split through :func:`make_split`."""
    if len(pools) != len(counts):
        raise ValueError(f"{len(pools)} pools but {len(counts)} counts")
    parts = [_choose(rng, np.asarray(p), int(k)) for p, k in zip(pools, counts, strict=True)]
    if not parts:
        return np.zeros(0, dtype=np.int64)
    return np.sort(np.concatenate(parts))


def subsample(
    labels: np.ndarray,
    size: int | None,
    *,
    seed: int = 0,
    balance: Balance = "equal",
    name: str = "benchmark",
) -> np.ndarray:
    """Sorted indices of a seeded, class-aware subsample of ``size`` texts (all when ``size`` is
    None or not smaller than ``len(labels)``)."""
    labels = _check_labels(labels, name)
    n = len(labels)
    if size is None or size >= n:
        if size is not None and size > n:
            warnings.warn(
                f"{name}: has {n} texts, fewer than the requested subsample of {size}; using all",
                UserWarning,
                stacklevel=2,
            )
        return np.arange(n, dtype=np.int64)
    members = np.flatnonzero(labels == 1)
    non_members = np.flatnonzero(labels == 0)
    if balance == "equal":
        k1 = size - size // 2
        k0 = size // 2
    elif balance == "stratified":
        k1 = round(size * len(members) / n)
        k0 = size - k1
    else:
        raise ValueError(f"balance must be 'equal' or 'stratified', got {balance!r}")
    for cls, k, pool in (("members", k1, members), ("non-members", k0, non_members)):
        if k > len(pool):
            raise ValueError(
                f"{name}: a {balance} subsample of {size} needs {k} {cls} but the benchmark has "
                f"{len(pool)} (members {len(members)}, non-members {len(non_members)}); "
                "use a smaller subsample or balance='stratified'"
            )
    picked = stratified_draw(_rng(seed, _SUBSAMPLE), (members, non_members), (k1, k0))
    return picked.astype(np.int64)


def _check_labels(labels: np.ndarray, name: str) -> np.ndarray:
    arr = np.asarray(labels)
    if arr.ndim != 1 or len(arr) == 0:
        raise ValueError(f"{name}: labels must be a non-empty 1-d array")
    if not np.isin(arr, (0, 1)).all():
        raise ValueError(f"{name}: labels must all be 0 or 1")
    return arr.astype(np.int64)


def _grouped_supervised(
    rng: np.random.Generator,
    pool: np.ndarray,
    groups: np.ndarray,
    k: int,
    cls: str,
    name: str,
) -> tuple[np.ndarray, np.ndarray]:
    """k texts of ``pool`` drawn from whole groups (seeded group order); returns (chosen, every
    text of ``pool`` in a chosen group)."""
    order = rng.permutation(np.unique(groups[pool]))
    taken: list[np.ndarray] = []
    n = 0
    for g in order:
        members_g = pool[groups[pool] == g]
        taken.append(members_g)
        n += members_g.size
        if n >= k:
            break
    used = np.sort(np.concatenate(taken))
    if len(taken) == len(order) and cls == "non-members":
        raise ValueError(
            f"{name}: group-aware split: the supervised split's {k} non-members take all "
            f"{len(order)} non-member group(s) of the subsample; none is left for calibration "
            "and the evaluation pool (use fewer supervised texts or more groups)"
        )
    if len(taken) == len(order):
        raise ValueError(
            f"{name}: group-aware split: the supervised split's {k} {cls} take all "
            f"{len(order)} {cls[:-1]} group(s) of the subsample; none is left for the "
            "evaluation pool"
        )
    return stratified_draw(rng, (used,), (k,)), used


def make_split(
    labels: np.ndarray,
    config: SplitConfig = SplitConfig(),
    *,
    seed: int = 0,
    subsample_size: int | None = None,
    name: str = "benchmark",
    ids: tuple[str, ...] | None = None,
    groups: Sequence[object] | None = None,
) -> Split:
    """The protocol on a label array. ``subsample_size`` is the resolved size (``config.subsample``
    must already be turned into an int or None; :func:`split_benchmark` does that). ``groups``
    (one hashable per text) makes the supervised split group-aware (see the module doc)."""
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)):
        raise ValueError(f"seed must be an int, got {seed!r}")
    labels = _check_labels(labels, name)
    sub_seed = seed if config.subsample_seed is None else config.subsample_seed
    sub = subsample(labels, subsample_size, seed=sub_seed, balance=config.balance, name=name)
    sub_labels = labels[sub]
    members, non_members = sub[sub_labels == 1], sub[sub_labels == 0]
    k = config.n_supervised_per_class
    for cls, pool, need in (("members", members, k), ("non-members", non_members, k + 1)):
        if len(pool) < need:
            extra = " (plus at least 1 left for calibration)" if cls == "non-members" else ""
            raise ValueError(
                f"{name}: the supervised split needs {k} {cls}{extra} but the "
                f"{'subsample' if len(sub) < len(labels) else 'benchmark'} has {len(pool)} "
                f"(n_supervised_per_class={k})"
            )
    rng = _rng(seed, _SUPERVISED)
    excluded = np.zeros(0, dtype=np.int64)
    if groups is None:
        sup = stratified_draw(rng, (members, non_members), (k, k))
    else:
        if len(groups) != len(labels):
            raise ValueError(f"{name}: {len(groups)} group ids for {len(labels)} texts")
        _, gid = np.unique(np.array([str(g) for g in groups], dtype=object), return_inverse=True)
        s1, used1 = _grouped_supervised(rng, members, gid, k, "members", name)
        s0, used0 = _grouped_supervised(rng, non_members, gid, k, "non-members", name)
        sup = np.sort(np.concatenate([s1, s0]))
        chosen_groups = np.unique(gid[np.r_[used1, used0]])
        in_chosen = sub[np.isin(gid[sub], chosen_groups)]
        excluded = np.setdiff1d(in_chosen, sup)
        # a group with both labels: its texts of the other class leave the pool too
        members = np.setdiff1d(members, excluded)
        non_members = np.setdiff1d(non_members, excluded)
    remaining_nm = np.setdiff1d(non_members, sup)
    if config.n_calibration is not None:
        n_cal = config.n_calibration
        if n_cal > len(remaining_nm):
            raise ValueError(
                f"{name}: n_calibration={n_cal} but only {len(remaining_nm)} non-members remain "
                "after the supervised split"
            )
    else:
        n_cal = math.floor(config.calibration_fraction * len(remaining_nm))
        if n_cal < 1:
            raise ValueError(
                f"{name}: calibration_fraction={config.calibration_fraction} of the "
                f"{len(remaining_nm)} remaining non-members leaves no calibration non-member"
            )
    cal = stratified_draw(_rng(seed, _CALIBRATION), (remaining_nm,), (n_cal,))
    evaluation = np.setdiff1d(np.setdiff1d(sub, sup), excluded)
    if config.protocol == "strict":
        evaluation = np.setdiff1d(evaluation, cal)
    ev_labels = labels[evaluation]
    if not (ev_labels == 1).any() or not (ev_labels == 0).any():
        raise ValueError(
            f"{name}: the evaluation pool ({len(evaluation)} texts) lacks a class "
            f"(members {int(ev_labels.sum())}); the benchmark is too small for this protocol"
        )
    return Split(
        subsample=sub,
        supervised=sup,
        calibration=cal,
        evaluation=evaluation,
        labels=labels,
        protocol=config.protocol,
        seed=int(seed),
        ids=ids,
        excluded=excluded,
    )


#: the paper's WikiMIA size (542) is the length-64 subset's size; other lengths are used whole
_PAPER_SUBSETS = {"wikimia": "length64"}


def resolve_subsample_size(
    config: SplitConfig, benchmark_name: str, subset: str | None = None
) -> int | None:
    """``config.subsample`` as a size: ``"paper"`` -> the paper's size for the benchmark (None,
    i.e. everything, when the benchmark or subset is not in the paper's table)."""
    if config.subsample != "paper":
        return config.subsample
    spec = benchmark_spec(benchmark_name)
    if spec is None or spec.name not in PAPER_SIZES:
        return None
    wanted = _PAPER_SUBSETS.get(spec.name)
    if wanted is not None and subset is not None and subset != wanted:
        return None
    return PAPER_SIZES[spec.name]


def split_benchmark(
    benchmark: Benchmark,
    config: SplitConfig = SplitConfig(),
    *,
    seed: int = 0,
) -> Split:
    """:func:`make_split` on a :class:`Benchmark` (paper size looked up by its name; groups from
    ``meta[config.group_by]`` when set)."""
    groups = None
    if config.group_by is not None:
        field = config.group_by
        missing = [s.id for s in benchmark.samples if s.meta.get(field) in (None, "")]
        if missing:
            have = sorted({k for s in benchmark.samples[:50] for k in s.meta})
            raise ValueError(
                f"{benchmark.key}: split.group_by={field!r} but {len(missing)} of "
                f"{len(benchmark)} texts have no meta {field!r} (first: id {missing[0]!r}); "
                f"meta fields present: {have or 'none'}"
            )
        groups = [s.meta[field] for s in benchmark.samples]
    return make_split(
        benchmark.labels,
        config,
        seed=seed,
        subsample_size=resolve_subsample_size(config, benchmark.name, benchmark.subset),
        name=benchmark.key,
        ids=tuple(benchmark.ids),
        groups=groups,
    )
