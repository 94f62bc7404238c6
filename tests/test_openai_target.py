"""The OpenAI-compatible backend against real loopback HTTP servers: a fault-injecting one (fast)
and `transformers serve` with a tiny local model (slow)."""

from __future__ import annotations

import json
import logging
import math
import os
import signal
import socket
import sqlite3
import subprocess
import sys
import textwrap
import threading
import time
from collections import Counter, defaultdict
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from calibdcd.targets import GenerationParams, create_target
from calibdcd.targets.cache import CachedTarget
from calibdcd.targets.openai import OpenAITarget, OpenAITargetError, request_seed

SRC = str(Path(__file__).resolve().parents[1] / "src")
SAMPLED = GenerationParams(max_new_tokens=5, temperature=0.9, top_p=0.95, n=2, seed=4)
GREEDY = GenerationParams(max_new_tokens=8, temperature=0.0, n=1, seed=0)


def expected_text(prompt: str, seed: int, max_tokens: int) -> str:
    return f"<{prompt}|{seed}|{max_tokens}>"


class FaultServer:
    """A real HTTP/1.1 server on loopback. ``plan(prompt, attempt) -> kind`` decides each answer:
    ok | 429 | 500 | stall | drop | malformed | 400. It records every request."""

    def __init__(
        self,
        plan,
        *,
        stall: float = 1.0,
        ok_delay: float = 0.0,
        served_model: str | None = None,
        answer=None,
    ):
        self.plan, self.stall, self.ok_delay = plan, stall, ok_delay
        #: ``answer(request body) -> text`` of an ok answer (default: :func:`expected_text`)
        self.answer = answer or (
            lambda req: expected_text(req["prompt"], req["seed"], req["max_tokens"])
        )
        self.served_model = served_model  # the "model" field of ok answers (None: not sent)
        #: the answer to GET /v1/models: (HTTP status, served model names)
        self.models: tuple[int, list[str]] = (200, [served_model or "tiny"])
        self.lock = threading.Lock()
        self.attempts: Counter = Counter()
        self.successes: Counter = Counter()
        self.log: list[tuple[float, str, int, str]] = []  # (time, prompt, seed, kind)
        self.auth: list[str | None] = []
        self.bodies: list[dict] = []  # every request body, in arrival order
        self.inflight = self.max_inflight = 0
        self.closed = False
        server = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"
            wbufsize = 1 << 16  # one write per response (no Nagle/delayed-ACK stalls)

            def log_message(self, *a):
                pass

            def _send(self, status, body: bytes, headers=()):
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                for k, v in headers:
                    self.send_header(k, v)
                self.end_headers()
                self.wfile.write(body)

            def do_GET(self):  # GET /v1/models, as vLLM, SGLang and llama.cpp answer it
                if not self.path.rstrip("/").endswith("/v1/models"):
                    return self._send(404, b'{"error": "not found"}')
                with server.lock:
                    server.auth.append(self.headers.get("Authorization"))
                status, names = server.models
                data = [{"id": n, "object": "model"} for n in names]
                self._send(status, json.dumps({"object": "list", "data": data}).encode())

            def do_POST(self):
                n = int(self.headers.get("Content-Length", 0))
                req = json.loads(self.rfile.read(n))
                key = (req["prompt"], req["seed"])
                with server.lock:
                    attempt = server.attempts[key]
                    server.attempts[key] += 1
                    kind = server.plan(req["prompt"], attempt)
                    server.log.append((time.monotonic(), req["prompt"], req["seed"], kind))
                    server.auth.append(self.headers.get("Authorization"))
                    server.bodies.append(req)
                    # a stalled request stays open here after the client gave up on it:
                    # count only the others towards the client's concurrency
                    counted = kind != "stall"
                    server.inflight += counted
                    server.max_inflight = max(server.max_inflight, server.inflight)
                try:
                    self._answer(kind, req, key)
                except OSError:
                    pass
                finally:
                    with server.lock:
                        server.inflight -= counted

            def _answer(self, kind, req, key):
                if kind == "ok":
                    time.sleep(server.ok_delay)
                    text = server.answer(req)
                    body = {"choices": [{"text": text, "index": 0, "finish_reason": "length"}]}
                    if server.served_model is not None:
                        body["model"] = server.served_model
                    self._send(200, json.dumps(body).encode())
                    with server.lock:
                        server.successes[key] += 1
                elif kind == "429":
                    self._send(429, b'{"error": "slow down"}', [("Retry-After", "1")])
                elif kind == "500":
                    self._send(500, b'{"error": "boom"}')
                elif kind == "stall":
                    time.sleep(server.stall)
                    self.close_connection = True
                elif kind == "drop":
                    self.close_connection = True
                    self.connection.shutdown(socket.SHUT_RDWR)
                elif kind == "malformed":
                    self._send(200, b'{"choices": [{"text": ')
                elif kind == "400":
                    self._send(400, b'{"error": "prompt too long"}')
                elif kind == "drip":  # a valid answer, one byte every 0.2 s (never idle long)
                    text = expected_text(req["prompt"], req["seed"], req["max_tokens"])
                    body = json.dumps({"choices": [{"text": text}]}).encode()
                    self.send_response(200)
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length", str(len(body)))
                    self.end_headers()
                    self.wfile.flush()
                    for b in body:
                        self.wfile.write(bytes([b]))
                        self.wfile.flush()
                        time.sleep(0.2)
                elif kind == "error200":
                    self._send(200, b'{"error": {"message": "KV cache exhausted", "code": 7}}')
                elif kind == "empty":
                    self._send(200, b'{"id": "cmpl-1", "choices": []}')
                elif kind == "redirect":
                    self._send(307, b"", [("Location", "http://127.0.0.1:9/v1/completions")])
                elif kind == "emptytext":
                    self._send(200, b'{"choices": [{"text": ""}]}')
                elif kind == "echo":  # a 400 that quotes the request's credentials back
                    said = f"bad request, auth {self.headers.get('Authorization')}"
                    self._send(400, json.dumps({"error": said}).encode())
                elif kind == "503":
                    self._send(503, b'{"error": "loading model, retry later"}')
                elif kind == "kill":  # the server process dies: this answer is lost, and
                    # every later connection is refused
                    self.close_connection = True
                    self.connection.shutdown(socket.SHUT_RDWR)
                    threading.Thread(target=server.close, daemon=True).start()

        class Quiet(ThreadingHTTPServer):
            # a client that drops its connections (a CLI exiting on an error) is not the
            # server's error: socketserver would print a traceback into the test's stderr
            def handle_error(self, request, client_address):
                pass

        self.httpd = Quiet(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)

    def __enter__(self):
        self.thread.start()
        return self

    def close(self):
        with self.lock:
            if self.closed:
                return
            self.closed = True
        self.httpd.shutdown()
        self.httpd.server_close()

    def __exit__(self, *exc):
        self.close()


