"""The persistent SQLite generation cache: hits, keys, kill -9 resume, shared files."""

from __future__ import annotations

import dataclasses
import hashlib
import os
import signal
import sqlite3
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from calibdcd.targets import GenerationParams
from calibdcd.targets.cache import CachedTarget, cache_key

SRC = str(Path(__file__).resolve().parents[1] / "src")
P = GenerationParams(max_new_tokens=8, temperature=0.8, top_p=0.9, n=3, seed=5)


class HashTarget:
    """A real (pure-Python, deterministic) target: sample i of a prompt is a hash of its inputs.
    It records every (prompt, sample) it is asked for, so tests can count generations."""

    family = None

    def __init__(self, name: str = "hash-lm", delay: float = 0.0):
        self.name = name
        self.delay = delay
        self.calls: list[tuple[str, int]] = []

    def _text(self, prompt: str, params: GenerationParams, i: int) -> str:
        blob = f"{prompt}|{params.temperature}|{params.top_p}|{params.top_k}|{params.seed}|{i}"
        return hashlib.sha1(blob.encode()).hexdigest()[: params.max_new_tokens]

    def generate(self, prompts, params):
        time.sleep(self.delay)
        self.calls += [(p, i) for p in prompts for i in range(params.n)]
        return [[self._text(p, params, i) for i in range(params.n)] for p in prompts]


def test_hits_misses_and_identical_results(tmp_path):
    inner = HashTarget()
    prompts = [f"text {i}" for i in range(10)]
    with CachedTarget(inner, tmp_path / "c.sqlite", chunk_size=4) as cached:
        assert cached.name == inner.name
        first = cached.generate(prompts, P)
        assert first == inner.generate(prompts, P)  # same as the uncached target
        inner.calls.clear()
        assert cached.stats.misses == 30 and cached.stats.hits == 0
        again = cached.generate(prompts, P)
        assert again == first and inner.calls == []
        assert cached.stats.hits == 30 and cached.stats.misses == 30
        # a wider request: only the new prompts and the new sample indices are generated
        wider = cached.generate([*prompts, "new"], dataclasses.replace(P, n=4))
        assert [w[:3] for w in wider[:10]] == first
        assert cached.stats.misses == 30 + 1 * 4 + 10  # "new" x4 and sample 3 of old prompts
        assert len(cached) == 44
    # persistent: a new process-level object sees the same file
    with CachedTarget(HashTarget(), tmp_path / "c.sqlite") as again2:
        assert again2.generate(prompts, P) == first
        assert again2.stats.misses == 0


def test_key_covers_every_parameter_and_target(tmp_path):
    base = cache_key("m", "p", P, 0)
    variants = [
        cache_key("m2", "p", P, 0),
        cache_key("m", "p ", P, 0),
        cache_key("m", "p", P, 1),
        *(
            cache_key("m", "p", dataclasses.replace(P, **{f: v}), 0)
            for f, v in [
                ("max_new_tokens", 9),
                ("temperature", 0.9),
                ("top_p", 0.8),
                ("top_k", 5),
                ("seed", 6),
            ]
        ),
    ]
    assert len({base, *variants}) == len(variants) + 1
    assert cache_key("m", "p", dataclasses.replace(P, n=7), 0) == base  # n is not a key part
    g = GenerationParams(max_new_tokens=8, temperature=0.0, n=3, seed=1, top_p=0.5)
    g2 = GenerationParams(max_new_tokens=8, temperature=0.0, seed=9)
    assert cache_key("m", "p", g, 2) == cache_key("m", "p", g2, 0)  # greedy: one entry


def test_greedy_generates_once_per_prompt(tmp_path):
    inner = HashTarget()
    g = GenerationParams(max_new_tokens=8, temperature=0.0, n=3)
    with CachedTarget(inner, tmp_path / "g.sqlite") as cached:
        out = cached.generate(["a", "b", "a"], g)
        assert out[0] == out[2] and len(set(out[0])) == 1
        assert cached.stats.misses == 2 and len(cached) == 2


def test_bad_arguments(tmp_path):
    bad = tmp_path / "not-a-db.sqlite"
    bad.write_bytes(b"this is not sqlite" * 100)
    with pytest.raises(ValueError, match="path"):
        CachedTarget(HashTarget(), bad)
    with pytest.raises(ValueError, match="chunk_size"):
        CachedTarget(HashTarget(), tmp_path / "x.sqlite", chunk_size=0)
    with pytest.raises(ValueError, match="target"):
        CachedTarget(object(), tmp_path / "x.sqlite")  # type: ignore[arg-type]
    with CachedTarget(HashTarget(), tmp_path / "y.sqlite") as c:
        with pytest.raises(ValueError, match="prompts"):
            c.generate([], P)
        with pytest.raises(ValueError, match=r"prompts\[0\]"):
            c.generate([None], P)  # type: ignore[list-item]


