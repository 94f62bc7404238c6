"""DPDLLM as its authors run it (issue 12.3): decoding inherited from the target and recorded,
the reference-LM arrangement (shared | per_split) as the experiment runner applies it, and the
reference LM's dtype (fp32 default, bf16 opt-in). Real tiny models: the tiny LM as the reference
LM, the lab micro's base model as the target."""

from __future__ import annotations

import dataclasses
import json
import shutil
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from calibdcd.detectors.dpdllm import DPDLLM, DPDLLMConfig, ReferenceLMConfig  # noqa: E402
from calibdcd.detectors.dpdllm.reference import ReferenceLM, reference_key  # noqa: E402
from calibdcd.targets import INHERIT  # noqa: E402
from calibdcd.targets.hf import HFTarget  # noqa: E402
from calibdcd.targets.tiny import cached_tiny_lm, synthetic_sentences  # noqa: E402

L = 16


@pytest.fixture(scope="module")
def tiny():
    torch.set_num_threads(2)
    return cached_tiny_lm()


def test_defaults_are_official_decoding_and_fp32_with_shared_reference():
    c = DPDLLMConfig()
    p = c.generation_params()
    assert (p.temperature, p.max_new_tokens, p.n) == (0.7, 128, 1)
    assert (p.top_k, p.top_p, p.repetition_penalty) == (INHERIT, INHERIT, INHERIT)
    assert DPDLLMConfig(top_k=50, top_p=1.0).generation_params().top_k == 50
    assert DPDLLMConfig(top_k=None).generation_params().top_k is None
    r = c.reference
    assert (r.bf16, r.arrangement) == (False, "shared")
    assert DPDLLM().reference_arrangement == "shared"
    with pytest.raises(ValueError, match=r"reference\.arrangement"):
        ReferenceLMConfig(arrangement="pooled")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"reference\.bf16"):
        ReferenceLMConfig(bf16="yes")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="dpdllm: top_p"):
        DPDLLMConfig(top_p="server")
    det = DPDLLM(reference=ReferenceLMConfig(arrangement="per_split"))
    assert det.reference_texts_for(["a"], ["a", "b"]) == ["a"]
    assert DPDLLM().reference_texts_for(["a"], ["a", "b"]) == ["a", "b"]


def test_bf16_is_opt_in_and_applied(tiny, tmp_path):
    texts = synthetic_sentences(12, seed=1)
    fp32 = ReferenceLMConfig(model_path=str(tiny), epochs=1, cache_dir=str(tmp_path), device="cpu")
    bf16 = dataclasses.replace(fp32, bf16=True)
    assert "bf16" not in fp32.training_key() and fp32.training_key() != bf16.training_key()
    assert reference_key(fp32, L, texts) != reference_key(bf16, L, texts)
    r32 = ReferenceLM.fine_tuned(fp32, L, texts, progress=False)
    r16 = ReferenceLM.fine_tuned(bf16, L, texts, progress=False)
    assert r32.path != r16.path
    assert next(r16.model.parameters()).dtype == torch.float32  # weights stay fp32
    s32 = r32.position_stats(texts)["cond_prob"]
    s16 = r16.position_stats(texts)["cond_prob"]
    assert np.isfinite(s16).all() and s16.shape == s32.shape
    assert not np.array_equal(s16, s32)  # bf16 autocast really ran (also on CPU)
    np.testing.assert_allclose(s16, s32, atol=0.1)


def test_extract_records_the_decoding_the_target_used(tiny, tmp_path):
    ckpt = tmp_path / "ckpt"
    shutil.copytree(tiny, ckpt)
    gc = json.loads((ckpt / "generation_config.json").read_text())
    gc.update(top_k=9, top_p=0.85, repetition_penalty=1.1)
    (ckpt / "generation_config.json").write_text(json.dumps(gc))
    target = HFTarget(ckpt, device="cpu")
    ref = ReferenceLMConfig(model_path=str(tiny), epochs=1, cache_dir=str(tmp_path / "ref"))
    texts = [" ".join(synthetic_sentences(4, seed=i)) for i in range(6)]
    det = DPDLLM(DPDLLMConfig(length=L, reference=ref, progress=False))
    feats = det.extract(texts, target)
    rec = feats.generation["continuation"]
    assert rec["used"]["top_k"] == 9 and rec["used"]["top_p"] == 0.85
    assert rec["used"]["repetition_penalty"] == 1.1 and rec["used"]["temperature"] == 0.7
    assert rec["requested"]["top_k"] == INHERIT and rec["source"] == "generation_config.json"
    over = DPDLLM(DPDLLMConfig(length=L, reference=ref, progress=False, top_k=50))
    assert over.extract(texts[:2], target).generation["continuation"]["used"]["top_k"] == 50


