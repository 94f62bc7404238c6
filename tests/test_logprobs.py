"""Token log-probabilities as a target capability (calibdcd.targets.logprobs): the hf backend
against a direct torch forward pass of the tiny LM, the OpenAI-compatible backend against a real
loopback server answering vLLM's echo format from the same model, the top-k moments, and the
SQLite cache (same file as completions, claims, kill -9 safe)."""

from __future__ import annotations

import json
import math
import subprocess
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import numpy as np
import pytest

from calibdcd.targets.cache import CachedTarget
from calibdcd.targets.logprobs import (
    TextLogprobs,
    TokenLogprobs,
    echo_logprobs,
    topk_moments,
)
from calibdcd.targets.openai import OpenAITarget, PreflightError

SRC = str(Path(__file__).resolve().parents[1] / "src")
TEXTS = ["the cat sat on the mat", "hello world, and a longer second text here", "ok"]
PREFIXES = ["Assistant:\n\n", "", "User:\n"]


def _direct(target, prefix: str, text: str):
    """log p of the text's tokens and the exact moments, by one unbatched forward pass."""
    import torch

    tok = target.tokenizer
    enc = tok(prefix + text, add_special_tokens=True, return_offsets_mapping=True)
    ids, offs = enc["input_ids"], enc["offset_mapping"]
    pos = [j for j, (a, b) in enumerate(offs) if j >= 1 and b > a and a >= len(prefix)]
    with torch.no_grad():
        logits = target.model(input_ids=torch.tensor([ids])).logits[0].float()
    lsm = torch.log_softmax(logits, -1)
    lp = np.array([lsm[j - 1, ids[j]].item() for j in pos])
    p = lsm.exp()
    mean = (p * lsm).sum(-1)
    var = (p * (lsm - mean[:, None]) ** 2).sum(-1)
    return (
        lp,
        np.array([mean[j - 1].item() for j in pos]),
        np.array([var[j - 1].item() for j in pos]),
    )


def test_hf_logprobs_equal_a_direct_forward_pass(target):
    assert isinstance(target, TokenLogprobs)
    rows = target.token_logprobs(TEXTS, PREFIXES, top_k=5)  # batch 8: padded together
    for row, prefix, text in zip(rows, PREFIXES, TEXTS, strict=True):
        lp, mean, var = _direct(target, prefix, text)
        assert row.exact and len(row.logprobs) == len(lp) > 0
        np.testing.assert_allclose(row.logprobs, lp, atol=1e-5)
        np.testing.assert_allclose(row.mean, mean, atol=1e-5)
        np.testing.assert_allclose(row.var, var, atol=1e-5)
    plain = target.token_logprobs(TEXTS)
    assert all(r.mean is None and r.var is None for r in plain)
    # the prefix conditions the text: the first text's log-probs change with it
    # (without a BOS token the text's first token is not scored without a prefix)
    n = len(plain[0].logprobs)
    assert n == len(rows[0].logprobs) - 1
    assert not np.allclose(plain[0].logprobs, rows[0].logprobs[1:])
    with pytest.raises(ValueError, match="prefixes must hold one string per text"):
        target.token_logprobs(TEXTS, ["x"])
    with pytest.raises(ValueError, match=r"texts\[0\] is empty"):
        target.token_logprobs([""])


def test_topk_moments_by_hand():
    # the whole vocabulary listed: exact. p = (.5, .25, .25): mu = .5 ln .5 + .5 ln .25
    lps = [math.log(0.5), math.log(0.25), math.log(0.25)]
    mu, var = topk_moments(lps)
    assert mu == pytest.approx(0.5 * math.log(0.5) + 0.5 * math.log(0.25))
    assert var == pytest.approx((math.log(2) / 2) ** 2)  # deviations +-ln(2)/2
    # two listed (.5, .25): the unlisted .25 lumped at the smallest listed, ln .25: the same
    assert topk_moments(lps[:2]) == pytest.approx((mu, var))
    # (.5, .125) listed, .375 unlisted lumped at ln .125: mu = .5 ln .5 + .5 ln .125
    mu2, _ = topk_moments([math.log(0.5), math.log(0.125)])
    assert mu2 == pytest.approx(0.5 * math.log(0.5) + 0.5 * math.log(0.125))


