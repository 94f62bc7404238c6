"""How many requests per second the ``openai`` backend sustains when the server is never the
bottleneck (run with nothing else on the CPU):

    python benchmarks/client_throughput.py [--requests 4000] [--concurrency 16 64 256]
        [--out benchmarks/results/client_throughput.json] [--write docs/scaling.md]

The server is a minimal asyncio HTTP/1.1 keep-alive server on loopback that answers every
``POST /v1/completions`` at once with a fixed completion (no model): what is measured is the
client - request building, httpx, JSON, the retry/replica machinery and, with the generation
cache on, the SQLite cache's claims and writes. It runs in a separate process so that its
event loop does not share the client's; on a 2-core machine the two still share the cores,
so the figures are a lower bound for a client talking to remote GPU servers.

For each concurrency: the wall time of ``CachedTarget(OpenAITarget).generate`` on N distinct
prompts (cache on, empty at start) and of the bare ``OpenAITarget`` (cache off), requests/s
and microseconds of client time per request (wall x cores used / requests is not reported:
the server shares the cores). Goal (issue 47, "Fast where users wait"): >= 1,000 requests/s
with the cache on (it was 380-410 while all requests shared one httpx connection pool, whose
bookkeeping grows with its number of connections); a vLLM server on one H100 serves a 7B model
at tens of requests/s for these lengths.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing as mp
import socket
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from calibdcd.provenance import commit_label, measured_on, save_measurement

ANSWER = json.dumps(
    {"id": "cmpl-0", "model": "bench", "choices": [{"text": " a fixed completion", "index": 0}]}
).encode()
MODELS = json.dumps({"object": "list", "data": [{"id": "bench", "object": "model"}]}).encode()


async def _serve(port: int) -> None:
    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                length = 0
                for line in head.split(b"\r\n"):
                    if line.lower().startswith(b"content-length:"):
                        length = int(line.split(b":", 1)[1])
                if length:
                    await reader.readexactly(length)
                body = MODELS if head.startswith(b"GET") else ANSWER
                writer.write(
                    b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
                    b"Content-Length: %d\r\n\r\n%s" % (len(body), body)
                )
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()

    server = await asyncio.start_server(handle, "127.0.0.1", port, backlog=1024)
    async with server:
        await server.serve_forever()


def _server_main(port: int) -> None:
    asyncio.run(_serve(port))


def start_stub_server() -> tuple[mp.process.BaseProcess, str]:
    """The instant OpenAI-compatible stub in a child process on a free loopback port, once it
    accepts connections: (the process, its base URL). Stop it with ``terminate()``."""
    from calibdcd.targets.serve import free_port

    port = free_port()
    proc = mp.get_context("spawn").Process(target=_server_main, args=(port,), daemon=True)
    proc.start()
    for _ in range(100):  # wait for the server
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.1).close()
            break
        except OSError:
            time.sleep(0.05)
    return proc, f"http://127.0.0.1:{port}/v1"


def table(record: dict) -> str:
    """docs/scaling.md's block ``client-throughput`` for a stored record."""
    commit = commit_label(record.get("git"))
    lines = [
        f"Written by `{record['command']}` (commit {commit}; {record['machine']}; "
        "`benchmarks/results/client_throughput.json`).",
        "",
        "| concurrency | requests | bare: requests/s | bare: µs/request | with the generation "
        "cache: requests/s | µs/request |",
        "|---|---|---|---|---|---|",
    ]
    for r in record["rows"]:
        lines.append(
            f"| {r['concurrency']} | {r['requests']} | {r['bare_rps']} | "
            f"{r['bare_us_per_request']} | {r['cached_rps']} | {r['cached_us_per_request']} |"
        )
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--requests", type=int, default=4000)
    ap.add_argument("--concurrency", type=int, nargs="+", default=[16, 64, 256])
    ap.add_argument("--out", type=Path, default=None)
    ap.add_argument("--write", type=Path, default=None, help="rewrite this doc's block "
                    "'client-throughput' from the record (e.g. docs/scaling.md)")  # fmt: skip
    args = ap.parse_args()

    from calibdcd.targets import GenerationParams
    from calibdcd.targets.cache import CachedTarget
    from calibdcd.targets.openai import OpenAITarget

    proc, url = start_stub_server()
    params = GenerationParams(max_new_tokens=32, temperature=0.0, n=1, seed=0)
    rows = []
    try:
        for conc in args.concurrency:
            prompts = [f"c{conc} prompt {i}" for i in range(args.requests)]
            target = OpenAITarget(url, "bench", concurrency=conc, dialect="vllm")
            t0 = time.perf_counter()
            target.generate(prompts, params)
            bare = time.perf_counter() - t0
            with tempfile.TemporaryDirectory() as d:
                cached_prompts = [f"cached {p}" for p in prompts]
                t0 = time.perf_counter()
                with CachedTarget(
                    OpenAITarget(url, "bench", concurrency=conc, dialect="vllm"),
                    Path(d) / "g.sqlite",
                ) as c:
                    c.generate(cached_prompts, params)
                cached = time.perf_counter() - t0
            row = {
                "concurrency": conc,
                "requests": args.requests,
                "bare_rps": round(args.requests / bare, 1),
                "cached_rps": round(args.requests / cached, 1),
                "bare_us_per_request": round(1e6 * bare / args.requests, 1),
                "cached_us_per_request": round(1e6 * cached / args.requests, 1),
            }
            rows.append(row)
            print(json.dumps(row), flush=True)
    finally:
        proc.terminate()
        proc.join(5)
    record = {
        **measured_on(),
        "command": "python benchmarks/client_throughput.py " + " ".join(sys.argv[1:]),
        "rows": rows,
    }
    save_measurement(args.out, record)
    if args.write is not None:
        from calibdcd.report.readme import write_block

        write_block(args.write, "client-throughput", table(record))


if __name__ == "__main__":
    main()