# --- the arrangement through the experiment runner -----------------------------------------------


def _config(tmp: Path, lab: Path, tiny: Path) -> Path:
    ref = f"model_path: {tiny}, epochs: 1, cache_dir: {tmp / 'ref'}"
    text = f"""
name: dpdllm-arrangement
seeds: [0]
benchmarks:
  - {{name: lab, path: {lab / "ground_truth.jsonl"}, label: lab}}
targets:
  - {{name: base, backend: hf, model: {lab / "base"}, post_trained: false,
     options: {{device: cpu, batch_size: 64}}}}
detectors:
  - {{name: dpdllm, label: shared, options: {{length: {L}, reference: {{{ref}}}}}}}
  - {{name: dpdllm, label: split,
     options: {{length: {L}, reference: {{{ref}, arrangement: per_split}}}}}}
split: {{subsample: 40, n_supervised_per_class: 8}}
analyses: {{ablations: false, adaptive_vs_fixed: false, fp_recovery: false}}
evaluation: {{n_boot: 0}}
cache_dir: {tmp / "cache"}
"""
    path = tmp / "arrangement.yaml"
    path.write_text(text)
    return path


@pytest.mark.slow  # ~50 s on 2 cores
def test_runner_passes_reference_texts_by_arrangement(lab_micro, tiny, tmp_path):
    from calibdcd.data import split_benchmark
    from calibdcd.experiment import load_config
    from calibdcd.experiment.plan import resolve
    from calibdcd.experiment.resources import RunContext
    from calibdcd.experiment.setting import run_setting

    cfg = load_config(_config(tmp_path, Path(lab_micro), tiny))
    plan = resolve(cfg, tmp_path / "run")
    ctx = RunContext(plan, progress=False)
    results, detectors = {}, {}
    for planned in plan.settings:  # one benchmark, one target, seed 0: one per detector
        label = planned.setting.detector.label
        results[label] = run_setting(planned, ctx.inputs(planned))
        detectors[label] = ctx.detector(planned.detector)

    bench = ctx.benchmark(plan.benchmarks[0])
    split = split_benchmark(bench, plan.benchmarks[0].split, seed=0)
    sup = list(split.supervised)
    rest = [int(i) for i in split.subsample if i not in set(sup)]
    pool = [bench.texts[i] for i in split.subsample]
    sup_t, rest_t = [bench.texts[i] for i in sup], [bench.texts[i] for i in rest]

    shared, per_split = detectors["shared"], detectors["split"]
    rc, w = shared.config.reference, shared.config.window
    # shared: one reference LM, fine-tuned on every text of the subsample (labels unused)
    assert set(shared._references) == {reference_key(rc, w, pool)}
    # per_split (official): one on the supervised texts, one on the rest of the subsample
    rc2 = per_split.config.reference
    assert set(per_split._references) == {
        reference_key(rc2, w, sup_t),
        reference_key(rc2, w, rest_t),
    }
    # both saw the same target continuations (one generation cache), other reference LMs
    for label in ("shared", "split"):
        res = results[label]
        gen = res["generation"]["continuation"]
        assert gen["requested"]["top_k"] == INHERIT and gen["backend"] == "hf"
        # the lab's generation_config sets no top-k: transformers' default 50, top-p 1.0
        assert (gen["used"]["top_k"], gen["used"]["top_p"], gen["used"]["temperature"]) == (
            50,
            1.0,
            0.7,
        )
        stored = json.loads((tmp_path / "run" / "settings" / res["id"] / "result.json").read_text())
        assert stored["generation"] == res["generation"]
    assert results["shared"]["before"] != results["split"]["before"]
    # the record survives the feature cache: a fresh context reads it back without generating
    plan2 = resolve(cfg, tmp_path / "run2")
    ctx2 = RunContext(plan2, progress=False)
    again = run_setting(plan2.settings[0], ctx2.inputs(plan2.settings[0]))
    assert ctx2.target_loads == 0 and again["generation"] == results["shared"]["generation"]