FAULTS = ["429", "500", "stall", "drop", "malformed"]


def fault_plan(prompt: str, attempt: int) -> str:
    i = int(prompt.split("-")[1])
    if attempt == 0:
        return [*FAULTS, "ok"][i % 6]
    if attempt == 1 and i % 4 == 1:  # some requests fail twice
        return "500"
    return "ok"


def test_fault_injection_every_prompt_gets_exactly_its_completions():
    prompts = [f"prompt-{i}" for i in range(24)]
    with FaultServer(fault_plan, stall=1.5, ok_delay=0.05) as srv:
        t = OpenAITarget(
            srv.url, "tiny", concurrency=6, timeout=0.5, max_retries=4, backoff_base=0.05
        )
        out = t.generate(prompts, SAMPLED)
    seeds = [request_seed(SAMPLED.seed, i) for i in range(SAMPLED.n)]
    assert out == [[expected_text(p, s, 5) for s in seeds] for p in prompts]
    # none twice: every (prompt, sample) was answered successfully exactly once
    assert set(srv.successes.values()) == {1} and len(srv.successes) == 48
    expected_retries = sum(srv.attempts[k] - 1 for k in srv.attempts)
    # 20 prompts fault on attempt 0, 4 of them (i % 4 == 1, i % 6 != 5) again on attempt 1
    assert t.retries == expected_retries == 2 * (20 + 4)
    assert t.requests == sum(srv.attempts.values())
    assert set(t.retry_reasons) == {"429", "5xx", "timeout", "connection", "malformed"}
    assert 1 < srv.max_inflight <= 6
    # Retry-After: 1 was honoured
    by_key = defaultdict(list)
    for when, p, s, kind in srv.log:
        by_key[(p, s)].append((when, kind))
    gaps = [ev[1][0] - ev[0][0] for ev in by_key.values() if ev[0][1] == "429"]
    assert gaps and min(gaps) >= 0.95


def test_greedy_sends_one_request_per_prompt_and_top_k_only_when_set():
    with FaultServer(lambda p, a: "ok") as srv:
        t = create_target("openai", base_url=srv.url + "/v1", model="m", concurrency=2)
        g = GenerationParams(max_new_tokens=3, temperature=0.0, n=3)
        out = t.generate(["prompt-0", "prompt-1"], g)
    assert [len(set(o)) for o in out] == [1, 1]
    assert sum(srv.attempts.values()) == 2


