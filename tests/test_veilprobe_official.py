"""Every official VeilProbe behaviour, one test each, at tiny scale with local stand-ins.

The official code (STAIR-BUPT/VeilProbe) uses GPT-2 S/M/L, bert-base-cased and bert-base-uncased
with a 6-layer width-512 mapping model; here the same code paths run on a tiny WordPiece
tokenizer, tiny randomly initialised GPT-2 proxies and BERT masked LM, and a 1-layer mapping
model (``tests/veilprobe_support.py``), so nothing is downloaded.
"""

from __future__ import annotations

import ast
import dataclasses
import math
import re
from pathlib import Path

import numpy as np
import pytest

from calibdcd.detectors.veilprobe import (
    PRESETS,
    AttributionConfig,
    FeatureConfig,
    ProtoNetIB,
    VeilProbeConfig,
)
from calibdcd.detectors.veilprobe.mapping import (
    _optimizer,
    _pool,
    constant_decoder_batch,
    decoder_batch,
    pooled_features,
    train_mapping_model,
    training_inputs,
)
from veilprobe_support import (
    STANDIN_CORPUS,
    tiny_bert_mlm,
    tiny_bert_tokenizer,
    tiny_gpt2_proxy,
)

DOCS = Path(__file__).resolve().parents[1] / "docs" / "veilprobe.md"
SUFFIXES = [[STANDIN_CORPUS[(i + 1) % 8], STANDIN_CORPUS[(i + 3) % 8][:30]] for i in range(8)]


@pytest.fixture(scope="module")
def tokdir(tmp_path_factory) -> Path:
    return tiny_bert_tokenizer(tmp_path_factory.mktemp("bert-uncased-standin"))


@pytest.fixture(scope="module")
def tok(tokdir):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(tokdir))


def tiny_mapping(tokdir: Path, preset: str = "official", **kw):
    """The preset's mapping options at tiny size, with the stand-in tokenizer."""
    base = VeilProbeConfig.preset(preset).mapping
    size = dict(
        vocab_size=400,
        hidden_size=32,
        num_layers=1,
        num_heads=2,
        intermediate_size=64,
        max_length=48,
        epochs=1,
        device="cpu",
    )
    if base.tokenizer is not None:
        size["tokenizer"] = str(tokdir)
    return dataclasses.replace(base, **{**size, **kw})


@pytest.fixture(scope="module")
def official_run(tokdir, tmp_path_factory):
    """A tiny mapping model trained with every official training option; its steps recorded."""
    steps = []
    mm = train_mapping_model(
        STANDIN_CORPUS,
        SUFFIXES,
        tiny_mapping(tokdir),
        tmp_path_factory.mktemp("cache"),
        progress=False,
        on_step=steps.append,
    )
    return mm, steps


# -- presets --------------------------------------------------------------------------------------


def _docs_table() -> dict[str, dict[str, object]]:
    """option -> {preset: value} from the preset table of docs/veilprobe.md."""
    rows: dict[str, dict[str, object]] = {}
    header = None
    for line in DOCS.read_text(encoding="utf-8").splitlines():
        if not line.startswith("|"):
            header = None
            continue
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if cells[:4] == ["option", "official", "paper", "cpu"]:
            header = cells
            continue
        if header is None or set(cells[0]) <= {"-", ":", " "}:
            continue
        m = re.fullmatch(r"`([\w.]+)`", cells[0])
        assert m, f"docs/veilprobe.md: option cell {cells[0]!r} is not `sub.field`"
        rows[m.group(1)] = {
            p: ast.literal_eval(cells[i + 1].strip("`")) for i, p in enumerate(PRESETS)
        }
    return rows


def _get(cfg, path: str):
    for part in path.split("."):
        cfg = getattr(cfg, part)
    return cfg


