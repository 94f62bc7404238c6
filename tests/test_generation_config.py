"""Decoding fields inherited from the target (issue 12.3 / 17.4): the repetition penalty in the hf
decoding loop, ``"inherit"`` resolved from a real tiny checkpoint's generation_config.json, the
cache keyed on resolved values, the OpenAI request leaving inherited fields to a real loopback
server, and what was used recorded."""

from __future__ import annotations

import hashlib
import json
import shutil
import sqlite3

import pytest

torch = pytest.importorskip("torch")

from calibdcd.targets import INHERIT, GenerationParams, generation_record  # noqa: E402
from calibdcd.targets.cache import CachedTarget, cache_key  # noqa: E402
from calibdcd.targets.hf import HFTarget, apply_repetition_penalty  # noqa: E402
from calibdcd.targets.openai import OpenAITarget, request_seed  # noqa: E402
from calibdcd.targets.tiny import synthetic_sentences  # noqa: E402

OPEN = {"top_k": INHERIT, "top_p": INHERIT, "repetition_penalty": INHERIT}
CKPT = {"do_sample": True, "temperature": 0.9, "top_k": 7, "top_p": 0.8, "repetition_penalty": 1.2}


def _with_generation_config(src, dst, fields: dict | None):
    """A copy of the tiny checkpoint whose generation_config.json sets ``fields`` on top of the
    token ids (None: no generation_config.json at all)."""
    shutil.copytree(src, dst)
    gc = dst / "generation_config.json"
    base = json.loads(gc.read_text())
    if fields is None:
        gc.unlink()
    else:
        keep = {k: v for k, v in base.items() if k.endswith("token_id")}
        gc.write_text(json.dumps({**keep, **fields}))
    return dst


@pytest.fixture(scope="module")
def ckpt_dirs(model_dir, tmp_path_factory):
    root = tmp_path_factory.mktemp("gencfg")
    return {
        "a": _with_generation_config(model_dir, root / "a", CKPT),
        "b": _with_generation_config(model_dir, root / "b", {**CKPT, "top_k": 3}),
        "none": _with_generation_config(model_dir, root / "none", None),
    }


