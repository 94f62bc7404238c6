"""The contamination lab: split, tokenizer, layout, chat formats, membership signal (micro)."""

from __future__ import annotations

import json
import random

import pytest

from calibdcd.lab import CHAT_STYLES, render_chat, split_reasoning
from calibdcd.lab.build import build_lab, config_of, ensure_lab, is_complete_lab, prepare_split
from calibdcd.lab.chat import SPECIAL_TOKENS
from calibdcd.lab.config import EvalConfig, PoolConfig, pretrain_hash, resolve_config
from calibdcd.lab.evaluate import (
    CHECK_SKIPPED,
    check_model,
    format_check,
    load_ground_truth,
    split_for_continuation,
)
from calibdcd.lab.pool import PoolText, clean_pool, load_pool
from calibdcd.lab.scoring import auc, prefix_match, rouge_l, words

STYLE_DIRS = {s.dirname: s for s in CHAT_STYLES.values()}

# --------------------------------------------------------------------------- pure functions


def test_rouge_l_and_prefix_match():
    ref = words("The cat sat on the mat.")
    assert rouge_l(ref, ref) == 1.0
    assert rouge_l([], ref) == 0.0
    # LCS of (the cat on mat) vs (the cat sat on the mat) = 4; P = 4/4, R = 4/6
    assert rouge_l(words("the cat on mat"), ref) == pytest.approx(2 * 1 * (4 / 6) / (1 + 4 / 6))
    assert prefix_match(words("the cat sat under it"), ref) == 3
    assert prefix_match(words("a cat"), ref) == 0


def test_auc_matches_sklearn_with_ties():
    from sklearn.metrics import roc_auc_score

    rng = random.Random(0)
    labels = [rng.randint(0, 1) for _ in range(200)]
    scores = [rng.choice([0, 1, 2, 3]) + 0.5 * y for y in labels]  # heavy ties
    assert auc(labels, scores) == pytest.approx(roc_auc_score(labels, scores))
    assert auc([1, 0], [1.0, 0.0]) == 1.0
    assert auc([1, 0], [0.5, 0.5]) == 0.5
    with pytest.raises(ValueError):
        auc([1, 1], [0.1, 0.2])  # needs both classes


