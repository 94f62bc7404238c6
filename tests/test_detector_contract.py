"""The detector contract, checked over every registered detector (as scikit-learn's
``check_estimator`` is run over every estimator): a new detector needs its module and one
``register_detector`` call, and these tests cover it.

* It is a :class:`~calibdcd.detectors.base.Detector`: a dataclass ``config`` (its parameters,
  apart from construction and fitting), a ``cache_version``, ``generation_kinds`` of
  :class:`~calibdcd.targets.base.GenerationParams`, ``calibration_blocks`` among its blocks.
* Its parameters resolve apart from construction (``create_detector_config``, as
  scikit-learn's ``get_params`` is apart from ``__init__`` and ``fit``): the config a detector
  would be built with, equal to the built detector's, with nothing built.
* Its fingerprint (the feature cache's key) changes with every option but where things live
  (``cache_dir``) and progress bars: an option missing from it would let two variants share
  cached features.
* Its classifier's fitted state round-trips through arrays + JSON with identical scores.
* Its features have the blocks it declares (here with real tiny models; VeilProbe's, which
  trains a masked LM and mapping models, in the slow suite).
* A whole fitted detector - classifier, learnt parts (VeilProbe's mapping model, DPDLLM's
  fine-tuned reference LM), null scores - saved as a bundle, loaded and rebuilt from the
  bundle's spec through the registry scores new texts exactly as it did before saving.
"""

from __future__ import annotations

import dataclasses
import itertools
import typing
from pathlib import Path

import numpy as np
import pytest

from calibdcd.detectors.base import Detector, PersistableClassifier
from calibdcd.detectors.registry import registered_detectors
from calibdcd.experiment.config import DetectorEntry
from calibdcd.experiment.detector_entries import detector_fingerprint, plan_detector
from calibdcd.targets.base import GenerationParams

NAMES = sorted(registered_detectors())
#: config fields that say where things live or how a run reports, not what a feature is
NOT_IN_KEY = {"cache_dir", "progress"}


def _entry(name: str, options: dict | None = None) -> DetectorEntry:
    return DetectorEntry(name=name, options=options or {})


def _build(name: str, cache: Path, options: dict | None = None):
    return plan_detector(_entry(name, options), "lab", 0, str(cache)).build()


def _leaves(cfg, path=()):
    for f in dataclasses.fields(cfg):
        v = getattr(cfg, f.name)
        if dataclasses.is_dataclass(v) and not isinstance(v, type):
            yield from _leaves(v, (*path, f.name))
        else:
            yield (*path, f.name), v, cfg


def _literals(tp) -> list:
    if typing.get_origin(tp) is typing.Literal:
        return list(typing.get_args(tp))
    return [x for a in typing.get_args(tp) for x in _literals(a)]


def _other_values(value, tp) -> list:
    """Values to try instead of ``value`` (the first one the detector accepts is used)."""
    lits = [x for x in _literals(tp) if x != value]
    if lits:
        return lits
    if isinstance(value, bool):
        return [not value]
    if isinstance(value, int):
        return [value + 1, max(1, value - 1), 2 * value]
    if isinstance(value, float):
        return [value * 0.5 if value else 0.5, value + 0.05, min(0.99, value * 1.1)]
    if isinstance(value, str):  # "inherit"-like strings take numbers too
        return [f"{value}-x", 0.9, 50, 1.1]
    if isinstance(value, (tuple, list)) and len(value) > 1:
        return [list(value[:-1])]
    if value is None:
        return [64, 1, 0.5, "x", True]
    return []


def _nest(path: tuple[str, ...], value) -> dict:
    out = value
    for p in reversed(path):
        out = {p: out}
    return out


@pytest.mark.parametrize("name", NAMES)
def test_every_registered_detector_is_a_detector(name, tmp_path):
    det = _build(name, tmp_path)
    assert isinstance(det, Detector), f"{name} lacks part of the Detector protocol"
    assert dataclasses.is_dataclass(det.config) and not isinstance(det.config, type)
    assert det.cache_version is None or isinstance(det.cache_version, (int, str))
    kinds = det.generation_kinds
    assert kinds and all(isinstance(p, GenerationParams) for p in kinds.values()), kinds
    blocks = getattr(det, "blocks", None)
    if det.calibration_blocks is not None and blocks is not None:
        assert set(det.calibration_blocks) <= set(blocks)


