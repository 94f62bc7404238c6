"""What changes on a CUDA device: device and dtype selection, batched decoding (row pruning
included) on the GPU, bf16 weights, and the lab's training loop under autocast. Skipped where
no CUDA device is at hand (CI, this project's CPU machines); `benchmarks/gpu_check.sh` runs them
on a GPU machine and docs/scaling.md records what they gave there."""

from __future__ import annotations

import random

import pytest

torch = pytest.importorskip("torch")

pytestmark = pytest.mark.skipif(
    not torch.cuda.is_available(), reason="no CUDA device here (these tests need a GPU)"
)

from calibdcd.device import autocast, native_bf16, resolve_device, resolve_dtype  # noqa: E402
from calibdcd.targets import GenerationParams  # noqa: E402
from calibdcd.targets.hf import HFTarget  # noqa: E402
from test_targets_hf import SAMPLED, _prompts, batch_invariant_samples  # noqa: E402

GREEDY = GenerationParams(max_new_tokens=16, temperature=0.0, n=1)


def test_auto_resolves_to_cuda_and_bf16():
    assert resolve_device("auto") == "cuda"
    bf16 = native_bf16("cuda")
    assert resolve_dtype("auto", "cuda") == (torch.bfloat16 if bf16 else torch.float32)
    assert resolve_dtype("auto", "cpu") == torch.float32
    x = torch.ones(4, 4, device="cuda")
    with autocast(torch.device("cuda")):
        assert (x @ x).dtype == (torch.bfloat16 if bf16 else torch.float32)


def test_cuda_fp32_sampling_is_independent_of_batch_size_and_pruning(model_dir):
    target = HFTarget(model_dir, device="cuda", dtype="float32", batch_size=8)
    assert next(target.model.parameters()).device.type == "cuda"
    prompts = _prompts(8)
    ref = batch_invariant_samples(target, prompts)
    assert target._can_prune  # the CUDA KV cache dropped finished rows (else it says False)
    lengths = [len(target.tokenizer(c)["input_ids"]) for row in ref for c in row]
    assert min(lengths) < SAMPLED.max_new_tokens - 2  # some rows ended early: pruning happened
    assert sum(len(set(c)) > 1 for c in ref) >= len(prompts) // 2  # real sampling


def test_cuda_fp32_greedy_agrees_with_cpu(model_dir):
    prompts = _prompts(16)
    gpu = HFTarget(model_dir, device="cuda", dtype="float32", batch_size=16)
    cpu = HFTarget(model_dir, device="cpu", batch_size=16)
    a, b = gpu.generate(prompts, GREEDY), cpu.generate(prompts, GREEDY)
    same = sum(x == y for x, y in zip(a, b, strict=True))
    # different kernels may break a near-tie of two logits; anything more is a bug
    assert same >= len(prompts) - 1, f"{same}/{len(prompts)} greedy completions equal"


def test_bf16_target_loads_bf16_and_is_deterministic(model_dir):
    if not native_bf16("cuda"):
        pytest.skip("this GPU has no native bf16")
    target = HFTarget(model_dir, device="cuda", batch_size=8)  # dtype auto
    assert next(target.model.parameters()).dtype == torch.bfloat16
    prompts = _prompts(8)
    first = target.generate(prompts, SAMPLED)
    assert first == target.generate(prompts, SAMPLED)
    assert all(len(c) == SAMPLED.n and all(isinstance(t, str) for t in c) for c in first)


def test_lab_training_loop_runs_under_cuda_autocast():
    from calibdcd.lab.config import ModelConfig, PretrainConfig
    from calibdcd.lab.train import build_model, pretrain

    special = {"bos": 0, "eos": 0, "pad": 1}
    tiny = ModelConfig(hidden_size=64, num_layers=2, num_heads=2, intermediate_size=128)
    model = build_model(tiny, 256, special, seed=0)
    rng = random.Random(0)
    docs = [[rng.randrange(2, 256) for _ in range(60)] for _ in range(8)] * 20  # memorisable
    cfg = PretrainConfig(batch_size=4, seq_len=64, epochs=3, lr=3e-3, warmup_steps=5)
    dtypes = []
    hook = model.lm_head.register_forward_hook(lambda m, i, o: dtypes.append(o.dtype))
    stats = pretrain(model, docs, 0, cfg, seed=0, device=torch.device("cuda"), progress=False)
    hook.remove()
    assert next(model.parameters()).device.type == "cuda"
    bf16 = native_bf16("cuda")
    assert set(dtypes) == {torch.bfloat16 if bf16 else torch.float32}  # autocast took effect
    assert all(torch.isfinite(p).all() for p in model.parameters())
    assert stats.steps > 10 and stats.last_loss < stats.first_loss - 1.0, stats


def test_gilot_ot_distances_on_the_gpu_equal_the_numpy_solver():
    """A text's IPOT distances solved in one float64 batch on the GPU (what a CUDA proxy's
    GiLOT does) equal the numpy solver's, support by support."""
    import numpy as np

    from calibdcd.detectors.veilprobe.ot import cosine_cost, ot_distance, ot_distances

    rng = np.random.default_rng(3)
    emb = rng.normal(size=(2000, 64)).astype(np.float32)
    pairs = []
    for k in (50, 400, 1000, 730):
        support = np.sort(rng.choice(2000, size=k, replace=False))
        pairs.append((rng.dirichlet(np.ones(k)), rng.dirichlet(np.ones(k) * 0.2), support))
    want = [ot_distance(p, q, cosine_cost(emb[s])) for p, q, s in pairs]
    got = ot_distances(pairs, emb, device="cuda")
    np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-14)