def _prompts(k: int) -> list[str]:
    """Prompts that already hold a sentence end: the penalised '.' makes the tiny model go on."""
    texts = [" ".join(synthetic_sentences(3, seed=i)) for i in range(k)]
    return [t[: len(t) // 2 + i] for i, t in enumerate(texts)]


# --- the repetition penalty ----------------------------------------------------------------------


def test_repetition_penalty_equals_transformers_processor_on_real_logits(target):
    from transformers.generation.logits_process import RepetitionPenaltyLogitsProcessor

    for p in _prompts(4):
        ids = target.tokenizer(p, return_tensors="pt")["input_ids"]
        with torch.inference_mode():
            scores = target.model(input_ids=ids).logits[:, -1, :].float()
        assert (scores > 0).any() and (scores < 0).any()
        seen = torch.zeros_like(scores, dtype=torch.bool)
        seen[0, ids[0]] = True
        for penalty in (1.05, 1.3, 0.8):
            ours = apply_repetition_penalty(scores, seen, penalty)
            ref = RepetitionPenaltyLogitsProcessor(penalty)(ids, scores.clone())
            assert torch.equal(ours, ref)
            assert not torch.equal(ours, scores)


def test_greedy_with_penalty_matches_generate_and_differs_without(target):
    prompts = _prompts(6)
    plain = GenerationParams(max_new_tokens=16, temperature=0.0)
    pen = GenerationParams(max_new_tokens=16, temperature=0.0, repetition_penalty=1.6)
    target.batch_size = 8  # left-padded batches: the penalty never sees the padding
    out_plain, out_pen = target.generate(prompts, plain), target.generate(prompts, pen)
    assert out_plain != out_pen
    tok, model = target.tokenizer, target.model
    for p, comps in zip(prompts, out_pen, strict=True):
        ids = tok(p, return_tensors="pt")
        ref = model.generate(
            **ids,
            max_new_tokens=16,
            do_sample=False,
            repetition_penalty=1.6,
            pad_token_id=target.pad_id,
        )
        new = ref[0, ids["input_ids"].shape[1] :].tolist()
        stop = [i for i, t in enumerate(new) if t in target.eos_ids]
        new = new[: stop[0]] if stop else new
        assert comps[0] == tok.decode(new, skip_special_tokens=True)


def test_sampling_with_penalty_stays_batch_invariant(target):
    prompts = _prompts(8)
    params = GenerationParams(
        max_new_tokens=14, temperature=1.0, top_k=40, top_p=0.95, n=2, seed=3,
        repetition_penalty=1.3,
    )  # fmt: skip
    target.batch_size = 8
    ref = target.generate(prompts, params)
    target.batch_size = 3
    try:
        assert target.generate(prompts[::-1], params) == ref[::-1]
        assert target.generate_indexed([prompts[5]], [1], params) == [ref[5][1]]
    finally:
        target.batch_size = 8
    no_pen = GenerationParams(**{**params.as_dict(), "repetition_penalty": 1.0})
    assert target.generate(prompts, no_pen) != ref


# --- inheritance from the checkpoint ------------------------------------------------------------


def test_inherit_resolves_from_generation_config_and_explicit_wins(ckpt_dirs):
    t = HFTarget(ckpt_dirs["a"], device="cpu")
    asked = GenerationParams(max_new_tokens=10, temperature=0.7, seed=2, **OPEN)
    got = t.resolve_params(asked)
    assert (got.temperature, got.top_k, got.top_p, got.repetition_penalty) == (0.7, 7, 0.8, 1.2)
    open_t = GenerationParams(max_new_tokens=4, temperature=INHERIT)
    assert t.resolve_params(open_t).temperature == 0.9
    over = t.resolve_params(dataclasses_replace(asked, top_k=3, repetition_penalty=1.0))
    assert (over.top_k, over.top_p, over.repetition_penalty) == (3, 0.8, 1.0)
    explicit = GenerationParams(
        max_new_tokens=10, temperature=0.7, seed=2, top_k=7, top_p=0.8, repetition_penalty=1.2
    )
    assert t.resolve_params(asked) == explicit
    prompts = _prompts(5)
    assert t.generate(prompts, asked) == t.generate(prompts, explicit)
    rec = generation_record(t, asked)
    assert rec["source"] == "generation_config.json"
    assert rec["inherited"] == ["top_p", "top_k", "repetition_penalty"]
    assert rec["used"] == explicit.as_dict() and rec["requested"]["top_k"] == INHERIT

    # no generation_config.json: transformers' defaults (top-k 50, no top-p, no penalty, greedy)
    bare = HFTarget(ckpt_dirs["none"], device="cpu")
    d = bare.resolve_params(GenerationParams(max_new_tokens=4, temperature=INHERIT, **OPEN))
    assert (d.temperature, d.top_k, d.top_p, d.repetition_penalty) == (0.0, 50, 1.0, 1.0)
    assert generation_record(bare, asked)["source"] == "transformers defaults"


def dataclasses_replace(p: GenerationParams, **kw) -> GenerationParams:
    return GenerationParams(**{**p.as_dict(), **kw})


def test_params_validation_names_the_field():
    with pytest.raises(ValueError, match="top_p must be a number or 'inherit'"):
        GenerationParams(max_new_tokens=4, temperature=1.0, top_p="auto")
    with pytest.raises(ValueError, match="repetition_penalty must be > 0"):
        GenerationParams(max_new_tokens=4, temperature=1.0, repetition_penalty=0.0)
    assert GenerationParams(max_new_tokens=4, temperature=1.0, top_k=0).top_k is None

    class Plain:  # a Target without resolve_params gets "inherit" as it is
        name = "plain"

        def __init__(self):
            self.seen: list[GenerationParams] = []

        def generate(self, prompts, params):
            self.seen.append(params)
            return [["x"] for _ in prompts]

    asked = GenerationParams(max_new_tokens=2, temperature=1.0, top_k=INHERIT)
    plain = Plain()
    assert CachedTarget(plain, ":memory:").generate(["a"], asked) == [["x"]]
    assert plain.seen[0].top_k == INHERIT
    rec = generation_record(plain, asked)
    assert rec["used"] is None and rec["requested"]["top_k"] == INHERIT


# --- the cache -----------------------------------------------------------------------------------


def _old_key(name: str, prompt: str, p: GenerationParams, sample: int) -> str:
    """The key formula before repetition_penalty existed."""
    kp = {"max_new_tokens": p.max_new_tokens, "temperature": float(p.temperature),
          "top_p": float(p.top_p), "top_k": p.top_k, "seed": p.seed}  # fmt: skip
    blob = json.dumps([name, prompt, kp, sample], ensure_ascii=False, sort_keys=True)
    return hashlib.sha256(blob.encode()).hexdigest()


def test_cache_keys_on_resolved_values(ckpt_dirs, tmp_path):
    p = GenerationParams(max_new_tokens=6, temperature=0.9, top_p=0.9, top_k=5, seed=1)
    assert cache_key("t", "x", p, 2) == _old_key("t", "x", p, 2)  # explicit runs: keys unchanged
    assert cache_key("t", "x", dataclasses_replace(p, repetition_penalty=1.1), 2) != cache_key(
        "t", "x", p, 2
    )
    asked = GenerationParams(max_new_tokens=6, temperature=0.9, seed=1, **OPEN)
    ta, tb = HFTarget(ckpt_dirs["a"], device="cpu"), HFTarget(ckpt_dirs["b"], device="cpu")
    ra, rb = ta.resolve_params(asked), tb.resolve_params(asked)
    # same target name, other generation_config -> other key (as for a GGUF, whose name is the
    # GGUF file's and whose generation config comes from the conversion)
    assert cache_key("same", "x", ra, 0) != cache_key("same", "x", rb, 0)

    db = tmp_path / "gen.sqlite"
    prompts = _prompts(4)
    with CachedTarget(ta, db) as ca:
        first = ca.generate(prompts, asked)
        assert ca.stats.misses == 4
        assert ca.generate(prompts, asked) == first and ca.stats.hits == 4
        assert first == ta.generate(prompts, ra)
    with CachedTarget(tb, db) as cb:
        cb.generate(prompts, asked)
        assert cb.stats.misses == 4 and cb.stats.hits == 0
    rows = sqlite3.connect(db).execute("SELECT params FROM completions").fetchall()
    stored = {json.loads(r[0])["top_k"] for r in rows}
    assert stored == {7, 3}  # resolved values, never "inherit", for an in-process target
    assert {json.loads(r[0])["repetition_penalty"] for r in rows} == {1.2}


# --- the OpenAI backend --------------------------------------------------------------------------


def test_openai_leaves_inherited_fields_to_the_server_and_records_what_it_sent(tmp_path):
    from test_openai_target import FaultServer

    prompts = ["prompt-0", "prompt-1"]
    with FaultServer(lambda p, a: "ok") as srv:
        t = OpenAITarget(srv.url, "m", concurrency=2)
        inherit = GenerationParams(max_new_tokens=5, temperature=0.7, seed=3, **OPEN)
        with CachedTarget(t, tmp_path / "gen.sqlite") as cached:
            cached.generate(prompts, inherit)
            rec_inherit = generation_record(cached, inherit)
        sent_inherit = list(srv.bodies)
        srv.bodies.clear()
        explicit = GenerationParams(
            max_new_tokens=5, temperature=0.7, seed=3, top_k=20, top_p=0.8, repetition_penalty=1.05
        )
        t.generate(prompts, explicit)
        sent_explicit = list(srv.bodies)
    for body in sent_inherit:
        assert set(body) == {"model", "prompt", "seed", "max_tokens", "temperature"}
        assert body["seed"] == request_seed(3, 0) and body["temperature"] == 0.7
    assert rec_inherit["sent"] == {"model": "m", "max_tokens": 5, "temperature": 0.7}
    assert rec_inherit["left_to_server"] == ["top_p", "top_k", "repetition_penalty"]
    for body in sent_explicit:
        assert {k: body[k] for k in ("top_k", "top_p", "repetition_penalty")} == {
            "top_k": 20, "top_p": 0.8, "repetition_penalty": 1.05,
        }  # fmt: skip
        rest = {k: v for k, v in body.items() if k not in ("prompt", "seed")}
        assert rest == t.generation_record(explicit)["sent"]
    # a server's cache entry is keyed on what the request said: "inherit" (the field was left out)
    rows = sqlite3.connect(tmp_path / "gen.sqlite").execute("SELECT params FROM completions")
    assert {json.loads(r[0])["top_p"] for r in rows} == {INHERIT}


def test_openai_dialects_say_no_top_k_each_in_their_own_way(tmp_path):
    from test_openai_target import FaultServer

    plain = GenerationParams(max_new_tokens=5, temperature=0.7, seed=3)  # top_k None, penalty 1
    bodies = {}
    with FaultServer(lambda p, a: "ok") as srv:
        for dialect in ("openai", "vllm", "transformers"):
            t = OpenAITarget(srv.url, "m", dialect=dialect)
            srv.bodies.clear()
            if dialect == "openai":
                with pytest.warns(UserWarning, match="top_k None .*dialect 'openai'"):
                    with CachedTarget(t, tmp_path / "gen.sqlite") as cached:
                        cached.generate(["prompt-0"], plain)
                        rec = generation_record(cached, plain)
                assert rec["left_to_server"] == ["top_k", "repetition_penalty"]
            else:
                t.generate(["prompt-0"], plain)
                rec = t.generation_record(plain)
                assert rec["left_to_server"] == []
            (body,) = srv.bodies
            assert {k: v for k, v in body.items() if k not in ("prompt", "seed")} == rec["sent"]
            bodies[dialect] = body
    assert "top_k" not in bodies["openai"] and "repetition_penalty" not in bodies["openai"]
    assert bodies["vllm"]["top_k"] == -1 and bodies["vllm"]["repetition_penalty"] == 1.0
    tf = bodies["transformers"]
    assert "top_k" not in tf and json.loads(tf["generation_config"]) == {
        "do_sample": True, "top_k": 0, "repetition_penalty": 1.0,
    }  # fmt: skip
    # in the openai dialect the cache says what the request said: the server decided top_k
    rows = sqlite3.connect(tmp_path / "gen.sqlite").execute("SELECT params FROM completions")
    assert {json.loads(r[0])["top_k"] for r in rows} == {INHERIT}
    # greedy decoding has no top-k to lose; an unknown dialect is refused
    greedy = GenerationParams(max_new_tokens=5, temperature=0.0)
    assert "top_k" not in OpenAITarget("http://x", "m").generation_record(greedy)["left_to_server"]
    with pytest.raises(ValueError, match="dialect must be one of"):
        OpenAITarget("http://x", "m", dialect="tgi")
