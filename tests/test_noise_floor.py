"""The noise floor that measures spread (``analyses.noise_floor: half_sample``): the half-sample
spread estimator against a known n-sample spread on synthetic data, and the floor of a real run
on the lab micro (an interval around the detector's AUC, recomputable from the cached
features, reported as its own row); the bootstrap floor kept as a named variant."""

from __future__ import annotations

import csv
import json

import numpy as np
import pytest

from calibdcd.experiment.analyses import (
    HALF_SAMPLE_SPLITS,
    half_sample_indices,
    half_sample_spread,
)
from calibdcd.metrics import auc

# --------------------------------------------------------------------------------------------
# The estimator (pure functions, synthetic data with a known n-sample spread)
# --------------------------------------------------------------------------------------------


def test_half_samples_are_stratified_complementary_halves():
    y = np.r_[np.ones(51, int), np.zeros(50, int)]
    draws = half_sample_indices(y, 4, seed=3)
    assert len(draws) == 8
    for a, b in zip(draws[::2], draws[1::2], strict=True):
        assert not set(a) & set(b)  # without replacement, disjoint
        assert (y[a] == 1).sum() == (y[b] == 1).sum() == 25  # the odd member in neither
        assert (y[a] == 0).sum() == (y[b] == 0).sum() == 25
    assert all(
        np.array_equal(x, z) for x, z in zip(draws, half_sample_indices(y, 4, 3), strict=True)
    )
    assert not np.array_equal(draws[0], half_sample_indices(y, 4, seed=4)[0])


@pytest.mark.parametrize("fraction", [0.5, 0.25])
def test_the_scale_factor_gives_the_n_sample_variance_of_a_mean(fraction):
    """For a mean, subsamples of m = f·n without replacement, scaled by √(f/(1 − f)), estimate
    Var(mean of n) = σ²/n (exactly 1 for halves): averaged over many samples, within 10 %."""
    rng = np.random.default_rng(0)
    n, sigma, reps = 100, 2.0, 400
    m = int(fraction * n)
    est = []
    for _ in range(reps):
        x = rng.normal(1.0, sigma, size=n)
        subs = [x[rng.permutation(n)[:m]].mean() for _ in range(20)]
        est.append(half_sample_spread(x.mean(), subs, fraction)["sd"] ** 2)
    assert np.mean(est) == pytest.approx(sigma**2 / n, rel=0.1)
    with pytest.raises(ValueError, match="fraction in"):
        half_sample_spread(0.0, [0.1, 0.2], 1.0)


def _centroid_auc(x, y, x_pool, y_pool):
    """A trained detector: the class-mean difference as its direction, AUC on a fixed pool
    (as the Mann-Whitney statistic of the ranks: ``metrics.auc``'s value, checked below, in
    a thirtieth of its time over the 4,300 AUCs of the simulation)."""
    from scipy.stats import rankdata

    w = x[y == 1].mean(0) - x[y == 0].mean(0)
    r = rankdata(x_pool @ w)
    n1 = int(y_pool.sum())
    return (r[y_pool == 1].sum() - n1 * (n1 + 1) / 2) / (n1 * (len(y_pool) - n1))


def test_the_simulations_auc_is_the_metrics_auc():
    rng = np.random.default_rng(0)
    x, y = rng.normal(size=(40, 3)), np.r_[np.ones(20, int), np.zeros(20, int)]
    x_pool = np.round(rng.normal(size=(300, 3)), 1)  # ties in the scores too
    y_pool = np.r_[np.ones(150, int), np.zeros(150, int)]
    w = x[y == 1].mean(0) - x[y == 0].mean(0)
    assert _centroid_auc(x, y, x_pool, y_pool) == pytest.approx(auc(y_pool, x_pool @ w))


def test_the_half_sample_interval_covers_at_the_training_set_size():
    """A classifier trained on 50 + 50 texts and scored on a fixed pool: its AUC's true spread
    over training sets of that size is simulated; the half-sample SD from one training set
    matches it (median ratio), the interval around the detector's AUC covers the expected AUC
    about 95 % of the time, while the halves (and a bootstrap resample) read lower: the shift
    that made the bootstrap floor one-sided is kept out of the spread."""
    rng = np.random.default_rng(1)
    d, n_c, shift = 20, 50, 0.25

    def draw(k):
        y = np.r_[np.ones(k, int), np.zeros(k, int)]
        return rng.normal(size=(2 * k, d)) + shift * y[:, None], y

    x_pool, y_pool = draw(1000)
    truth = np.array([_centroid_auc(*draw(n_c), x_pool, y_pool) for _ in range(1000)])
    mean_n, sd_n = truth.mean(), truth.std(ddof=1)
    ratios, covered, shifts, boot = [], [], [], []
    for i in range(150):
        x, y = draw(n_c)
        full = _centroid_auc(x, y, x_pool, y_pool)
        halves = [
            _centroid_auc(x[idx], y[idx], x_pool, y_pool)
            for idx in half_sample_indices(y, HALF_SAMPLE_SPLITS, seed=i)
        ]
        s = half_sample_spread(full, halves, 0.5)
        ratios.append(s["sd"] / sd_n)
        covered.append(s["low"] <= mean_n <= s["high"])
        shifts.append(s["shift"])
        b = np.r_[rng.choice(n_c, n_c), n_c + rng.choice(n_c, n_c)]
        boot.append(_centroid_auc(x[b], y[b], x_pool, y_pool) - full)
    assert 0.75 < np.median(ratios) < 1.3
    assert 0.85 <= np.mean(covered) <= 1.0
    assert np.mean(shifts) < -0.2 * sd_n  # the halves' learning curve, not in the spread
    assert np.mean(boot) < -0.2 * sd_n  # the bootstrap floor's one-sided shift