_WORKER = textwrap.dedent(
    """
    import sys, time, hashlib
    sys.path.insert(0, {src!r})
    from calibdcd.targets import GenerationParams
    from calibdcd.targets.cache import CachedTarget

    class SlowHash:
        name, family = "slow-hash", None
        def generate(self, prompts, params):
            time.sleep({delay})
            with open({log!r}, "a") as f:
                for p in prompts:
                    f.write(p + "\\n")
            return [[hashlib.sha1(f"{{p}}|{{i}}".encode()).hexdigest() for i in range(params.n)]
                    for p in prompts]

    prompts = [f"p{{i:03d}}" for i in range({n_prompts})]
    params = GenerationParams(max_new_tokens=8, temperature=1.0, n=2, seed=3)
    with CachedTarget(SlowHash(), {db!r}, chunk_size={chunk}) as c:
        out = c.generate(prompts, params)
    with open({out!r}, "w") as f:
        f.write(repr(out))
    """
)


def _worker(tmp_path: Path, tag: str, delay: float, db: Path, n_prompts: int = 40, chunk: int = 4):
    script = tmp_path / f"worker_{tag}.py"
    log, out = tmp_path / f"{tag}.log", tmp_path / f"{tag}.out"
    script.write_text(
        _WORKER.format(
            src=SRC,
            delay=delay,
            log=str(log),
            db=str(db),
            chunk=chunk,
            out=str(out),
            n_prompts=n_prompts,
        )
    )
    return script, log, out


def _lines(p: Path) -> list[str]:
    return p.read_text().split() if p.exists() else []


def test_kill9_resume_redoes_no_completed_generation(tmp_path):
    db = tmp_path / "kill.sqlite"
    script, log, out = _worker(tmp_path, "run", 0.15, db)
    proc = subprocess.Popen([sys.executable, str(script)])
    deadline = time.time() + 30
    while len(_lines(log)) < 12 and time.time() < deadline:  # let >= 3 chunks through
        time.sleep(0.02)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    assert not out.exists(), "worker finished before it was killed"
    requested_before = _lines(log)
    con = sqlite3.connect(db)
    assert con.execute("PRAGMA integrity_check").fetchone() == ("ok",)
    stored = {r[0] for r in con.execute("SELECT prompt FROM completions")}
    con.close()
    assert stored and stored <= set(requested_before)
    # restart: finishes, and never asks the target again for a stored prompt
    log.write_text("")
    subprocess.run([sys.executable, str(script)], check=True, timeout=60)
    requested_after = _lines(log)
    assert not (set(requested_after) & stored)
    assert len(requested_after) == len(set(requested_after)) == 40 - len(stored)
    # and the result equals an uninterrupted run
    s2, _, out2 = _worker(tmp_path, "fresh", 0.0, tmp_path / "fresh.sqlite")
    subprocess.run([sys.executable, str(s2)], check=True, timeout=60)
    assert out.read_text() == out2.read_text()


def _run_workers(tmp_path: Path, tags, delay, db, n_prompts, chunk, timeout):
    """Start one worker per tag on the same file at once; wait for all; (outs, logs)."""
    procs, outs, logs = [], [], []
    for tag in tags:
        script, log, out = _worker(tmp_path, tag, delay, db, n_prompts=n_prompts, chunk=chunk)
        procs.append(subprocess.Popen([sys.executable, str(script)]))
        outs.append(out)
        logs.append(log)
    for p in procs:
        assert p.wait(timeout=timeout) == 0
    return outs, logs


def test_processes_share_one_file(tmp_path):
    """Three processes start on one new file at once (creation races included)."""
    db = tmp_path / "shared.sqlite"
    outs, _ = _run_workers(tmp_path, ("a", "b", "c"), 0.01, db, 60, 3, 120)
    assert outs[0].read_text() == outs[1].read_text() == outs[2].read_text()
    con = sqlite3.connect(db)
    assert con.execute("SELECT COUNT(*) FROM completions").fetchone() == (120,)
    assert con.execute("PRAGMA integrity_check").fetchone() == ("ok",)
    con.close()


