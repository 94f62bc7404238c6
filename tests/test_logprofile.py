"""The log-probability profile detector (``logprofile``, issue 49 item 4, ours): its features
against the attacks' pure functions on a case computed by hand and on the tiny LM's real token
log-probabilities, a view's prefix moving them, and CalibDCD fitted on it end to end. The
detector contract (blocks, fingerprint, classifier state, bundles) is
tests/test_detector_contract.py's, parametrised over the registered detectors."""

from __future__ import annotations

import math

import numpy as np
import pytest

from calibdcd.detectors.attacks.loss import loss_score
from calibdcd.detectors.attacks.mink import mink_score
from calibdcd.detectors.attacks.minkpp import minkpp_score
from calibdcd.detectors.attacks.profile import (
    LogProfile,
    ProfileConfig,
    profile_features,
    segment_means,
)
from calibdcd.detectors.attacks.zlib_ratio import zlib_entropy, zlib_score
from calibdcd.targets.logprobs import TextLogprobs

LP = np.array([-0.5, -3.0, -1.0, -0.1, -2.0, -0.2, -4.0, -0.3, -0.6, -1.5])
TEXT = "the cat sat on the mat " * 4


def _texts(n: int, seed: int, size: int = 24) -> list[str]:
    rng = np.random.default_rng(seed)
    words = [f"word{i}" for i in range(200)]
    return [" ".join(rng.choice(words, size=size)) for _ in range(n)]


def test_the_features_are_the_attacks_statistics_on_a_case_by_hand():
    cfg = ProfileConfig()
    z = profile_features(TextLogprobs(LP), TEXT, cfg)
    assert cfg.feature_names() == [
        "mink@0.05", "mink@0.1", "mink@0.2", "mink@0.3", "mink@0.5",
        "mean", "std", "zlib",
        "segment1/4", "segment2/4", "segment3/4", "segment4/4",
    ]  # fmt: skip
    assert cfg.blocks == {
        "mink": slice(0, 5),
        "moments": slice(5, 7),
        "zlib": slice(7, 8),
        "positions": slice(8, 12),
    }
    # Min-K% of 10 tokens: max(1, int(k * 10)) lowest = 1, 1, 2, 3, 5 tokens
    want_mink = [-4.0, -4.0, -3.5, -3.0, -11.5 / 5]
    np.testing.assert_allclose(z[:5], want_mink)
    np.testing.assert_allclose(z[:5], [mink_score(LP, k) for k in cfg.ks])
    # mean -1.32; std (ddof 0): sqrt(mean(l^2) - mean^2) = sqrt(33.0 / 10 - 1.7424)
    assert z[5] == pytest.approx(-1.32) and z[5] == pytest.approx(loss_score(LP))
    assert z[6] == pytest.approx(math.sqrt(33.0 / 10 - 1.32**2))
    assert z[7] == pytest.approx(-1.32 / zlib_entropy(TEXT))
    assert z[7] == pytest.approx(zlib_score(LP, TEXT))
    # quarters of 10 tokens: [0, 2), [2, 5), [5, 7), [7, 10)
    np.testing.assert_allclose(z[8:], [-3.5 / 2, -3.1 / 3, -4.2 / 2, -2.4 / 3])


def test_segments_cover_short_texts_and_minkpp_is_a_setting():
    # fewer tokens than runs: each run one token, neighbours sharing
    np.testing.assert_allclose(segment_means(np.array([-1.0, -3.0]), 4), [-1, -1, -3, -3])
    assert np.isnan(segment_means(np.array([]), 3)).all()
    lp = np.array([-1.0, -2.0, -0.5, -3.0, -1.0])
    mu = np.array([-1.5, -1.0, -1.0, -2.0, -2.0])
    var = np.array([0.25, 1.0, 0.25, 4.0, 1.0])
    cfg = ProfileConfig(minkpp=True, minkpp_k=0.4)
    z = profile_features(TextLogprobs(lp, mu, var), TEXT, cfg)
    assert cfg.blocks["minkpp"] == slice(12, 13) and z.shape == (13,)
    assert z[12] == pytest.approx(-0.75) and z[12] == minkpp_score(lp, mu, var, 0.4)
    assert cfg.alternatives == 20 and ProfileConfig().alternatives == 0
    with pytest.raises(ValueError, match="mean and variance"):
        profile_features(TextLogprobs(lp), TEXT, cfg)
    assert np.isnan(profile_features(TextLogprobs(np.array([])), TEXT, cfg)).all()