# --------------------------------------------------------------------------------------------
# A real run on the lab micro
# --------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    from experiment_support import micro_run

    return micro_run(tmp_path_factory)


def test_the_half_sample_floor_of_a_real_run(run):
    """The default floor on the lab micro: an interval around the detector's AUC with a
    positive width, no per-text scores or paired comparison of its own, recomputed exactly
    from the cached features; the bootstrap floor is the named variant."""
    from calibdcd.experiment import RunContext, grid, load_config, prepare_setting, resolve
    from calibdcd.experiment.analyses import controls, half_sample_floor

    cfg_path, run_dir = run
    cfg = load_config(cfg_path)
    assert cfg.analyses.noise_floor == "half_sample"
    plan = resolve(cfg)
    ctx = RunContext(plan, progress=False)
    for s in grid(cfg):
        d = run_dir / "settings" / s.id
        res = json.loads((d / "result.json").read_text())
        nf = res["controls"]["noise_floor"]
        before = res["before"]["auc"]["estimate"]
        assert nf["method"] == "half_sample" and nf["draws"] == 2 * HALF_SAMPLE_SPLITS
        assert nf["auc"] == before and nf["fraction"] == 0.5
        assert nf["auc_sd"] > 0 and nf["auc_low"] < before < nf["auc_high"]
        assert nf["auc_high"] - before == pytest.approx(1.959964 * nf["auc_sd"], rel=1e-5)
        assert "noise_floor_vs_original" not in res["paired"]
        with (d / "scores.csv").open() as fh:
            assert "score_noise_floor" not in next(csv.reader(fh))
        prep = prepare_setting(plan.setting(s.id), ctx.inputs(plan.setting(s.id)))
        p = prep.problem
        again = half_sample_floor(p, p.run(cfg.calibration).calibration, seed=s.seed)
        assert again["auc_halves"] == pytest.approx(nf["auc_halves"], abs=1e-12)
        assert again["auc_low"] == pytest.approx(nf["auc_low"], abs=1e-12)
        main = p.run(cfg.calibration)
        boot = controls(p, main, cfg.calibration, seed=s.seed, noise_floor="bootstrap")
        nb = boot["noise_floor"]
        assert nb.extra == {"method": "bootstrap"} and nb.scorer is not None
        assert not np.allclose(nb.outcome.scores, p.scores_before)
        with pytest.raises(ValueError, match="unknown noise floor 'jackknife'"):
            controls(p, main, cfg.calibration, seed=s.seed, noise_floor="jackknife")
    assert ctx.target_loads == 0


def test_the_report_shows_the_interval_and_reads_old_bootstrap_floors(run):
    """The main table's half-sample row is the interval around the detector; a result written
    before the option (its noise floor has no ``method``) is read as the bootstrap row."""
    from calibdcd.report.aggregate import load_results, main_cells
    from calibdcd.report.tables import build_tables

    _, run_dir = run
    results = load_results(run_dir)
    table = {t.key: t for t in build_tables(results)}["auc_main"]
    row = next(r for r in table.rows if r[0] == "Overlap noise floor (half-sample interval)")
    post = next(r for r in results if r.post_trained)
    nf = post.controls["noise_floor"]
    assert row[1] == f"[{100 * nf['auc_low']:.1f}, {100 * nf['auc_high']:.1f}]"
    assert not any("bootstrap retrain" in r[0] for r in table.rows)
    paired = {t.key: t for t in build_tables(results)}["paired"]
    assert not any("noise floor" in r[0] for r in paired.rows)
    # an earlier result: the bootstrap floor's AUC under the key, no method
    old = post.model_copy(deep=True)
    old.controls["noise_floor"] = {"auc": 0.6, "tpr": 0.1, "label": "noise floor"}
    cell = main_cells([old])["cells"][(old.detector, old.benchmark, old.target)]["methods"]
    assert cell["noise_floor"]["auc"]["mean"] == 0.6 and "noise_interval" not in cell


