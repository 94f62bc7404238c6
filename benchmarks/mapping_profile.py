"""Where one step of VeilProbe's mapping-model training spends its time (issue 47 item 3), on
whatever device is at hand: the host's tokenisation of the batch, the forward pass, the
backward pass, the optimiser step, and the number of operators dispatched per step (on a GPU,
each is at least one kernel launch, paid on the host whatever the model's size).

    python benchmarks/mapping_profile.py                    # the cpu preset's mapping model
    python benchmarks/mapping_profile.py --preset paper     # the paper's (6 layers, width 512)
    python benchmarks/mapping_profile.py --device cuda --json benchmarks/results/x.json

It trains the mapping model exactly as :func:`calibdcd.detectors.veilprobe.mapping.
train_mapping_model` does (its tokenizer, model, inputs, optimiser and autocast), on synthetic
(text, suffix) pairs, timing each phase of each step with the device synchronised at the
phase's end (so the phases add up to the step), after ``--warmup`` untimed steps. The
operator count comes from :mod:`torch.profiler` over ``--profile-steps`` steps.

What it predicts: a step's host cost on a GPU is at least ``ops x t_launch`` (eager PyTorch
pays roughly 5-20 µs of host time per dispatched operator and CUDA launch; the figure is an
assumption printed with the prediction, not a measurement), so a small model whose step has
thousands of operators cannot run faster than that many steps per second however fast the GPU.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import statistics
import sys
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")

REPO = Path(__file__).resolve().parent.parent


def _pairs(n: int, seed: int) -> list[tuple[str, str]]:
    from calibdcd.targets.tiny import synthetic_sentences

    # texts of about six sentences and suffixes of about three: lab-like lengths
    words = synthetic_sentences(9 * n, seed=seed)
    return [(" ".join(words[9 * i : 9 * i + 6]), " ".join(words[9 * i + 6 : 9 * i + 9]))
            for i in range(n)]  # fmt: skip


def profile(preset: str, device_name: str, steps: int, warmup: int, profile_steps: int) -> dict:
    import tempfile

    import torch

    from calibdcd.detectors.veilprobe import VeilProbeConfig
    from calibdcd.detectors.veilprobe.mapping import (
        _build,
        _optimizer,
        _tokenizer,
        training_inputs,
    )
    from calibdcd.device import autocast, torch_device
    from calibdcd.provenance import measured_on

    cfg = VeilProbeConfig.preset(preset).mapping
    tokenizer_note = cfg.tokenizer
    if cfg.tokenizer is not None:
        from calibdcd.model_refs import MissingModelError, resolve_model

        try:
            resolve_model(cfg.tokenizer, need="tokenizer")
        except MissingModelError:  # offline: one trained on the pairs, at the preset's vocab
            cfg = dataclasses.replace(cfg, tokenizer=None, vocab_size=30522)
            tokenizer_note = f"{tokenizer_note} not here: a 30,522-word one trained on the pairs"
    device = torch_device(device_name)
    pairs = _pairs(cfg.batch_size * (steps + warmup + profile_steps), seed=0)
    corpus = list(dict.fromkeys([t for t, _ in pairs] + [s for _, s in pairs]))
    with tempfile.TemporaryDirectory() as tmp:
        tok = _tokenizer(cfg, corpus, Path(tmp))
    torch.manual_seed(0)
    model = _build(cfg, tok).to(device).train()
    opt = _optimizer(model, cfg)

    def sync() -> None:
        if device.type == "cuda":
            torch.cuda.synchronize(device)

    def phase(counter, name: str) -> None:
        if counter is not None:
            counter.phase = name

    def step(
        batch: list[tuple[str, str]], times: dict[str, list[float]] | None, counter=None
    ) -> None:
        phase(counter, "inputs")
        t0 = time.perf_counter()
        inputs, labels = training_inputs(tok, batch, cfg)
        inputs = {n: v.to(device) for n, v in inputs.items()}
        labels = labels.to(device)
        sync()
        t1 = time.perf_counter()
        phase(counter, "forward")
        with autocast(device, cfg.bf16):
            logits = model(**inputs).logits.float()
        loss = torch.nn.functional.cross_entropy(
            logits.view(-1, logits.shape[-1]), labels.view(-1), ignore_index=-100
        )
        sync()
        t2 = time.perf_counter()
        phase(counter, "backward")
        opt.zero_grad()
        loss.backward()
        sync()
        t3 = time.perf_counter()
        phase(counter, "optimizer")
        opt.step()
        sync()
        t4 = time.perf_counter()
        if times is not None:
            for k, a, b in (("inputs", t0, t1), ("forward", t1, t2), ("backward", t2, t3),
                            ("optimizer", t3, t4)):  # fmt: skip
                times[k].append(b - a)

    b = cfg.batch_size
    batches = [pairs[i : i + b] for i in range(0, len(pairs), b)]
    for batch in batches[:warmup]:
        step(batch, None)
    times: dict[str, list[float]] = {k: [] for k in ("inputs", "forward", "backward", "optimizer")}
    for batch in batches[warmup : warmup + steps]:
        step(batch, times)
    counts = _count_ops(lambda batch, mode: step(batch, None, mode), batches[warmup + steps :])
    ms = {k: 1000 * statistics.median(v) for k, v in times.items()}
    total = sum(ms.values())
    n_params = sum(p.numel() for p in model.parameters())
    return {
        "preset": preset,
        "device": str(device),
        **measured_on(torch=True),
        "threads": torch.get_num_threads(),
        "parameters": n_params,
        "tokenizer": tokenizer_note,
        "batch_size": b,
        "max_length": cfg.max_length,
        "steps_timed": steps,
        "median_ms": {k: round(v, 3) for k, v in ms.items()},
        "step_ms": round(total, 3),
        "steps_per_s": round(1000 / total, 2),
        "ops_per_step": {k: round(v / max(profile_steps, 1), 1) for k, v in counts.items()},
    }


def _count_ops(run, batches) -> dict[str, int]:
    """Operators dispatched per phase while ``run`` trains on ``batches`` (a dispatch mode sees
    every aten operator, the backward's included: on a GPU each is a kernel launch or more)."""
    from collections import Counter

    from torch.utils._python_dispatch import TorchDispatchMode

    class Count(TorchDispatchMode):
        def __init__(self) -> None:
            super().__init__()
            self.n: Counter[str] = Counter()
            self.phase = "forward"

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            self.n[self.phase] += 1
            return func(*args, **(kwargs or {}))

    mode = Count()
    with mode:
        for batch in batches:
            run(batch, mode)
    return dict(mode.n)


def predict(result: dict, launch_us: tuple[float, float] = (5.0, 20.0)) -> str:
    ops = sum(result["ops_per_step"].values())
    per_phase = ", ".join(f"{k} {v:.0f}" for k, v in result["ops_per_step"].items())
    lo, hi = (ops * us / 1000 for us in launch_us)
    return (
        f"{result['preset']} mapping model ({result['parameters']:,} parameters, batch "
        f"{result['batch_size']}) on {result['device']}: {result['step_ms']:.1f} ms a step "
        f"({result['steps_per_s']:.1f} steps/s; inputs {result['median_ms']['inputs']:.1f}, "
        f"forward {result['median_ms']['forward']:.1f}, backward "
        f"{result['median_ms']['backward']:.1f}, optimizer {result['median_ms']['optimizer']:.1f}"
        f" ms), {ops:.0f} operators dispatched a step ({per_phase}). On a GPU at {launch_us[0]:g}-"
        f"{launch_us[1]:g} µs of host time per operator (assumed), the host alone needs "
        f"{lo:.0f}-{hi:.0f} ms a step: at most {1000 / lo:.0f}-{1000 / hi:.0f} steps/s whatever "
        "the GPU, plus the batch's tokenisation (measured above, the same on any device)."
    )


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--preset", default="cpu", choices=("cpu", "paper", "official"))
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--profile-steps", type=int, default=5)
    ap.add_argument("--json", type=Path, help="write the figures there")
    args = ap.parse_args(argv)
    res = profile(args.preset, args.device, args.steps, args.warmup, args.profile_steps)
    res["prediction"] = predict(res)
    print(json.dumps(res, indent=2))
    from calibdcd.provenance import save_measurement

    save_measurement(args.json, res)
    return 0


if __name__ == "__main__":
    sys.exit(main())