def test_non_retryable_4xx_and_exhausted_retries():
    with FaultServer(lambda p, a: "400" if p == "prompt-3" else "ok") as srv:
        t = OpenAITarget(srv.url, "m", max_retries=3, backoff_base=0.01)
        with pytest.raises(OpenAITargetError, match="400"):
            t.generate([f"prompt-{i}" for i in range(6)], SAMPLED)
        # not retried: the run stops at the first 400, so a sample of prompt-3 still
        # queued then is never sent (0), but none that was sent is sent again
        rejected = [n for (p, _), n in srv.attempts.items() if p == "prompt-3"]
        assert rejected and max(rejected) == 1
    with FaultServer(lambda p, a: "500") as srv:
        t = OpenAITarget(srv.url, "m", max_retries=2, backoff_base=0.01)
        with pytest.raises(OpenAITargetError, match="2 retries"):
            t.generate(["prompt-0"], SAMPLED)
        assert t.retries >= 2


def test_api_key_only_from_env_and_never_leaks(tmp_path, monkeypatch, caplog):
    secret = "sk-test-7d1e0b2c9f"
    monkeypatch.setenv("CALIBDCD_TEST_KEY", secret)
    caplog.set_level(logging.DEBUG)
    with FaultServer(lambda p, a: "500" if a == 0 else ("400" if p == "prompt-9" else "ok")) as srv:
        t = OpenAITarget(srv.url, "m", api_key_env="CALIBDCD_TEST_KEY", backoff_base=0.01)
        with CachedTarget(t, tmp_path / "k.sqlite") as c:
            c.generate(["prompt-0", "prompt-1"], SAMPLED)
        with pytest.raises(OpenAITargetError) as err:
            t.generate(["prompt-9"], SAMPLED)
    assert set(srv.auth) == {f"Bearer {secret}"}
    assert secret not in str(err.value)
    assert secret not in repr(t) and secret not in t.name
    assert all(secret not in repr(v) for v in vars(t).values())
    assert secret not in caplog.text
    for f in tmp_path.iterdir():
        assert secret.encode() not in f.read_bytes()
    monkeypatch.delenv("CALIBDCD_TEST_KEY")
    with FaultServer(lambda p, a: "ok") as srv:
        OpenAITarget(srv.url, "m", api_key_env="CALIBDCD_TEST_KEY").generate(["prompt-0"], SAMPLED)
    assert set(srv.auth) == {None}


def test_a_dripping_server_times_out_at_the_deadline_then_retries():
    """httpx's timeout bounds each read; the deadline bounds the whole answer."""
    with FaultServer(lambda p, a: "drip" if a == 0 else "ok") as srv:
        t = OpenAITarget(srv.url, "m", timeout=1.0, max_retries=2, backoff_base=0.01)
        out = t.generate(["prompt-0"], SAMPLED)
    assert out[0][0] == expected_text("prompt-0", request_seed(4, 0), 5)
    # both samples dripped once, then succeeded: a byte every 0.2 s never trips httpx's 1 s
    # read timeout, so each "timeout" is the total deadline's (without it a drip answers in
    # ~16 s, and there would be no retry at all)
    assert t.retry_reasons["timeout"] == 2
    with FaultServer(lambda p, a: "drip") as srv:
        t = OpenAITarget(srv.url, "m", timeout=0.5, max_retries=1, backoff_base=0.01)
        with pytest.raises(OpenAITargetError, match=r"1 retries.*within 0.5 s"):
            t.generate(["prompt-0"], SAMPLED)


def test_server_errors_are_surfaced_verbatim():
    for kind, words in (
        ("error200", "KV cache exhausted"),
        ("empty", r"without any choice.*cmpl-1"),
        ("redirect", r"307 redirect to 'http://127.0.0.1:9/v1/completions'.*not followed"),
    ):
        with FaultServer(lambda p, a, kind=kind: kind) as srv:
            t = OpenAITarget(srv.url, "m", max_retries=3, backoff_base=0.01)
            with pytest.raises(OpenAITargetError, match=words):
                t.generate(["prompt-0"], SAMPLED)
            # never retried (the server said why); the second sample may be cancelled unsent
            assert srv.attempts and set(srv.attempts.values()) == {1}
    with FaultServer(lambda p, a: "503") as srv:  # retried, and the last words are kept
        t = OpenAITarget(srv.url, "m", max_retries=1, backoff_base=0.01)
        with pytest.raises(OpenAITargetError, match=r"503.*loading model, retry later"):
            t.generate(["prompt-0"], SAMPLED)