def test_echo_logprobs_takes_the_texts_tokens_from_the_end():
    lp = {  # "Q: " + "ab c": tokens [BOS, "Q", ":", " ", "ab", " c"]
        "tokens": ["<s>", "Q", ":", " ", "ab", " c"],
        "token_logprobs": [None, -1.0, -2.0, -3.0, -4.0, -5.0],
        "top_logprobs": [None, {"Q": -1.0}, {":": -2.0}, {" ": -3.0}, {"ab": -4.0}, {" c": -5.0}],
    }
    row = echo_logprobs(lp, "ab c", moments=True)
    np.testing.assert_array_equal(row.logprobs, [-4.0, -5.0])
    assert not row.exact and row.mean is not None
    # a token straddling the boundary (" ab" when the text is "b c") is the prefix's
    assert list(echo_logprobs(lp, "b c", moments=False).logprobs) == [-5.0]
    with pytest.raises(ValueError, match="no `logprobs` object"):
        echo_logprobs(None, "x", moments=False)


class EchoServer:
    """A real loopback OpenAI-compatible server that answers completions with ``echo``,
    ``max_tokens: 0`` and ``logprobs: k`` as vLLM does (legacy ``logprobs`` object: decoded
    tokens, their log-probabilities, the top-k alternatives), computed by the tiny LM itself.
    ``fail_first``: the first request of each prompt answers 500 (retried by the target);
    ``no_logprobs``: answers without a ``logprobs`` object (a server that cannot)."""

    def __init__(self, hf_target, *, fail_first: bool = False, no_logprobs: bool = False):
        self.hf, self.fail_first, self.no_logprobs = hf_target, fail_first, no_logprobs
        self.seen: dict[str, int] = {}
        self.lock = threading.Lock()
        server = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *a):
                pass

            def _send(self, status, obj):
                body = json.dumps(obj).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def do_GET(self):
                self._send(200, {"object": "list", "data": [{"id": "tiny"}]})

            def do_POST(self):
                req = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                with server.lock:
                    n = server.seen.get(req["prompt"], 0)
                    server.seen[req["prompt"]] = n + 1
                if server.fail_first and n == 0:
                    return self._send(500, {"error": "warming up"})
                choice = {"text": req["prompt"], "index": 0}
                if not server.no_logprobs:
                    choice["logprobs"] = server.echo(req["prompt"], int(req["logprobs"]))
                self._send(200, {"model": "tiny", "choices": [choice]})

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def echo(self, prompt: str, k: int) -> dict:
        import torch

        tok, model = self.hf.tokenizer, self.hf.model
        ids = tok(prompt, add_special_tokens=True)["input_ids"]
        with torch.no_grad():
            lsm = torch.log_softmax(model(input_ids=torch.tensor([ids])).logits[0].float(), -1)
        tokens = [tok.decode([i]) for i in ids]
        lps: list = [None] + [lsm[j - 1, ids[j]].item() for j in range(1, len(ids))]
        tops: list = [None]
        for j in range(1, len(ids)):
            vals, idx = torch.topk(lsm[j - 1], k)
            top = {tokens[j]: lps[j]}  # the actual token first, as vLLM lists it
            top.update({tok.decode([int(i)]): v.item() for v, i in zip(vals, idx, strict=True)})
            tops.append(top)
        return {"tokens": tokens, "token_logprobs": lps, "top_logprobs": tops}

    def close(self):
        self.httpd.shutdown()
        self.httpd.server_close()


def _server_target(server) -> OpenAITarget:
    return OpenAITarget(server.url, "tiny", max_retries=2, backoff_base=0.01, backoff_max=0.02)


