"""The field's standard attacks (issue 49) against their published definitions, on cases
computed by hand; the full detectors run through tests/test_detector_contract.py."""

from __future__ import annotations

import math
import warnings
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


# --------------------------------------------------------------------------------------------
# ReCaLL (Xie et al., 2024): LL(x | P) / LL(x), P a prefix of known non-members
# --------------------------------------------------------------------------------------------


def _words(n: int, size: int, seed: int) -> list[str]:
    rng = np.random.default_rng(seed)
    vocab = ["the", "cat", "sat", "on", "a", "mat", "and", "dog", "ran", "far", "by", "sea"]
    return [" ".join(rng.choice(vocab, size=size)) for _ in range(n)]


def _recall(**options):
    from calibdcd.detectors.registry import create_detector

    return create_detector("recall", options=options, benchmark="lab", cache_dir="unused")


def test_recall_divides_the_conditional_by_the_unconditional_log_likelihood():
    from calibdcd.detectors.attacks.recall import build_prefix, recall_score

    # LL(x | P) = (-2 - 4 - 3) / 3 = -3, LL(x) = (-1 - 2) / 2 = -1.5: 2.0; higher = member (a
    # member loses more likelihood after non-member context)
    assert recall_score(np.array([-2.0, -4.0, -3.0]), np.array([-1.0, -2.0])) == pytest.approx(2.0)
    assert math.isnan(recall_score(np.array([]), np.array([-1.0])))
    texts = ["a b", "c d", "e f", "g h"]
    p = build_prefix(texts, 2, 0)
    assert p == build_prefix(texts, 2, 0) and p.endswith("\n\n")  # seeded
    picked = p.split("\n\n")[:-1]  # each text followed by a blank line, in the given order
    assert len(picked) == 2 and set(picked) <= set(texts)
    assert picked == sorted(picked, key=texts.index)
    with pytest.raises(ValueError, match="needs 3 known non-member"):
        build_prefix(texts[:2], 3, 0)


def test_recall_scores_each_text_after_the_prefix_and_alone(target):
    from calibdcd.detectors.adapter import DetectorAdapter
    from calibdcd.detectors.base import completions_per_text
    from calibdcd.views import View

    det = _recall(shots=2, max_words=10)
    adapter = DetectorAdapter(det)
    assert adapter.takes_nonmembers and not DetectorAdapter(_recall_loss()).takes_nonmembers
    texts, nonmembers = _words(3, 14, 1), _words(4, 14, 2)
    with pytest.raises(ValueError, match="no non-member prefix"):
        det.extract(texts, target)
    adapter.use_nonmembers(nonmembers)
    # the prefix: two of the non-members, each cut to max_words as the scored texts are
    shots = [t for t in (det.query(n) for n in nonmembers) if t + "\n\n" in det.prefix]
    assert len(shots) == 2 and "".join(s + "\n\n" for s in shots) == det.prefix
    view = View(code="v", name="test", prefix="Q: ", suffix="")
    for v, head in ((None, ""), (view, "Q: ")):
        got = adapter.extract(texts, target, v).values[:, 0]
        scored = [det.query(t) for t in texts]
        plain = target.token_logprobs(scored, [head] * 3)
        cond = target.token_logprobs(scored, [head + det.prefix] * 3)
        want = [
            loss_score(c.logprobs) / loss_score(p.logprobs)
            for c, p in zip(cond, plain, strict=True)
        ]
        np.testing.assert_allclose(got, want, rtol=1e-12)
    # two scoring requests a text: what the dry run multiplies the texts by
    assert completions_per_text(det)[0] == 2
    assert completions_per_text(_recall_loss())[0] == 1


def _recall_loss():
    from calibdcd.detectors.registry import create_detector

    return create_detector("loss", options={}, benchmark="lab", cache_dir="unused")