def test_presets_resolve_to_the_values_documented_in_docs_veilprobe_md():
    table = _docs_table()
    assert len(table) >= 40, "the preset table in docs/veilprobe.md was not found"
    for option, values in table.items():
        for preset, documented in values.items():
            got = _get(VeilProbeConfig.preset(preset), option)
            assert got == documented, f"{preset}: {option} is {got!r}, docs say {documented!r}"
    # every option that differs between presets is in the table
    flat = {p: _flatten(VeilProbeConfig.preset(p).as_dict()) for p in PRESETS}
    differing = {k for k in flat["official"] if len({repr(flat[p][k]) for p in PRESETS}) > 1}
    assert differing <= set(table), f"undocumented preset differences: {differing - set(table)}"


def _flatten(d: dict, prefix: str = "") -> dict:
    out = {}
    for k, v in d.items():
        key = f"{prefix}{k}"
        out.update(_flatten(v, key + ".") if isinstance(v, dict) else {key: v})
    return out


def test_paper_is_the_default_and_unknown_presets_are_rejected():
    assert VeilProbeConfig() == VeilProbeConfig.paper() == VeilProbeConfig.preset("paper")
    with pytest.raises(ValueError, match="unknown VeilProbe preset 'gpu'"):
        VeilProbeConfig.preset("gpu")
    with pytest.raises(ValueError, match=r"features\.decoder_input must be one of"):
        FeatureConfig(decoder_input="dummy")  # type: ignore[arg-type]


def test_official_and_paper_share_the_feature_extraction_except_the_decoder_input():
    off, pap = VeilProbeConfig.official(), VeilProbeConfig.paper()
    assert off.mapping == pap.mapping and off.perturb == pap.perturb
    assert off.sampling == pap.sampling
    assert dataclasses.replace(pap.features, decoder_input="constant", normalize=False) == (
        off.features
    )


# -- decoder input --------------------------------------------------------------------------------


def test_constant_decoder_input_is_cls_cls_sep_then_pads_to_max_length(tok, official_run):
    ids, mask = constant_decoder_batch(tok, 3, 48, pad_to_max=True)
    row = [tok.cls_token_id, tok.cls_token_id, tok.sep_token_id] + [tok.pad_token_id] * 45
    assert ids.tolist() == [row] * 3
    assert mask[0].tolist() == [1, 1, 1] + [0] * 45

    # ... and that is exactly what the decoder reads under `official`
    mm, _ = official_run
    seen = []
    hook = mm.model.decoder.register_forward_pre_hook(
        lambda mod, args, kw: seen.append(kw), with_kwargs=True
    )
    try:
        pooled_features(mm, STANDIN_CORPUS[:2], None, VeilProbeConfig.official().features)
    finally:
        hook.remove()
    assert seen[0]["input_ids"].tolist() == [row] * 2


def test_official_target_format_labels_and_shifted_decoder_input(tok):
    ids, mask, labels = decoder_batch(tok, ["a river"], 12, True, "official")
    body = tok("a river", add_special_tokens=False)["input_ids"]
    cls, sep, pad = tok.cls_token_id, tok.sep_token_id, tok.pad_token_id
    lab = [cls, *body, sep]
    assert labels[0].tolist() == lab + [pad] * (12 - len(lab))
    assert ids[0].tolist() == [cls, *lab] + [pad] * (11 - len(lab))  # shift_tokens_right
    assert mask[0].tolist() == [1] * len(lab) + [0] * (12 - len(lab))
    # an empty suffix teacher-forces exactly the official constant input
    empty = decoder_batch(tok, [""], 12, True, "official")[0]
    assert empty.tolist() == constant_decoder_batch(tok, 1, 12, True)[0].tolist()
    ids, _, labels = decoder_batch(tok, ["a river"], 12, False, "plain")
    assert ids[0].tolist() == [cls, *body] and labels[0].tolist() == [*body, sep]


# -- training -------------------------------------------------------------------------------------


