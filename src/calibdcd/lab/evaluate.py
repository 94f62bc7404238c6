"""``lab check``: membership signals of each lab model against the lab's ground truth.

Per model and prompt mode:

* gray-box: ``loss_auc`` — AUC of the negated mean token NLL of the whole text (after
  ``<|endoftext|>``, the pre-training document separator);
* black-box: greedy continuation of the text's first half (``⌊n/2⌋`` whitespace words), compared
  with its true second half (capped at ``max_ref_words``) on lower-case ``\\w+`` words, the
  generation truncated to the reference length: ``rougeL_auc`` (ROUGE-L F1) and ``prefix_auc``
  (number of leading words reproduced exactly).

Prompt modes: ``raw`` sends the prefix as it is (no special tokens — what a completion API
client sends); ``chat`` puts ``"Continue the text:\\n{prefix}"`` in a user turn of the model's
chat template with the generation prompt. Reasoning-style answers are scored on the text after
``</think>`` (empty if the think block never closes; such a model gets
``reasoning_extra_tokens`` more new tokens in chat mode). Decoding is explicitly greedy and stops at
the style's end-of-turn token or ``<|endoftext|>``; up to ``1.7 x`` reference words + 6 new
tokens (at most ``max_new_tokens``).
"""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from calibdcd.lab.chat import ENDOFTEXT, PAD, ChatStyle, get_style, render_chat, split_reasoning
from calibdcd.lab.config import EvalConfig
from calibdcd.lab.scoring import auc, prefix_match, rouge_l, words

__all__ = [
    "EvalItem",
    "check_lab",
    "check_model",
    "evaluate_model",
    "greedy_completions",
    "load_ground_truth",
    "mean_token_nll",
    "split_for_continuation",
]

MODES = ("raw", "chat")


@dataclass(frozen=True)
class EvalItem:
    id: str
    text: str
    label: int


def split_for_continuation(text: str, max_ref_words: int) -> tuple[str, str]:
    """``(prefix, reference)``: the first ⌊n/2⌋ whitespace words and the rest (capped)."""
    parts = text.split()
    half = len(parts) // 2
    return " ".join(parts[:half]), " ".join(parts[half : half + max_ref_words])


def load_ground_truth(lab_dir: str | Path) -> list[EvalItem]:
    path = Path(lab_dir) / "ground_truth.jsonl"
    if not path.is_file():
        raise ValueError(f"{lab_dir} is not a lab directory: {path.name} is missing")
    from calibdcd.data.files import load_table

    # the one reader of labelled texts (every problem of the file at once, naming its line)
    bench = load_table(path, text_field="text", label_field="label", id_field="id")
    return [EvalItem(s.id, s.text, s.label) for s in bench.samples]


def _select(items: Sequence[EvalItem], n_per_class: int | None) -> list[EvalItem]:
    if n_per_class is None:
        return list(items)
    pos = [x for x in items if x.label == 1][:n_per_class]
    neg = [x for x in items if x.label == 0][:n_per_class]
    return pos + neg


def mean_token_nll(
    model,
    tok,
    texts: Sequence[str],
    device,
    batch_size: int,
    *,
    sep: int | None = None,
    pad: int | None = None,
) -> list[float]:
    """Mean token NLL of each text after the document separator ``sep`` (the lab's
    ``<|endoftext|>`` by default; a real model's own end-of-text id in the real-model lab)."""
    import torch

    sep = tok.convert_tokens_to_ids(ENDOFTEXT) if sep is None else sep
    pad = tok.convert_tokens_to_ids(PAD) if pad is None else pad
    out: list[float] = []
    for b in range(0, len(texts), batch_size):
        seqs = [
            [sep, *tok(t, add_special_tokens=False)["input_ids"]] for t in texts[b : b + batch_size]
        ]
        width = max(map(len, seqs))
        ids = torch.full((len(seqs), width), pad, dtype=torch.long)
        mask = torch.zeros((len(seqs), width), dtype=torch.long)
        for r, s in enumerate(seqs):
            ids[r, : len(s)] = torch.tensor(s)
            mask[r, : len(s)] = 1
        ids, mask = ids.to(device), mask.to(device)
        with torch.no_grad():
            logits = model(input_ids=ids, attention_mask=mask).logits.float()
        logp = torch.log_softmax(logits[:, :-1], dim=-1)
        tgt = ids[:, 1:]
        tok_lp = logp.gather(-1, tgt.unsqueeze(-1)).squeeze(-1) * mask[:, 1:]
        out.extend((-(tok_lp.sum(1)) / mask[:, 1:].sum(1)).tolist())
    return out


