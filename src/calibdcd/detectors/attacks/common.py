"""What the score-only attacks share: their config, their non-learning classifier and the
gray-box detector that turns a target's token log-probabilities into one statistic a text.

Views: a view wraps the query e0, and a gray-box attack's query is the text itself (ReCaLL's:
its non-member prefix, then the text). Under a view the text is scored after the view's prefix
(``view.prefix``): its log-probabilities conditioned on the wrapping that precedes it; the view's
suffix comes after the text and cannot change them (a causal LM), so it is not sent.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence
from typing import Any, Literal

import numpy as np

from calibdcd.detectors.attacks.loss import loss_score
from calibdcd.detectors.attacks.mink import mink_score
from calibdcd.detectors.attacks.minkpp import minkpp_score
from calibdcd.detectors.attacks.zlib_ratio import zlib_score
from calibdcd.detectors.base import Features, PersistableClassifier
from calibdcd.targets.logprobs import LogprobQuery, TextLogprobs, TokenLogprobs

__all__ = [
    "GRAYBOX",
    "STATISTICS",
    "AttackConfig",
    "GrayBoxDetector",
    "LogprobAttack",
    "ScoreClassifier",
    "truncate_words",
]

Statistic = Literal["loss", "zlib", "mink", "mink++", "recall"]
#: the one-pass gray-box attacks (registered names): one statistic of one scoring request a text
GRAYBOX: tuple[str, ...] = ("loss", "zlib", "mink", "mink++")
#: every statistic an :class:`AttackConfig` names: the one-pass ones and ReCaLL's ratio of two
#: passes (:mod:`calibdcd.detectors.attacks.recall`)
STATISTICS: tuple[str, ...] = (*GRAYBOX, "recall")


@dataclasses.dataclass(frozen=True)
class AttackConfig:
    """A gray-box attack's parameters. ``statistic`` is fixed by the registered name; the other
    fields are shared, each used by the attacks that name it (an unused field still keys the
    feature cache, so leave it at its default):

    * ``max_words``: the text is scored on its first ``max_words`` whitespace words (all);
    * ``k``: Min-K% and Min-K%++'s fraction of lowest tokens (their papers' 20%);
    * ``top_k``: alternatives a server lists per position for Min-K%++'s moments (``hf``:
      exact, whatever it is);
    * ``shots``, ``seed``: ReCaLL's number of known non-member texts in its prefix and their
      draw (:mod:`calibdcd.detectors.attacks.recall`).
    """

    statistic: Statistic = "loss"
    max_words: int = 256
    k: float = 0.2
    top_k: int = 20
    shots: int = 5
    seed: int = 0

    def __post_init__(self) -> None:
        if self.statistic not in STATISTICS:
            raise ValueError(
                f"statistic must be one of {', '.join(STATISTICS)}, got {self.statistic!r}"
            )
        for name in ("max_words", "top_k", "shots"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ValueError(f"{name} must be an integer >= 1, got {v!r}")
        if isinstance(self.k, bool) or not (0.0 < float(self.k) <= 1.0):
            raise ValueError(f"k must lie in (0, 1], got {self.k!r}")
        if isinstance(self.seed, bool) or not isinstance(self.seed, int):
            raise ValueError(f"seed must be an integer, got {self.seed!r}")

    @property
    def alternatives(self) -> int:
        """The top-k alternatives requested per position (Min-K%++ only)."""
        return self.top_k if self.statistic == "mink++" else 0


def truncate_words(text: str, max_words: int) -> str:
    """The text's first ``max_words`` whitespace words, joined by single spaces (the text as
    it is when it has no more)."""
    words = text.split()
    return text if len(words) <= max_words else " ".join(words[:max_words])


class ScoreClassifier(PersistableClassifier):
    """The classifier of a score-only attack: it learns nothing; ``score`` is the attack's
    statistic (feature column 0, signed so that higher = member)."""

    def __init__(self) -> None:
        self.dim: int | None = None

    def fit(self, z: np.ndarray, labels: np.ndarray) -> ScoreClassifier:
        z = np.asarray(z, dtype=np.float64)
        if z.ndim != 2 or z.shape[1] < 1 or np.shape(labels) != (z.shape[0],):
            raise ValueError(f"z must be (n, d>=1) with one label per row, got {z.shape}")
        self.dim = int(z.shape[1])
        return self

    def score(self, z: np.ndarray) -> np.ndarray:
        z = np.asarray(z, dtype=np.float64)
        if self.dim is None:
            raise ValueError("the classifier is not fitted: call fit first")
        if z.ndim != 2 or z.shape[1] != self.dim:
            raise ValueError(f"z must be (n, {self.dim}), got {z.shape}")
        return z[:, 0].copy()

    def state(self) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
        if self.dim is None:
            raise ValueError("the classifier is not fitted: call fit first")
        return {}, {"dim": self.dim}

    @classmethod
    def from_state(cls, arrays: Mapping[str, np.ndarray], meta: Mapping[str, Any]) -> Any:
        clf = cls()
        clf.dim = int(meta["dim"])
        return clf


def token_rows(
    name: str, target: Any, texts: Sequence[str], prefixes: Sequence[str], alternatives: int
) -> list[TextLogprobs]:
    """Gray-box detector ``name``'s one way to ask a target for the token log-probabilities of
    ``texts`` after ``prefixes`` (``alternatives`` top-k per position): a ValueError naming the
    detector when the target cannot give them, or gives another number of rows."""
    if not isinstance(target, TokenLogprobs):
        raise ValueError(
            f"detector {name!r} needs a target that returns token log-probabilities "
            f"(backend hf, or a server answering echo + logprobs); {type(target).__name__} "
            "does not"
        )
    rows = target.token_logprobs(list(texts), list(prefixes), alternatives)
    if len(rows) != len(texts):
        raise ValueError(f"target returned {len(rows)} rows for {len(texts)} texts")
    return rows


def statistic(cfg: AttackConfig, row: TextLogprobs, text: str) -> float:
    """The attack's score of one text from its token log-probabilities (higher = member)."""
    if not row.logprobs.size:
        return math.nan
    if cfg.statistic == "loss":
        return loss_score(row.logprobs)
    if cfg.statistic == "zlib":
        return zlib_score(row.logprobs, text)
    if cfg.statistic == "mink":
        return mink_score(row.logprobs, cfg.k)
    if cfg.statistic == "mink++":
        if row.mean is None or row.var is None:
            raise ValueError("Min-K%++ needs the per-position mean and variance (top_k > 0)")
        return minkpp_score(row.logprobs, row.mean, row.var, cfg.k)
    raise ValueError(f"statistic {cfg.statistic!r} is not a one-pass statistic")


