"""ReCaLL (Xie et al., EMNLP 2024, "ReCaLL: Membership Inference via Relative Conditional
Log-Likelihoods").

``ReCaLL(x) = LL(x | P) / LL(x)``: the mean token log-likelihood of ``x`` after a prefix ``P`` of
known non-member texts over its unconditional one. Conditioning a member on non-member context
lowers its likelihood more than a non-member's, so the ratio (of two negative numbers) is higher
for members: the score is the ratio itself (the official code's ``ll_nonmember / ll``, ranked
as it is).

``P`` is ``shots`` known non-member texts (each truncated as the scored texts are, to
``max_words``) drawn with ``seed`` from the texts handed to :meth:`ReCaLL.use_nonmembers`, in
their given order, each followed by a blank line. The caller hands labelled non-members that are
never evaluated: in an experiment the supervised split's, in a fitted detector the fit's
supervised ones (docs/interpretations.md). A text is scored twice, each one scoring request:
after the view's prefix (``LL(x)``) and after the view's prefix then ``P`` (``LL(x | P)``).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from calibdcd.detectors.attacks.common import AttackConfig, LogprobAttack
from calibdcd.detectors.attacks.loss import loss_score
from calibdcd.detectors.base import NeedsNonMembers

__all__ = ["ReCaLL", "build_prefix", "recall_score"]


def recall_score(conditional: np.ndarray, unconditional: np.ndarray) -> float:
    """``LL(x | P) / LL(x)`` from the token log-probabilities of ``x`` after ``P`` and alone
    (NaN when either has no token or ``LL(x)`` is 0)."""
    cond, plain = loss_score(conditional), loss_score(unconditional)
    if not (math.isfinite(cond) and math.isfinite(plain)) or plain == 0.0:
        return math.nan
    return cond / plain


def build_prefix(nonmembers: Sequence[str], shots: int, seed: int) -> str:
    """``shots`` of ``nonmembers`` drawn without replacement (``seed``), in their given order,
    each followed by a blank line; a ValueError when fewer are given."""
    if len(nonmembers) < shots:
        raise ValueError(
            f"ReCaLL needs {shots} known non-member texts for its prefix (shots), got "
            f"{len(nonmembers)}"
        )
    pick = np.random.default_rng(seed).choice(len(nonmembers), size=shots, replace=False)
    return "".join(nonmembers[int(i)] + "\n\n" for i in sorted(pick))


class ReCaLL(LogprobAttack, NeedsNonMembers):
    """ReCaLL as a detector: one feature column, the ratio; no learnt classifier. Its known
    non-members come through :class:`~calibdcd.detectors.adapter.DetectorAdapter`."""

    statistics = ("recall",)
    #: scoring requests a text: ``LL(x)`` and ``LL(x | P)`` (a dry run's estimate)
    queries_per_text = 2

    def __init__(self, config: AttackConfig | None = None) -> None:
        super().__init__(config)
        #: the non-member prefix P (None until :meth:`use_nonmembers`)
        self.prefix: str | None = None

    def use_nonmembers(self, texts: list[str]) -> None:
        """Draw the prefix from the known non-members ``texts`` (every later ``extract``)."""
        cfg = self.config
        self.prefix = build_prefix([self.query(t) for t in texts], cfg.shots, cfg.seed)

    def features_of(self, scored: Sequence[str], target: Any, head: str) -> np.ndarray:
        """The ratio column: each text scored after ``head`` and after ``head`` then P."""
        if self.prefix is None:
            raise ValueError(
                "ReCaLL has no non-member prefix: hand it known non-members first "
                "(DetectorAdapter.use_nonmembers)"
            )
        plain = self.token_rows(scored, target, [head] * len(scored))
        cond = self.token_rows(scored, target, [head + self.prefix] * len(scored))
        vals = [recall_score(c.logprobs, p.logprobs) for c, p in zip(cond, plain, strict=True)]
        return np.asarray(vals, dtype=np.float64)[:, None]
