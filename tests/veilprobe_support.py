"""Test support for the VeilProbe tests: a real local transformers causal LM behind the Target
protocol (used until/unless ``calibdcd.targets.hf.HFTarget`` is available), and the lab loader."""

from __future__ import annotations

import json
import os
from pathlib import Path

from calibdcd.targets.base import GenerationParams, validate_prompts


class LocalCausalTarget:
    """Completion-style generation with a local causal LM (left-padded batches, seeded per
    sample index so the j-th completion of a prompt does not depend on the batch)."""

    family = "lab"

    def __init__(
        self, model_dir: str | Path, batch_size: int = 32, add_special_tokens: bool = True
    ):
        import torch
        from transformers import AutoModelForCausalLM, AutoTokenizer

        torch.set_num_threads(min(2, torch.get_num_threads()))
        self.path = Path(model_dir)
        self.name = f"local:{self.path.resolve()}"
        self.tok = AutoTokenizer.from_pretrained(str(self.path))
        self.tok.padding_side = "left"
        if self.tok.pad_token_id is None:
            self.tok.pad_token = self.tok.eos_token
        self.model = AutoModelForCausalLM.from_pretrained(str(self.path)).eval()
        self.batch_size = batch_size
        self.add_special_tokens = add_special_tokens

    def generate(self, prompts, params: GenerationParams) -> list[list[str]]:
        import torch

        prompts = validate_prompts(prompts)
        out: list[list[str]] = [[] for _ in prompts]
        for j in range(params.n):
            for k in range(0, len(prompts), self.batch_size):
                chunk = prompts[k : k + self.batch_size]
                enc = self.tok(
                    chunk,
                    return_tensors="pt",
                    padding=True,
                    add_special_tokens=self.add_special_tokens,
                )
                torch.manual_seed(params.seed * 1_000_003 + j * 7919 + k)
                with torch.no_grad():
                    gen = self.model.generate(
                        **enc,
                        max_new_tokens=params.max_new_tokens,
                        do_sample=not params.greedy,
                        temperature=params.temperature if not params.greedy else None,
                        top_p=params.top_p,
                        top_k=params.top_k or 0,
                        pad_token_id=self.tok.pad_token_id,
                    )
                new = gen[:, enc["input_ids"].shape[1] :]
                for i, row in enumerate(new):
                    out[k + i].append(self.tok.decode(row, skip_special_tokens=True))
        return out


def lab_dir() -> Path | None:
    """The prebuilt lab (``CALIBDCD_LAB`` or /work/cache/lab-micro) when present."""
    for cand in (os.environ.get("CALIBDCD_LAB"), "/work/cache/lab-micro"):
        if cand and (Path(cand) / "ground_truth.jsonl").exists():
            return Path(cand)
    return None


def ground_truth(lab: Path) -> tuple[list[str], list[int]]:
    texts, labels = [], []
    with (lab / "ground_truth.jsonl").open(encoding="utf-8") as f:
        for line in f:
            if line.strip():
                row = json.loads(line)
                texts.append(row["text"])
                labels.append(int(row["label"]))
    return texts, labels