def test_a_server_gives_the_hf_logprobs_through_the_request_path(target):
    server = EchoServer(target, fail_first=True)  # every prompt's first answer is a 500
    try:
        remote = _server_target(server)
        remote.logprob_preflight()
        got = remote.token_logprobs(TEXTS, PREFIXES, top_k=0)
        want = target.token_logprobs(TEXTS, PREFIXES)
        for g, w in zip(got, want, strict=True):
            np.testing.assert_allclose(g.logprobs, w.logprobs, atol=1e-5)
        assert remote.retries >= len(TEXTS)  # the 500s were retried by the one request path
        assert remote.served == 0 and remote.scored >= len(TEXTS)  # scores, not completions
        # every alternative asked for: the server's moments are the exact ones up to the
        # tokens whose decoded strings coincide (the answer keys alternatives by their text, as
        # vLLM's does, so their mass goes to the lumped tail): measured <= 0.007 here
        vocab = len(target.tokenizer)
        full = remote.token_logprobs(TEXTS[:2], PREFIXES[:2], top_k=vocab)
        exact = target.token_logprobs(TEXTS[:2], PREFIXES[:2], top_k=1)
        for g, w in zip(full, exact, strict=True):
            assert not g.exact
            np.testing.assert_allclose(g.mean, w.mean, atol=1e-2)
            np.testing.assert_allclose(g.var, w.var, rtol=0.1)
    finally:
        server.close()


def test_a_server_without_prompt_logprobs_fails_preflight_in_one_line(target):
    server = EchoServer(target, no_logprobs=True)
    try:
        with pytest.raises(PreflightError) as err:
            _server_target(server).logprob_preflight()
        assert "does not return prompt log-probabilities" in str(err.value)
        assert "\n" not in str(err.value)
    finally:
        server.close()


def test_the_cache_keeps_logprobs_beside_completions(target, tmp_path):
    from calibdcd.targets.base import GenerationParams

    path = tmp_path / "gen.sqlite"
    with CachedTarget(target, path) as cached:
        first = cached.token_logprobs(TEXTS, PREFIXES, top_k=3)
        cached.generate(["hello"], GenerationParams(max_new_tokens=2, temperature=0.0))
        assert cached.stats.misses == len(TEXTS) + 1
        assert len(cached) == len(TEXTS) + 1  # one file, one table, their own keys
    with CachedTarget(target, path) as again:
        second = again.token_logprobs(TEXTS, PREFIXES, top_k=3)
        assert again.stats.hits == len(TEXTS) and again.stats.misses == 0
        other = again.token_logprobs(TEXTS[:1], PREFIXES[:1], top_k=0)  # another key
        assert again.stats.misses == 1 and other[0].mean is None
    for a, b in zip(first, second, strict=True):
        np.testing.assert_allclose(a.logprobs, b.logprobs, rtol=0, atol=1e-12)
        np.testing.assert_allclose(a.var, b.var, rtol=0, atol=1e-12)
    assert TextLogprobs.from_json(first[0].as_json()).exact


_KILLED = """
import os, sys
sys.path.insert(0, {src!r})
from calibdcd.targets.cache import CachedTarget
from calibdcd.targets.hf import HFTarget

class Dies:
    name, family = "dies", None
    def generate(self, prompts, params):
        raise AssertionError
    def token_logprobs(self, texts, prefixes=None, top_k=0):
        os.kill(os.getpid(), 9)  # dies holding its claims, before storing anything

CachedTarget(Dies(), {path!r}).token_logprobs(["abc"])
"""


def test_a_killed_process_leaves_no_claim_that_blocks(tmp_path):
    from calibdcd.targets.logprobs import TextLogprobs

    path = str(tmp_path / "gen.sqlite")
    proc = subprocess.run([sys.executable, "-c", _KILLED.format(src=SRC, path=path)], check=False)
    assert proc.returncode == -9

    class Scores:
        name, family = "dies", None

        def generate(self, prompts, params):
            raise AssertionError

        def token_logprobs(self, texts, prefixes=None, top_k=0):
            return [TextLogprobs(np.array([-1.0, -2.0])) for _ in texts]

    with CachedTarget(Scores(), path, timeout=5) as cached:
        (row,) = cached.token_logprobs(["abc"])  # the dead claim is taken over at once
    assert list(row.logprobs) == [-1.0, -2.0]


def _served_config(tmp_path, url: str, detectors: list):
    from calibdcd.experiment import parse_config

    bench = tmp_path / "bench.jsonl"
    rows = [
        {"text": f"text number {i} about the sea and the shore", "label": i % 2} for i in range(8)
    ]
    bench.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return parse_config(
        {
            "name": "served-graybox",
            "benchmarks": [{"name": "b", "path": str(bench)}],
            "targets": [
                {"name": "remote", "backend": "openai", "model": "tiny", "family": "qwen2.5",
                 "options": {"base_url": url + "/v1"}}
            ],
            "detectors": detectors,
            "cache_dir": str(tmp_path / "cache"),
        }
    )  # fmt: skip