def greedy_completions(
    model,
    tok,
    prompts: Sequence[str],
    budgets: Sequence[int],
    stop_ids,
    device,
    batch_size,
    *,
    pad: int | None = None,
):
    """Greedy completions (decoded, special tokens kept, cut at the first stop token or pad);
    ``pad``: the padding id (the lab's ``<|pad|>`` by default; a real model's own in the
    real-model lab)."""
    import torch
    from transformers import GenerationConfig

    pad = tok.convert_tokens_to_ids(PAD) if pad is None else pad
    pad_token = tok.convert_ids_to_tokens(pad)
    stop_tokens = {tok.convert_ids_to_tokens(i) for i in stop_ids}
    order = sorted(range(len(prompts)), key=lambda i: budgets[i])
    out = [""] * len(prompts)
    for b in range(0, len(order), batch_size):
        idx = order[b : b + batch_size]
        seqs = [tok(prompts[i], add_special_tokens=False)["input_ids"] for i in idx]
        width = max(map(len, seqs))
        ids = torch.full((len(seqs), width), pad, dtype=torch.long)
        mask = torch.zeros((len(seqs), width), dtype=torch.long)
        for r, s in enumerate(seqs):  # left padding
            ids[r, width - len(s) :] = torch.tensor(s)
            mask[r, width - len(s) :] = 1
        gc = GenerationConfig(
            do_sample=False,
            max_new_tokens=max(budgets[i] for i in idx),
            eos_token_id=list(stop_ids),
            pad_token_id=pad,
        )
        with torch.no_grad():
            gen = model.generate(
                input_ids=ids.to(device), attention_mask=mask.to(device), generation_config=gc
            )
        for r, i in enumerate(idx):
            new = gen[r, width:].tolist()
            toks = tok.convert_ids_to_tokens(new)
            cut = next(
                (k for k, t in enumerate(toks) if t in stop_tokens or t == pad_token), len(new)
            )
            out[i] = tok.decode(new[:cut], skip_special_tokens=False)
    return out


def _model_info(model_dir: Path) -> dict[str, Any]:
    meta = model_dir / "calibdcd.json"
    return json.loads(meta.read_text()) if meta.is_file() else {}