class GrayBoxDetector:
    """What every gray-box detector shares (the score-only attacks, ReCaLL, logprofile): its
    query is the text's first ``config.max_words`` words, scored by the target after the view's
    prefix (one scoring request a text, ``config.alternatives`` top-k per position); a subclass
    gives ``name``, ``config``, ``blocks`` and :meth:`row_features`, the features of the texts
    from their token log-probabilities."""

    calibration_blocks: tuple[str, ...] | None = None
    cache_version: int | None = None
    name: str
    config: Any

    @property
    def blocks(self) -> dict[str, slice]:  # pragma: no cover - every subclass gives its own
        raise NotImplementedError

    @property
    def generation_kinds(self) -> dict[str, LogprobQuery]:
        """One scoring request a text (a server: echo, no new token)."""
        return {"score": LogprobQuery(alternatives=self.config.alternatives)}

    def query(self, text: str) -> str:
        return truncate_words(text, self.config.max_words)

    def token_rows(
        self, texts: Sequence[str], target: Any, prefixes: Sequence[str]
    ) -> list[TextLogprobs]:
        """The target's token log-probabilities of ``texts`` after ``prefixes``."""
        return token_rows(self.name, target, texts, prefixes, self.config.alternatives)

    def row_features(self, rows: Sequence[TextLogprobs], scored: Sequence[str]) -> np.ndarray:
        """The ``(n, d)`` features of the scored texts from their rows."""
        raise NotImplementedError  # pragma: no cover - every subclass gives its own

    def features_of(self, scored: Sequence[str], target: Any, head: str) -> np.ndarray:
        """The ``(n, d)`` features of the scored texts, each scored after ``head`` (the view's
        prefix): one scoring request a text, then :meth:`row_features`."""
        return self.row_features(self.token_rows(scored, target, [head] * len(scored)), scored)

    def extract(self, texts: Sequence[str], target: Any, view: Any | None = None) -> Features:
        if isinstance(texts, str) or not texts:
            raise ValueError("texts must be a non-empty sequence of strings")
        scored = [self.query(t) for t in texts]
        head = "" if view is None else view.prefix
        return Features(self.features_of(scored, target, head), dict(self.blocks))


class LogprobAttack(GrayBoxDetector):
    """A gray-box attack: features = one column, its statistic of each text's token
    log-probabilities from the target (:class:`~calibdcd.targets.logprobs.TokenLogprobs`)."""

    #: the statistics this class computes (ReCaLL's is its own class)
    statistics: tuple[str, ...] = GRAYBOX

    def __init__(self, config: AttackConfig | None = None) -> None:
        self.config = config or AttackConfig(statistic=self.statistics[0])  # type: ignore[arg-type]
        if self.config.statistic not in self.statistics:
            raise ValueError(
                f"{type(self).__name__} computes {', '.join(self.statistics)}, not "
                f"{self.config.statistic!r}"
            )
        self.name = self.config.statistic

    @property
    def blocks(self) -> dict[str, slice]:
        return {"score": slice(0, 1)}

    def new_classifier(self, seed: int = 0) -> ScoreClassifier:
        return ScoreClassifier()

    def row_features(self, rows: Sequence[TextLogprobs], scored: Sequence[str]) -> np.ndarray:
        vals = [statistic(self.config, r, t) for r, t in zip(rows, scored, strict=True)]
        return np.asarray(vals, dtype=np.float64)[:, None]