def test_the_answering_model_is_checked_with_explicit_aliases(tmp_path):
    with FaultServer(lambda p, a: "ok", served_model="other-model") as srv:
        t = OpenAITarget(srv.url, "m", max_retries=0)
        with (
            CachedTarget(t, tmp_path / "g.sqlite") as c,
            pytest.raises(OpenAITargetError, match=r"'other-model', not 'm'.*model_aliases"),
        ):
            c.generate(["prompt-0"], SAMPLED)
        with CachedTarget(t, tmp_path / "g.sqlite") as c:
            assert len(c) == 0  # nothing cached under the configured name
        # llama.cpp reports its own name for the served model: an explicit alias accepts it
        t = OpenAITarget(srv.url, "m", model_aliases=["other-model"])
        assert t.generate(["prompt-0"], SAMPLED)[0][0].startswith("<prompt-0|")
    with FaultServer(lambda p, a: "ok", served_model="m") as srv:
        assert OpenAITarget(srv.url, "m").generate(["prompt-0"], SAMPLED)[0][0]
    with FaultServer(lambda p, a: "ok") as srv:  # answers that name no model: said once
        t = OpenAITarget(srv.url, "m")
        with pytest.warns(RuntimeWarning, match="name no model") as caught:
            t.generate(["prompt-0", "prompt-1"], SAMPLED)
        assert len([w for w in caught if "name no model" in str(w.message)]) == 1
    with pytest.raises(ValueError, match="model_aliases"):
        OpenAITarget("http://127.0.0.1:9", "m", model_aliases="other")


def test_preflight_finds_an_absent_server_a_refused_key_and_another_model(monkeypatch):
    """Before any work, GET /v1/models: each failure is one line saying what to change."""
    from calibdcd.targets.openai import PreflightError

    monkeypatch.setenv("CALIBDCD_TEST_KEY", "sk-test-0f9e")
    with FaultServer(lambda p, a: "ok", served_model="org/model") as srv:
        t = OpenAITarget(srv.url + "/v1", "org/model", api_key_env="CALIBDCD_TEST_KEY")
        assert t.preflight() == ["org/model"]
        assert srv.auth[-1] == "Bearer sk-test-0f9e"  # with the key
        assert not srv.log  # no completion asked for
        with pytest.raises(PreflightError, match=r"serves \['org/model'\], not 'other'.*aliases"):
            OpenAITarget(srv.url, "other").preflight()
        assert OpenAITarget(srv.url, "other", model_aliases=["org/model"]).preflight()
        srv.models = (401, [])
        with pytest.raises(PreflightError, match=r"refused the key \(HTTP 401; sent \$CALIBDCD"):
            OpenAITarget(srv.url, "org/model", api_key_env="CALIBDCD_TEST_KEY").preflight()
        srv.models = (404, [])
        assert OpenAITarget(srv.url, "org/model").preflight() is None  # nothing to check
    with pytest.raises(PreflightError, match=r"127\.0\.0\.1:9/v1/models: cannot reach"):
        OpenAITarget("http://127.0.0.1:9/v1", "m").preflight()


def test_echoed_credentials_are_masked_in_quoted_server_errors(monkeypatch):
    """A server that echoes the Authorization header (Bearer key, or Basic user:pass from the
    URL) in its error body: the verbatim quote masks both."""
    import base64

    secret = "sk-echo-5c0ffee1"
    monkeypatch.setenv("CALIBDCD_TEST_KEY", secret)
    with FaultServer(lambda p, a: "echo") as srv:
        t = OpenAITarget(srv.url, "m", api_key_env="CALIBDCD_TEST_KEY", max_retries=0)
        with pytest.raises(OpenAITargetError, match="bad request, auth Bearer \\*\\*\\*") as err:
            t.generate(["prompt-0"], SAMPLED)
    assert secret not in str(err.value)
    monkeypatch.delenv("CALIBDCD_TEST_KEY")
    with FaultServer(lambda p, a: "echo") as srv:
        url = srv.url.replace("http://", "http://bob:pw-3e7a91@")
        t = OpenAITarget(url, "m", max_retries=0)
        with pytest.raises(OpenAITargetError) as err:
            t.generate(["prompt-0"], SAMPLED)
    assert srv.auth and srv.auth[0].startswith("Basic ")  # httpx sent the URL's credentials
    assert base64.b64encode(b"bob:pw-3e7a91").decode() not in str(err.value)
    assert "pw-3e7a91" not in str(err.value) and "auth Basic ***" in str(err.value)


def test_credentials_in_the_url_never_reach_messages(caplog):
    caplog.set_level(logging.DEBUG)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    t = OpenAITarget(f"http://user:hunter2pw@127.0.0.1:{port}", "m", max_retries=1)
    with pytest.raises(OpenAITargetError) as err:
        t.generate(["x"], SAMPLED)
    assert "hunter2pw" not in str(err.value) and "***@127.0.0.1" in str(err.value)
    assert "hunter2pw" not in repr(t) and "hunter2pw" not in caplog.text


