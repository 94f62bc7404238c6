"""A tiny Llama-style causal LM with its own byte-level BPE tokenizer, built locally in seconds.

For tests and benchmarks of the target backends (nothing is downloaded): the model is trained for
a few steps on seeded synthetic sentences ending in ``<|endoftext|>``, so it produces word-like
text of varying length and stops at EOS on its own. Its tokenizer carries a Qwen-style (ChatML)
chat template. ``generation_config.json`` sets ``do_sample: true`` so that OpenAI-compatible
servers such as ``transformers serve`` honour ``temperature``/``top_p``/``seed``.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import random
from pathlib import Path

from calibdcd.atomic import atomic_directory
from calibdcd.paths import cache_root
from calibdcd.tiny_lm import llama_config

__all__ = [
    "TinyLMConfig",
    "build_tiny_lm",
    "cached_tiny_lm",
    "synthetic_sentences",
]

CHATML_TEMPLATE = (
    "{% for m in messages %}"
    "{{ '<|im_start|>' + m['role'] + '\\n' + m['content'] + '<|im_end|>\\n' }}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)
_WORDS = (
    "the a one every some old young small great quiet bright dark river city king child road "
    "house light night morning story voice garden stone fire water wind bird tree book door "
    "walked found saw heard held carried opened followed remembered kept lost gave took made "
    "slowly softly again never always under over near through beyond within before after and "
    "but while because so then there here long cold warm green silver golden"
).split()


@dataclasses.dataclass(frozen=True)
class TinyLMConfig:
    hidden_size: int = 64
    num_layers: int = 2
    num_heads: int = 4
    intermediate_size: int = 176
    vocab_size: int = 512
    train_steps: int = 60
    batch_size: int = 32
    seq_len: int = 48
    lr: float = 3e-3
    seed: int = 0


def synthetic_sentences(n: int, seed: int = 0) -> list[str]:
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        words = [rng.choice(_WORDS) for _ in range(rng.randint(3, 14))]
        out.append(" ".join(words).capitalize() + ".")
    return out


def build_tiny_lm(out_dir: str | Path, config: TinyLMConfig | None = None) -> Path:
    """Build, briefly train and save a tiny causal LM + tokenizer to ``out_dir``; return it."""
    import torch
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import GenerationConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    cfg = config or TinyLMConfig()
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    texts = synthetic_sentences(3000, cfg.seed)
    specials = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|pad|>"]
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = trainers.BpeTrainer(
        vocab_size=cfg.vocab_size,
        special_tokens=specials,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(texts, trainer)
    hf_tok = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        eos_token="<|endoftext|>",
        pad_token="<|pad|>",
        chat_template=CHATML_TEMPLATE,
    )
    eos = hf_tok.eos_token_id

    torch.manual_seed(cfg.seed)
    mcfg = llama_config(
        vocab_size=len(hf_tok),
        hidden_size=cfg.hidden_size,
        num_layers=cfg.num_layers,
        num_heads=cfg.num_heads,
        intermediate_size=cfg.intermediate_size,
        max_positions=512,
        pad_id=hf_tok.pad_token_id,
        bos_id=eos,
        eos_id=eos,
    )
    model = LlamaForCausalLM(mcfg)
    stream: list[int] = []
    for t in texts:
        stream.extend(hf_tok(t)["input_ids"] + [eos])
    data = torch.tensor(stream)
    n_win = (len(data) - 1) // cfg.seq_len
    windows = data[: n_win * cfg.seq_len + 1]
    opt = torch.optim.AdamW(model.parameters(), lr=cfg.lr)
    g = torch.Generator().manual_seed(cfg.seed)
    model.train()
    loss = None  # train_steps=0: random weights
    for _ in range(cfg.train_steps):
        starts = torch.randint(0, n_win, (cfg.batch_size,), generator=g) * cfg.seq_len
        x = torch.stack([windows[s : s + cfg.seq_len] for s in starts])
        y = torch.stack([windows[s + 1 : s + cfg.seq_len + 1] for s in starts])
        loss = torch.nn.functional.cross_entropy(
            model(input_ids=x).logits.reshape(-1, mcfg.vocab_size), y.reshape(-1)
        )
        opt.zero_grad()
        loss.backward()
        opt.step()
    model.eval()
    model.generation_config = GenerationConfig(
        do_sample=True,
        temperature=1.0,
        top_p=1.0,
        top_k=0,
        bos_token_id=eos,
        eos_token_id=eos,
        pad_token_id=hf_tok.pad_token_id,
    )
    model.save_pretrained(out)
    hf_tok.save_pretrained(out)
    (out / "tiny_lm.json").write_text(
        json.dumps(
            {
                **dataclasses.asdict(cfg),
                "final_loss": None if loss is None else float(loss.detach()),
            },
            indent=1,
        )
    )
    return out


def cached_tiny_lm(config: TinyLMConfig | None = None, cache_dir: str | Path | None = None) -> Path:
    """:func:`build_tiny_lm`, built once per configuration under the cache dir (atomic rename)."""
    cfg = config or TinyLMConfig()
    key = hashlib.sha256(json.dumps(dataclasses.asdict(cfg), sort_keys=True).encode()).hexdigest()
    root = Path(cache_dir) if cache_dir else cache_root() / "tiny-lm"
    final = root / f"tiny-{key[:16]}"
    if (final / "tiny_lm.json").exists():
        return final
    with atomic_directory(final) as tmp:  # built concurrently by another process: keep theirs
        build_tiny_lm(tmp, cfg)
    return final
