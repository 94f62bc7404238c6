"""Peak memory of a run that loads no torch model (issue "Resolve a config once", item 5):

    python benchmarks/import_footprint.py [--texts 240] \
        [--out benchmarks/results/import_footprint.json]

A whole ``calibdcd run`` (overlap detector, CalibDCD and its analyses, the report) against the
instant loopback server of ``client_throughput.py`` (a fixed completion for every prompt), in a
fresh process, twice: as the toolkit runs it, and with ``import torch`` done first, which is what
every such run did while ``environment.json`` read torch's CPU kernel level. Reported: each
process's peak RSS (``ru_maxrss``), whether torch was imported, and the ratio of the two peaks
(the figure to read: it is measured in the same invocation on the same machine).
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
sys.path.insert(0, str(HERE.parent / "src"))

from calibdcd.provenance import measured_on, save_measurement  # noqa: E402
from client_throughput import start_stub_server  # noqa: E402

_CHILD = """\
import json, resource, sys
if sys.argv[2] == "torch-first":
    import torch  # noqa: F401
from calibdcd.cli import main
sys.argv = ["calibdcd", "run", sys.argv[1], "--no-progress"]
try:
    main()
except SystemExit as exc:
    assert not exc.code, exc.code
peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
print(json.dumps({"torch": "torch" in sys.modules, "peak_rss_mb": round(peak, 1)}))
"""


def _config(d: Path, url: str, n: int, name: str) -> Path:
    rng = random.Random(0)
    words = [f"w{i}" for i in range(300)]
    data = d / "texts.jsonl"
    if not data.exists():
        data.write_text(
            "".join(
                json.dumps({"text": " ".join(rng.choice(words) for _ in range(40)), "label": i % 2})
                + "\n"
                for i in range(n)
            )
        )
    cfg = {
        "name": name,
        "benchmarks": [{"name": "mine", "path": str(data)}],
        "targets": [
            {
                "name": "served",
                "backend": "openai",
                "model": "bench",
                "family": "qwen2.5",
                "options": {"base_url": url, "dialect": "vllm"},
            }
        ],
        "detectors": ["overlap"],
        "cache_dir": str(d / f"cache-{name}"),
        "output": str(d / name),
    }
    path = d / f"{name}.yaml"
    path.write_text(json.dumps(cfg))
    return path


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--texts", type=int, default=240)
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()
    proc, url = start_stub_server()
    rows = []
    env = {**os.environ, "PYTHONPATH": str(HERE.parent / "src"), "HF_HUB_OFFLINE": "1"}
    try:
        with tempfile.TemporaryDirectory() as tmp:
            for mode in ("as-run", "torch-first"):
                cfg = _config(Path(tmp), url, args.texts, mode)
                t0 = time.perf_counter()
                res = subprocess.run(
                    [sys.executable, "-c", _CHILD, str(cfg), mode],
                    capture_output=True,
                    text=True,
                    env=env,
                    check=True,
                )
                row = {
                    "mode": mode,
                    **json.loads(res.stdout.strip().splitlines()[-1]),
                    "wall_s": round(time.perf_counter() - t0, 1),
                }
                rows.append(row)
                print(json.dumps(row), flush=True)
    finally:
        proc.terminate()
        proc.join(5)
    ratio = rows[1]["peak_rss_mb"] / rows[0]["peak_rss_mb"]
    print(f"peak RSS with torch imported / as run: {ratio:.2f}x")
    record = {
        **measured_on(),
        "texts": args.texts,
        "rows": rows,
        "torch_first_over_as_run": round(ratio, 2),
    }
    save_measurement(args.out, record)


if __name__ == "__main__":
    main()
