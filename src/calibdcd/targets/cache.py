"""A persistent SQLite generation cache that wraps any :class:`~calibdcd.targets.base.Target`.

Every completion is stored under ``sha256([target.name, prompt, max_new_tokens, temperature, top_p,
top_k, seed, (repetition_penalty,) sample index])`` of the parameters *as the target resolves them*
(``target.resolve_params``): an in-process target fills fields a detector leaves as ``"inherit"``
from its checkpoint's generation config, so a changed generation config is a different key; a
server target keeps ``"inherit"``, which is what its request says (the field is left out). The
repetition penalty enters the key only when it is not 1.0, so keys of runs without it are the
same as before it existed. Only the misses go to the wrapped target. A target that streams
(``stream_indexed``: the OpenAI backend) gets them all at once and keeps its bounded number of
requests in flight until the last one (no barrier at which a server's batch drains); each
handful of completions is committed as it arrives. Any other target gets them in chunks of
``chunk_size`` completions (the in-process backend: one batch each), each chunk committed in its
own transaction. Either way a run killed at any point (even ``kill -9``) keeps every completion
committed and never leaves a corrupt file (SQLite's WAL journal is atomic).

Several processes can share one file: WAL mode lets readers run during a write, writers wait up
to ``timeout`` seconds for each other, and the first completion stored wins.
Processes that need the same completions at the same time do not both generate them: before
generating, a process *claims* its missing keys (table ``claims``: owner, host, pid, expiry), skips
keys another live process has claimed, generates its own, and then waits for the others' keys to
land (polling the file). A claim is dead, and taken over, when its process is gone (same host: the
pid no longer runs, so a run resumed after ``kill -9`` does not wait) or its lease (``claim_ttl``
seconds, renewed with the stored completions, at most every ``claim_ttl / 10`` seconds) has run
out (another host sharing the file).

Greedy decoding (``temperature == 0``) ignores top-p, top-k, the seed and the sample index (not
the repetition penalty), so those are normalised out of its key: the ``n`` greedy samples of
a prompt are one entry.

Wrapped targets that offer ``stream_indexed`` or ``generate_indexed(prompts, sample_indices,
params)`` (the built-in backends do) are asked for exactly the missing samples; for any other
target the cache asks for ``n = 1 + the largest missing index`` and stores every sample it gets
back.

The API key of a remote target never reaches the cache: only ``target.name``, prompts, parameters
and completions are stored.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import os
import socket
import sqlite3
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

from calibdcd.progress import inner_bar
from calibdcd.targets.base import (
    INHERIT,
    GenerationParams,
    Target,
    resolve_params,
    validate_prompts,
)
from calibdcd.targets.logprobs import LogprobQuery, TextLogprobs, check_logprob_inputs

__all__ = [
    "EMPTY_RATE",
    "CacheStats",
    "CachedTarget",
    "cache_key",
    "completion_counts",
    "empty_completions_warning",
    "logprob_key",
]

_SCHEMA_VERSION = 1
_SQL_VARS = 500  # keys per SELECT ... IN (...)


@dataclasses.dataclass
class CacheStats:
    """``hits``: requested completions served from the file; ``misses``: completions the wrapped
    target generated; ``target_calls``: calls made to the wrapped target (one per chunk);
    ``served`` / ``empty``: completions returned and the empty ones among them; ``waited``:
    completions another process was generating, served once it had stored them (also hits)."""

    hits: int = 0
    misses: int = 0
    target_calls: int = 0
    waited: int = 0
    #: completions returned to callers, and how many of them were empty (whitespace only)
    served: int = 0
    empty: int = 0

    @property
    def hit_rate(self) -> float:
        total = self.hits + self.misses
        return self.hits / total if total else 0.0


#: from this share of empty (whitespace-only) completions on, a result is warned about
EMPTY_RATE = 0.5


def completion_counts(target: Any) -> tuple[int, int]:
    """(completions served, empty ones among them) so far by ``target``: a
    :class:`CachedTarget`'s stats (cache hits included: what the detector saw), else the
    target's own ``served`` / ``empty`` counters (the OpenAI backend's), else (0, 0). Take it
    before and after a piece of work, and hand the differences to
    :func:`empty_completions_warning`."""
    st = getattr(target, "stats", None)
    if isinstance(st, CacheStats):
        return st.served, st.empty
    if isinstance(st, dict) and "served" in st:
        return int(st["served"]), int(st.get("empty", 0))
    served, empty = getattr(target, "served", None), getattr(target, "empty", None)
    if isinstance(served, int) and isinstance(empty, int):
        return served, empty
    return 0, 0


def empty_completions_warning(
    served: int, empty: int, measures: str = "the detector's score"
) -> str | None:
    """The one check of ``run``, ``fit`` and ``score`` on empty completions: a warning when all
    of ``served`` completions, or at least :data:`EMPTY_RATE` of them, were empty; else None.
    ``measures`` names what then measures nothing (``run``: the AUC)."""
    if served and empty == served:
        return (
            f"all {served} completions of the target were empty: {measures} measures nothing "
            "(check the server, max_new_tokens and the stop settings)"
        )
    if served and empty / served >= EMPTY_RATE:
        return f"{empty} of {served} completions of the target were empty"
    return None


def _num(v: Any) -> Any:
    return v if v == INHERIT else float(v)


def _key_params(params: GenerationParams, sample: int) -> tuple[dict[str, Any], int]:
    rp = params.repetition_penalty
    extra = {} if rp == 1.0 else {"repetition_penalty": _num(rp)}
    if params.greedy:
        return {
            "max_new_tokens": params.max_new_tokens,
            "temperature": 0.0,
            "top_p": 1.0,
            "top_k": None,
            "seed": 0,
            **extra,
        }, 0
    return {
        "max_new_tokens": params.max_new_tokens,
        "temperature": _num(params.temperature),
        "top_p": _num(params.top_p),
        "top_k": params.top_k,
        "seed": params.seed,
        **extra,
    }, sample


def _retry_locked(fn: Any, timeout: float) -> Any:
    deadline = time.monotonic() + timeout
    delay = 0.01
    while True:
        try:
            return fn()
        except sqlite3.OperationalError as e:
            if "locked" not in str(e) or time.monotonic() > deadline:
                raise
            time.sleep(delay)
            delay = min(0.5, delay * 2)


#: what a stored row of token log-probabilities records as its prompt and decoding (its key
#: carries the prefix, the text and top_k: :func:`logprob_key`)
_LOGPROB_MARK = "<token_logprobs>"
_LOGPROB_PARAMS = LogprobQuery()


def logprob_key(target_name: str, prefix: str, text: str, top_k: int) -> str:
    """The cache key of the token log-probabilities of ``text`` after ``prefix`` (with
    ``top_k`` alternatives) for target ``target_name``: never a completion's key."""
    blob = json.dumps(["token_logprobs/v1", target_name, prefix, text, top_k], ensure_ascii=False)
    return hashlib.sha256(blob.encode("utf-8", "surrogatepass")).hexdigest()