def test_bad_inputs():
    t = OpenAITarget("http://127.0.0.1:9", "m")
    with pytest.raises(ValueError, match="prompts"):
        t.generate([], SAMPLED)
    with pytest.raises(ValueError, match=r"prompts\[2\]"):
        t.generate(["a", "b", b"c"], SAMPLED)  # type: ignore[list-item]
    with pytest.raises(ValueError, match="n must"):
        GenerationParams(max_new_tokens=5, temperature=1.0, n=0)
    with pytest.raises(ValueError, match="max_new_tokens"):
        GenerationParams(max_new_tokens=0, temperature=1.0)
    with pytest.raises(ValueError, match="base_url"):
        OpenAITarget("localhost:8000", "m")
    with pytest.raises(ValueError, match="model"):
        OpenAITarget("http://127.0.0.1:9", "")
    with pytest.raises(ValueError, match="concurrency"):
        OpenAITarget("http://127.0.0.1:9", "m", concurrency=0)
    with pytest.raises(ValueError, match="params"):
        t.generate(["a"], {"max_new_tokens": 3})  # type: ignore[arg-type]


def test_connection_refused_is_retried_then_reported():
    with socket.socket() as s:  # a port with nobody listening
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    t = OpenAITarget(f"http://127.0.0.1:{port}", "m", max_retries=2, backoff_base=0.01)
    with pytest.raises(OpenAITargetError, match="connection"):
        t.generate(["x"], SAMPLED)
    assert t.retry_reasons["connection"] >= 2


_RESUME_WORKER = textwrap.dedent(
    """
    import sys
    sys.path.insert(0, {src!r})
    from calibdcd.targets import GenerationParams
    from calibdcd.targets.cache import CachedTarget
    from calibdcd.targets.openai import OpenAITarget

    target = OpenAITarget({url!r}, "tiny", concurrency=2, backoff_base=0.01)
    prompts = [f"prompt-{{i}}" for i in range(40)]
    params = GenerationParams(max_new_tokens=5, temperature=1.0, n=1, seed=9)
    with CachedTarget(target, {db!r}, chunk_size=4) as c:
        out = c.generate(prompts, params)
    open({out!r}, "w").write(repr(out))
    """
)


def test_kill9_resume_through_server(tmp_path):
    db, out = tmp_path / "gen.sqlite", tmp_path / "out.txt"
    with FaultServer(lambda p, a: "ok", ok_delay=0.05) as srv:
        script = tmp_path / "w.py"
        script.write_text(_RESUME_WORKER.format(src=SRC, url=srv.url, db=str(db), out=str(out)))
        proc = subprocess.Popen([sys.executable, str(script)])
        deadline = time.time() + 60
        while sum(srv.successes.values()) < 14 and time.time() < deadline:
            time.sleep(0.01)
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
        assert not out.exists()
        con = sqlite3.connect(db)
        assert con.execute("PRAGMA integrity_check").fetchone() == ("ok",)
        stored = {r[0] for r in con.execute("SELECT prompt FROM completions")}
        con.close()
        assert 8 <= len(stored) < 40
        before = len(srv.log)
        subprocess.run([sys.executable, str(script)], check=True, timeout=120)
        second = [p for _, p, _, _ in srv.log[before:]]
    assert not set(second) & stored  # completed generations came from the cache
    assert len(second) == len(set(second)) == 40 - len(stored)
    # equal to an uninterrupted run
    with FaultServer(lambda p, a: "ok") as srv2:
        out2 = tmp_path / "out2.txt"
        script.write_text(
            _RESUME_WORKER.format(src=SRC, url=srv2.url, db=str(tmp_path / "b.db"), out=str(out2))
        )
        subprocess.run([sys.executable, str(script)], check=True, timeout=120)
    assert out.read_text() == out2.read_text()


# --- a real OpenAI-compatible server: transformers serve -------------------------------------
# Start-up takes ~7-10 s on 2 cores for the tiny model, so this stays in the fast suite.


@pytest.fixture(scope="module")
def served_model():
    pytest.importorskip("fastapi")
    from calibdcd.targets.serve import transformers_serve

    if not (Path(sys.executable).parent / "transformers").exists():
        pytest.skip("transformers CLI not installed (extra `serve`)")
    from calibdcd.targets.tiny import cached_tiny_lm

    model_dir = cached_tiny_lm()
    with transformers_serve(model_dir, threads=1, startup_timeout=120) as url:
        yield url, model_dir