def test_official_training_attends_pads_and_trains_pad_labels(official_run, tok):
    _, steps = official_run
    assert len(steps) == math.ceil(16 / 2)
    for st in steps:
        assert "attention_mask" not in st.inputs and "decoder_attention_mask" not in st.inputs
        assert st.inputs["input_ids"].shape[1] == 48  # padded to max_length
        assert st.inputs["decoder_input_ids"].shape[1] == 48
        labels = st.labels
        assert (labels != -100).all()  # pad positions keep the [PAD] id and are trained
        assert (labels == tok.pad_token_id).any()
        assert (labels[:, 0] == tok.cls_token_id).all()  # official labels start with [CLS]


def test_masked_training_options_pass_masks_and_ignore_pads(tok, tokdir):
    cfg = tiny_mapping(tokdir, "cpu")
    batch = list(zip(STANDIN_CORPUS[:2], ["short", "a much longer suffix of words"], strict=True))
    inputs, labels = training_inputs(tok, batch, cfg)
    assert inputs["attention_mask"].shape == inputs["input_ids"].shape
    assert inputs["input_ids"].shape[1] < 48  # padded to the longest text only
    assert (labels[0] == -100).any() and (labels[1] != tok.pad_token_id).all()
    # the official options give the opposite, each on its own
    off = training_inputs(tok, batch, dataclasses.replace(cfg, train_attend_pads=True))[0]
    assert "attention_mask" not in off
    assert (
        training_inputs(tok, batch, dataclasses.replace(cfg, train_pad_to_max=True))[0][
            "input_ids"
        ].shape[1]
        == 48
    )
    keep = training_inputs(tok, batch, dataclasses.replace(cfg, labels_ignore_pad=False))[1]
    assert (keep != -100).all()


def test_gradients_are_clipped_at_one(official_run, tokdir, tmp_path):
    import torch

    def clipped_norm(model):
        return float(
            torch.linalg.vector_norm(
                torch.stack([p.grad.norm() for p in model.parameters() if p.grad is not None])
            )
        )

    _, steps = official_run
    assert VeilProbeConfig.official().mapping.max_grad_norm == 1.0
    assert any(st.grad_norm > 1.0 for st in steps), "no step needed clipping; test is void"
    # the official run is over: recompute one clipped step by training again with a probe
    seen = []
    train_mapping_model(
        STANDIN_CORPUS,
        SUFFIXES,
        tiny_mapping(tokdir),
        tmp_path / "a",
        progress=False,
        on_step=lambda st: seen.append((st.grad_norm, clipped_norm(st.model))),
    )
    for before, after in seen:
        assert after == pytest.approx(min(before, 1.0), rel=1e-4)
    unclipped = []
    train_mapping_model(
        STANDIN_CORPUS,
        SUFFIXES,
        tiny_mapping(tokdir, max_grad_norm=None),
        tmp_path / "b",
        progress=False,
        on_step=lambda st: unclipped.append((st.grad_norm, clipped_norm(st.model))),
    )
    assert any(after > 1.0 for _, after in unclipped)
    for before, after in unclipped:
        assert after == pytest.approx(before, rel=1e-4)


def test_weight_decay_skips_biases_and_layernorm_like_the_trainer(official_run, tokdir):
    mm, _ = official_run
    opt = _optimizer(mm.model, tiny_mapping(tokdir))
    names = {id(p): n for n, p in mm.model.named_parameters()}
    decayed = {names[id(p)] for g in opt.param_groups if g["weight_decay"] > 0 for p in g["params"]}
    assert decayed and not any("bias" in n or "LayerNorm" in n for n in decayed)
    assert any("LayerNorm.weight" in names[id(p)] for p in opt.param_groups[1]["params"])
    assert opt.param_groups[0]["weight_decay"] == 0.01
    every = _optimizer(mm.model, tiny_mapping(tokdir, decay_bias_and_norm=True))
    assert len(every.param_groups) == 1 and every.param_groups[0]["weight_decay"] == 0.01


