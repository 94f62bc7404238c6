"""The field's standard attacks (issue 49) against their published definitions, on cases
computed by hand; the full detectors run through tests/test_detector_contract.py."""

from __future__ import annotations

import math
import zlib

import numpy as np
import pytest

from calibdcd.detectors.attacks.loss import loss_score
from calibdcd.detectors.attacks.mink import lowest_k_mean, mink_score
from calibdcd.detectors.attacks.minkpp import minkpp_score, minkpp_token_scores
from calibdcd.detectors.attacks.zlib_ratio import zlib_entropy, zlib_score

LP = np.array([-0.5, -3.0, -1.0, -0.1, -2.0, -0.2, -4.0, -0.3, -0.6, -1.5])


def test_loss_is_the_mean_token_log_likelihood():
    # (-0.5 - 3 - 1 - 0.1 - 2 - 0.2 - 4 - 0.3 - 0.6 - 1.5) / 10 = -13.2 / 10
    assert loss_score(LP) == pytest.approx(-1.32)
    assert math.isnan(loss_score(np.array([])))


def test_zlib_divides_the_loss_by_the_compressed_length():
    text = "the cat sat on the mat " * 4
    assert zlib_entropy(text) == len(zlib.compress(text.encode("utf-8")))
    # Carlini et al.: log-perplexity over zlib entropy; the score is its negative
    assert zlib_score(LP, text) == pytest.approx(-1.32 / zlib_entropy(text))


def test_mink_averages_the_lowest_k_fraction():
    # k = 20 % of 10 tokens: the 2 lowest, -4.0 and -3.0
    assert mink_score(LP, 0.2) == pytest.approx(-3.5)
    # k = 50 %: -4, -3, -2, -1.5, -1
    assert mink_score(LP, 0.5) == pytest.approx(-11.5 / 5)
    # at least one token, however short the text
    assert lowest_k_mean(np.array([-1.0, -2.0, -0.5]), 0.2) == pytest.approx(-2.0)
    assert mink_score(LP, 1.0) == pytest.approx(loss_score(LP))


def test_minkpp_normalises_each_token_by_its_positions_distribution():
    lp = np.array([-1.0, -2.0, -0.5, -3.0, -1.0])
    mu = np.array([-1.5, -1.0, -1.0, -2.0, -2.0])
    var = np.array([0.25, 1.0, 0.25, 4.0, 1.0])
    # (lp - mu) / sigma = 0.5/0.5, -1/1, 0.5/0.5, -1/2, 1/1 = 1, -1, 1, -0.5, 1
    np.testing.assert_allclose(minkpp_token_scores(lp, mu, var), [1.0, -1.0, 1.0, -0.5, 1.0])
    # k = 40 % of 5: the 2 lowest normalised scores, -1 and -0.5
    assert minkpp_score(lp, mu, var, 0.4) == pytest.approx(-0.75)
    # a member-like text (every token above its position's mean) scores higher
    assert minkpp_score(mu + 0.5, mu, var, 0.4) > minkpp_score(mu - 0.5, mu, var, 0.4)