@pytest.mark.parametrize(
    "bad",
    [
        {"ks": ()},
        {"ks": (0.2, 0.1)},
        {"ks": (0.0, 0.5)},
        {"ks": "0.2"},
        {"segments": 0},
        {"max_words": True},
        {"minkpp": 1},
        {"minkpp_k": 1.5},
        {"top_k": 0},
        {"l2": 0.0},
    ],
)
def test_the_config_is_checked(bad):
    with pytest.raises(ValueError):
        ProfileConfig(**bad)


def test_registered_options_take_lists_and_ask_no_alternatives_by_default(tmp_path):
    from calibdcd.detectors.registry import create_detector, detector_registration

    det = create_detector("logprofile", options={"ks": [0.1, 0.2]}, cache_dir=str(tmp_path))
    assert isinstance(det, LogProfile) and det.config.ks == (0.1, 0.2)
    assert det.generation_kinds["score"].alternatives == 0
    reg = detector_registration("logprofile")
    assert reg.needs_logprobs and not reg.uses_torch


def test_real_features_match_the_pure_functions_and_a_view_moves_them(target):
    from calibdcd.views import universal_views

    det = LogProfile(ProfileConfig(max_words=20))
    texts = _texts(4, seed=1)
    feats = det.extract(texts, target)
    scored = [det.query(t) for t in texts]
    rows = target.token_logprobs(scored, [""] * len(scored), 0)
    for z, row, text in zip(feats.values, rows, scored, strict=True):
        lp = row.logprobs
        assert len(text.split()) == 20 and lp.size > 8
        np.testing.assert_allclose(z[:5], [mink_score(lp, k) for k in det.config.ks])
        np.testing.assert_allclose(z[5:8], [loss_score(lp), lp.std(), zlib_score(lp, text)])
        np.testing.assert_allclose(z[8:], segment_means(lp, 4))
    view = universal_views()[0]
    moved = det.extract(texts, target, view)
    prefixed = target.token_logprobs(scored, [view.prefix] * len(scored), 0)
    want = [profile_features(r, t, det.config) for r, t in zip(prefixed, scored, strict=True)]
    np.testing.assert_allclose(moved.values, want)
    # the prefix shifts every block (the shift CalibDCD's views measure), never to NaN
    assert np.isfinite(moved.values).all()
    for name, cols in det.blocks.items():
        assert not np.allclose(moved.values[:, cols], feats.values[:, cols]), name


def test_calibdcd_fits_on_the_profile(target, tmp_path):
    from calibdcd.calibration import CalibrationConfig
    from calibdcd.detectors.overlap import LogisticClassifier
    from calibdcd.fitted import FittedDetector, FitTexts, fit_detector
    from calibdcd.views import universal_views

    texts = _texts(52, seed=7)
    fit_texts = FitTexts(
        supervised=tuple(texts[:16]),
        labels=(1,) * 8 + (0,) * 8,
        calibration=tuple(texts[16:32]),
        heldout=tuple(texts[32:52]),
    )
    det = LogProfile(ProfileConfig(max_words=20))
    new = _texts(4, seed=9)
    for space in ("raw", "normalized"):
        fitted = fit_detector(
            det,
            target,
            fit_texts,
            views=universal_views()[:4],
            calibration=CalibrationConfig(ranks=(1, 2), strengths=(0.5, 1.0), n_views=2),
            space=space,
        )
        scorer = fitted.scorer
        assert isinstance(scorer.original, LogisticClassifier) and scorer.space == space
        cal = scorer.calibration
        assert cal is not None and cal.dim == 12 and list(cal.block) == list(range(12))
        assert len(cal.selected_views) == 2 and len(cal.objective) == 4
        scores = fitted.score(new, target, det, check_distribution=False).scores
        assert scores.shape == (4,) and np.isfinite(scores).all()
    # the calibrated fit travels as a bundle (classifiers as arrays + JSON) and scores the same
    fitted.save(tmp_path / "bundle")
    loaded = FittedDetector.load(tmp_path / "bundle")
    again = loaded.score(new, target, det, check_distribution=False).scores
    np.testing.assert_allclose(again, scores, rtol=1e-9, atol=1e-12)