def test_recall_prefix_never_holds_an_evaluation_text(target, tmp_path):
    """Through the setting's own feature step (``_features``) under the paper protocol, where
    the calibration non-members lie inside the evaluation pool: the prefix comes from the
    supervised split's non-members, and they key the feature cache (other detectors' keys as
    before)."""
    from calibdcd.data import SplitConfig
    from calibdcd.data.protocol import make_split
    from calibdcd.data.types import Benchmark, Sample
    from calibdcd.experiment.caches import ArrayCache
    from calibdcd.experiment.features import FeatureExtractor
    from calibdcd.experiment.resources import SettingInputs
    from calibdcd.experiment.setting import _features
    from calibdcd.keys import digest

    texts = _words(24, 12, 3)
    labels = [1, 0] * 12
    samples = tuple(
        Sample(str(i), t, y) for i, (t, y) in enumerate(zip(texts, labels, strict=True))
    )
    bench = Benchmark("toy", samples, "test")
    split = make_split(np.array(labels), SplitConfig(n_supervised_per_class=3), seed=0)
    assert split.protocol == "paper" and set(split.calibration) <= set(split.evaluation)
    arrays = ArrayCache(tmp_path)

    def inputs(det, key):
        return SettingInputs(
            benchmark=bench, detector=det, detector_key=key, target_key="tiny",
            benchmark_digest="toy", inputs_hash="h", target=lambda: target, views=lambda: [],
            completion_counts=lambda: (0, 0), arrays=arrays,
        )  # fmt: skip

    det = _recall(shots=2)
    ext, z_sup, z_rest, _, _ = _features(inputs(det, "recall"), split, lambda s: None)
    assert z_sup.shape == (6, 1) and np.isfinite(z_rest).all()
    in_prefix = {i for i, t in enumerate(texts) if t + "\n\n" in det.prefix}
    assert len(in_prefix) == 2
    sup_nm = [int(i) for i in split.supervised if labels[i] == 0]
    assert in_prefix <= set(sup_nm) and not in_prefix & {int(i) for i in split.evaluation}
    assert ext.nonmembers == [texts[i] for i in sup_nm]
    # the non-members key the features: the same ones hit the cache, others miss it
    sup_texts = [texts[i] for i in split.supervised]
    for nonmembers, misses in ((ext.nonmembers, 0), (ext.nonmembers[::-1], 1)):
        again = FeatureExtractor(inputs(_recall(shots=2), "recall"), [])
        again.use_nonmembers(nonmembers)
        before = arrays.misses
        again(sup_texts, None, sup_texts)
        assert arrays.misses - before == misses
    # a detector that takes none: its key is what it was before the capability
    loss = FeatureExtractor(inputs(_recall_loss(), "loss"), [])
    loss.use_nonmembers(ext.nonmembers)  # a no-op
    loss(sup_texts, None, sup_texts)
    old_key = digest("features/v1", "loss", "tiny", "e0", sup_texts, None, None)
    assert arrays.load_arrays("features", old_key) is not None


def test_recall_fit_and_score_draw_the_same_prefix_from_the_bundle(target, tmp_path):
    from calibdcd.fitted import FittedDetector, FitTexts, fit_detector
    from calibdcd.fitted.detector import BundleIntegrityError

    texts = _words(22, 12, 4)
    fit_texts = FitTexts(supervised=tuple(texts[:8]), labels=(1, 0) * 4, heldout=tuple(texts[8:18]))
    new = texts[18:]
    spec = {"name": "recall", "preset": None, "options": {"shots": 3}, "benchmark": "lab"}
    det = _recall(shots=3)
    with warnings.catch_warnings():  # a tiny fit's: its separation is not checkable
        warnings.simplefilter("ignore", RuntimeWarning)
        fitted = fit_detector(det, target, fit_texts, fpr=0.2, detector_spec=spec)
    assert {t for t in texts if t + "\n\n" in det.prefix} <= set(texts[1:8:2])  # its non-members
    before = fitted.score(new, target, det, check_distribution=False)
    fitted.save(tmp_path / "bundle")
    loaded = FittedDetector.load(tmp_path / "bundle")
    fresh = loaded.build_detector(tmp_path / "fresh")
    assert fresh.prefix is None
    again = loaded.score(new, target, fresh, check_distribution=False)
    assert fresh.prefix == det.prefix
    np.testing.assert_array_equal(again.scores, before.scores)
    np.testing.assert_array_equal(again.p_values, before.p_values)
    # the prefix's texts are the bundle's texts.json: an edited one is refused
    path = tmp_path / "bundle" / "texts.json"
    path.write_text(path.read_text().replace(texts[1], texts[1] + " x"))
    with pytest.raises(BundleIntegrityError, match=r"texts\.json"):
        FittedDetector.load(tmp_path / "bundle")
