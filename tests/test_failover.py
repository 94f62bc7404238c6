"""Replica failover of the OpenAI-compatible target against real loopback HTTP servers: a
replica answering 500 or hanging is taken out (one warning naming it) and its requests go to the
others, nothing lost and nothing answered twice; when retries are exhausted the one-line error
names every failed replica with its last answers and whether it still answers GET /v1/models.
Also the empty-completion counts run, fit and score check alike."""

from __future__ import annotations

import re
import threading
import time
import warnings

import pytest

from calibdcd.redact import redact_url
from calibdcd.targets import GenerationParams
from calibdcd.targets.cache import CachedTarget, completion_counts, empty_completions_warning
from calibdcd.targets.openai import OpenAITarget, OpenAITargetError, request_seed
from test_openai_target import SAMPLED, FaultServer, expected_text

PROMPTS = [f"prompt-{i}" for i in range(16)]


def _expected(prompts: list[str]) -> list[list[str]]:
    seeds = [request_seed(SAMPLED.seed, i) for i in range(SAMPLED.n)]
    return [[expected_text(p, s, SAMPLED.max_new_tokens) for s in seeds] for p in prompts]


def _where(srv: FaultServer) -> str:
    return redact_url(srv.url + "/v1/completions")


def _taken_out(caught) -> list[str]:
    return [str(w.message) for w in caught if "taken out" in str(w.message)]


def test_a_replica_answering_500_is_taken_out_and_its_requests_go_to_the_other(tmp_path):
    ok = lambda p, a: "ok"  # noqa: E731
    with (
        FaultServer(ok, ok_delay=0.01, served_model="tiny") as a,
        FaultServer(lambda p, att: "500", served_model="tiny") as b,
    ):
        t = OpenAITarget([a.url, b.url], "tiny", concurrency=2, max_retries=2, backoff_base=0.01)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            assert t.generate(PROMPTS, SAMPLED) == _expected(PROMPTS)
        # nothing lost, nothing answered twice: every request succeeded exactly once, on a
        assert len(a.successes) == 2 * len(PROMPTS) and set(a.successes.values()) == {1}
        assert not b.successes
        # b went out after max_retries + 1 failed answers in a row (and what was in flight)
        assert 3 <= len(b.log) <= 3 + 2
        said = _taken_out(caught)
        assert len(said) == 1, said
        assert _where(b) in said[0] and _where(a) not in said[0]
        assert "3 failed answers in a row" in said[0] and "500" in said[0] and "boom" in said[0]
        assert t.replicas_out.keys() == {_where(b)} and len(t.replica_events) == 1
        # out for the session: the next call (a generation cache calls once per chunk) asks
        # nothing of b and warns no more
        n_b = len(b.log)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            with CachedTarget(t, tmp_path / "g.sqlite", chunk_size=4) as c:
                more = [f"more-{i}" for i in range(8)]
                assert c.generate(more, SAMPLED) == _expected(more)
        assert len(b.log) == n_b and not _taken_out(caught)
        # after readmit_after seconds it is tried again (and taken out again)
        t.readmit_after = 0.0
        with pytest.warns(RuntimeWarning, match="taken out"):
            again = [f"again-{i}" for i in range(8)]
            assert t.generate(again, SAMPLED) == _expected(again)
        assert len(b.log) > n_b


def test_a_hanging_replica_is_taken_out_at_the_deadline():
    ok = lambda p, a: "ok"  # noqa: E731
    with (
        FaultServer(ok, ok_delay=0.01, served_model="tiny") as a,
        FaultServer(lambda p, att: "stall", stall=6.0, served_model="tiny") as b,
    ):
        t = OpenAITarget(
            [a.url, b.url], "tiny", concurrency=3, timeout=0.5, max_retries=3,
            backoff_base=0.01,
        )  # fmt: skip
        t0 = time.monotonic()
        with pytest.warns(RuntimeWarning, match="taken out") as caught:
            assert t.generate(PROMPTS, SAMPLED) == _expected(PROMPTS)
        took = time.monotonic() - t0
        # one deadline on b, then a alone (without the take-out: 3 stalls per round of b's
        # slots, each 0.5 s, with retries sent back to b)
        assert took < 3.0, took
        said = _taken_out(caught)
        assert len(said) == 1 and _where(b) in said[0], said
        assert "timed out" in said[0] and "0.5 s" in said[0]
        assert len(a.successes) == 2 * len(PROMPTS) and set(a.successes.values()) == {1}
        assert len(b.log) <= 3  # only what was in flight when it hung
        # re-routed requests are not retries: no request used its budget on b
        assert t.retry_reasons["replica down"] == len(b.log)
        assert t.retry_reasons["timeout"] == 0