def test_the_option_keeps_the_hashes_of_configs_without_it(tmp_path):
    """Configs that leave ``analyses.noise_floor`` at its default keep their setting hashes
    (every stored run's); choosing the bootstrap floor gives new ones."""
    import yaml

    from calibdcd.experiment import grid, load_config
    from calibdcd.experiment.plan import setting_hash
    from experiment_support import REPO

    cfg = load_config(REPO / "configs" / "lab-micro.yaml")
    s = grid(cfg)[0]
    assert s.id == "lab__chat-qwen__VeilProbe__s0" and setting_hash(s, cfg) == "c487a14b2fdcc879"
    raw = yaml.safe_load((REPO / "configs" / "lab-micro.yaml").read_text())
    for value, same in (("half_sample", True), ("bootstrap", False)):
        raw["analyses"] = {"noise_floor": value}
        (tmp_path / "c.yaml").write_text(yaml.safe_dump(raw))
        alt = load_config(tmp_path / "c.yaml")
        assert (setting_hash(grid(alt)[0], alt) == "c487a14b2fdcc879") is same


# --------------------------------------------------------------------------------------------
# Score-only detectors: no noise floor (their classifier learns nothing)
# --------------------------------------------------------------------------------------------


def test_score_only_registrations_are_the_detectors_whose_classifier_learns_nothing():
    """A detector registered ``score_only`` scores the same whatever it was fitted on (so a
    retrain measures nothing); the cheap learning ones (overlap, logprofile) do not. Checked on
    every built-in that builds without a model."""
    from calibdcd.detectors.registry import create_detector, registered_detectors

    rng = np.random.default_rng(0)
    z = rng.normal(size=(40, 6))
    y1, y2 = np.repeat([0, 1], 20), rng.permutation(np.repeat([0, 1], 20))
    flags = {}
    for name in ("loss", "zlib", "mink", "mink++", "recall", "samia", "overlap", "logprofile"):
        det = create_detector(name)
        a = det.new_classifier(0).fit(z, y1).score(z)
        b = det.new_classifier(0).fit(z, y2).score(z)
        learns = not np.array_equal(a, b)
        flags[name] = registered_detectors()[name].score_only
        assert flags[name] is not learns, name
    assert sorted(n for n, f in flags.items() if f) == [
        "loss", "mink", "mink++", "recall", "samia", "zlib"
    ]  # fmt: skip


def test_a_stored_score_only_floor_is_not_shown():
    """The stored real-regime run (written before runs left the floor out) holds a zero-width
    half-sample floor for every score-only attack; the report drops those and keeps the
    learning detectors' floors, and its note says why."""
    from calibdcd.report.aggregate import load_results, main_cells
    from calibdcd.report.tables import _noise_floor_note
    from experiment_support import verdict_module

    verdict = verdict_module()
    archive = verdict.RUNS / "real-regime.tar.xz"
    if not archive.exists():
        pytest.skip(f"{archive} absent")
    with verdict.unpacked(archive) as (run,):
        stored = json.loads(
            (run / "settings" / "real-regime__chat__SaMIA__s0" / "result.json").read_text()
        )["controls"]["noise_floor"]
        assert stored["auc_sd"] == pytest.approx(0.0, abs=1e-12)  # measured nothing
        assert set(stored["auc_halves"]) == {stored["auc"]}
        results = load_results(run)
    by = {r.detector: r for r in results}
    for det in ("SaMIA", "LOSS", "ReCaLL"):
        assert "noise_floor" not in by[det].controls
    for det in ("VeilProbe", "DPDLLM", "Overlap", "LogProfile"):
        assert "noise_floor" in by[det].controls
    cells = main_cells(results)["cells"]

    def shown(method):
        return {det for (det, _, _), c in cells.items() if method in c["methods"]}

    # the half-sample floor (the attacks' run) and the earlier bootstrap one
    assert shown("noise_interval") == {"LogProfile"}
    assert shown("noise_floor") == {"VeilProbe", "DPDLLM", "Overlap"}
    assert "none for a score-only detector" in _noise_floor_note(results)
    # a table of score-only detectors alone claims no floor; without controls it names none
    samia = [r for r in results if r.detector == "SaMIA"]
    assert _noise_floor_note(samia).startswith("noise floor: none computed; none for a score-only")
    bare = [r.model_copy(update={"controls": {}}) for r in samia]
    assert _noise_floor_note(bare) == "noise floor: none computed"


def test_a_run_computes_no_floor_for_a_score_only_detector(run, tmp_path):
    """A run with LOSS beside the overlap detector on the lab micro: LOSS's result has its
    placebo but no noise floor (its classifier learns nothing), the overlap's has both."""
    from calibdcd.experiment import load_config, run_experiment
    from experiment_support import micro_config_text

    cfg_path, _ = run
    text = micro_config_text(cfg_path.parent / "cache", targets=("chat-qwen",))
    text = text.replace("detectors:\n", "detectors:\n  - {name: loss, label: LOSS}\n", 1)
    (tmp_path / "c.yaml").write_text(text)
    run_dir = tmp_path / "run"
    run_experiment(load_config(tmp_path / "c.yaml"), run_dir, progress=False)
    res = {
        d: json.loads(
            (run_dir / "settings" / f"lab__chat-qwen__{d}__s0" / "result.json").read_text()
        )
        for d in ("LOSS", "Overlap")
    }
    assert "placebo" in res["LOSS"]["controls"] and "noise_floor" not in res["LOSS"]["controls"]
    assert res["Overlap"]["controls"]["noise_floor"]["method"] == "half_sample"