@pytest.mark.parametrize("name", NAMES)
def test_parameters_resolve_apart_from_construction(name, tmp_path):
    from calibdcd.detectors.registry import (
        create_detector,
        create_detector_config,
        registered_detectors,
    )

    # registered as parameters + build (not a factory that must build to show its config)
    assert registered_detectors()[name].params is not None, f"{name}: no params function"
    det = _build(name, tmp_path)
    varied = {}  # one option varied: the first leaf that takes another value
    for path, value, owner in _leaves(det.config):
        hint = typing.get_type_hints(type(owner)).get(path[-1])
        for other in _other_values(value, hint):
            try:
                _build(name, tmp_path, _nest(path, other))
            except (ValueError, TypeError):
                continue
            varied = _nest(path, other)
            break
        if varied:
            break
    assert varied, name
    for options in ({}, varied):
        kw = {"options": options, "benchmark": "lab", "cache_dir": str(tmp_path)}
        assert create_detector_config(name, **kw) == create_detector(name, **kw).config
        entry = _entry(name, options)
        planned = plan_detector(entry, "lab", 0, str(tmp_path))
        assert planned.config == planned.build().config
    with pytest.raises(ValueError, match="unknown detector"):
        create_detector_config(name + "x")


@pytest.mark.parametrize("name", NAMES)
def test_the_fingerprint_changes_with_every_option(name, tmp_path):
    det = _build(name, tmp_path)
    fp0 = detector_fingerprint(det, tmp_path)
    changed, same = [], []
    for path, value, owner in _leaves(det.config):
        hint = typing.get_type_hints(type(owner)).get(path[-1])
        for other in _other_values(value, hint):
            try:
                varied = _build(name, tmp_path, _nest(path, other))
            except (ValueError, TypeError):
                continue  # not a value this option takes: try the next
            key = ".".join(path)
            (changed if detector_fingerprint(varied, tmp_path) != fp0 else same).append(key)
            break
    leaked = [k for k in same if k.split(".")[-1] not in NOT_IN_KEY]
    assert not leaked, f"{name}: options outside the feature cache's key: {leaked}"
    assert len(changed) >= 5, changed  # the check really varied the options


@pytest.mark.parametrize("name", NAMES)
def test_the_classifier_state_round_trips_with_identical_scores(name, tmp_path):
    # VeilProbe's ProtoNet at its 400 episodes took 15-19 s of the fast suite; the state round
    # trip is the same after 5 (tests/test_reliability.py uses 5 too)
    det = _build(name, tmp_path, {"protonet": {"episodes": 5}} if name == "veilprobe" else None)
    blocks = getattr(det, "blocks", None)
    dim = max(s.stop for s in blocks.values()) if blocks else 12
    rng = np.random.default_rng(0)
    y = np.repeat([0, 1], 30)
    z = rng.normal(size=(60, dim)) + 0.8 * y[:, None]
    clf = det.new_classifier(0).fit(z, y)
    assert isinstance(clf, PersistableClassifier)
    arrays, meta = clf.state()
    again = type(clf).from_state(arrays, meta)
    probe = rng.normal(size=(25, dim))
    np.testing.assert_array_equal(again.score(probe), clf.score(probe))
    assert np.all(np.isfinite(clf.score(probe)))


def _texts() -> list[str]:
    rng = np.random.default_rng(3)
    words = [f"word{i}" for i in range(200)]
    return [" ".join(rng.choice(words, size=48)) for _ in range(6)]


def _extraction_options(name: str, model: str, tmp_path: Path) -> dict:
    if name == "dpdllm":  # the tiny LM as the reference model, one short epoch
        return {"length": 16, "reference": {"model_path": model, "epochs": 1}, "progress": False}
    if name == "overlap":
        return {"max_new_tokens": 8, "positions": 4}
    if name == "veilprobe":  # tests/veilprobe_support.fast_config, as registry options
        return {
            "sampling": {"max_new_tokens": 32, "n_suffixes": 3, "prompt_fraction": 0.5},
            "perturb": {
                "attribution": {"method": "loo", "max_tokens": 64},
                "mlm": {"hidden_size": 64, "intermediate_size": 128, "epochs": 4},
            },
            "progress": False,
        }
    return {}