def test_a_dry_run_asks_a_served_target_for_logprobs_only_when_a_detector_reads_them(
    target, tmp_path
):
    """The run's preflight (here its dry run) sends one scoring request when a gray-box
    detector will read the target's token log-probabilities, with the alternatives Min-K%++
    asks; a server that cannot answer it is one problem line, before any work; a run of
    black-box detectors only never asks."""
    from calibdcd.experiment import dry_run

    mute = EchoServer(target, no_logprobs=True)
    good = EchoServer(target)
    try:
        _, problems = dry_run(_served_config(tmp_path, mute.url, ["overlap"]))
        assert not any("log-probabilities" in p for p in problems), problems
        assert mute.seen == {}  # nothing was scored

        _, problems = dry_run(_served_config(tmp_path, mute.url, ["overlap", "mink"]))
        (bad,) = [p for p in problems if "log-probabilities" in p]
        assert "does not return prompt log-probabilities" in bad and "\n" not in bad
        assert bad.startswith("targets[0] (remote)")

        lines, problems = dry_run(_served_config(tmp_path, good.url, ["mink", "mink++"]))
        assert not any("log-probabilities" in p for p in problems), problems
        (said,) = [x for x in lines if "returns prompt log-probabilities" in x]
        assert "20 alternatives a position" in said  # Min-K%++'s default top_k, the most asked
    finally:
        mute.close()
        good.close()


def test_fit_and_score_a_gray_box_attack_through_a_server(target, tmp_path, monkeypatch):
    """``calibdcd fit --detector mink++`` against a served model writes a bundle that ``score``
    uses through the same server (issue 49): the server is asked first whether it returns
    prompt log-probabilities, with Min-K%++'s 20 alternatives; a server that cannot stops
    ``fit`` in one line before any work."""
    import random

    from typer.testing import CliRunner

    from calibdcd.cli import app

    rng = random.Random(3)
    words = "the sea a ship sails over water and wind at dawn to the harbour of old".split()
    texts = [" ".join(rng.choice(words) for _ in range(12)) for _ in range(150)]
    monkeypatch.chdir(tmp_path)
    (tmp_path / "m.txt").write_text("".join(t + "\n" for t in texts[:50]))
    (tmp_path / "n.txt").write_text("".join(t + "\n" for t in texts[50:120]))
    (tmp_path / "suspect.txt").write_text("".join(t + "\n" for t in texts[120:]))
    runner = CliRunner()
    mute, good = EchoServer(target, no_logprobs=True), EchoServer(target)
    try:
        fit = ["fit", "--members", "m.txt", "--nonmembers", "n.txt", "--detector", "mink++",
               "--cache-dir", "cache", "--no-progress"]  # fmt: skip
        spec = "openai:base_url={}/v1,model=tiny,family=qwen2.5,dialect=vllm"
        res = runner.invoke(app, [*fit, "--target", spec.format(mute.url), "-o", "b0"])
        assert res.exit_code == 2, res.output
        (line,) = [x for x in res.output.splitlines() if "log-probabilities" in x]
        assert line.startswith("error: target:") and "does not return prompt" in line
        assert not (tmp_path / "b0").exists()

        res = runner.invoke(app, [*fit, "--target", spec.format(good.url), "-o", "bundle"])
        assert res.exit_code == 0, res.output
        assert "returns prompt log-probabilities, 20 alternatives a position" in res.output
        asked = len(good.seen)
        res = runner.invoke(
            app, ["score", "bundle", "suspect.txt", "--cache-dir", "cache", "--no-progress",
                  "-o", "s.jsonl"],
        )  # fmt: skip
        assert res.exit_code == 0, res.output
        rows = [json.loads(x) for x in (tmp_path / "s.jsonl").read_text().splitlines()[1:]]
        assert len(rows) == 30 and all(math.isfinite(r["score"]) for r in rows)
        assert len(good.seen) > asked  # the suspect texts were scored through the server
    finally:
        mute.close()
        good.close()