def test_transformers_serve_roundtrip(served_model, tmp_path):
    url, model_dir = served_model
    t = OpenAITarget(url, str(model_dir), concurrency=4, timeout=60)
    prompts = ["The river", "A small bird walked", "Every night the king"]
    params = GenerationParams(max_new_tokens=8, temperature=1.0, n=3, seed=2)
    out = t.generate(prompts, params)
    assert [len(o) for o in out] == [3, 3, 3]
    assert all(isinstance(c, str) for o in out for c in o)
    assert t.retries == 0
    # the server honours the per-sample seeds. It seeds torch's global RNG per request, so its
    # sampled texts are reproducible only when requests do not overlap (concurrency=1)
    serial = OpenAITarget(url, str(model_dir), concurrency=1)
    again = serial.generate(prompts, params)
    assert serial.generate(prompts, params) == again
    assert any(len(set(o)) > 1 for o in again)  # distinct seeds give distinct samples
    # through the cache: a re-run sends no request
    with CachedTarget(t, tmp_path / "s.sqlite") as c:
        first = c.generate(prompts, params)
        before = t.requests
        assert c.generate(prompts, params) == first and t.requests == before
    # greedy through the server equals our own transformers backend
    pytest.importorskip("torch")
    from calibdcd.targets.hf import HFTarget

    g = GenerationParams(max_new_tokens=8, temperature=0.0)
    local = HFTarget(model_dir, device="cpu").generate(prompts, g)
    assert t.generate(prompts, g) == local


def test_transformers_dialect_reaches_the_servers_sampler(served_model):
    """transformers serve takes top_k only inside ``generation_config``: top-k 1 there turns
    sampling into greedy decoding; the same field at the top level is refused with 422."""
    url, model_dir = served_model
    prompts = ["The river", "A small bird walked"]
    greedy = OpenAITarget(url, str(model_dir)).generate(
        prompts, GenerationParams(max_new_tokens=8, temperature=0.0)
    )
    top1 = GenerationParams(max_new_tokens=8, temperature=1.0, top_k=1, n=3, seed=5)
    t = OpenAITarget(url, str(model_dir), dialect="transformers", concurrency=2)
    assert t.generate(prompts, top1) == [[g[0]] * 3 for g in greedy]
    with pytest.raises(OpenAITargetError, match="422"):
        OpenAITarget(url, str(model_dir), dialect="vllm").generate(prompts, top1)
    # no top-k (None) is sent as top_k 0, which transformers reads as "all tokens": it samples
    free = GenerationParams(max_new_tokens=8, temperature=1.0, top_k=None, n=3, seed=5)
    assert any(len(set(o)) > 1 for o in t.generate(prompts, free))


def test_replicas_share_the_requests_and_a_dead_one_loses_none(tmp_path):
    """A target may name several base_urls (replicas of one model): requests are spread over
    them with ``concurrency`` in flight per replica; when one dies mid-run its requests go to
    the others (not counted as retries), every prompt gets exactly its completion, and through
    the generation cache nothing is asked twice on a re-run."""
    from calibdcd.targets import create_target
    from calibdcd.targets.cache import CachedTarget

    prompts = [f"prompt-{i}" for i in range(60)]
    with (
        FaultServer(lambda p, a: "ok", ok_delay=0.02) as a,
        FaultServer(lambda p, a: "ok", ok_delay=0.02) as b,
    ):
        t = create_target(
            "openai", base_url=[a.url + "/v1", b.url + "/v1"], model="tiny", concurrency=3,
            max_retries=0,
        )  # fmt: skip
        assert t.preflight() == ["tiny"]  # both replicas asked
        out = t.generate(prompts[:30], GREEDY)
        assert [o[0] for o in out] == [
            expected_text(p, request_seed(0, 0), 8) for p in prompts[:30]
        ]
        assert len(a.log) > 0 and len(b.log) > 0  # both served
        assert a.max_inflight <= 3 and b.max_inflight <= 3
        # replica b dies: it drops every connection from now on
        b.plan = lambda p, att: "drop"
        with CachedTarget(t, tmp_path / "g.sqlite") as c:
            out = c.generate(prompts[30:], GREEDY)
            assert [o[0] for o in out] == [
                expected_text(p, request_seed(0, 0), 8) for p in prompts[30:]
            ]
        assert t.retry_reasons["replica down"] >= 1
        served = [p for _, p, _, kind in a.log if kind == "ok"]
        assert set(prompts[30:]) <= set(served)  # b's share went to a; max_retries=0 held
        n = len(a.log)
        with CachedTarget(t, tmp_path / "g.sqlite") as c:  # a re-run asks nothing
            c.generate(prompts[30:], GREEDY)
        assert len(a.log) == n
    with pytest.raises(ValueError, match="names a replica twice"):
        OpenAITarget(["http://127.0.0.1:9/v1", "http://127.0.0.1:9/v1/"], "m")


def _memorising_answer(texts: list[str], labels: list[int]):
    """A deterministic stand-in for a served model that memorised the members: a prompt holding
    a member's opening is continued with part of that member's true continuation (how much
    depends on the prompt and seed), any other prompt with pseudo-random words. Any replica
    gives any request the same answer, as replicas of one model with per-request seeds do."""
    import hashlib

    vocab = sorted({w for t in texts for w in t.split()})
    members = {
        " ".join(t.split()[:6]): t.split()[20:] for t, y in zip(texts, labels, strict=True) if y
    }

    def answer(req: dict) -> str:
        h = hashlib.sha256(f"{req['prompt']}|{req['seed']}".encode()).digest()
        noise = [vocab[b % len(vocab)] for b in h[:8]]
        cont = next((c for o, c in members.items() if o in req["prompt"]), None)
        if cont is None:
            return " " + " ".join(noise)
        keep = 2 + h[8] % 7
        return " " + " ".join(cont[:keep] + noise[keep:])

    return answer