def check_model(
    model_dir: str | Path,
    items: Sequence[EvalItem],
    cfg: EvalConfig,
    *,
    device: str = "auto",
    modes: Sequence[str] = MODES,
    progress: bool = True,
) -> dict[str, Any]:
    """Membership AUCs of one lab model (see the module docstring)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from calibdcd.device import torch_device

    model_dir = Path(model_dir)
    info = _model_info(model_dir)
    style = get_style(info.get("chat_style") or "qwen2.5")
    dev = torch_device(device)
    tok = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).to(dev).eval()
    return evaluate_model(
        model,
        tok,
        style,
        items,
        cfg,
        device=dev,
        modes=modes,
        progress=progress,
        desc=f"check {model_dir.name}",
    )


def evaluate_model(
    model,
    tok,
    style: ChatStyle,
    items: Sequence[EvalItem],
    cfg: EvalConfig,
    *,
    device,
    modes: Sequence[str] = MODES,
    progress: bool = True,
    desc: str = "check",
) -> dict[str, Any]:
    """:func:`check_model` on an already loaded model and tokenizer."""
    from calibdcd.progress import inner_bar

    bad = sorted(set(modes) - set(MODES))
    if bad:
        raise ValueError(f"unknown check mode(s) {bad}; valid: {list(MODES)}")
    dev = device
    stop_ids = [tok.convert_tokens_to_ids(t) for t in style.stop_tokens]
    labels = [x.label for x in items]
    t0 = time.perf_counter()
    result: dict[str, Any] = {"n_members": sum(labels), "n_nonmembers": len(labels) - sum(labels)}
    nll = mean_token_nll(model, tok, [x.text for x in items], dev, cfg.batch_size)
    result["loss_auc"] = auc(labels, [-v for v in nll])
    result["mean_nll"] = _means(labels, nll)
    splits = [split_for_continuation(x.text, cfg.max_ref_words) for x in items]
    budgets = [
        min(cfg.max_new_tokens, int(cfg.new_tokens_per_word * len(ref.split())) + 6)
        for _, ref in splits
    ]
    for mode in inner_bar(modes, desc=desc, unit="mode", enabled=progress):
        if mode == "raw":
            prompts = [prefix for prefix, _ in splits]
        else:
            prompts = [
                render_chat(
                    style,
                    [{"role": "user", "content": f"{cfg.continue_instruction}\n{prefix}"}],
                    add_generation_prompt=True,
                )
                for prefix, _ in splits
            ]
        mode_budgets = budgets
        if mode == "chat" and style.reasoning:
            mode_budgets = [b + cfg.reasoning_extra_tokens for b in budgets]
        gens = greedy_completions(model, tok, prompts, mode_budgets, stop_ids, dev, cfg.batch_size)
        if mode == "chat" and style.reasoning:
            gens = [split_reasoning(g)[1] for g in gens]
        rl, pm, exact = [], [], []
        for g, (_, ref) in zip(gens, splits, strict=False):
            ref_w = words(ref)
            gen_w = words(g)[: len(ref_w)]
            rl.append(rouge_l(gen_w, ref_w))
            pm.append(prefix_match(gen_w, ref_w))
            exact.append(float(bool(ref_w) and pm[-1] == len(ref_w)))
        result[mode] = {
            "rougeL_auc": auc(labels, rl),
            "prefix_auc": auc(labels, pm),
            "mean_rougeL": _means(labels, rl),
            "mean_prefix_words": _means(labels, pm),
            "exact_rate": _means(labels, exact),
            "examples": [
                {"id": x.id, "label": x.label, "completion": g[:300]}
                for x, g in list(zip(items, gens, strict=False))[:2]
                + [p for p in zip(items, gens, strict=False) if p[0].label == 0][:1]
            ],
        }
    result["seconds"] = round(time.perf_counter() - t0, 2)
    return result


def _means(labels: Sequence[int], values: Sequence[float]) -> dict[str, float]:
    pos = [v for y, v in zip(labels, values, strict=False) if y == 1]
    neg = [v for y, v in zip(labels, values, strict=False) if y == 0]
    return {
        "member": round(sum(pos) / max(len(pos), 1), 4),
        "nonmember": round(sum(neg) / max(len(neg), 1), 4),
    }


def lab_models(lab_dir: str | Path) -> list[Path]:
    """Model directories of a lab (base first), i.e. sub-directories with a calibdcd.json."""
    lab_dir = Path(lab_dir)
    dirs = sorted(p.parent for p in lab_dir.glob("*/calibdcd.json"))
    return sorted(dirs, key=lambda p: (p.name != "base", p.name))


def check_lab(
    lab_dir: str | Path,
    cfg: EvalConfig | None = None,
    *,
    models: Sequence[str] | None = None,
    modes: Sequence[str] = MODES,
    device: str = "auto",
    progress: bool = True,
) -> dict[str, Any]:
    """``check_model`` for every model of the lab (or the named ones)."""
    lab_dir = Path(lab_dir)
    if cfg is None:
        cfg = lab_eval_config(lab_dir)
    items = _select(load_ground_truth(lab_dir), cfg.n_per_class)
    dirs = lab_models(lab_dir)
    if models is not None:
        known = {d.name for d in dirs}
        bad = sorted(set(models) - known)
        if bad:
            raise ValueError(f"unknown model(s) {bad} in {lab_dir}; available: {sorted(known)}")
        dirs = [d for d in dirs if d.name in models]
    t0 = time.perf_counter()
    out = {
        d.name: check_model(d, items, cfg, device=device, modes=modes, progress=progress)
        for d in dirs
    }
    return {"models": out, "seconds": round(time.perf_counter() - t0, 2), "eval": vars(cfg)}


def lab_eval_config(lab_dir: Path) -> EvalConfig:
    meta = lab_dir / "lab.json"
    if meta.is_file():
        data = json.loads(meta.read_text()).get("config", {}).get("evaluation")
        if data:
            return EvalConfig(**data)
    return EvalConfig()


#: ``lab.json``'s ``check`` when a lab was built without its check (``check=False``: experiments
#: build their labs so, as they measure the lab themselves); the cache key ignores ``check``, so
#: such a lab is the same lab and is reused by builds that would have checked it
CHECK_SKIPPED = (
    "not run at build time (built with check off, e.g. on first use by an experiment, which "
    "measures the lab itself); `calibdcd lab check LAB_DIR` measures its signal"
)


def format_check(report: dict[str, Any]) -> str:
    """A plain-text table of a :func:`check_lab` report (or the line saying it was skipped)."""
    if "skipped" in report:
        return f"lab check: {report['skipped']}"
    lines = [
        f"{'model':<16}{'loss AUC':>9}  {'mode':<5}{'ROUGE-L AUC':>12}{'prefix AUC':>11}"
        f"{'ROUGE-L m/nm':>15}{'exact m':>8}"
    ]
    for name, r in report["models"].items():
        first = True
        for mode in MODES:
            if mode not in r:
                continue
            m = r[mode]
            loss = f"{r['loss_auc']:.3f}" if first else ""
            lines.append(
                f"{name if first else '':<16}{loss:>9}  {mode:<5}{m['rougeL_auc']:>12.3f}"
                f"{m['prefix_auc']:>11.3f}"
                f"{m['mean_rougeL']['member']:>8.2f}/{m['mean_rougeL']['nonmember']:.2f}"
                f"{m['exact_rate']['member']:>8.2f}"
            )
            first = False
    return "\n".join(lines)
