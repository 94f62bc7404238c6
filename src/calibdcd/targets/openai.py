"""The OpenAI-compatible backend: any server with ``POST /v1/completions`` (vLLM, SGLang, TGI,
``transformers serve``, hosted APIs) as a black-box Target.

* Raw prompts: views need exact prompt strings, so the completions endpoint is used, never chat.
* One prompt and one sample per request. ``transformers serve`` rejects prompt lists and ignores
  ``n``; vLLM with ``n > 1`` draws all samples from one seeded stream, so sample ``i`` would depend
  on ``n``. Instead sample ``i`` of a prompt is requested with its own seed
  ``request_seed(seed, i)`` (31 bits of ``blake2b("{seed}:{i}")``), which keeps every sample
  reproducible on its own and the cache exact (as far as the server is: vLLM/SGLang seed each
  request's own generator; ``transformers serve`` seeds torch's global RNG per request, so its
  samples are reproducible only with ``concurrency=1``). Greedy requests (``temperature == 0``)
  are sent once per prompt and their result repeated ``n`` times.
* Decoding fields: ``max_tokens`` always; ``temperature`` and ``top_p`` unless ``"inherit"``.
  ``top_k`` and ``repetition_penalty`` are not OpenAI fields, and how a server takes them (and
  how it says "no top-k") depends on the server, so ``dialect`` names it:

  - ``"openai"`` (default; hosted APIs that reject unknown fields): sent only when they truncate
    or penalise (an integer top-k, a penalty other than 1.0). "No top-k" and "no penalty" cannot
    be said, so they are resolved to ``"inherit"`` (:meth:`OpenAITarget.resolve_params`; the
    cache key and the run's record show it) and the server's default applies, with a warning
    once per field: transformers serve and SGLang default to the model's generation config
    (transformers: top-k 50 when it sets none), llama.cpp to top-k 40.
  - ``"vllm"``, ``"sglang"``, ``"llama.cpp"``: both top-level fields, always sent unless
    ``"inherit"``; no top-k is sent as ``-1``, which all three read as "all tokens".
  - ``"transformers"`` (``transformers serve``): it rejects unknown top-level fields with 422 but
    takes a ``generation_config`` JSON string, whose unset fields generate() fills from the
    model's. calibdcd sends ``do_sample`` (true when the temperature is explicit and > 0, so no
    sampling copy of the checkpoint is needed), ``top_k`` (0 = none) and
    ``repetition_penalty`` there, each unless ``"inherit"``.

  A field left out is decided by the server (vLLM applies the model's ``generation_config`` by
  default, ``--generation-config vllm`` turns that off). A field left as ``"inherit"`` is never
  sent: that is how a detector inherits the served model's decoding.
  :meth:`OpenAITarget.generation_record` says exactly which fields a request carries.
  ``extra_body`` adds server-specific fields (and overrides the ones above).
* Bounded concurrency (``asyncio`` + ``httpx``): ``concurrency`` workers per replica, each
  sending the next request as soon as its last is answered, so the server's batch stays full
  until the last request; each worker keeps its own keep-alive connection (one shared pool of
  many connections costs httpx more per request than the request itself).
  :meth:`OpenAITarget.stream_indexed` hands the completions over as they arrive (a generation
  cache commits them meanwhile).
* ``timeout`` is a total deadline per attempt (connect, send, wait and read the whole answer),
  enforced with ``asyncio.wait_for``: a server that drips its answer byte by byte times out too.
* Retries (at most ``max_retries`` per request) with exponential backoff and jitter on 429
  (``Retry-After`` honoured, seconds or HTTP date), 5xx, timeouts, connection errors and
  unparseable response bodies; any other 4xx raises :class:`OpenAITargetError` at once.
  ``retries`` / ``retry_reasons`` count them. The server's own words are kept: the body of a
  non-2xx answer, an HTTP 200 whose JSON carries ``error``, or an empty ``choices`` is quoted in
  the error (an error body and an empty ``choices`` are not retried: the server said why).
  When a request's retries are exhausted, the one-line error names every replica that failed,
  quotes its last HTTP answers (status and message, truncated) and says whether it still
  answers ``GET /v1/models`` (asked once, with a deadline of ``min(timeout, 5)`` s).
  A refused connection (nothing listens: the server is down) is retried after at most 2 s, and
  when every replica has refused connections for ``down_after`` seconds (30) or the retries are
  exhausted, the same error says the server is down and what to do: a dead server stops a run
  within seconds, not after the whole backoff of every request.
* Replicas (``base_url`` a list: one model served by several servers): each holds at most
  ``concurrency`` requests in flight, and a request goes to the live replica with the fewest;
  a retry goes to another replica than the one that just failed it, when one is free. A replica
  is *taken out* (one warning line naming it and why; its requests go to the others, not
  counted against their retries; each completion still comes from exactly one successful
  request) when its connection fails, when an attempt exceeds the ``timeout`` deadline (a
  hanging server), or when ``max_retries + 1`` attempts in a row failed on it (5xx or
  unparseable answers; a 429 is the server pacing, not a failure). The last live replica is
  never taken out: its failures are retried, and the call fails when a request's retries are
  exhausted. A replica stays out for the target's session (the later calls too: a generation
  cache calls once per chunk) and is tried again ``readmit_after`` seconds (``max(300,
  10 * timeout)``) after it was taken out. ``replica_events`` lists the take-outs.
* ``served`` / ``empty``: completions returned by this target and the empty (whitespace-only)
  ones among them; :func:`calibdcd.targets.cache.completion_counts` reads them (or a generation
  cache's, which count cache hits too) for :func:`calibdcd.targets.cache.empty_completions_warning`.
* Redirects are refused: a 3xx raises :class:`OpenAITargetError` naming the ``Location``. A
  redirected POST may change method or host (and would carry the Authorization header there);
  point ``base_url`` at the final address instead.
* The answer's ``model`` field (when the server sends one) must equal ``model`` or one of
  ``model_aliases``; otherwise the completion is rejected (it would be cached under the
  configured model); ``<model>@<revision>`` is accepted for a ``model`` given without a revision
  (``transformers serve`` answers ``<id>@main``). Servers that report their own name (llama.cpp
  reports the GGUF file name) need that name in ``model_aliases``.
* The API key is read from the environment variable ``api_key_env`` at request time and only put
  in the ``Authorization`` header: it is never stored on the object, in ``name``, in errors, logs
  or cache files. Without the variable no header is sent (local servers).
* ``name`` = ``openai:<model>`` (or the ``name`` argument). The served model id is the identity,
  not the URL, so a restarted server on another port keeps its cache; pass ``name=`` with a
  weights fingerprint when the model id does not pin the weights.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import dataclasses
import email.utils
import hashlib
import json
import logging
import os
import queue
import random
import threading
import time
import warnings
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any, NamedTuple
from urllib.parse import urlparse

from calibdcd.progress import inner_bar
from calibdcd.redact import quote_answer
from calibdcd.targets.base import INHERIT, GenerationParams, register_backend, validate_prompts
from calibdcd.targets.logprobs import (
    LogprobQuery,
    TextLogprobs,
    check_logprob_inputs,
    echo_logprobs,
)

__all__ = ["DIALECTS", "OpenAITarget", "OpenAITargetError", "PreflightError", "request_seed"]

#: how a server takes the non-OpenAI decoding fields (``top_k``, ``repetition_penalty``)
DIALECTS = ("openai", "vllm", "sglang", "llama.cpp", "transformers")

log = logging.getLogger(__name__)


class OpenAITargetError(RuntimeError):
    """A request that cannot succeed (non-retryable 4xx, or retries exhausted)."""


class PreflightError(ValueError):
    """The server cannot serve this target: unreachable, refusing the key, or serving another
    model (found before any work, by :meth:`OpenAITarget.preflight`)."""


class _Retryable(Exception):
    """A failed attempt worth retrying: ``reason`` is ``"<kind>: <detail>"`` (kind one of 429,
    5xx, timeout, connection, malformed); ``answer`` is the server's HTTP answer when it gave
    one (status and message, truncated)."""

    def __init__(
        self,
        reason: str,
        retry_after: float | None = None,
        answer: str | None = None,
        refused: bool = False,
    ) -> None:
        super().__init__(reason)
        self.reason = reason
        self.retry_after = retry_after
        self.answer = answer
        #: the connection could not be opened (refused, unreachable): nothing listens there
        self.refused = refused

    @property
    def kind(self) -> str:
        return self.reason.split(":")[0]


#: how much of a server's failed answer an error quotes
_ANSWER_CHARS = 200
#: the deadline of the ``GET /v1/models`` probe after retries are exhausted (at most)
_PROBE_TIMEOUT = 5.0
#: the longest wait before retrying a connection that could not be opened: a server that is
#: down is found out within seconds, not after the full backoff
_REFUSED_BACKOFF = 2.0


@dataclasses.dataclass(eq=False)
class _Replica:
    """One replica's health in a target's session (kept across calls)."""

    url: str  # its completions endpoint
    where: str  # the same, credentials redacted (for messages)
    in_row: int = 0  # attempts failed in a row (5xx, unparseable); a success resets it
    last: str | None = None  # the last failure's reason
    last_was_answer: bool = False  # ... was an HTTP answer (else: timeout, connection)
    answers: collections.deque[str] = dataclasses.field(
        default_factory=lambda: collections.deque(maxlen=5)
    )  # its last failed HTTP answers, oldest first
    out: str | None = None  # why it is taken out (None: in)
    out_at: float = 0.0  # time.monotonic() when it was taken out
    refused_since: float | None = None  # time.monotonic() of the first refusal in a row


def request_seed(seed: int, sample: int) -> int:
    """The server-side seed for sample ``sample`` of a request with ``params.seed == seed``."""
    d = hashlib.blake2b(f"{seed}:{sample}".encode(), digest_size=4).digest()
    return int.from_bytes(d, "little") & 0x7FFFFFFF


def _parse_retry_after(value: str | None) -> float | None:
    if not value:
        return None
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    return max(0.0, when.timestamp() - time.time())


def _check_backend_options(model: str, options: Mapping[str, Any]) -> None:
    """The ``openai`` backend's option check for the contract: its constructor validates every
    value and connects to nothing."""
    OpenAITarget(model=model, **options)


@register_backend("openai", check_options=_check_backend_options)
class OpenAITarget:
    """A model behind an OpenAI-compatible ``/v1/completions`` endpoint."""

    def __init__(
        self,
        base_url: str | Sequence[str],
        model: str,
        *,
        api_key_env: str | None = "OPENAI_API_KEY",
        concurrency: int = 8,
        timeout: float = 120.0,
        max_retries: int = 8,
        backoff_base: float = 0.5,
        backoff_max: float = 30.0,
        family: str | None = None,
        name: str | None = None,
        extra_body: dict[str, Any] | None = None,
        model_aliases: Sequence[str] = (),
        dialect: str = "openai",
        progress: bool = False,
    ) -> None:
        bases = [base_url] if isinstance(base_url, str) else list(base_url or [])
        if not bases or not all(
            isinstance(b, str) and urlparse(b).scheme in ("http", "https") for b in bases
        ):
            raise ValueError(
                f"base_url must be an http(s) URL or a non-empty list of them, got {base_url!r}"
            )
        if not isinstance(model, str) or not model:
            raise ValueError(
                f"model must be a non-empty string (the served model id), got {model!r}"
            )
        if not isinstance(concurrency, int) or concurrency < 1:
            raise ValueError(f"concurrency must be an integer >= 1, got {concurrency!r}")
        if not timeout > 0:
            raise ValueError(f"timeout must be > 0 seconds, got {timeout!r}")
        if not isinstance(max_retries, int) or max_retries < 0:
            raise ValueError(f"max_retries must be an integer >= 0, got {max_retries!r}")
        if extra_body is not None and not isinstance(extra_body, dict):
            raise ValueError("extra_body must be a dict of extra request fields")
        if isinstance(model_aliases, str) or not all(
            isinstance(a, str) and a for a in model_aliases
        ):
            raise ValueError(f"model_aliases must be a list of model names, got {model_aliases!r}")
        if dialect not in DIALECTS:
            raise ValueError(f"dialect must be one of {', '.join(DIALECTS)}, got {dialect!r}")
        #: every replica's completions endpoint (one model served by several servers)
        self.urls = [_completions_url(b) for b in bases]
        if len(set(self.urls)) != len(self.urls):
            raise ValueError(f"base_url names a replica twice: {base_url!r}")
        self.url = self.urls[0]
        for u in self.urls:
            _register_url_credentials(u)
        self.model = model
        self.model_aliases = tuple(model_aliases)
        self.api_key_env = api_key_env
        self.concurrency = concurrency
        self.timeout = float(timeout)
        self.max_retries = max_retries
        self.backoff_base = backoff_base
        self.backoff_max = backoff_max
        self.extra_body = dict(extra_body or {})
        self.dialect = dialect
        self._warned_unsendable: set[str] = set()
        self.progress = progress
        self.name = name or f"openai:{model}"
        if family is None:
            from calibdcd.targets.hf import detect_family  # torch-free helper

            family = detect_family(model.rstrip("/").split("@")[0])
        self.family = family
        self.requests = 0  # HTTP attempts sent
        self.retries = 0
        self.retry_reasons: collections.Counter[str] = collections.Counter()
        self._count_lock = threading.Lock()
        self._warned_no_model = False
        #: completions returned by this target, and the empty (whitespace-only) ones
        self.served = 0
        self.empty = 0
        #: texts scored (token log-probabilities: :meth:`token_logprobs`)
        self.scored = 0
        # the replicas' health, kept across calls (a take-out lasts for the session)
        from calibdcd.redact import redact_url

        self._replicas = {u: _Replica(u, redact_url(u)) for u in self.urls}
        #: seconds after which a replica taken out is tried again
        self.readmit_after = max(300.0, 10 * self.timeout)
        #: one line per replica taken out (which, when in the session, why)
        self.replica_events: list[str] = []

    #: seconds after which a server whose every replica refuses connections stops the call
    #: (one error line), even with retries left
    down_after: float = 30.0

    def __repr__(self) -> str:
        return f"OpenAITarget(url={self.where!r}, model={self.model!r}, name={self.name!r})"

    @property
    def where(self) -> str:
        """The endpoint for messages: credentials in the URL are redacted (with several
        replicas, the first and how many more)."""
        from calibdcd.redact import redact_url

        more = f" (+{len(self.urls) - 1} replica(s))" if len(self.urls) > 1 else ""
        return redact_url(self.url) + more

    @property
    def stats(self) -> dict[str, Any]:
        return {
            "requests": self.requests,
            "retries": self.retries,
            "retry_reasons": dict(self.retry_reasons),
            "served": self.served,
            "empty": self.empty,
            "scored": self.scored,
            "replicas_out": self.replicas_out,
        }

    @property
    def replicas_out(self) -> dict[str, str]:
        """The replicas taken out now (redacted endpoint -> why)."""
        with self._count_lock:
            return {r.where: r.out for r in self._replicas.values() if r.out is not None}

    # -- decoding parameters --

    def resolve_params(self, params: GenerationParams) -> GenerationParams:
        """``"inherit"`` fields stay open and are left out of the request. In the ``"openai"``
        dialect, "no top-k" (None) and "no penalty" (1.0) cannot be sent either: they become
        ``"inherit"`` (the server's default applies), with a warning once per field."""
        _check_params(params)
        if self.dialect != "openai":
            return params
        unsendable = {}
        if params.top_k is None and not params.greedy:  # greedy decoding has no top-k
            unsendable["top_k"] = "None (no top-k)"
        if params.repetition_penalty == 1.0:
            unsendable["repetition_penalty"] = "1.0 (no penalty)"
        for f, what in unsendable.items():
            if f not in self._warned_unsendable:
                self._warned_unsendable.add(f)
                warnings.warn(
                    f"{self.name}: {f} {what} cannot be sent in dialect 'openai', so the server's "
                    f"default decides it (transformers serve: the model's generation config, "
                    f"top-k 50 if it sets none; llama.cpp: top-k 40; vLLM: the model's "
                    f"generation config); the run records {f} as left to the server. Set the "
                    f"target's options.dialect to one of {', '.join(DIALECTS[1:])} to send it.",
                    stacklevel=2,
                )
        return dataclasses.replace(params, **dict.fromkeys(unsendable, INHERIT))

    def request_fields(self, params: GenerationParams) -> dict[str, Any]:
        """The decoding fields of every request for ``params`` (without prompt and seed), in
        this target's ``dialect`` (module docstring)."""
        params = self.resolve_params(params)
        fields: dict[str, Any] = {"model": self.model, "max_tokens": params.max_new_tokens}
        for name in ("temperature", "top_p"):
            v = getattr(params, name)
            if v != INHERIT:
                fields[name] = float(v)
        k, r = params.top_k, params.repetition_penalty
        if self.dialect == "transformers":
            gc: dict[str, Any] = {}
            if params.temperature not in (0.0, INHERIT):
                gc["do_sample"] = True
            if k != INHERIT:
                gc["top_k"] = 0 if k is None else k
            if r != INHERIT:
                gc["repetition_penalty"] = float(r)
            if gc:
                fields["generation_config"] = json.dumps(gc, sort_keys=True)
        elif self.dialect == "openai":  # resolve_params made 1.0 (and sampled None) inherit
            if k not in (None, INHERIT):  # None is left here only when greedy: irrelevant
                fields["top_k"] = k
            if r != INHERIT:
                fields["repetition_penalty"] = float(r)
        else:  # vllm, sglang, llama.cpp: -1 = all tokens
            if k != INHERIT:
                fields["top_k"] = -1 if k is None else k
            if r != INHERIT:
                fields["repetition_penalty"] = float(r)
        fields.update(self.extra_body)
        return fields

    def generation_record(self, params: GenerationParams) -> dict[str, Any]:
        """What a request for ``params`` carries: ``sent`` (every field but the prompt and the
        per-sample ``seed``, which is ``request_seed(params.seed, sample index)``) and
        ``left_to_server`` (decoding fields not sent: the server's defaults apply)."""
        sent = self.request_fields(params)
        return {
            "backend": "openai",
            "dialect": self.dialect,
            "requested": params.as_dict(),
            "sent": sent,
            "seed": f"request_seed({params.seed}, sample index)",
            "left_to_server": list(self.resolve_params(params).inherited()),
        }

    # -- the Target API --

    def generate(self, prompts: Sequence[str], params: GenerationParams) -> list[list[str]]:
        prompts = validate_prompts(prompts)
        _check_params(params)
        rows = [(p, i) for p in prompts for i in range(params.n)]
        flat = self._run(rows, params)
        return [flat[k * params.n : (k + 1) * params.n] for k in range(len(prompts))]

    def generate_indexed(
        self, prompts: Sequence[str], sample_indices: Sequence[int], params: GenerationParams
    ) -> list[str]:
        """Sample ``sample_indices[j]`` of ``prompts[j]`` (``params.n`` is ignored)."""
        prompts = validate_prompts(prompts)
        _check_params(params)
        idx = list(sample_indices)
        if len(idx) != len(prompts) or any(not isinstance(i, int) or i < 0 for i in idx):
            raise ValueError("sample_indices must hold one integer >= 0 per prompt")
        return self._run(list(zip(prompts, idx, strict=True)), params)

    async def agenerate(self, prompts: Sequence[str], params: GenerationParams) -> list[list[str]]:
        """``generate`` for callers already inside an event loop."""
        prompts = validate_prompts(prompts)
        _check_params(params)
        rows = [(p, i) for p in prompts for i in range(params.n)]
        flat = await self._arun(rows, params)
        return [flat[k * params.n : (k + 1) * params.n] for k in range(len(prompts))]

    # -- machinery --

    def _run(self, rows: list[tuple[str, int]], params: GenerationParams) -> list[str]:
        try:
            asyncio.get_running_loop()
        except RuntimeError:
            return asyncio.run(self._arun(rows, params))
        # called from inside a running loop (e.g. Jupyter): run ours in a worker thread
        box: dict[str, Any] = {}

        def work() -> None:
            try:
                box["out"] = asyncio.run(self._arun(rows, params))
            except BaseException as e:
                box["err"] = e

        t = threading.Thread(target=work)
        t.start()
        t.join()
        if "err" in box:
            raise box["err"]
        return box["out"]

    async def _arun(
        self,
        rows: list[tuple[str, int]],
        params: GenerationParams,
        emit: Callable[[tuple[str, int], str], None] | None = None,
    ) -> list[str]:
        """Every row's completion, ``concurrency`` requests in flight per replica from the
        first to the last (workers that each take the next row as soon as theirs is answered:
        the server's batch never drains between rows). ``emit(row, text)`` (when given) is
        called in the event loop as each distinct row is answered."""
        import httpx

        ask = self._ask(params)
        eff = [(p, 0) if params.greedy else (p, i) for p, i in rows]
        unique = list(dict.fromkeys(eff))
        self._readmit()
        total = self.concurrency * len(self.urls)
        pool = _ReplicaPool(self, self.concurrency)
        # each worker has its own client, one keep-alive connection per replica: one shared
        # pool of ``total`` connections costs httpcore O(connections) per request, which
        # bounded the client at a few hundred requests/s (benchmarks/client_throughput.py)
        lanes = httpx.Limits(max_connections=len(self.urls), max_keepalive_connections=None)
        tls = httpx.create_ssl_context()  # built once: the workers' clients share it
        bar = inner_bar(total=len(unique), desc="requests", unit="request", enabled=self.progress)
        got: dict[tuple[str, int], str] = {}
        todo = iter(unique)

        async def worker() -> None:
            async with httpx.AsyncClient(
                timeout=self.timeout, limits=lanes, follow_redirects=False, verify=tls
            ) as client:
                for row in todo:  # shared: each row goes to exactly one worker
                    text = await self._request(client, row[0], row[1], ask, pool)
                    got[row] = text
                    if emit is not None:
                        emit(row, text)
                    bar.update(1)

        tasks = [asyncio.ensure_future(worker()) for _ in range(min(total, len(unique)))]
        try:
            await asyncio.gather(*tasks)
        except BaseException:
            for t in tasks:
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            raise
        finally:
            bar.close()
        out = [got[r] for r in eff]
        with self._count_lock:
            if ask.completions:
                self.served += len(out)
                self.empty += sum(not t.strip() for t in out)
            else:
                self.scored += len(out)
        return out

    def stream_indexed(
        self, prompts: Sequence[str], sample_indices: Sequence[int], params: GenerationParams
    ) -> Iterator[list[tuple[int, str]]]:
        """``generate_indexed`` as the answers arrive: lists of ``(j, completion of row j)``
        holding whatever was answered since the last list (every row exactly once), while
        ``concurrency`` requests per replica stay in flight until the last one. The requests
        run in a worker thread's event loop, so the consumer's work between lists (a
        generation cache's commits) never stalls them; closing the iterator early (or an
        error in it) cancels the requests still in flight."""
        prompts = validate_prompts(prompts)
        _check_params(params)
        idx = list(sample_indices)
        if len(idx) != len(prompts) or any(not isinstance(i, int) or i < 0 for i in idx):
            raise ValueError("sample_indices must hold one integer >= 0 per prompt")
        rows = list(zip(prompts, idx, strict=True))
        where: dict[tuple[str, int], list[int]] = collections.defaultdict(list)
        for j, (p, i) in enumerate(rows):
            where[(p, 0) if params.greedy else (p, i)].append(j)
        return _stream(self, rows, params, where)

    def _ask(self, params: GenerationParams) -> _Ask:
        """How a request of ``params`` is asked and its answer read: a completion (the sampled
        text), or a scoring request (:class:`LogprobQuery`: the echoed prompt log-probabilities
        as JSON text). The one place the request path tells the two apart."""
        if isinstance(params, LogprobQuery):
            return _Ask(
                lambda prompt, sample: {**params.body(self.model, prompt), **self.extra_body},
                _read_echoed,
                completions=False,
            )
        fields = self.request_fields(params)

        def body(prompt: str, sample: int) -> dict[str, Any]:
            return {"prompt": prompt, "seed": request_seed(params.seed, sample), **fields}

        return _Ask(body, _read_text, completions=True)

    def _headers(self) -> dict[str, str]:
        headers = {"Content-Type": "application/json"}
        key = os.environ.get(self.api_key_env) if self.api_key_env else None
        if key:
            # a server may echo the header in an error body that is then quoted verbatim
            from calibdcd.redact import register_secret

            register_secret(key)
            headers["Authorization"] = f"Bearer {key}"
        return headers

    def preflight(self) -> list[str] | None:
        """Ask the server which models it serves (``GET .../v1/models``, with the key) before
        any work: an unreachable server, a refused key, or a server serving another model (the
        served names against ``model`` and ``model_aliases``) raise :class:`PreflightError` in
        one line. Returns the served names, or None when the server does not list its models
        (a 404/405/501 answer: nothing to check, the completions' ``model`` field still is)."""
        served: list[str] | None = None
        for u in self.urls:
            got = self._preflight_one(u)
            if got is not None:
                served = got if served is None else served + [m for m in got if m not in served]
        return served

    def _preflight_one(self, completions_url: str) -> list[str] | None:
        import httpx

        from calibdcd.redact import redact_url

        url = completions_url.removesuffix("/completions") + "/models"
        where = redact_url(url)
        try:
            with httpx.Client(timeout=min(self.timeout, 15.0), follow_redirects=False) as c:
                r = c.get(url, headers=self._headers())
        except httpx.HTTPError as exc:
            raise PreflightError(
                f"{where}: cannot reach the server ({type(exc).__name__}: {exc}); is it running, "
                "and is base_url right?"
            ) from None
        if r.status_code in (401, 403):
            key = f"${self.api_key_env}" if self.api_key_env else "no key (api_key_env unset)"
            raise PreflightError(
                f"{where}: the server refused the key (HTTP {r.status_code}; sent {key}): "
                f"{quote_answer(r.text, 200)}"
            )
        if r.status_code in (404, 405, 501):
            return None
        if r.status_code != 200:
            raise PreflightError(f"{where}: HTTP {r.status_code}: {quote_answer(r.text, 200)}")
        try:
            served = [str(m["id"]) for m in r.json()["data"]]
        except (ValueError, KeyError, TypeError):
            raise PreflightError(
                f"{where}: not an OpenAI model list: {quote_answer(r.text, 200)}"
            ) from None
        if not any(self._same_model(m) for m in served):
            raise PreflightError(
                f"{where}: the server serves {served}, not {self.model!r}: set the target's "
                "model to the served name, or add the served name to its model_aliases"
            )
        return served

    def _same_model(self, served: Any) -> bool:
        return _same_model_name(served, self.model, self.model_aliases)

    def _count(self, reason: str | None) -> None:
        with self._count_lock:
            if reason is None:
                self.requests += 1
            else:
                self.retries += 1
                self.retry_reasons[reason] += 1

    async def _request(
        self,
        client: Any,
        prompt: str,
        sample: int,
        ask: _Ask,
        pool: _ReplicaPool | None = None,
    ) -> str:
        body = ask.body(prompt, sample)
        pool = pool or _ReplicaPool(self, self.concurrency)
        attempt = 0
        avoid: str | None = None  # the replica that failed this request last
        while True:
            url = await pool.acquire(avoid)
            try:
                text = await self._attempt(client, body, url, ask.read)
            except _Retryable as e:
                err = e
                # judged before the slot is released: no waiting request then takes the slot
                # of a replica that is out now
                rerouted = self._failed(url, e)
            else:
                self._succeeded(url)
                return text
            finally:
                await pool.release(url)
            if rerouted:  # ``url`` is out: the request goes to the others (not a retry)
                self._count("replica down")
                continue
            down_for = self._down_for()
            if attempt == self.max_retries or (down_for or 0.0) >= self.down_after:
                raise await self._exhausted(pool, err, url, attempt)
            self._count(err.kind)
            avoid = url
            delay = min(self.backoff_max, self.backoff_base * 2**attempt)
            if err.refused:  # nothing listens: ask again soon, the run stops if it stays so
                delay = min(delay, _REFUSED_BACKOFF)
            delay *= 0.5 + random.random() / 2  # jitter: spread simultaneous retries
            if err.retry_after is not None:
                delay = max(delay, min(err.retry_after, 10 * self.backoff_max))
            log.debug("retrying %s in %.2fs (%s)", self._replicas[url].where, delay, err.reason)
            attempt += 1
            await asyncio.sleep(delay)

    # -- replica health --

    def _live_urls(self) -> list[str]:
        with self._count_lock:
            live = [u for u, r in self._replicas.items() if r.out is None]
        return live or list(self.urls)

    def _succeeded(self, url: str) -> None:
        with self._count_lock:
            r = self._replicas[url]
            if r.last is not None:  # it answers again: its failures are history
                r.in_row, r.last, r.last_was_answer = 0, None, False
                r.answers.clear()
                r.refused_since = None

    def _failed(self, url: str, err: _Retryable) -> bool:
        """Record a failed attempt on replica ``url``; True when ``url`` is out (taken out now,
        or already) and the request goes to another replica. A replica is taken out when its
        connection fails, an attempt runs past the deadline, or ``max_retries + 1`` attempts in
        a row failed on it (5xx, unparseable) — never the last live one."""
        with self._count_lock:
            r = self._replicas[url]
            r.last, r.last_was_answer = err.reason, err.answer is not None
            if err.answer is not None:
                r.answers.append(err.answer)
            if not err.refused:
                r.refused_since = None
            elif r.refused_since is None:
                r.refused_since = time.monotonic()
            if err.kind in ("5xx", "malformed"):
                r.in_row += 1
            if r.out is not None:
                return True  # out already (another replica is live: the last never goes out)
            live = [x for x in self._replicas.values() if x.out is None]
            if len(live) < 2:
                return False  # the last live replica: its failures are retried
            detail = err.reason.split(": ", 1)[-1]
            if err.kind == "connection":
                why = f"its connection failed: {detail}"
            elif err.kind == "timeout":
                why = f"timed out: {detail}"
            elif err.kind in ("5xx", "malformed") and r.in_row > self.max_retries:
                why = f"{r.in_row} failed answers in a row, the last {err.answer or detail}"
            else:
                return False
            r.out, r.out_at = why, time.monotonic()
            msg = (
                f"{self.name}: replica {r.where} taken out ({why}); its requests go to the "
                f"{len(live) - 1} other replica(s), and it is tried again in "
                f"{self.readmit_after:g} s"
            )
            self.replica_events.append(msg)
        # one line on the command line (its warning display); recorded by ``replica_events``
        warnings.warn(msg, RuntimeWarning, stacklevel=2)
        return True

    def _down_for(self) -> float | None:
        """Seconds every replica has been refusing connections (None: one answers, or
        failed otherwise last): the server is down, or ``base_url`` is wrong."""
        with self._count_lock:
            since = [r.refused_since for r in self._replicas.values()]
        if any(t is None for t in since):
            return None
        return time.monotonic() - max(t for t in since if t is not None)

    def _readmit(self) -> None:
        """Replicas out for ``readmit_after`` seconds are tried again (from this call on)."""
        now = time.monotonic()
        back = []
        with self._count_lock:
            for r in self._replicas.values():
                if r.out is not None and now - r.out_at >= self.readmit_after:
                    r.out, r.in_row = None, 0
                    back.append(r.where)
        for where in back:
            log.info("%s: replica %s is tried again", self.name, where)

    async def _probe(self, url: str) -> str:
        """Whether replica ``url`` still answers ``GET /v1/models``, in words."""
        import httpx

        models = url.removesuffix("/completions") + "/models"
        limit = min(self.timeout, _PROBE_TIMEOUT)
        try:
            async with httpx.AsyncClient(timeout=limit, follow_redirects=False) as c:
                r = await asyncio.wait_for(c.get(models, headers=self._headers()), limit)
        except (TimeoutError, asyncio.TimeoutError, httpx.TimeoutException):
            return f"GET /v1/models gets no answer within {limit:g} s"
        except httpx.HTTPError as exc:
            return f"GET /v1/models gets no answer ({type(exc).__name__}): it stopped answering"
        return f"it still answers GET /v1/models (HTTP {r.status_code})"

    async def _exhausted(
        self, pool: _ReplicaPool, err: _Retryable, url: str, retries: int
    ) -> OpenAITargetError:
        """The one-line error of a request whose retries are exhausted (or of a server that
        refused every connection for ``down_after`` seconds): every replica that failed, its
        last answers, whether it still answers ``GET /v1/models``, and what to do when the
        server is down."""
        down_for = self._down_for()
        probes = await pool.probe_all()
        parts = []
        with self._count_lock:
            n_out = sum(r.out is not None for r in self._replicas.values())
            for r in self._replicas.values():
                if r.url != url and r.last is None and r.out is None:
                    continue  # answering
                bits = [f"taken out: {r.out}"] if r.out is not None else []
                answers = _runs(r.answers)
                if r.last_was_answer:
                    bits.append(f"its last answers: {answers}")
                else:
                    said_out = r.out is not None and str(r.last).split(": ", 1)[-1] in r.out
                    if not said_out:  # (a take-out says its failure already)
                        bits.append(f"last failure: {r.last}")
                    if answers:
                        bits.append(f"its last answers before that: {answers}")
                bits.append(probes[r.url])
                parts.append(f"{r.where} ({'; '.join(bits)})")
        left = (
            " on the last live replica, the others taken out"
            if n_out and n_out == len(self.urls) - 1
            else (f" ({n_out} replica(s) taken out)" if n_out else "")
        )
        down = (
            ""
            if down_for is None
            else (
                f". The server is down: every replica refused connections for {down_for:.0f} s."
                " Start it (or fix the target's base_url) and run the same command again: the "
                "completions already generated are kept in the generation cache"
            )
        )
        return OpenAITargetError(
            f"{self.name}: giving up after {retries} retries{left} (last failure: "
            f"{err.reason}): " + "; ".join(parts) + down
        )

    async def _attempt(
        self, client: Any, body: dict[str, Any], url: str, read: Callable[..., str]
    ) -> str:
        import httpx

        self._count(None)
        where = self._replicas[url].where
        try:
            # httpx's timeout bounds each read, not the whole answer: the deadline is total
            resp = await asyncio.wait_for(
                client.post(url, json=body, headers=self._headers()), self.timeout
            )
        except (TimeoutError, asyncio.TimeoutError):
            raise _Retryable(f"timeout: no complete answer within {self.timeout:g} s") from None
        except httpx.TimeoutException as e:
            raise _Retryable(f"timeout: {type(e).__name__}") from None
        except httpx.ConnectError as e:  # refused, unreachable: nothing listens there
            raise _Retryable(f"connection: {type(e).__name__}", refused=True) from None
        except httpx.TransportError as e:  # connection reset, dropped, protocol errors
            raise _Retryable(f"connection: {type(e).__name__}") from None
        status = resp.status_code
        said = quote_answer(resp.text)
        short = quote_answer(resp.text, _ANSWER_CHARS)
        if status == 429 or status >= 500:
            raise _Retryable(
                f"429: {short}" if status == 429 else f"5xx: {status} {short}",
                _parse_retry_after(resp.headers.get("retry-after")),
                answer=f"{status} {short}",
            )
        if 300 <= status < 400:
            raise OpenAITargetError(
                f"{where} answered {status} redirect to "
                f"{resp.headers.get('location', '?')!r}; redirects are not followed: "
                "set base_url to the final address"
            )
        if status >= 400 or status < 200:
            raise OpenAITargetError(f"{where} answered {status} (not retried): {said}")
        try:
            data = resp.json()
        except ValueError:
            raise _Retryable(
                f"malformed: response is not JSON: {short}",
                answer=f"{status} (not JSON) {short}",
            ) from None
        if isinstance(data, dict) and data.get("error"):
            raise OpenAITargetError(f"{where} answered {status} with an error: {said}")
        choices = data.get("choices") if isinstance(data, dict) else None
        if not isinstance(choices, list) or not choices:
            raise OpenAITargetError(f"{where} answered without any choice: {said}")
        served = data.get("model")
        if served is None and not self._warned_no_model:
            # nothing to check: say so once (the OpenAI API always names the model)
            self._warned_no_model = True
            warnings.warn(
                f"{where}: the server's answers name no model, so calibdcd cannot check "
                f"that {self.model!r} answered them",
                RuntimeWarning,
                stacklevel=2,
            )
        if served is not None and not self._same_model(served):
            raise OpenAITargetError(
                f"{where} answered as model {served!r}, not {self.model!r}; if the server "
                f"reports its own name for this model, add it to the target's model_aliases"
            )
        return read(choices[0], where, said, f"{status}", short)

    # -- token log-probabilities (calibdcd.targets.logprobs.TokenLogprobs) --

    def token_logprobs(
        self, texts: Sequence[str], prefixes: Sequence[str] | None = None, top_k: int = 0
    ) -> list[TextLogprobs]:
        """The log-probability of every token of each text after its prefix, from the server's
        echoed prompt log-probabilities (one request per prompt through the same request path
        as completions: retries, replicas); with ``top_k > 0`` the per-position mean and
        variance approximated from ``top_k`` alternatives (:mod:`calibdcd.targets.logprobs`)."""
        pairs = check_logprob_inputs(texts, prefixes, top_k)
        answers = self._run([(p + t, 0) for p, t in pairs], LogprobQuery(alternatives=top_k))
        return [
            echo_logprobs(json.loads(a), t, top_k > 0)
            for a, (_, t) in zip(answers, pairs, strict=True)
        ]

    def logprob_preflight(self, top_k: int = 0) -> None:
        """Check that the server returns prompt log-probabilities (one short scoring request):
        :class:`PreflightError` in one line when it does not."""
        try:
            self.token_logprobs(["Hello world"], top_k=top_k)
        except (OpenAITargetError, ValueError) as exc:
            raise PreflightError(
                f"{self.where}: the server does not return prompt log-probabilities "
                f"(completions with echo, max_tokens 0, logprobs {top_k}), which gray-box "
                f"detectors need: {str(exc).splitlines()[0]}"
            ) from None


class _Ask(NamedTuple):
    """One kind of request (:meth:`OpenAITarget._ask`): ``body(prompt, sample)`` is what is
    posted, ``read(choice, where, said, status, short)`` the answer as text (raising
    :class:`_Retryable` or :class:`OpenAITargetError` as the request path does);
    ``completions``: its answers are completions (counted as served / empty), else scores."""

    body: Callable[[str, int], dict[str, Any]]
    read: Callable[..., str]
    completions: bool


def _read_text(choice: Any, where: str, said: str, status: str, short: str) -> str:
    """A completion's text (a choice without one is a malformed, retried answer)."""
    text = choice.get("text") if isinstance(choice, dict) else None
    if not isinstance(text, str):
        raise _Retryable(
            f"malformed: choices[0].text is not a string: {short}",
            answer=f"{status} (no text) {short}",
        )
    return text


def _read_echoed(choice: Any, where: str, said: str, status: str, short: str) -> str:
    """The ``logprobs`` object of a scoring answer as JSON text (the request path's answers
    are strings); a server that answers without prompt log-probabilities cannot score."""
    lp = choice.get("logprobs") if isinstance(choice, dict) else None
    if not isinstance(lp, dict) or not isinstance(lp.get("token_logprobs"), list):
        raise OpenAITargetError(
            f"{where} answered an echo request without prompt log-probabilities: {said}"
        )
    return json.dumps(lp)


_DONE = object()  # the end of a stream's queue


def _stream(
    target: OpenAITarget,
    rows: list[tuple[str, int]],
    params: GenerationParams,
    where: Mapping[tuple[str, int], list[int]],
) -> Iterator[list[tuple[int, str]]]:
    """:meth:`OpenAITarget.stream_indexed`'s generator: the event loop runs in a thread and
    hands each answer over a queue; each list yielded drains what the queue holds."""
    answers: queue.SimpleQueue[Any] = queue.SimpleQueue()
    state: dict[str, Any] = {}
    started = threading.Event()

    async def main() -> None:
        state["loop"], state["task"] = asyncio.get_running_loop(), asyncio.current_task()
        started.set()
        await target._arun(rows, params, emit=lambda row, text: answers.put((row, text)))

    def work() -> None:
        try:
            asyncio.run(main())
        except BaseException as e:  # handed to the consumer (cancellation too)
            state["err"] = e
        finally:
            started.set()
            answers.put(_DONE)

    thread = threading.Thread(target=work, name="calibdcd-stream", daemon=True)
    thread.start()
    done = False
    try:
        while not done:
            batch = [answers.get()]
            while True:  # whatever else has arrived meanwhile
                try:
                    batch.append(answers.get_nowait())
                except queue.Empty:
                    break
            done = batch[-1] is _DONE
            answered = batch[:-1] if done else batch
            out = [(j, text) for row, text in answered for j in where[row]]
            if out:  # (also those answered before an error: the cache keeps them)
                yield out
            if done and "err" in state:
                raise state["err"]
    finally:
        if thread.is_alive():  # the consumer stopped early: cancel what is in flight
            started.wait()
            loop, task = state.get("loop"), state.get("task")
            if loop is not None and task is not None:
                with contextlib.suppress(RuntimeError):  # the loop closed meanwhile
                    loop.call_soon_threadsafe(task.cancel)
            thread.join()


def _completions_url(base_url: str) -> str:
    url = base_url.rstrip("/")
    return url + ("/completions" if url.endswith("/v1") else "/v1/completions")


class _ReplicaPool:
    """One call's slots on a target's replicas: at most ``per_replica`` requests in flight on
    each; a request goes to the live replica (:meth:`OpenAITarget._live_urls`) with the fewest
    in flight, other than ``avoid`` (the one that just failed it) unless that is the only one
    live. Which replicas are live is the target's (its session's) business."""

    def __init__(self, target: OpenAITarget, per_replica: int):
        self.target = target
        self.urls = list(target.urls)
        self.per = per_replica
        self.inflight = dict.fromkeys(self.urls, 0)
        self.cond = asyncio.Condition()
        self._probes: asyncio.Future[list[str]] | None = None

    async def acquire(self, avoid: str | None = None) -> str:
        async with self.cond:
            while True:
                live = self.target._live_urls()
                pick = [u for u in live if u != avoid] or live
                free = [u for u in pick if self.inflight[u] < self.per]
                if free:
                    url = min(free, key=lambda u: (self.inflight[u], self.urls.index(u)))
                    self.inflight[url] += 1
                    return url
                await self.cond.wait()

    async def release(self, url: str) -> None:
        async with self.cond:
            self.inflight[url] -= 1
            self.cond.notify_all()

    async def probe_all(self) -> dict[str, str]:
        """Every replica's answer to ``GET /v1/models`` in words, asked once per call."""
        if self._probes is None:
            self._probes = asyncio.ensure_future(
                asyncio.gather(*(self.target._probe(u) for u in self.urls))
            )
        return dict(zip(self.urls, await asyncio.shield(self._probes), strict=True))


def _runs(items: Sequence[str]) -> str:
    """``a, a, b`` -> ``a (x2), b``."""
    out: list[list[Any]] = []
    for x in items:
        if out and out[-1][0] == x:
            out[-1][1] += 1
        else:
            out.append([x, 1])
    return ", ".join(x if n == 1 else f"{x} (x{n})" for x, n in out)


def _same_model_name(served: Any, model: str, aliases: Sequence[str]) -> bool:
    """``served`` names ``model``: equal, an alias, or ``model@<revision>`` for a model given
    without a revision (``transformers serve`` answers ``<id>@main``)."""
    if served == model or served in aliases:
        return True
    return isinstance(served, str) and "@" not in model and served.split("@", 1)[0] == model


def _check_params(params: GenerationParams) -> None:
    if not isinstance(params, GenerationParams):
        raise ValueError(f"params must be a GenerationParams, got {type(params).__name__}")


def _register_url_credentials(url: str) -> None:
    """URL credentials travel as ``Authorization: Basic base64(user:pass)``: a server that
    echoes the header would put them in an error body quoted verbatim, so the password and the
    encoded pair are secret too (:mod:`calibdcd.redact`)."""
    import base64
    import urllib.parse

    from calibdcd.redact import register_secret

    parts = urllib.parse.urlsplit(url)
    if parts.password:
        register_secret(parts.password)
        user, password = parts.username or "", parts.password
        # the pair as written and percent-decoded (what the client actually encodes)
        for u, p in {
            (user, password),
            (urllib.parse.unquote(user), urllib.parse.unquote(password)),
        }:
            register_secret(base64.b64encode(f"{u}:{p}".encode()).decode())