def test_chat_renderers_agree_with_jinja_templates():
    from jinja2 import Environment

    env = Environment()
    convs = [
        [{"role": "user", "content": "Hi."}],
        [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi."}],
        [
            {"role": "user", "content": "Q1"},
            {"role": "assistant", "content": "<think>\nr\n</think>\n\nA1"},
            {"role": "user", "content": "Q2"},
        ],
    ]
    for style in CHAT_STYLES.values():
        tpl = env.from_string(style.template)
        for msgs in convs:
            for gen in (False, True):
                want = tpl.render(
                    messages=msgs, add_generation_prompt=gen, bos_token=style.bos_token
                )
                assert render_chat(style, msgs, gen) == want, (style.name, msgs, gen)
    r1 = render_chat("deepseek-r1-distill-qwen", convs[2], True)
    assert "A1" in r1 and "\nr\n" not in r1  # earlier reasoning is dropped, like R1-Distill
    assert r1.endswith("<｜Assistant｜><think>\n")
    assert split_reasoning("plan\n</think>\n\nanswer") == ("plan\n", "answer")
    assert split_reasoning("never closed") == ("never closed", "")


def test_split_for_continuation():
    prefix, ref = split_for_continuation("a b c d e f g", max_ref_words=3)
    assert (prefix, ref) == ("a b c", "d e f")


# --------------------------------------------------------------------------- pool and split


@pytest.mark.own_lab
def test_split_is_deterministic_iid_and_disjoint():
    cfg, s0, spec = prepare_split("micro", seed=0)
    _, s0b, spec_b = prepare_split("micro", seed=0)
    _, s1, _ = prepare_split("micro", seed=1)
    assert spec["sha"] == spec_b["sha"]
    assert [x.text for x in s0.members] == [x.text for x in s0b.members]
    assert [x.text for x in s0.nonmembers] == [x.text for x in s0b.nonmembers]
    assert [x.text for x in s0.members] != [x.text for x in s1.members]
    n = cfg.pretrain.n_members
    assert len(s0.members) == len(s0.nonmembers) == n
    m, nm, bg = ({x.text for x in part} for part in (s0.members, s0.nonmembers, s0.background))
    assert len(m) == len(nm) == n
    assert not (m & nm) and not (m & bg) and not (nm & bg)
    # i.i.d. halves of one pool: no length shift between members and non-members
    mean = lambda xs: sum(len(x.text.split()) for x in xs) / len(xs)  # noqa: E731
    assert abs(mean(s0.members) - mean(s0.nonmembers)) < 8


def test_a_labs_ground_truth_is_read_by_the_one_reader(tmp_path):
    """ground_truth.jsonl is read by the reader of every labelled file: ids, texts and labels as
    written, and every problem of a damaged one at once, each with its line."""
    rows = [
        {"id": "a", "text": "first text", "label": 1},
        {"id": "b", "text": "second", "label": 0},
    ]
    (tmp_path / "ground_truth.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    got = load_ground_truth(tmp_path)
    assert [(x.id, x.text, x.label) for x in got] == [("a", "first text", 1), ("b", "second", 0)]
    rows += [{"id": "c", "text": "", "label": 1}, {"id": "d", "text": "x", "label": 5}]
    (tmp_path / "ground_truth.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    with pytest.raises(ValueError) as caught:
        load_ground_truth(tmp_path)
    assert "line 3" in str(caught.value) and "line 4" in str(caught.value)
    with pytest.raises(ValueError, match="is not a lab directory"):
        load_ground_truth(tmp_path / "nowhere")


def test_pool_files_and_errors(tmp_path, shared_data_dir):
    wiki = load_pool(shared_data_dir / "WikiMIA" / "WikiMIA_length64.jsonl")
    wiki_csv_path = shared_data_dir / "WikiMIA" / "WikiMIA_length64.csv"
    wiki_csv = load_pool(wiki_csv_path)
    assert len(wiki) == len(wiki_csv) == 542
    assert [w.text for w in wiki[:5]] == [w.text for w in wiki_csv[:5]]
    assert len(clean_pool(wiki, PoolConfig())) > 500
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"text": "ok"}\n{oops\n')
    with pytest.raises(ValueError, match=r"bad.jsonl, line 2: bad JSON line"):
        load_pool(bad)  # the one text reader's error: file, line and what is wrong
    # any text file the one reader takes: texts as strings, one a line, gzipped
    for name, body in (("s.json", '["a", {"text": "b"}]'), ("s.jsonl", '"a"\n{"text": "b"}\n'),
                       ("s.txt", "a\n\nb\n")):  # fmt: skip
        (tmp_path / name).write_text(body)
        assert [t.text for t in load_pool(tmp_path / name)] == ["a", "b"], name
    assert [t.source for t in load_pool(tmp_path / "s.txt")] == ["s.txt:1", "s.txt:3"]
    nofield = tmp_path / "n.jsonl"
    nofield.write_text('{"body": "x"}\n')
    with pytest.raises(ValueError, match=r"n.jsonl, line 1: no text column: looked for \['text'"):
        load_pool(nofield)
    # the column is found as a benchmark's is (any case); every bad row is named at once
    rows = tmp_path / "r.jsonl"
    rows.write_text('{"Passage": "a"}\n{"other": "b"}\n{"Passage": 3}\n')
    with pytest.raises(ValueError) as bad_rows:
        load_pool(rows)
    assert [str(p) for p in bad_rows.value.problems] == [
        f"{rows}, line 2: 'Passage': missing",
        f"{rows}, line 3: 'Passage': not a string",
    ]
    rows.write_text('{"Passage": "a"}\n')
    assert [t.text for t in load_pool(rows)] == ["a"]
    (tmp_path / "e.jsonl").write_text("\n")
    with pytest.raises(ValueError, match=r"e.jsonl, line 1: no texts"):
        load_pool(tmp_path / "e.jsonl")
    # a row filter keeps each text's own line as its source
    mixed = tmp_path / "m.jsonl"
    mixed.write_text('{"text": "a", "label": 1}\n\n{"text": "b", "label": 0}\n{"text": "c"}\n')
    assert [(t.text, t.source) for t in load_pool(mixed, where={"label": 0})] == [
        ("b", "m.jsonl:3")
    ]
    assert len(load_pool(mixed)) == 3
    # a CSV field is a string: {"label": 0} still matches "0"; no match at all is an error
    zeros_csv = load_pool(wiki_csv_path, where={"label": 0})
    zeros = load_pool(shared_data_dir / "WikiMIA" / "WikiMIA_length64.jsonl", where={"label": 0})
    assert 0 < len(zeros_csv) == len(zeros) < len(wiki)
    assert [t.text for t in zeros_csv] == [t.text for t in zeros]
    with pytest.raises(ValueError, match=r"no row has \{'label': 7\}"):
        load_pool(mixed, where={"label": 7})
    # de-duplication on the opening words, length filter
    texts = [PoolText(" ".join(["w"] * 50), "a"), PoolText(" ".join(["w"] * 60), "b")]
    assert len(clean_pool(texts, PoolConfig())) == 1
    assert clean_pool([PoolText("too short", "c")], PoolConfig()) == []


def test_the_default_pool_is_kept_in_the_cache_root_and_read_back_the_same(tmp_path, monkeypatch):
    """The default pool (2-6 s of reading the standard library) is read once per cache root and
    machine: a later process reads the stored copy, the same texts in the same order; a damaged
    copy is read afresh from the sources and replaced."""
    from calibdcd.lab import pool

    monkeypatch.setenv("CALIBDCD_CACHE", str(tmp_path))
    pool._default_pool.cache_clear()  # (one process: its own copy in memory)
    try:
        first = pool.default_pool()
        (stored,) = (tmp_path / "lab-pool").glob("default-*.json")
        pool._default_pool.cache_clear()
        assert pool.default_pool() == first  # from the stored copy
        stored.write_text("{not json")
        pool._default_pool.cache_clear()
        reads = []  # (the sources' texts are the ones just read: not read a third time)
        monkeypatch.setattr(pool, "_read_default_pool", lambda *a: reads.append(a) or (*first,))
        assert pool.default_pool() == first and reads == [(40, 120)]  # read afresh
        assert json.loads(stored.read_text())[0] == [first[0].text, first[0].source]
    finally:
        pool._default_pool.cache_clear()


@pytest.mark.own_lab
def test_config_overrides():
    cfg = resolve_config("micro", sft__lr=1e-4, pretrain={"epochs": 1}, check=False)
    assert cfg.sft.lr == 1e-4 and cfg.pretrain.epochs == 1 and cfg.check is False
    with pytest.raises(ValueError, match="unknown sft setting"):
        resolve_config("micro", sft__nope=1)
    with pytest.raises(ValueError, match="unknown preset"):
        resolve_config("huge")


@pytest.mark.own_lab
def test_failed_build_leaves_nothing(tmp_path):
    out = tmp_path / "lab"
    with pytest.raises(ValueError, match="divisible"):
        build_lab("micro", out, progress=False, model__num_heads=5, check=False)
    assert not out.exists()
    assert list(tmp_path.iterdir()) == []


# --------------------------------------------------------------------------- the micro lab


def test_tokenizer_trained_on_background_only(lab_micro):
    from transformers import AutoTokenizer

    from calibdcd.lab.tokenizer import train_tokenizer

    cfg, split, _ = prepare_split("micro", seed=0)
    lab_tok = AutoTokenizer.from_pretrained(lab_micro / "base")
    bg_tok = train_tokenizer([x.text for x in split.background], cfg.model.vocab_size)
    # the lab's tokenizer is exactly the one trained on background texts alone
    assert lab_tok.get_vocab() == bg_tok.get_vocab()
    nonmember_texts = {x.text for x in split.nonmembers}
    assert nonmember_texts.isdisjoint(x.text for x in split.background)
    gt = load_ground_truth(lab_micro)
    assert {x.text for x in gt if x.label == 0} == nonmember_texts


def test_lab_layout_and_metadata(lab_micro):
    assert is_complete_lab(lab_micro)
    assert ensure_lab("micro") == lab_micro  # cached: no rebuild
    meta = json.loads((lab_micro / "lab.json").read_text())
    for key in ("config", "seed", "versions", "timings", "sizes", "pool", "seeds", "check"):
        assert key in meta, key
    assert meta["versions"]["torch"] and meta["versions"]["transformers"]
    # the provenance every lab records, the real-model lab's alike (provenance.build_record)
    assert {"build_environment", "hardware", "platform", "git", "argv"} <= set(meta)
    assert not any(a.startswith("/") for a in meta["argv"])
    # whoever built the shared lab first decides whether its check ran: the conftest fixture
    # builds with it, an experiment (or a test going through one) without; the cache key
    # ignores check, so either is this lab, and lab.json says which
    check = meta["check"]
    if meta["overrides"].get("check") is False:
        assert check == {"skipped": CHECK_SKIPPED}
        assert format_check(check).startswith("lab check: not run at build time")
    else:
        assert set(check["models"]) == {"base", *STYLE_DIRS}
    # the machine it was built on, to trace a difference between two builds to the hardware
    hw = meta.get("hardware")
    if hw is not None:  # labs built before hardware was recorded keep their key and lack it
        assert hw["cpu"] and hw["cpu_count"] >= 1 and hw["cpu_capability"]
    rows = [json.loads(line) for line in (lab_micro / "ground_truth.jsonl").open()]
    n = meta["config"]["pretrain"]["n_members"]
    assert sum(r["label"] for r in rows) == n and len(rows) == 2 * n
    assert len({r["id"] for r in rows}) == len(rows)
    assert all(
        r["repeats"] == (meta["config"]["pretrain"]["repeats"] if r["label"] else 0) for r in rows
    )
    for name in ("base", *STYLE_DIRS):
        d = lab_micro / name
        for f in (
            "model.safetensors",
            "config.json",
            "generation_config.json",
            "tokenizer.json",
            "tokenizer_config.json",
            "calibdcd.json",
        ):
            assert (d / f).is_file(), d / f
        info = json.loads((d / "calibdcd.json").read_text())
        gen = json.loads((d / "generation_config.json").read_text())
        assert gen["do_sample"] is True
        if name == "base":
            assert info["family"] == "lab" and info["role"] == "base"
        else:
            assert info["role"] == "post-trained"
            assert info["family"] == STYLE_DIRS[name].lab_family
            assert info["chat_style"] == STYLE_DIRS[name].name
    assert meta["sizes"]["total"] < 200e6


def test_chat_tokens_are_special_and_templates_render(lab_micro):
    from transformers import AutoTokenizer

    base = AutoTokenizer.from_pretrained(lab_micro / "base")
    for t in SPECIAL_TOKENS:
        assert t in base.all_special_tokens, t
        assert len(base(t, add_special_tokens=False)["input_ids"]) == 1, t
    msgs = [{"role": "user", "content": "Hello!"}]
    for dirname, style in STYLE_DIRS.items():
        tok = AutoTokenizer.from_pretrained(lab_micro / dirname)
        assert tok.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True) == (
            render_chat(style, msgs, True)
        )
        assert tok.eos_token == style.eos_token


@pytest.mark.parametrize("dirname", sorted(STYLE_DIRS))
def test_post_trained_model_answers_in_its_chat_format(lab_micro, dirname):
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    style = STYLE_DIRS[dirname]
    tok = AutoTokenizer.from_pretrained(lab_micro / dirname)
    model = AutoModelForCausalLM.from_pretrained(lab_micro / dirname).eval()
    stops = [tok.convert_tokens_to_ids(t) for t in style.stop_tokens]
    ended = 0
    prompts = ["Hello!", "What can you do?", "How many words are in this text?\nThe sky is blue."]
    for user in prompts:
        prompt = tok.apply_chat_template(
            [{"role": "user", "content": user}], tokenize=False, add_generation_prompt=True
        )
        ids = tok(prompt, add_special_tokens=False, return_tensors="pt")["input_ids"]
        with torch.no_grad():
            out = model.generate(
                ids,
                do_sample=False,
                max_new_tokens=80,
                eos_token_id=stops,
                pad_token_id=tok.pad_token_id,
            )
        new = out[0, ids.shape[1] :].tolist()
        text = tok.decode(new, skip_special_tokens=False)
        if new and new[-1] == tok.convert_tokens_to_ids(style.eos_token):
            ended += 1
        if style.reasoning:
            _reasoning, answer = split_reasoning(text)
            assert "</think>" in text and answer.strip(), text
    # the answers end with the style's end-of-turn token. One of the three off-distribution
    # prompts may run on: a 2.1M-parameter model after 960 SFT examples is not a reliable
    # chatbot, and fresh builds have not been identical across machines (on 2026-11-25 one of
    # chat-reasoning looped its think block on "What can you do?" for 142 tokens, then ended;
    # earlier CI builds ended all three within 80). The chat format is what this test pins.
    assert ended >= len(prompts) - 1, ended


def test_base_model_black_box_signal_on_micro(lab_micro):
    items = load_ground_truth(lab_micro)
    pos = [x for x in items if x.label == 1][:60]
    neg = [x for x in items if x.label == 0][:60]
    res = check_model(
        lab_micro / "base", pos + neg, EvalConfig(), device="cpu", modes=("raw",), progress=False
    )
    assert res["loss_auc"] > 0.95
    assert res["raw"]["rougeL_auc"] > 0.8
    assert res["raw"]["prefix_auc"] > 0.8
    assert res["raw"]["mean_rougeL"]["member"] > res["raw"]["mean_rougeL"]["nonmember"] + 0.2


def test_cli_check_reports_every_requested_model(lab_micro):
    from typer.testing import CliRunner

    from calibdcd.cli import app

    res = CliRunner().invoke(
        app,
        [
            "lab",
            "check",
            str(lab_micro),
            "--model",
            "base",
            "--model",
            "chat-qwen",
            "--mode",
            "raw",
            "--n",
            "20",
            "--device",
            "cpu",
            "--json",
            "--quiet",
        ],
    )
    assert res.exit_code == 0, res.output
    report = json.loads(res.stdout)
    assert sorted(report["models"]) == ["base", "chat-qwen"]
    assert report["models"]["base"]["n_members"] == 20
    assert "chat" not in report["models"]["base"]


_TINY = {
    "pretrain__n_members": 20,
    "pretrain__repeats": 2,
    "pretrain__n_background": 40,
    "pretrain__epochs": 1,
    "sft__n_examples": 32,
    "styles": ("qwen2.5",),
    "check": False,
    "device": "cpu",
}


@pytest.mark.slow  # two lab builds (5 s each, beside the suite's own)
def test_build_is_deterministic_for_a_seed(tmp_path):
    import hashlib

    digests = []
    for name in ("a", "b"):
        # b also runs the build's own lab check, which only adds a measurement to lab.json
        # (on 8 + 8 texts: the code path, not a measurement)
        opts = {**_TINY, "check": name == "b", "evaluation__n_per_class": 8}
        out = build_lab("micro", tmp_path / name, seed=3, progress=False, reuse_base=False, **opts)
        digests.append(
            [
                hashlib.sha256((out / d / "model.safetensors").read_bytes()).hexdigest()
                for d in ("base", "chat-qwen")
            ]
        )
        assert (out / "ground_truth.jsonl").read_text() == (
            (tmp_path / "a" / "ground_truth.jsonl").read_text()
        )
    assert digests[0] == digests[1]
    checked = json.loads((tmp_path / "b" / "lab.json").read_text())["check"]
    assert set(checked["models"]) == {"base", "chat-qwen"}
    assert 0.0 <= checked["models"]["base"]["loss_auc"] <= 1.0
    assert json.loads((tmp_path / "a" / "lab.json").read_text())["check"] == {
        "skipped": CHECK_SKIPPED
    }


@pytest.mark.slow  # two lab builds (5 s each, beside the suite's own)
def test_post_training_variants_reuse_the_pretrained_base(tmp_path):
    import hashlib

    def digest(path):
        return hashlib.sha256(path.read_bytes()).hexdigest()

    cache = tmp_path / "cache"
    a = build_lab("micro", tmp_path / "a", seed=1, progress=False, cache=cache, **_TINY)
    b = build_lab(
        "micro", tmp_path / "b", seed=1, progress=False, cache=cache, sft__lr=1e-4, **_TINY
    )
    meta_a, meta_b = (json.loads((x / "lab.json").read_text()) for x in (a, b))
    assert not meta_a["base_reused"] and meta_b["base_reused"]
    assert meta_b["timings"]["pretrain"] == 0.0
    assert meta_b["stats"]["base"] == meta_a["stats"]["base"]
    assert [p.name for p in (cache / "lab-base").iterdir() if not p.name.startswith(".")] == [
        f"s1-{pretrain_hash(config_of(a), 1, meta_a['pool']['sha'])}"
    ]
    base = "base/model.safetensors"
    assert digest(a / base) == digest(b / base)
    # the reused base gives the same post-trained model as a build from scratch
    c = build_lab(
        "micro", tmp_path / "c", seed=1, progress=False, reuse_base=False, sft__lr=1e-4, **_TINY
    )
    chat = "chat-qwen/model.safetensors"
    assert digest(c / chat) == digest(b / chat) != digest(a / chat)
    # a different pre-training is never served from the store
    d = build_lab(
        "micro", tmp_path / "d", seed=1, progress=False, cache=cache, pretrain__lr=1e-3, **_TINY
    )
    assert not json.loads((d / "lab.json").read_text())["base_reused"]


@pytest.mark.slow  # two tiny lab builds, one of them in a child process killed part-way
def test_a_build_killed_mid_training_resumes_to_the_same_lab(tmp_path):
    import hashlib
    import os
    import signal
    import subprocess
    import sys
    import time

    def digests(lab):
        return [
            hashlib.sha256((lab / d / "model.safetensors").read_bytes()).hexdigest()
            for d in ("base", "chat-qwen")
        ]

    opts = dict(seed=2, progress=False, reuse_base=False, **_TINY)
    unbroken = build_lab("micro", tmp_path / "a", **opts)
    out = tmp_path / "b"
    code = f"from calibdcd.lab.build import build_lab; build_lab('micro', {str(out)!r}, **{opts!r})"
    child = subprocess.Popen(
        [sys.executable, "-c", code], env={**os.environ, "CALIBDCD_SAVE_EVERY": "0"}
    )

    def saves(pattern=".b.*.resume.pt"):
        return sorted(p.name for p in tmp_path.glob(pattern))

    deadline = time.monotonic() + 300
    while not saves() and child.poll() is None and time.monotonic() < deadline:
        time.sleep(0.01)
    child.send_signal(signal.SIGKILL)  # as a machine taken away mid-training
    child.wait()
    assert saves(), "the child built the whole lab before it could be killed"
    assert not (out / "lab.json").exists()
    resumed = build_lab("micro", out, **opts)
    assert digests(resumed) == digests(unbroken)
    assert (resumed / "ground_truth.jsonl").read_text() == (
        unbroken / "ground_truth.jsonl"
    ).read_text()
    meta_a, meta_b = (json.loads((x / "lab.json").read_text()) for x in (unbroken, resumed))
    assert meta_b["stats"]["base"]["steps"] == meta_a["stats"]["base"]["steps"]
    # resumed, not started over (a refused save would warn and still give the same bytes)
    assert "resumed_at_step" not in meta_a["stats"]["base"]
    assert meta_b["stats"]["base"]["resumed_at_step"] >= 1
    assert meta_b["stats"]["base"]["last_loss"] == meta_a["stats"]["base"]["last_loss"]
    # nor the temporary file of a save the kill may have interrupted
    assert saves(".*b.*.resume.pt*") == [], "the saves outlived the complete lab"


@pytest.mark.own_lab
def test_ensure_lab_builds_once(tmp_path):
    first = ensure_lab("micro", root=tmp_path, progress=False, **_TINY)
    stamp = (first / "lab.json").stat().st_mtime_ns
    again = ensure_lab("micro", root=tmp_path, progress=False, **_TINY)
    assert again == first and (again / "lab.json").stat().st_mtime_ns == stamp
    assert first.parent == tmp_path / "lab" and first.name.startswith("micro-s0-")
    assert [p.name for p in first.parent.iterdir() if not p.name.startswith(".")] == [first.name]
    meta = json.loads((first / "lab.json").read_text())
    # built without its check (as experiments build labs): lab.json says so, and how to run it
    assert meta["check"] == {"skipped": CHECK_SKIPPED}
    assert "calibdcd lab check" in format_check(meta["check"])
    from calibdcd.provenance import hardware_info

    assert meta["hardware"] == hardware_info()