def test_both_replicas_failing_is_one_error_naming_both():
    """a answers 500; b answers 503 twice and then dies (the dying server of the issue): one
    line naming both, their last answers, and which still answers GET /v1/models."""
    seen = {"n": 0}
    lock = threading.Lock()

    def dying(p, att):
        with lock:
            seen["n"] += 1
            return "503" if seen["n"] <= 2 else "kill"

    with (
        FaultServer(lambda p, att: "500") as a,
        FaultServer(dying) as b,
    ):
        t = OpenAITarget(
            [a.url, b.url], "tiny", concurrency=1, timeout=2.0, max_retries=3,
            backoff_base=0.01,
        )  # fmt: skip
        t0 = time.monotonic()
        with (
            warnings.catch_warnings(record=True),
            pytest.raises(OpenAITargetError) as err,
        ):
            warnings.simplefilter("always")
            t.generate(PROMPTS[:3], GenerationParams(max_new_tokens=5, temperature=0.0))
        assert time.monotonic() - t0 < 10
        assert b.closed
    msg = str(err.value)
    assert "\n" not in msg
    assert "giving up after 3 retries" in msg
    # each replica named once, with its last answers and its GET /v1/models
    part_a, part_b = (msg.split(_where(srv), 1)[1] for srv in (a, b))
    part_a = part_a.split(_where(b))[0]
    part_b = part_b.split(_where(a))[0]
    assert '500 \'{"error": "boom"}\'' in part_a
    assert "still answers GET /v1/models (HTTP 200)" in part_a
    assert '503 \'{"error": "loading model, retry later"}\' (x2)' in part_b
    # (ConnectError once b's socket is closed, which takes up to 0.5 s after its death)
    assert "GET /v1/models gets no answer" in part_b
    assert "taken out" in msg


def test_a_dying_server_error_quotes_its_last_answers_and_says_it_stopped_answering():
    seen = {"n": 0}

    def dying(p, att):
        seen["n"] += 1  # under the server's lock
        return "500" if seen["n"] <= 2 else "kill"

    with FaultServer(dying) as srv:
        t = OpenAITarget(srv.url, "tiny", max_retries=3, backoff_base=0.01)
        with pytest.raises(OpenAITargetError) as err:
            t.generate(["prompt-0"], GenerationParams(max_new_tokens=5, temperature=0.0))
    msg = str(err.value)
    assert re.search(r"giving up after 3 retries \(last failure: connection: \w+\)", msg), msg
    assert 'its last answers before that: 500 \'{"error": "boom"}\' (x2)' in msg
    assert re.search(r"GET /v1/models gets no answer (\(\w+\): it stopped|within)", msg)
    assert _where(srv) in msg and "taken out" not in msg  # one replica is never taken out
    with FaultServer(lambda p, att: "500") as srv:  # a server that still lists its models
        t = OpenAITarget(srv.url, "tiny", max_retries=1, backoff_base=0.01)
        with pytest.raises(OpenAITargetError) as err:
            t.generate(["prompt-0"], GenerationParams(max_new_tokens=5, temperature=0.0))
    assert 'its last answers: 500 \'{"error": "boom"}\' (x2)' in str(err.value)
    assert "it still answers GET /v1/models (HTTP 200)" in str(err.value)


def test_empty_completions_are_counted_by_the_target_and_its_cache(tmp_path):
    """Whitespace-only completions: the target counts them (``served`` / ``empty``), a
    generation cache counts them with its hits, and one check words the warning for run, fit
    and score alike."""

    def answer(req):
        i = int(req["prompt"].split("-")[1])
        return " \n " if i % 4 else expected_text(req["prompt"], req["seed"], req["max_tokens"])

    with FaultServer(lambda p, a: "ok", answer=answer, served_model="tiny") as srv:
        t = OpenAITarget(srv.url, "tiny", concurrency=4)
        with CachedTarget(t, tmp_path / "g.sqlite") as c:
            c.generate(PROMPTS, SAMPLED)
            assert completion_counts(t) == (32, 24) == (t.served, t.empty)
            assert t.stats["served"] == 32 and t.stats["empty"] == 24
            c.generate(PROMPTS, SAMPLED)  # from the cache: the target saw nothing new
            assert completion_counts(t) == (32, 24)
            assert completion_counts(c) == (64, 48)
    assert empty_completions_warning(64, 48) == "48 of 64 completions of the target were empty"
    assert "all 8 completions of the target were empty: the detector's score measures" in (
        empty_completions_warning(8, 8) or ""
    )
    assert empty_completions_warning(64, 31) is None and empty_completions_warning(0, 0) is None
    assert completion_counts(object()) == (0, 0)


def test_a_server_that_is_down_stops_the_run_in_seconds_with_one_line(tmp_path):
    """Every connection refused (nothing listens on the port): the call stops within seconds
    with one line naming the URL and what to do, not after the whole backoff of every retry;
    with retries left, ``down_after`` seconds of refusals end it."""
    import socket

    with socket.socket() as s:  # a real loopback port that refuses connections
        s.bind(("127.0.0.1", 0))
        url = f"http://127.0.0.1:{s.getsockname()[1]}"
    t = OpenAITarget(url, "tiny", concurrency=4)  # the defaults: 8 retries, backoff to 30 s
    t0 = time.monotonic()
    with CachedTarget(t, tmp_path / "g.sqlite") as c, pytest.raises(OpenAITargetError) as err:
        c.generate(PROMPTS, SAMPLED)
    took = time.monotonic() - t0
    msg = str(err.value)
    assert took < 20, took
    assert "\n" not in msg and redact_url(url + "/v1/completions") in msg
    assert "The server is down: every replica refused connections" in msg
    assert "Start it (or fix the target's base_url) and run the same command again" in msg
    t = OpenAITarget(url, "tiny", max_retries=1000, backoff_base=0.01)
    t.down_after = 1.0
    t0 = time.monotonic()
    with pytest.raises(OpenAITargetError, match="The server is down"):
        t.generate(["prompt-0"], SAMPLED)
    assert time.monotonic() - t0 < 5 and t.retries < 1000
