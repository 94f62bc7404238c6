"""Peak memory of a whole ``calibdcd score`` on 1k, 10k and 100k suspect texts (issue 44,
item 6: 100,000 texts under 600 MB on the overlap detector), end to end:

    python benchmarks/score_end_to_end.py [--sizes 1000 10000 100000] \
        [--out benchmarks/results/score_end_to_end.json]

A bundle of the overlap detector is fitted once with ``calibdcd fit`` (150 members, 150
non-members) against the instant loopback server of ``benchmarks/client_throughput.py`` (one
fixed completion for every prompt: no model, so the figures are the client's: the HTTP client,
the SQLite generation cache, the features, the scores, p-values, the set test, the
distribution check and the output). Then each size is scored by ``calibdcd score`` in a fresh
process with an empty generation cache; its peak RSS is that process's ``ru_maxrss``
(``RUSAGE_SELF`` read by the process itself as it exits). Wall time is recorded too:
it is a timing only when nothing else runs on the machine (say so when quoting it).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from calibdcd.provenance import measured_on, save_measurement  # noqa: E402
from client_throughput import start_stub_server  # noqa: E402


def _texts(rng: random.Random, n: int, tag: str) -> list[str]:
    words = [f"w{i}" for i in range(5000)]
    return [f"{tag}{i} " + " ".join(rng.choice(words) for _ in range(48)) for i in range(n)]


#: runs calibdcd in this process and prints its own peak RSS (KB) as the last line of stderr
_MEASURED = (
    "import resource, sys\n"
    "from calibdcd.cli import main\n"
    "sys.argv = ['calibdcd', *sys.argv[1:]]\n"
    "code = 0\n"
    "try:\n    main()\nexcept SystemExit as e:\n    code = e.code or 0\n"
    "print(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss, file=sys.stderr)\n"
    "sys.exit(code)\n"
)


def _cli(args: list[str], env: dict[str, str]) -> tuple[float, float]:
    """(peak RSS MB, wall s) of ``calibdcd ARGS`` in a fresh process of its own."""
    t0 = time.perf_counter()
    done = subprocess.run(
        [sys.executable, "-c", _MEASURED, *args], env=env, capture_output=True, text=True
    )
    wall = time.perf_counter() - t0
    if done.returncode != 0:
        raise SystemExit(f"calibdcd {' '.join(args)} failed:\n{done.stderr[-3000:]}")
    return int(done.stderr.strip().splitlines()[-1]) / 1024, wall


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sizes", type=int, nargs="+", default=[1000, 10_000, 100_000])
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()
    proc, url = start_stub_server()
    rng = random.Random(0)
    rows = []
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONPATH": str(HERE.parent / "src")}
    spec = f"openai:base_url={url},model=bench,family=qwen2.5,dialect=vllm,concurrency=64"
    try:
        with tempfile.TemporaryDirectory() as d:
            w = Path(d)
            (w / "m.txt").write_text("".join(t + "\n" for t in _texts(rng, 150, "m")))
            (w / "n.txt").write_text("".join(t + "\n" for t in _texts(rng, 150, "n")))
            _cli(["fit", "--target", spec, "--members", str(w / "m.txt"), "--nonmembers",
                  str(w / "n.txt"), "--detector", "overlap", "-o", str(w / "bundle"),
                  "--cache-dir", str(w / "fit-cache"), "--no-progress"], env)  # fmt: skip
            for k in sorted(args.sizes):
                suspect = w / f"suspect{k}.jsonl"
                suspect.write_text(
                    "".join(json.dumps({"text": t}) + "\n" for t in _texts(rng, k, f"s{k}-"))
                )
                peak, wall = _cli(
                    ["score", str(w / "bundle"), str(suspect), "--cache-dir",
                     str(w / f"cache{k}"), "--no-progress", "-o", str(w / f"scores{k}.jsonl")],
                    env,
                )  # fmt: skip
                row = {"texts": k, "peak_rss_mb": round(peak, 1), "wall_s": round(wall, 1)}
                rows.append(row)
                print(json.dumps(row), flush=True)
    finally:
        proc.terminate()
        proc.join(5)
    record = {
        **measured_on(),
        "detector": "overlap (defaults), fitted on 150 + 150 texts",
        "goal": "peak RSS < 600 MB at 100,000 texts",
        "rows": rows,
    }
    save_measurement(args.out, record)


if __name__ == "__main__":
    main()