# -- feature read-out ---------------------------------------------------------------------------


def test_pooling_over_all_positions_includes_the_pads(official_run):
    mm, _ = official_run
    texts = STANDIN_CORPUS[:3]
    fewer_pads = dataclasses.replace(mm, config=dataclasses.replace(mm.config, max_length=40))
    official = VeilProbeConfig.official().features
    E48, D48 = pooled_features(mm, texts, None, official)
    E40, D40 = pooled_features(fewer_pads, texts, None, official)
    assert not np.allclose(E48, E40, atol=1e-4) and not np.allclose(D48, D40, atol=1e-4)

    # masked pooling (with masked attention) ignores pads: batch company and max_length alike
    masked = dataclasses.replace(official, pooling="masked", attention="masked")
    alone = pooled_features(
        mm, texts[:1], [SUFFIXES[0]], dataclasses.replace(masked, decoder_input="suffix")
    )
    batched = pooled_features(
        fewer_pads, texts, SUFFIXES[:3], dataclasses.replace(masked, decoder_input="suffix")
    )
    np.testing.assert_allclose(alone[0][0], batched[0][0], atol=1e-5)
    np.testing.assert_allclose(alone[1][0], batched[1][0], atol=1e-5)

    # the pooling itself: pads count under "all" and do not under "masked"
    import torch

    h = (torch.ones(1, 4, 2), torch.ones(1, 4, 2))
    h[0][0, 2:] = 0.0
    mask = torch.tensor([[1, 1, 0, 0]])
    assert _pool(h, mask, True)[0, 0] == pytest.approx(0.5)
    assert _pool(h, mask, False)[0, 0] == pytest.approx(1.0)


def test_official_attention_masks_at_feature_time(official_run):
    mm, _ = official_run
    enc_kw, dec_kw = [], []
    hooks = [
        mm.model.encoder.register_forward_pre_hook(
            lambda m, a, kw: enc_kw.append(kw), with_kwargs=True
        ),
        mm.model.decoder.register_forward_pre_hook(
            lambda m, a, kw: dec_kw.append(kw), with_kwargs=True
        ),
    ]
    try:
        pooled_features(mm, STANDIN_CORPUS[:2], None, VeilProbeConfig.official().features)
        masked = dataclasses.replace(VeilProbeConfig.official().features, attention="masked")
        pooled_features(mm, STANDIN_CORPUS[:2], None, masked)
    finally:
        for h in hooks:
            h.remove()
    # official: the encoder gets its padding mask (pads masked in its self-attention) ...
    am = enc_kw[0]["attention_mask"]
    assert am.shape == (2, 48) and (am == 0).any() and (am == 1).any()
    # ... the decoder's self-attention and cross-attention get none (they see the pads)
    assert dec_kw[0]["attention_mask"] is None and dec_kw[0]["encoder_attention_mask"] is None
    # "masked": both padding masks are passed
    assert dec_kw[1]["attention_mask"] is not None
    assert dec_kw[1]["encoder_attention_mask"] is not None


# -- key tokens -----------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def perturber(tmp_path_factory):
    """The official perturbation options on three tiny GPT-2 stand-ins and a tiny BERT."""
    from calibdcd.detectors.veilprobe.perturb import KeyTokenPerturber

    root = tmp_path_factory.mktemp("standins")
    proxies = tuple(
        str(tiny_gpt2_proxy(root / f"gpt2-{i}", seed=i, n_layer=i + 1)) for i in range(3)
    )
    cfg = dataclasses.replace(
        VeilProbeConfig.official().perturb,
        proxies=proxies,
        masked_lm=str(tiny_bert_mlm(root / "bert-cased")),
        attribution=AttributionConfig(method="loo", max_tokens=256),
    )
    return KeyTokenPerturber(cfg, root / "cache", progress=False)