def cache_key(target_name: str, prompt: str, params: GenerationParams, sample: int) -> str:
    """The cache key of sample ``sample`` of ``prompt`` under ``params`` for target ``name``
    (``params`` as the target resolved them: see :func:`~calibdcd.targets.base.resolve_params`)."""
    kp, s = _key_params(params, sample)
    blob = json.dumps([target_name, prompt, kp, s], ensure_ascii=False, sort_keys=True)
    return hashlib.sha256(blob.encode("utf-8", "surrogatepass")).hexdigest()


class CachedTarget:
    """``CachedTarget(target, "gen.sqlite")`` is a Target that remembers every completion."""

    def __init__(
        self,
        target: Target,
        path: str | os.PathLike[str],
        *,
        chunk_size: int = 64,
        timeout: float = 120.0,
        claim_ttl: float = 900.0,
        poll: float = 0.2,
    ) -> None:
        if not hasattr(target, "generate") or not isinstance(getattr(target, "name", None), str):
            raise ValueError("target must be a Target with a str `name` and a `generate` method")
        if not isinstance(chunk_size, int) or chunk_size < 1:
            raise ValueError(f"chunk_size must be an integer >= 1, got {chunk_size!r}")
        self.target = target
        self.name: str = target.name
        self.family: str | None = getattr(target, "family", None)
        self.path = Path(path)
        self.chunk_size = chunk_size
        self.claim_ttl = float(claim_ttl)
        self.poll = float(poll)
        self._host = socket.gethostname()
        self._owner = f"{self._host}:{os.getpid()}:{uuid.uuid4().hex[:12]}"
        self._lock = threading.Lock()
        self._stats = CacheStats()
        self._renewed = 0.0  # time.monotonic() of the last renewal of this cache's claims
        if self.path.parent and not self.path.parent.exists():
            self.path.parent.mkdir(parents=True, exist_ok=True)
        try:
            self._conn = sqlite3.connect(
                str(self.path), timeout=timeout, isolation_level=None, check_same_thread=False
            )
            self._conn.execute(f"PRAGMA busy_timeout={int(timeout * 1000)}")
            # switching to WAL needs an exclusive lock and does not wait on the busy handler
            # when another process is creating the file at the same moment: retry
            _retry_locked(lambda: self._conn.execute("PRAGMA journal_mode=WAL"), timeout)
            self._conn.execute("PRAGMA synchronous=NORMAL")
            with self._transaction():
                self._conn.execute(
                    "CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL)"
                )
                self._conn.execute(
                    "INSERT OR IGNORE INTO meta VALUES ('schema_version', ?)",
                    (str(_SCHEMA_VERSION),),
                )
                self._conn.execute(
                    "CREATE TABLE IF NOT EXISTS completions ("
                    " key TEXT PRIMARY KEY, target TEXT NOT NULL, prompt TEXT NOT NULL,"
                    " params TEXT NOT NULL, sample INTEGER NOT NULL, completion TEXT NOT NULL,"
                    " created REAL NOT NULL)"
                )
                # who is generating which missing completion right now (rows are deleted when
                # the completion is stored or the claimer gives up)
                self._conn.execute(
                    "CREATE TABLE IF NOT EXISTS claims (key TEXT PRIMARY KEY, owner TEXT NOT NULL,"
                    " host TEXT NOT NULL, pid INTEGER NOT NULL, expires REAL NOT NULL)"
                )
            (ver,) = self._conn.execute(
                "SELECT value FROM meta WHERE key='schema_version'"
            ).fetchone()
        except sqlite3.DatabaseError as e:
            raise ValueError(
                f"path: {str(self.path)!r} is not a usable SQLite cache ({e}): move it aside "
                "(completions are then requested again) or repair it with `sqlite3 FILE .recover`"
            ) from e
        if int(ver) != _SCHEMA_VERSION:
            raise ValueError(f"path: {str(self.path)!r} has cache schema {ver}, expected 1")

    # -- plumbing --

    def _transaction(self) -> Any:
        conn = self._conn

        class _Tx:
            def __enter__(self) -> None:
                conn.execute("BEGIN IMMEDIATE")

            def __exit__(self, exc_type: Any, *_: Any) -> None:
                conn.execute("ROLLBACK" if exc_type else "COMMIT")

        return _Tx()

    def _damaged(self, e: sqlite3.DatabaseError) -> ValueError:
        """A read/write error of the file (a corrupt page, ...) as an error naming the file."""
        return ValueError(
            f"generation cache {str(self.path)!r}: {e}. The file is damaged: move it aside "
            "(completions are then requested again) or repair it with `sqlite3 FILE .recover`"
        )

    def _lookup(self, keys: Sequence[str]) -> dict[str, str]:
        try:
            return self._lookup_unchecked(keys)
        except sqlite3.DatabaseError as e:
            if "locked" in str(e):
                raise
            raise self._damaged(e) from e

    def _lookup_unchecked(self, keys: Sequence[str]) -> dict[str, str]:
        found: dict[str, str] = {}
        uniq = list(dict.fromkeys(keys))
        for i in range(0, len(uniq), _SQL_VARS):
            part = uniq[i : i + _SQL_VARS]
            marks = ",".join("?" * len(part))
            q = f"SELECT key, completion FROM completions WHERE key IN ({marks})"
            found.update(self._conn.execute(q, part).fetchall())
        return found

    def _store(self, rows: list[tuple[str, str, GenerationParams, int, str]]) -> None:
        try:
            self._store_unchecked(rows)
        except sqlite3.DatabaseError as e:
            if "locked" in str(e):
                raise
            raise self._damaged(e) from e

    def _store_unchecked(self, rows: list[tuple[str, str, GenerationParams, int, str]]) -> None:
        now = time.time()
        with self._transaction():
            self._conn.executemany(
                "INSERT OR IGNORE INTO completions VALUES (?, ?, ?, ?, ?, ?, ?)",
                [
                    (
                        k,
                        self.name,
                        p,
                        json.dumps(_key_params(prm, s)[0], sort_keys=True),
                        _key_params(prm, s)[1],
                        text,
                        now,
                    )
                    for k, p, prm, s, text in rows
                ],
            )
            self._conn.executemany(
                "DELETE FROM claims WHERE key = ? AND owner = ?",
                [(k, self._owner) for k, *_ in rows],
            )
            # the lease of the claims still being worked on starts again (not at every one of
            # a stream's small commits: that would rewrite every claim each time)
            if time.monotonic() - self._renewed >= self.claim_ttl / 10:
                self._renewed = time.monotonic()
                self._conn.execute(
                    "UPDATE claims SET expires = ? WHERE owner = ?",
                    (now + self.claim_ttl, self._owner),
                )

    def _claim_alive(self, host: str, pid: int, expires: float, now: float) -> bool:
        if expires <= now:
            return False
        if host != self._host:
            return True  # another machine: only its lease can end the claim
        try:
            os.kill(pid, 0)  # PermissionError: it runs, under another user
        except ProcessLookupError:
            return False
        except PermissionError:
            pass
        return True

    def _claim(self, keys: Sequence[str]) -> tuple[list[str], dict[str, str]]:
        """Claim the keys nobody stored or is generating: (keys now ours, completions that
        were stored meanwhile). Keys under another live process's claim are neither."""
        now = time.time()
        mine: list[str] = []
        with self._transaction():
            stored = self._lookup_unchecked(keys)
            rest = [k for k in keys if k not in stored]
            held: dict[str, tuple[str, str, int, float]] = {}
            for i in range(0, len(rest), _SQL_VARS):
                part = rest[i : i + _SQL_VARS]
                marks = ",".join("?" * len(part))
                q = f"SELECT key, owner, host, pid, expires FROM claims WHERE key IN ({marks})"
                held.update((r[0], r[1:]) for r in self._conn.execute(q, part).fetchall())
            for k in rest:
                h = held.get(k)
                if h is None or h[0] == self._owner or not self._claim_alive(*h[1:], now):
                    mine.append(k)
            pid = os.getpid()
            self._conn.executemany(
                "INSERT OR REPLACE INTO claims VALUES (?, ?, ?, ?, ?)",
                [(k, self._owner, self._host, pid, now + self.claim_ttl) for k in mine],
            )
        self._renewed = time.monotonic()
        return mine, stored

    def _release(self) -> None:
        """Drop this cache's remaining claims (after an error: others may take them over)."""
        try:
            with self._transaction():
                self._conn.execute("DELETE FROM claims WHERE owner = ?", (self._owner,))
        except sqlite3.Error:
            pass  # the claims then end with the process (same host) or their lease

    def _generate_missing(
        self, missing: list[tuple[str, int]], params: GenerationParams
    ) -> Iterator[list[tuple[str, str, GenerationParams, int, str]]]:
        """The rows to store for ``missing`` (prompt, sample index): as they stream from a
        target that streams, else chunk by chunk."""
        stream = getattr(self.target, "stream_indexed", None)
        if callable(stream):
            # one call: the target keeps its requests in flight until the last; whatever
            # arrived while the previous handful was committed is the next transaction
            self._stats.target_calls += 1
            ps, ss = [p for p, _ in missing], [s for _, s in missing]
            with contextlib.closing(stream(ps, ss, params)) as answers:
                for got in answers:
                    yield [
                        (cache_key(self.name, ps[j], params, ss[j]), ps[j], params, ss[j], t)
                        for j, t in got
                    ]
            return
        indexed = getattr(self.target, "generate_indexed", None)
        if callable(indexed):
            # an indexed target's samples do not depend on the batch they are drawn in, so the
            # misses go longest prompt first: each chunk (= one batch) holds prompts of similar
            # length and pads little (1.5-2x faster on mixed-length prompts)
            missing = sorted(missing, key=lambda m: -len(m[0]))
            for i in range(0, len(missing), self.chunk_size):
                chunk = missing[i : i + self.chunk_size]
                self._stats.target_calls += 1
                texts = indexed([p for p, _ in chunk], [s for _, s in chunk], params)
                if len(texts) != len(chunk):
                    raise RuntimeError(
                        f"{self.name}: generate_indexed returned {len(texts)} texts for "
                        f"{len(chunk)} requests"
                    )
                got = [(p, s, t) for (p, s), t in zip(chunk, texts, strict=True)]
                yield [(cache_key(self.name, p, params, s), p, params, s, t) for p, s, t in got]
            return
        # plain Target: whole prompts, n = 1 + the largest missing index of the chunk
        by_prompt: dict[str, int] = {}
        for p, s in missing:
            by_prompt[p] = max(by_prompt.get(p, 0), s + 1)
        chunk_prompts: list[str] = []
        rows = 0
        items = list(by_prompt.items())
        for j, (p, need) in enumerate(items):
            chunk_prompts.append(p)
            rows += need
            if rows < self.chunk_size and j < len(items) - 1:
                continue
            n = max(by_prompt[q] for q in chunk_prompts)
            self._stats.target_calls += 1
            outs = self.target.generate(chunk_prompts, dataclasses.replace(params, n=n))
            yield [
                (cache_key(self.name, q, params, s), q, params, s, outs[k][s])
                for k, q in enumerate(chunk_prompts)
                for s in range(n)
            ]
            chunk_prompts, rows = [], 0

    # -- the Target API --

    def generate(self, prompts: Sequence[str], params: GenerationParams) -> list[list[str]]:
        prompts = validate_prompts(prompts)
        if not isinstance(params, GenerationParams):
            raise ValueError(f"params must be a GenerationParams, got {type(params).__name__}")
        params = resolve_params(self.target, params)
        flat = self._get([(p, s) for p in prompts for s in range(params.n)], params)
        n = params.n
        return [flat[k * n : (k + 1) * n] for k in range(len(prompts))]

    def generate_indexed(
        self, prompts: Sequence[str], sample_indices: Sequence[int], params: GenerationParams
    ) -> list[str]:
        prompts = validate_prompts(prompts)
        idx = list(sample_indices)
        if len(idx) != len(prompts) or any(not isinstance(i, int) or i < 0 for i in idx):
            raise ValueError("sample_indices must hold one integer >= 0 per prompt")
        if not isinstance(params, GenerationParams):
            raise ValueError(f"params must be a GenerationParams, got {type(params).__name__}")
        params = resolve_params(self.target, params)
        return self._get(list(zip(prompts, idx, strict=True)), params)

    def _get(self, rows: list[tuple[str, int]], params: GenerationParams) -> list[str]:
        with self._lock:
            keys = [cache_key(self.name, p, params, s) for p, s in rows]
            found = self._lookup(keys)
            self._stats.hits += sum(k in found for k in keys)
            missing_keys: dict[str, tuple[str, int]] = {}
            for k, (p, s) in zip(keys, rows, strict=True):
                if k not in found and k not in missing_keys:
                    missing_keys[k] = (p, 0) if params.greedy else (p, s)
            self._fill(dict(missing_keys), found, lambda work: self._generate_missing(work, params))
            out = [found[k] for k in keys]
            self._stats.served += len(out)
            self._stats.empty += sum(not t.strip() for t in out)
            return out

    def _fill(
        self,
        pending: dict[str, Any],
        found: dict[str, str],
        produce: Callable[[list[Any]], Iterator[list[tuple[str, str, Any, int, str]]]],
    ) -> None:
        """Every ``pending`` key (-> its work item) into ``found``: claimed across processes,
        waited for while another live process computes it, else computed by ``produce(work)``
        (rows to store as they come), each batch committed and read back (first writer wins);
        the claims released if anything fails. The one loop behind completions and token
        log-probabilities."""
        try:
            while pending:
                mine, landed = self._claim(list(pending))
                for k in landed:  # stored by another process since the first lookup
                    pending.pop(k)
                    self._stats.waited += 1
                    self._stats.hits += 1
                found.update(landed)
                if not mine:
                    time.sleep(self.poll)  # the rest is being computed elsewhere
                    continue
                work = [pending[k] for k in mine]
                with (
                    self._one_bar(len(work)) as bar,
                    contextlib.closing(produce(work)) as rows_in,
                ):
                    for stored in rows_in:
                        self._store(stored)
                        wanted = [k for k, *_ in stored if pending.pop(k, None) is not None]
                        self._stats.misses += len(wanted)
                        found.update(self._lookup(wanted))  # first writer wins
                        bar.update(len(stored))
        except BaseException:
            self._release()
            raise

    @contextlib.contextmanager
    def _one_bar(self, total: int) -> Iterator[Any]:
        """One bar over every missing completion of a call (count, rate, ETA), in place of the
        wrapped target's own bar, which would restart with each chunk of ``chunk_size``."""
        shown = bool(getattr(self.target, "progress", False)) and total > self.chunk_size
        bar = inner_bar(total=total, desc="generate", unit="completion", enabled=shown)
        if shown:
            self.target.progress = False
        try:
            yield bar
        finally:
            if shown:
                self.target.progress = True
            bar.close()

    # -- token log-probabilities (calibdcd.targets.logprobs.TokenLogprobs) --

    def token_logprobs(
        self, texts: Sequence[str], prefixes: Sequence[str] | None = None, top_k: int = 0
    ) -> list[TextLogprobs]:
        """The wrapped target's ``token_logprobs``, remembered in the same file as completions
        (rows of the ``completions`` table under their own keys, :func:`logprob_key`) with the
        same cross-process claims: a key another live process is computing is waited for, and a
        killed process's claims end with it."""
        pairs = check_logprob_inputs(texts, prefixes, top_k)
        inner = getattr(self.target, "token_logprobs", None)
        if not callable(inner):
            raise ValueError(f"{self.name}: this target does not return token log-probabilities")
        with self._lock:
            keys = [logprob_key(self.name, p, t, top_k) for p, t in pairs]
            found = self._lookup(keys)
            self._stats.hits += sum(k in found for k in keys)
            pending = {k: (k, *pt) for k, pt in zip(keys, pairs, strict=True) if k not in found}

            def produce(work: list[tuple[str, str, str]]) -> Iterator[list[tuple]]:
                for i in range(0, len(work), self.chunk_size):
                    part = work[i : i + self.chunk_size]
                    self._stats.target_calls += 1
                    rows = inner([t for _, _, t in part], [p for _, p, _ in part], top_k)
                    yield [
                        (k, _LOGPROB_MARK, _LOGPROB_PARAMS, 0, json.dumps(r.as_json()))
                        for (k, _, _), r in zip(part, rows, strict=True)
                    ]

            self._fill(pending, found, produce)
        return [TextLogprobs.from_json(json.loads(found[k])) for k in keys]

    # -- misc --

    def __getattr__(self, attr: str) -> Any:
        # everything else (tokenizer, model_dir, retries, ...) comes from the wrapped target
        if attr in ("target", "_conn", "_stats", "_lock", "_owner", "_host"):
            raise AttributeError(attr)
        return getattr(self.target, attr)

    @property
    def stats(self) -> CacheStats:
        return dataclasses.replace(self._stats)

    def reset_stats(self) -> None:
        self._stats = CacheStats()

    def __len__(self) -> int:
        (n,) = self._conn.execute("SELECT COUNT(*) FROM completions").fetchone()
        return int(n)

    def close(self) -> None:
        self._conn.close()

    def __enter__(self) -> CachedTarget:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"CachedTarget({self.target!r}, path={str(self.path)!r})"