@pytest.mark.parametrize(
    "name",
    [pytest.param(n, marks=pytest.mark.slow) if n == "veilprobe" else n for n in NAMES],
)
def test_features_have_the_declared_blocks(name, tmp_path, model_dir, target):
    from calibdcd.detectors.adapter import DetectorAdapter

    texts = _texts()
    if name == "veilprobe":
        from calibdcd.detectors.veilprobe import VeilProbe
        from veilprobe_support import fast_config

        det = VeilProbe(fast_config(tmp_path))
    else:
        det = _build(name, tmp_path, _extraction_options(name, str(model_dir), tmp_path))
    adapter = DetectorAdapter(det)
    adapter.use_nonmembers(texts)  # known non-members (ReCaLL's prefix); a no-op for the rest
    adapter.prepare(texts, target)
    feats = adapter.extract(texts[:4], target, None, adapter.reference_texts(texts[:4], texts))
    values = np.asarray(feats.values)
    assert values.shape[0] == 4
    covered = sorted((s.start, s.stop) for s in feats.blocks.values())
    assert covered[0][0] == 0 and covered[-1][1] == values.shape[1]
    assert all(a[1] == b[0] for a, b in itertools.pairwise(covered))  # no gap
    declared = getattr(det, "blocks", None)
    if declared is not None:
        assert dict(feats.blocks) == dict(declared)
    if det.calibration_blocks is not None:
        assert set(det.calibration_blocks) <= set(feats.blocks)


@pytest.mark.parametrize(
    "name",
    [pytest.param(n, marks=pytest.mark.slow) if n == "veilprobe" else n for n in NAMES],
)
def test_a_bundle_rebuilt_through_the_registry_scores_as_before(name, tmp_path, model_dir, target):
    """fit (inductive: the learnt parts are trained at fit and travel in the bundle), save,
    load, rebuild the detector from the bundle's own spec with ``create_detector`` into an
    empty cache, score: the same scores, p-values and threshold as the in-process fit, and no
    learnt part trained again (the empty cache stays without one)."""
    from calibdcd.detectors.registry import create_detector
    from calibdcd.fitted import FittedDetector, FitTexts, fit_detector

    rng = np.random.default_rng(5)
    words = [f"word{i}" for i in range(200)]
    texts = [" ".join(rng.choice(words, size=40)) for _ in range(72)]
    per = 20 if name == "veilprobe" else 8  # VeilProbe's ProtoNet episodes need 20 a class
    fit_texts = FitTexts(
        supervised=tuple(texts[: 2 * per]),
        labels=(1,) * per + (0,) * per,
        heldout=tuple(texts[2 * per : 2 * per + 20]),  # 20 >= 1/fpr - 1: a finite threshold
    )
    new = texts[2 * per + 20 :]
    options = _extraction_options(name, str(model_dir), tmp_path)
    preset = "cpu" if name == "veilprobe" else None  # its paper preset's GPT-2 is not here
    spec = {"name": name, "preset": preset, "options": options, "benchmark": "lab"}
    det = create_detector(
        name, preset=preset, options=options, benchmark="lab", cache_dir=str(tmp_path / "a")
    )
    fitted = fit_detector(det, target, fit_texts, mode="inductive", detector_spec=spec)
    before = fitted.score(new, target, det, check_distribution=False)
    fitted.save(tmp_path / "bundle")
    loaded = FittedDetector.load(tmp_path / "bundle")
    assert loaded.detector_spec == spec
    fresh = tmp_path / "fresh"
    again = loaded.score(new, target, loaded.build_detector(fresh), check_distribution=False)
    np.testing.assert_allclose(again.scores, before.scores, rtol=1e-6, atol=1e-9)
    np.testing.assert_array_equal(again.p_values, before.p_values)
    assert again.threshold == before.threshold and np.isfinite(before.threshold)
    # a text whose features are missing (a tiny random LM's empty continuation) is NaN in both
    assert np.isfinite(before.scores).sum() >= len(new) - 2, before.scores
    learnt = sorted(fitted.learnt)
    want = {"dpdllm": ["reference"], "veilprobe": ["mapping", "masked_lm", "proxy"]}
    assert learnt == want.get(name, []), learnt
    trained_again = [p for p in fresh.rglob("*") if p.is_file()] if fresh.exists() else []
    assert not [p for p in trained_again if p.suffix in {".safetensors", ".bin", ".pt"}]