def _memorised_corpus(tmp_path: Path) -> tuple[Path, Any]:
    """240 labelled texts in a jsonl file, and a served model's answer that memorised the
    members (:func:`_memorising_answer`)."""
    import random

    rng = random.Random(0)
    words = [f"w{i}" for i in range(300)]
    texts = [" ".join(rng.choice(words) for _ in range(40)) for _ in range(240)]
    labels = [i % 2 for i in range(240)]
    data = tmp_path / "texts.jsonl"
    data.write_text(
        "".join(
            json.dumps({"text": t, "label": y}) + "\n" for t, y in zip(texts, labels, strict=True)
        )
    )
    return data, _memorising_answer(texts, labels)


def _served_run_config(tmp_path: Path, data: Path, name: str, urls: list[str], **opts) -> Path:
    """A run config of the overlap detector on ``data`` through the replicas ``urls``."""
    p = tmp_path / f"{name}.yaml"
    options = {"base_url": urls, "concurrency": 4, "max_retries": 0, "dialect": "vllm", **opts}
    target = {
        "name": "served", "backend": "openai", "model": "tiny", "family": "qwen2.5",
        "options": options,
    }  # fmt: skip
    p.write_text(
        json.dumps(
            {
                "name": name,
                "benchmarks": [{"name": "mine", "path": str(data)}],
                "targets": [target],
                "detectors": ["overlap"],
                "cache_dir": str(tmp_path / f"cache-{name}"),
                "output": str(tmp_path / name),
            }
        )
    )
    return p


def test_a_run_through_two_replicas_one_killed_gives_the_one_replica_tables(tmp_path):
    """The issue's check, at the level of a config: a run through two replicas of one
    deterministic model, one of them killed mid-run, writes the tables a run through one replica
    writes, and no request is answered twice. The one-replica run is also a whole run that
    loads no torch model: it never imports torch (a run's environment record used to)."""
    data, answer = _memorised_corpus(tmp_path)

    def config(name: str, urls: list[str]) -> Path:
        return _served_run_config(tmp_path, data, name, urls)

    ok = lambda p, a: "ok"  # noqa: E731
    with FaultServer(ok, answer=answer, served_model="tiny") as one:
        script = (
            "import json, resource, sys\n"
            "from calibdcd.cli import main\n"
            "sys.argv = ['calibdcd', 'run', sys.argv[1], '--no-progress']\n"
            "try:\n    main()\nexcept SystemExit as e:\n    assert not e.code, e.code\n"
            "print(json.dumps({'torch': 'torch' in sys.modules,"
            " 'rss_kb': resource.getrusage(resource.RUSAGE_SELF).ru_maxrss}))\n"
        )
        env = {**os.environ, "PYTHONPATH": SRC, "HF_HUB_OFFLINE": "1"}
        res = subprocess.run(
            [sys.executable, "-c", script, str(config("one", [one.url + "/v1"]))],
            capture_output=True, text=True, env=env, timeout=600,
        )  # fmt: skip
        assert res.returncode == 0, res.stderr[-3000:]
        said = json.loads(res.stdout.strip().splitlines()[-1])
        assert said["torch"] is False, said  # the run loaded no torch model, and no torch
        n_one = len(one.log)
    env_json = json.loads((tmp_path / "one" / "environment.json").read_text())
    assert env_json["torch"] == {"loaded": False} and env_json["cpu_capability"] is None

    served = Counter()
    dead = {"after": 150, "seen": 0}

    def dies(p, a):
        dead["seen"] += 1  # called under the server's lock
        return "ok" if dead["seen"] < dead["after"] else "kill"

    from calibdcd.experiment import load_config, run_experiment

    with (
        FaultServer(ok, answer=answer, served_model="tiny") as a,
        FaultServer(dies, answer=answer, served_model="tiny") as b,
    ):
        two = config("two", [a.url + "/v1", b.url + "/v1"])
        run_experiment(load_config(two), progress=False)
        assert b.closed and dead["seen"] >= dead["after"]  # b died mid-run
        for srv in (a, b):
            for key, n in srv.successes.items():
                served[key] += n
    assert max(served.values()) == 1  # no request answered twice
    assert sum(served.values()) == n_one  # and exactly the one-replica run's requests
    results = (tmp_path / "one" / "results.csv").read_text()
    assert (tmp_path / "two" / "results.csv").read_text() == results
    import csv

    row = next(csv.DictReader(results.splitlines()))
    assert float(row["auc_before"]) > 0.8  # the tables say something: members are readable
    # machine-readable: every column but the names, the views and the reason parses as a number
    # (or is empty: no correction has no rank); no "66.1 [62.6, 69.6]" strings
    words = {"id", "benchmark", "target", "detector", "selected_views", "no_correction_reason"}
    for r in csv.DictReader(results.splitlines()):
        for k, v in r.items():
            if k not in words and v != "":
                assert v in ("True", "False") or math.isfinite(float(v)), (k, v)
    assert {"auc_after_low", "calibdcd_delta_auc_half_width", "calibdcd_delta_auc_p"} <= set(row)
    from calibdcd.report import write_report

    tables = [(write_report(tmp_path / d).parent / "tables.md").read_text() for d in ("one", "two")]
    assert tables[0] == tables[1]


