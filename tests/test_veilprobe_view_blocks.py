"""Does a CalibDCD view move VeilProbe's output-derived (D, dD) columns?

Under ``paper`` (the observed suffixes teacher-forced through the decoder) it must: CalibDCD
corrects exactly those columns. Under ``official`` (the constant ``[CLS]`` decoder input) it
cannot, with the mapping model fixed: the target's output then reaches the features only through
the mapping model's training, and CalibDCD would have nothing to correct. Real tiny models
throughout: the project's transformers target on the tiny local LM, GPT-2 and BERT stand-ins.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from calibdcd.detectors.veilprobe import AttributionConfig, VeilProbe, VeilProbeConfig
from veilprobe_support import (
    PrefixView,
    tiny_bert_mlm,
    tiny_bert_tokenizer,
    tiny_gpt2_proxy,
)

VIEWS = (
    PrefixView("assistant", prefix="Assistant: "),
    PrefixView("continue", prefix="Continue the text: "),
)


@pytest.fixture(scope="module")
def target(tmp_path_factory):
    from calibdcd.targets.cache import CachedTarget
    from calibdcd.targets.hf import HFTarget
    from calibdcd.targets.tiny import cached_tiny_lm

    hf = HFTarget(str(cached_tiny_lm()), device="cpu", batch_size=32)
    return CachedTarget(hf, tmp_path_factory.mktemp("gen") / "generations.sqlite")


@pytest.fixture(scope="module")
def pool():
    from calibdcd.targets.tiny import synthetic_sentences

    return synthetic_sentences(8, seed=7)


@pytest.fixture(scope="module")
def paper_cfg(tmp_path_factory):
    """The ``paper`` preset's every option, at tiny size, on local stand-ins."""
    from calibdcd.targets.tiny import synthetic_sentences

    root = tmp_path_factory.mktemp("vp-views")
    paper = VeilProbeConfig.paper()
    return VeilProbeConfig.paper(
        # the tiny LM ends a complete sentence at once (empty suffixes, which teacher-force exactly
        # the constant input): prompt with the first half of each text, as on the lab
        sampling=dataclasses.replace(
            paper.sampling, max_new_tokens=12, n_suffixes=2, prompt_fraction=0.5
        ),
        perturb=dataclasses.replace(
            paper.perturb,
            proxies=tuple(str(tiny_gpt2_proxy(root / f"gpt2-{i}", seed=i)) for i in range(2)),
            masked_lm=str(tiny_bert_mlm(root / "bert-cased")),
            attribution=AttributionConfig(method="loo", max_tokens=64),
        ),
        mapping=dataclasses.replace(
            paper.mapping,
            hidden_size=32,
            num_layers=1,
            num_heads=2,
            intermediate_size=64,
            max_length=64,
            epochs=1,
            tokenizer=str(
                tiny_bert_tokenizer(root / "bert-uncased", extra=synthetic_sentences(200))
            ),
            device="cpu",
        ),
        cache_dir=str(root / "cache"),
        progress=False,
    )


def _blocks(feats, names):
    return {b: feats.values[:, feats.blocks[b]] for b in names}


def _changed_rows(det, pool, target):
    """(rows whose text's suffixes differ between the views, rows whose text's or perturbed
    copy's suffixes differ), compared as the mapping model reads them (token ids)."""
    tok = det._mapping[target.name][0].tokenizer
    q = [det.query(t) for t in pool]
    r = det.perturbed(q)

    def ids(texts, view):
        return [[tok(s)["input_ids"] for s in ss] for ss in det.suffixes(texts, target, view)]

    s_moved = np.array([a != b for a, b in zip(ids(q, VIEWS[0]), ids(q, VIEWS[1]), strict=True)])
    r_moved = np.array([a != b for a, b in zip(ids(r, VIEWS[0]), ids(r, VIEWS[1]), strict=True)])
    return s_moved, s_moved | r_moved


def test_a_view_moves_D_and_dD_under_paper_and_nothing_under_official(paper_cfg, pool, target):
    paper = VeilProbe(paper_cfg)
    paper.prepare(pool, target)
    f = [paper.extract(pool, target, view=v) for v in VIEWS]
    s_moved, any_moved = _changed_rows(paper, pool, target)
    assert s_moved.sum() >= len(pool) // 2, "the views hardly changed the suffixes; test is void"
    for name, moved in (("D", s_moved), ("dD", any_moved)):
        a, b = _blocks(f[0], [name])[name], _blocks(f[1], [name])[name]
        diff = np.abs(a - b).max(axis=1)
        assert (diff[moved] > 1e-6).all(), f"{name} did not move where the suffixes changed"
        assert (diff[~any_moved] == 0).all(), f"{name} moved where no suffix changed"
    for name in ("E", "dE"):  # the mapping model reads e0(s): the input blocks stay put
        np.testing.assert_array_equal(
            f[0].values[:, f[0].blocks[name]], f[1].values[:, f[1].blocks[name]]
        )

    official_features = dataclasses.replace(
        paper_cfg.features, decoder_input="constant", normalize=False
    )
    official = VeilProbe(dataclasses.replace(paper_cfg, features=official_features))
    official.prepare(pool, target)
    # the same, fixed mapping model (same training options and pairs: loaded from the cache)
    assert official._mapping[target.name][0].path == paper._mapping[target.name][0].path
    g = [official.extract(pool, target, view=v) for v in VIEWS]
    np.testing.assert_array_equal(g[0].values, g[1].values)
    # ... while the same texts' D columns do differ from the teacher-forced ones
    assert not np.allclose(g[0].values[:, g[0].blocks["D"]], f[0].values[:, f[0].blocks["D"]])


def test_encoder_input_view_moves_the_input_blocks_too(paper_cfg, pool, target):
    feats = dataclasses.replace(paper_cfg.features, encoder_input="view")
    det = VeilProbe(dataclasses.replace(paper_cfg, features=feats))
    det.prepare(pool, target)
    f = [det.extract(pool, target, view=v) for v in VIEWS]
    for name in ("E", "D"):
        assert not np.allclose(f[0].values[:, f[0].blocks[name]], f[1].values[:, f[1].blocks[name]])
    # without a view the encoder reads e0(s) either way
    base = VeilProbe(paper_cfg)
    base.prepare(pool, target)
    np.testing.assert_array_equal(
        det.extract(pool, target).values, base.extract(pool, target).values
    )


def test_shared_model_false_trains_one_mapping_model_per_side(paper_cfg, pool, target):
    mapping = dataclasses.replace(paper_cfg.mapping, shared_model=False)
    det = VeilProbe(dataclasses.replace(paper_cfg, mapping=mapping))
    det.prepare(pool, target)
    mm_s, mm_r = det._mapping[target.name]
    assert mm_s.path != mm_r.path
    shared = VeilProbe(paper_cfg)
    shared.prepare(pool, target)
    assert shared._mapping[target.name][0] is shared._mapping[target.name][1]
    a, b = det.extract(pool, target), shared.extract(pool, target)
    assert a.values.shape == b.values.shape and not np.allclose(a.values, b.values)
