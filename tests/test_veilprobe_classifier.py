"""ProtoNet-IB, the supervised preprocessing, block layout and config validation."""

import numpy as np
import pytest

from calibdcd.detectors.base import Classifier, Detector
from calibdcd.detectors.veilprobe import (
    OUTPUT_BLOCKS,
    Preprocessor,
    ProtoNetConfig,
    ProtoNetIB,
    VeilProbe,
    VeilProbeConfig,
)
from calibdcd.detectors.veilprobe.features import block_slices, compose, welch_keep


def auc(y, s):
    from sklearn.metrics import roc_auc_score

    return roc_auc_score(y, s)


def gaussian_data(n_per_class=60, d=40, shift=1.0, informative=5, seed=0):
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(2 * n_per_class, d))
    y = np.repeat([0, 1], n_per_class)
    x[y == 1, :informative] += shift
    return x.astype(np.float32), y


SMALL = ProtoNetConfig(episodes=150, hidden=64, latent=16)


def test_protonet_separates_and_scores_members_higher():
    x, y = gaussian_data(seed=1)
    xt, yt = gaussian_data(seed=2)
    clf = ProtoNetIB(SMALL, seed=0).fit(x, y)
    s = clf.score(xt)
    assert s.shape == (len(yt),)
    assert auc(yt, s) > 0.8  # 5 informative dims with unit shift: Bayes AUC ~0.94
    assert s[yt == 1].mean() > s[yt == 0].mean()


def test_protonet_is_deterministic_for_a_seed_and_varies_across_seeds():
    x, y = gaussian_data(seed=3)
    a = ProtoNetIB(SMALL, seed=5).fit(x, y).score(x)
    b = ProtoNetIB(SMALL, seed=5).fit(x, y).score(x)
    c = ProtoNetIB(SMALL, seed=6).fit(x, y).score(x)
    np.testing.assert_array_equal(a, b)
    assert not np.allclose(a, c)


def test_protonet_paper_settings_and_shuffled_labels_near_chance():
    cfg = ProtoNetConfig()  # 400 episodes, 10+10, beta 0.005, latent 128, squared Euclidean
    assert (cfg.episodes, cfg.n_support, cfg.n_query, cfg.latent) == (400, 10, 10, 128)
    assert (cfg.beta, cfg.distance) == (0.005, "sqeuclidean")
    x, y = gaussian_data(n_per_class=50, seed=4)
    xt, yt = gaussian_data(n_per_class=200, seed=5)
    aucs = []
    for seed in range(3):
        shuffled = np.random.default_rng(seed).permutation(y)
        aucs.append(auc(yt, ProtoNetIB(cfg, seed=seed).fit(x, shuffled).score(xt)))
    assert abs(np.mean(aucs) - 0.5) < 0.12
    assert auc(yt, ProtoNetIB(cfg, seed=0).fit(x, y).score(xt)) > 0.8  # Bayes AUC ~0.94


def test_protonet_rejects_too_few_items():
    x, y = gaussian_data(n_per_class=8)
    with pytest.raises(ValueError, match="n_support \\+ n_query"):
        ProtoNetIB(ProtoNetConfig(), seed=0).fit(x, y)


def test_welch_pruning_and_zscore_are_fitted_on_the_training_split_only():
    x, y = gaussian_data(n_per_class=50, d=30, shift=2.0, informative=3, seed=7)
    prune_cols = np.arange(10, 30)  # the "delta" columns; informative dims 0-2 are never pruned
    x[y == 1, 10:12] += 2.0  # two informative delta columns survive pruning
    pre = Preprocessor(prune_cols, prune_p=0.01).fit(x, y)
    assert set(range(12, 30)) - set(pre.zeroed_.tolist()) <= {12, 13, 14}  # few false keeps
    assert not {10, 11} & set(pre.zeroed_.tolist())
    zt = pre.transform(x)
    np.testing.assert_allclose(zt.mean(axis=0)[:12], 0, atol=1e-5)
    np.testing.assert_allclose(zt.std(axis=0)[:12], 1, atol=1e-4)
    assert np.all(zt[:, pre.zeroed_] == 0)
    # evaluation rows never influence the fit: refit with garbage appended to a copy
    test_rows = np.random.default_rng(0).normal(50, 10, size=(40, 30)).astype(np.float32)
    before = (pre.mean_.copy(), pre.std_.copy(), pre.zeroed_.copy())
    out = pre.transform(test_rows)
    np.testing.assert_array_equal(before[0], pre.mean_)
    np.testing.assert_array_equal(before[2], pre.zeroed_)
    np.testing.assert_allclose(out[:, 0], (test_rows[:, 0] - pre.mean_[0]) / pre.std_[0], 1e-5)
    # same result as fitting by hand on the training rows
    np.testing.assert_allclose(pre.mean_[0], x[:, 0].mean(), rtol=1e-5)
    assert welch_keep(x[:, 10:12], y, 0.01).all()


def test_blocks_layout_and_compose():
    rng = np.random.default_rng(0)
    E_s, D_s, E_r, D_r = (rng.normal(size=(4, 6)) for _ in range(4))
    f = compose(E_s, D_s, E_r, D_r)
    assert f.blocks == block_slices(6)
    np.testing.assert_allclose(f.values[:, f.blocks["E"]], E_s, rtol=1e-6)
    np.testing.assert_allclose(f.values[:, f.blocks["D"]], D_s, rtol=1e-6)
    np.testing.assert_allclose(f.values[:, f.blocks["dE"]], np.abs(E_r - E_s), rtol=1e-6)
    np.testing.assert_allclose(f.values[:, f.blocks["dD"]], np.abs(D_r - D_s), rtol=1e-6)
    np.testing.assert_array_equal(f.columns(OUTPUT_BLOCKS), np.r_[6:12, 18:24])


def test_detector_protocol_and_presets():
    det = VeilProbe(VeilProbeConfig.cpu())
    assert isinstance(det, Detector)
    assert det.calibration_blocks == ("D", "dD")
    assert det.query("some text") == "some text"
    clf = det.new_classifier(0)
    assert isinstance(clf, Classifier)
    w = det.config.mapping.block_width
    np.testing.assert_array_equal(clf.preprocessor.prune_columns, np.arange(2 * w, 4 * w))
    paper = VeilProbeConfig.paper()
    assert paper.mapping.block_width == 7 * 512  # official: 3,584 per block, 14,336 in all
    assert (paper.sampling.temperature, paper.sampling.max_new_tokens) == (0.2, 512)
    assert paper.sampling.n_suffixes == 3
    assert paper.perturb.attribution.method == "gilot"
    assert VeilProbeConfig.cpu().perturb.attribution.method == "loo"
    with pytest.raises(ValueError, match=r"attribution\.method"):
        VeilProbeConfig.cpu().perturb.attribution.__class__(method="lime")