@pytest.mark.slow  # two whole served runs (about a minute)
@pytest.mark.parametrize("fault", ["500", "stall"])
def test_a_run_through_a_replica_that_fails_or_hangs_gives_the_one_replica_tables(tmp_path, fault):
    """A replica that answers 500 from some point on, or hangs past the request timeout, is
    taken out and its requests go to the other: the run finishes with the tables of a run
    through one replica, and no prompt is answered twice."""
    from calibdcd.experiment import load_config, run_experiment
    from calibdcd.report import write_report

    data, answer = _memorised_corpus(tmp_path)
    ok = lambda p, a: "ok"  # noqa: E731
    with FaultServer(ok, answer=answer, served_model="tiny") as one:
        run_experiment(load_config(_served_run_config(tmp_path, data, "one", [one.url + "/v1"])),
                       progress=False)  # fmt: skip
    seen = {"n": 0}

    def fails(p, a):
        seen["n"] += 1
        return "ok" if seen["n"] < 100 else fault

    with (
        FaultServer(ok, answer=answer, served_model="tiny") as a,
        FaultServer(fails, answer=answer, served_model="tiny", stall=8.0) as b,
    ):
        cfg = _served_run_config(tmp_path, data, "two", [a.url + "/v1", b.url + "/v1"],
                                 timeout=2.0)  # fmt: skip
        with pytest.warns(RuntimeWarning, match="taken out"):
            run_experiment(load_config(cfg), progress=False)
        served = Counter(a.successes) + Counter(b.successes)
    assert max(served.values()) == 1
    assert (tmp_path / "two" / "results.csv").read_text() == (
        tmp_path / "one" / "results.csv"
    ).read_text()
    tables = [(write_report(tmp_path / d).parent / "tables.md").read_text() for d in ("one", "two")]
    assert tables[0] == tables[1]


def test_the_cache_streams_misses_without_a_barrier(tmp_path):
    """Through a generation cache, a slow request holds one slot only: the other slots keep
    the server busy with the rest (no chunk waits for its slowest request), and each
    completion is committed as it arrives, long before the slow one lands."""

    def answer(req):
        if req["prompt"] == "prompt-0":
            time.sleep(1.5)
        return expected_text(req["prompt"], req["seed"], req["max_tokens"])

    prompts = [f"prompt-{i}" for i in range(40)]
    params = GenerationParams(max_new_tokens=5, temperature=1.0, n=1, seed=9)
    with FaultServer(lambda p, a: "ok", answer=answer, ok_delay=0.02) as srv:
        t = OpenAITarget(srv.url, "tiny", concurrency=4)
        with CachedTarget(t, tmp_path / "g.sqlite", chunk_size=4) as c:
            out = c.generate(prompts, params)
            assert c.stats.target_calls == 1 and c.stats.misses == 40
        assert srv.max_inflight == 4
    seeds = request_seed(params.seed, 0)
    assert out == [[expected_text(p, seeds, 5)] for p in prompts]
    con = sqlite3.connect(tmp_path / "g.sqlite")
    created = dict(con.execute("SELECT prompt, created FROM completions").fetchall())
    con.close()
    slow = created.pop("prompt-0")
    # every other completion was stored (in several small commits) while prompt-0 ran
    assert max(created.values()) < slow - 0.5
    assert len(set(created.values())) > 3


def test_a_stream_closed_early_cancels_what_is_in_flight():
    with FaultServer(lambda p, a: "ok", ok_delay=0.05) as srv:
        t = OpenAITarget(srv.url, "tiny", concurrency=2)
        prompts = [f"prompt-{i}" for i in range(200)]
        it = t.stream_indexed(prompts, [0] * len(prompts), SAMPLED)
        first = next(it)
        it.close()
        # requests the server had already received finish there (within ok_delay) and are
        # logged then; what must not happen is a request sent after the close
        time.sleep(0.15)
        sent = len(srv.log)
        time.sleep(0.3)
        assert len(srv.log) == sent < 20 and first