TEXT = " ".join(STANDIN_CORPUS[:3])  # about 45 proxy tokens


def test_official_key_tokens_are_13_from_the_top_26_of_each_proxy(perturber):
    from calibdcd.detectors.veilprobe.attribution import attribute
    from calibdcd.detectors.veilprobe.perturb import key_token_count

    off = VeilProbeConfig.official().perturb
    assert (off.n_key, off.top_k_factor) == (13, 2)
    keys = perturber.key_tokens(TEXT)
    assert len(keys) == 13
    top26 = set()
    for proxy in perturber._proxies:
        scored = attribute(proxy, TEXT, perturber.config.attribution)
        assert len(scored) > 26
        best = sorted(scored, key=lambda s: -s.score)[:26]
        top26 |= {TEXT[s.start : s.end].strip() for s in best}
    assert {k.token for k in keys} <= top26
    assert key_token_count(off, 60) == 13 and key_token_count(off, 0) == 0
    assert key_token_count(VeilProbeConfig.cpu().perturb, 60) == 6  # ceil(10% of 60)


def test_perturbation_replaces_the_official_key_tokens(perturber):
    (r,) = perturber.perturb([TEXT])
    changed = sum(a != b for a, b in zip(TEXT.split(), r.split(), strict=False))
    assert 0 < changed <= 13


# -- ProtoNet -------------------------------------------------------------------------------------


def test_official_protonet_hyperparameters_and_euclidean_inference():
    import torch

    cfg = VeilProbeConfig.official().protonet
    assert (cfg.episodes, cfg.n_support, cfg.n_query) == (500, 5, 5)
    assert (cfg.hidden, cfg.latent, cfg.beta) == (64, 16, 1e-3)
    assert (cfg.distance, cfg.train_distance) == ("euclidean", "sqeuclidean")
    assert VeilProbeConfig.official().features.normalize is False
    rng = np.random.default_rng(0)
    x = rng.normal(size=(40, 12)).astype(np.float32)
    y = np.repeat([0, 1], 20)
    x[y == 1, :3] += 1.5
    clf = ProtoNetIB(cfg, seed=0).fit(x, y)
    with torch.no_grad():
        g = clf.net(torch.as_tensor(x))
        d = torch.linalg.vector_norm(g[:, None, :] - clf.prototypes_[None], dim=-1)
    np.testing.assert_allclose(clf.score(x), (d[:, 0] - d[:, 1]).numpy(), rtol=1e-5, atol=1e-5)
    sq = ProtoNetIB(dataclasses.replace(cfg, distance="sqeuclidean"), seed=0).fit(x, y)
    np.testing.assert_allclose(
        sq.score(x), (d[:, 0] ** 2 - d[:, 1] ** 2).numpy(), rtol=1e-4, atol=1e-4
    )


def test_a_config_selects_each_preset_and_overrides_single_options(tmp_path):
    from calibdcd.experiment.config import DetectorEntry
    from calibdcd.experiment.detector_entries import plan_detector

    for preset in PRESETS:
        entry = DetectorEntry("veilprobe", preset=preset)
        det = plan_detector(entry, "wikimia", 0, str(tmp_path)).build()
        expected = dataclasses.replace(
            VeilProbeConfig.preset(preset), cache_dir=str(tmp_path / "veilprobe"), progress=False
        )
        assert det.config == expected
    entry = DetectorEntry(
        "veilprobe", preset="official", options={"features": {"decoder_input": "suffix"}}
    )
    det = plan_detector(entry, "wikimia", 0, str(tmp_path)).build()
    assert det.config.features.decoder_input == "suffix"
    assert det.config.protonet == VeilProbeConfig.official().protonet
    with pytest.raises(ValueError, match="VeilProbe presets are official, paper, cpu"):
        plan_detector(DetectorEntry("veilprobe", preset="gpu"), "wikimia", 0, str(tmp_path)).build()