def test_two_runs_sharing_a_cache_request_each_completion_once(tmp_path):
    """Two processes that need the same completions at the same time: one generates each, the
    other waits for it (issue 15: identical runs sharing a cache requested everything twice)."""
    db = tmp_path / "twice.sqlite"
    outs, logs = _run_workers(tmp_path, ("a", "b"), 0.1, db, 40, 4, 300)
    requested = _lines(logs[0]) + _lines(logs[1])
    assert sorted(requested) == sorted(f"p{i:03d}" for i in range(40))  # each prompt once
    assert outs[0].read_text() == outs[1].read_text()
    con = sqlite3.connect(db)
    assert con.execute("SELECT COUNT(*) FROM claims").fetchone() == (0,)  # all released
    con.close()


def test_a_dead_process_claims_are_taken_over_at_once(tmp_path):
    """Claims of a process that no longer runs (kill -9) do not make the next run wait."""
    import socket

    db = tmp_path / "dead.sqlite"
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    inner = HashTarget()
    with CachedTarget(inner, db, claim_ttl=3600) as c:
        prompt_keys = [cache_key(c.name, f"q{i}", P, s) for i in range(3) for s in range(P.n)]
        with c._conn:
            c._conn.executemany(
                "INSERT INTO claims VALUES (?, 'ghost', ?, ?, ?)",
                [(k, socket.gethostname(), dead.pid, time.time() + 3600) for k in prompt_keys],
            )
        # the claims' process is gone: they are dead at once (no waiting for their hour-long
        # lease), so this process takes them over and generates
        now = time.time()
        assert not c._claim_alive(socket.gethostname(), dead.pid, now + 3600, now)
        out = c.generate([f"q{i}" for i in range(3)], P)
        assert len(inner.calls) == 3 * P.n
        assert out == HashTarget().generate([f"q{i}" for i in range(3)], P)


def test_cached_real_model_equals_fresh_generation(tmp_path):
    torch = pytest.importorskip("torch")
    from calibdcd.targets.hf import HFTarget
    from calibdcd.targets.tiny import cached_tiny_lm, synthetic_sentences

    torch.set_num_threads(2)
    target = HFTarget(cached_tiny_lm(), device="cpu", batch_size=8)
    prompts = [s[:12] for s in synthetic_sentences(6, seed=4)]
    params = GenerationParams(max_new_tokens=10, temperature=1.0, top_p=0.95, n=2, seed=1)
    fresh = target.generate(prompts, params)
    with CachedTarget(target, tmp_path / "hf.sqlite", chunk_size=5) as cached:
        # chunks of 5 rows cut prompts' samples apart: still the same texts
        assert cached.generate(prompts, params) == fresh
        assert cached.stats.target_calls == 3 and cached.stats.misses == 12
        more = cached.generate(prompts, dataclasses.replace(params, n=3))
        assert [m[:2] for m in more] == fresh
        assert cached.stats.misses == 12 + 6  # only sample index 2 was generated
        assert more == target.generate(prompts, dataclasses.replace(params, n=3))
        assert cached.tokenizer is target.tokenizer  # wrapped attributes pass through


def test_two_caches_streaming_from_one_server_generate_each_completion_once(tmp_path):
    """Two generation caches on one file (two owners, as two processes), each streaming from a
    real loopback server, asked for overlapping prompts at the same time: every completion is
    requested exactly once, and both get every text."""
    import threading

    from calibdcd.targets.openai import OpenAITarget, request_seed
    from test_openai_target import FaultServer, expected_text

    params = GenerationParams(max_new_tokens=5, temperature=1.0, n=2, seed=4)
    a_prompts = [f"prompt-{i}" for i in range(30)]
    b_prompts = [f"prompt-{i}" for i in range(15, 45)]
    got: dict[str, list[list[str]]] = {}
    with FaultServer(lambda p, a: "ok", ok_delay=0.02, served_model="tiny") as srv:

        def run(who: str, prompts: list[str]) -> None:
            t = OpenAITarget(srv.url, "tiny", concurrency=4, dialect="vllm")
            with CachedTarget(t, tmp_path / "g.sqlite", poll=0.05) as c:
                got[who] = c.generate(prompts, params)

        threads = [
            threading.Thread(target=run, args=("a", a_prompts)),
            threading.Thread(target=run, args=("b", b_prompts)),
        ]
        for th in threads:
            th.start()
        for th in threads:
            th.join(60)
    seeds = [request_seed(params.seed, i) for i in range(params.n)]
    for who, prompts in (("a", a_prompts), ("b", b_prompts)):
        assert got[who] == [[expected_text(p, s, 5) for s in seeds] for p in prompts]
    assert len(srv.successes) == 2 * 45 and set(srv.successes.values()) == {1}
