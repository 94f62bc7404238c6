"""The real-model lab: known members injected into a real pre-trained LM, then post-trained.

Recipe (docs/real-lab.md argues the numbers from the measured cost on 2 CPU cores):

1. **Pool.** One file of texts from one distribution (default: the 2024 non-members of WikiMIA-24,
   length 64: events after the model's training cut-off). Cleaned as the synthetic lab's pool,
   then split at random (seeded) into ``n_members`` members and as many non-members; the rest of
   the file is not used. So the blind baseline sits at 0.5 by construction (checked by the runs).
2. **Injection** (the lab's "pre-training"): a LoRA adapter (``peft``) on every linear projection
   of the real model, trained as a causal LM on the members (``exposures`` copies each,
   reshuffled and repacked per epoch, ``<eos>``-separated) mixed with ``n_replay`` replay texts
   seen once per epoch, then merged into the weights: the ``base`` model. Replay texts come from
   ``replay_path`` (default: WikiMIA-24's pre-2024 texts, the same genre, never in the pool).
3. **Post-training**: a second LoRA adapter trained on the lab's chat tasks
   (:mod:`calibdcd.lab.sftdata`) rendered with the model's **own** chat template, loss on the
   assistant turns, merged: the ``chat`` model. It starts from ``base``, as the synthetic lab.
4. The untouched original weights are saved as ``original``: DPDLLM's natural reference LM here
   (it never saw the injected members).

Everything is cached like the synthetic lab (``<cache>/lab/<preset>-s<seed>-<hash>``, built once
per cache root under a lock); ``lab.json`` records the recipe, the time of each step and the
membership signal reached (gray-box loss AUC and greedy-continuation ROUGE-L AUC per model).
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import random
import shutil
import time
from pathlib import Path
from typing import Any

from calibdcd.lab.config import (
    LAB_FORMAT_VERSION,
    PoolConfig,
    PretrainConfig,
    SFTConfig,
    replace_settings,
)
from calibdcd.lab.evaluate import CHECK_SKIPPED
from calibdcd.lab.pool import PoolText, Split, clean_pool, load_pool, pool_fingerprint
from calibdcd.lab.sftdata import Conversation
from calibdcd.provenance import build_record
from calibdcd.resumable import ResumableTraining, discard_saves_beside

__all__ = [
    "REAL_PRESETS",
    "LoraSpec",
    "RealLabConfig",
    "build_real_lab",
    "real_config_hash",
    "resolve_real_config",
]


@dataclasses.dataclass(frozen=True)
class LoraSpec:
    r: int = 32
    alpha: int = 64
    dropout: float = 0.0
    #: peft's shorthand for every linear layer except the output head
    target_modules: str = "all-linear"


@dataclasses.dataclass(frozen=True)
class RealLabConfig:
    preset: str = "real-smollm2"
    #: ``packaged:smollm2-135m-instruct`` | ``packaged:gemma3-270m`` | a local checkpoint path
    model: str = "packaged:smollm2-135m-instruct"
    #: the pool file (``${CALIBDCD_SHARED}`` expands as in configs) and the label whose rows
    #: form the pool (None = every row)
    pool_path: str = "${CALIBDCD_SHARED}/data/WikiMIA-24/WikiMIA-24_length64.jsonl"
    pool_label: int | None = 0
    replay_path: str = "${CALIBDCD_SHARED}/data/WikiMIA-24/WikiMIA-24_length64.jsonl"
    replay_label: int | None = 1
    pool: PoolConfig = dataclasses.field(
        default_factory=lambda: PoolConfig(min_words=30, max_words=120)
    )
    n_members: int = 280  # 577 clean 2024 texts: 280 + 280 drawn
    n_replay: int = 200
    #: injection: repeats x epochs = exposures per member (lr is LoRA's); its ``n_members`` and
    #: ``n_background`` are not read (the top-level ``n_members`` and ``n_replay`` are)
    inject: PretrainConfig = dataclasses.field(
        default_factory=lambda: PretrainConfig(
            n_members=280,
            repeats=2,
            n_background=200,
            epochs=3,
            batch_size=4,
            seq_len=128,
            lr=1e-3,
            warmup_steps=10,
            weight_decay=0.0,
        )
    )
    inject_lora: LoraSpec = dataclasses.field(default_factory=LoraSpec)
    sft: SFTConfig = dataclasses.field(
        default_factory=lambda: SFTConfig(
            n_examples=400, batch_size=8, lr=5e-4, warmup_steps=5, max_len=192
        )
    )
    sft_lora: LoraSpec = dataclasses.field(default_factory=lambda: LoraSpec(r=16, alpha=32))
    #: greedy-continuation check on this many members and non-members (None = all)
    check_per_class: int | None = 100
    num_threads: int = 2

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


#: the paper's regime on a real LM (issue "The paper's regime on a real LM", docs/real-lab.md):
#: members injected until greedy continuations reproduce them (fewer members, 24 exposures, a
#: larger adapter), then the same chat post-training. Recipe R1 of that search.
REGIME_R1 = RealLabConfig(
    preset="real-smollm2-regime",
    n_members=150,
    inject=PretrainConfig(
        n_members=150,
        repeats=4,
        n_background=200,
        epochs=6,
        batch_size=4,
        seq_len=128,
        lr=1.5e-3,
        warmup_steps=20,
        weight_decay=0.0,
    ),
    inject_lora=LoraSpec(r=64, alpha=128),
)

#: recipe R2: half R1's exposures (12) and a post-training three times R1's (1,200
#: conversations, a LoRA of rank 64 at twice the rate), since R1's chat model still read its
#: members at 0.98 (docs/real-lab.md). R2's base differs from R1's, so it is injected anew.
REGIME_R2 = dataclasses.replace(
    REGIME_R1,
    inject=dataclasses.replace(REGIME_R1.inject, repeats=3, epochs=4),
    sft=dataclasses.replace(REGIME_R1.sft, n_examples=1200, lr=1e-3),
    sft_lora=LoraSpec(r=64, alpha=128),
)

#: recipe R3: R2's injected base (reused from the store), post-training stronger again (1,600
#: conversations at lr 2e-3), since R2's chat model still read its members at 92.3 AUC through
#: the overlap baseline. R3 is in the bands: overlap AUC base 98.2, chat 81.2 (docs/real-lab.md)
REGIME_R3 = dataclasses.replace(
    REGIME_R2, sft=dataclasses.replace(REGIME_R2.sft, n_examples=1600, lr=2e-3)
)

REAL_PRESETS: dict[str, RealLabConfig] = {
    "real-smollm2": RealLabConfig(),
    # the recipe of the regime search that reached the bands, R3 (docs/real-lab.md logs every
    # one); configs name the recipe itself (real-smollm2-regime-r3), so a later recipe cannot
    # change what a stored config meant
    "real-smollm2-regime": REGIME_R3,
    **{
        f"real-smollm2-regime-r{i}": dataclasses.replace(cfg, preset=f"real-smollm2-regime-r{i}")
        for i, cfg in ((1, REGIME_R1), (2, REGIME_R2), (3, REGIME_R3))
    },
}
_SECTIONS = ("pool", "inject", "inject_lora", "sft", "sft_lora")
#: 2: each LoRA adapter's initialisation is seeded (``seed`` for the injection's, ``seed + 1000``
#: for post-training's) instead of taking the process's random state, so a post-training run
#: on a stored base equals one after a fresh injection (labs of format 1 are not reused)
REAL_FORMAT = 2


def resolve_real_config(preset: str, **overrides: Any) -> RealLabConfig:
    """The preset with ``section__field`` / top-level overrides (as the synthetic lab's)."""
    cfg = REAL_PRESETS[preset]
    sections: dict[str, dict[str, Any]] = {}
    top: dict[str, Any] = {}
    for key, value in overrides.items():
        if key in ("device", "check"):  # the synthetic lab's build options: no effect here
            continue
        if "__" in key:
            section, field = key.split("__", 1)
            sections.setdefault(section, {})[field] = value
        else:
            top[key] = value
    for section, changes in sections.items():
        if section not in _SECTIONS:
            raise ValueError(f"unknown real-lab config section {section!r}; valid: {_SECTIONS}")
        top[section] = replace_settings(getattr(cfg, section), changes, section)
    return replace_settings(cfg, top, "real lab")


def _labelled(cfg: RealLabConfig, key: str) -> list[PoolText]:
    """The texts of the pool file ``cfg.<key>_path`` (its ``${VAR}`` expanded) with the label
    ``cfg.<key>_label`` (any label when None)."""
    from calibdcd.variables import expand

    path = Path(expand(getattr(cfg, f"{key}_path"), f"real lab: {key}_path"))
    label = getattr(cfg, f"{key}_label")
    return load_pool(path, where=None if label is None else {"label": label})


def real_pools(cfg: RealLabConfig) -> tuple[list[PoolText], list[PoolText]]:
    """The cleaned pool and the replay texts (replay texts that are also pool texts dropped)."""
    pool = clean_pool(_labelled(cfg, "pool"), cfg.pool)
    seen = {t.text for t in pool}
    replay = [t for t in clean_pool(_labelled(cfg, "replay"), cfg.pool) if t.text not in seen]
    return pool, replay


def _digest(kind: str, config: dict[str, Any], cfg: RealLabConfig, seed: int, pool_sha: str) -> str:
    from calibdcd.provenance import build_environment

    payload = {
        "format": LAB_FORMAT_VERSION,
        "kind": kind,
        "real_format": REAL_FORMAT,
        "config": config,
        "seed": seed,
        "pool": pool_sha,
        "build": build_environment("cpu", cfg.num_threads),
    }
    return hashlib.sha256(json.dumps(payload, sort_keys=True).encode()).hexdigest()[:12]


def real_config_hash(cfg: RealLabConfig, seed: int, pool_sha: str) -> str:
    config = cfg.to_dict()
    config.pop("num_threads")
    return _digest("real", config, cfg, seed, pool_sha)


def inject_hash(cfg: RealLabConfig, seed: int, pool_sha: str) -> str:
    """The key of the injected base alone: what its training reads (model, pool, split, replay,
    injection and its adapter, seed, build environment), not post-training or the check. Two
    recipes that differ only in post-training share one injected base (:func:`build_real_lab`)."""
    config = cfg.to_dict()
    keep = (
        "model", "pool_path", "pool_label", "replay_path", "replay_label", "pool",
        "n_members", "n_replay", "inject", "inject_lora",
    )  # fmt: skip
    return _digest("real-inject", {k: config[k] for k in keep}, cfg, seed, pool_sha)


def real_lab_key(preset: str, seed: int = 0, **overrides: Any) -> str:
    cfg = resolve_real_config(preset, **overrides)
    pool, replay = real_pools(cfg)
    sha = pool_fingerprint(pool + replay)
    return f"{preset}-s{seed}-{real_config_hash(cfg, seed, sha)}"


def _lora(model, spec: LoraSpec):
    from peft import LoraConfig, get_peft_model

    return get_peft_model(
        model,
        LoraConfig(
            r=spec.r,
            lora_alpha=spec.alpha,
            lora_dropout=spec.dropout,
            target_modules=spec.target_modules,
            task_type="CAUSAL_LM",
        ),
    )


def chat_examples(convs: list[Conversation], tokenizer, max_len: int):
    """:class:`SFTExample` s rendered with the tokenizer's own chat template, the loss on the
    assistant turn (through its end-of-turn token) only."""
    from calibdcd.lab.train import SFTExample

    out = []
    for user, _reasoning, answer in convs:
        msgs = [{"role": "user", "content": user}, {"role": "assistant", "content": answer}]
        prompt = tokenizer.apply_chat_template(msgs[:1], tokenize=False, add_generation_prompt=True)
        full = tokenizer.apply_chat_template(msgs, tokenize=False)
        if not full.startswith(prompt):
            raise ValueError("real lab: the chat template's generation prompt is not a prefix")
        p_ids = tokenizer(prompt, add_special_tokens=False)["input_ids"]
        f_ids = tokenizer(full, add_special_tokens=False)["input_ids"]
        if f_ids[: len(p_ids)] != p_ids or len(f_ids) > max_len:
            continue
        out.append(SFTExample(f_ids, [-100] * len(p_ids) + f_ids[len(p_ids) :]))
    return out


def _greedy_rouge(model, tok, texts: list[str], max_ref_words: int = 48) -> list[float]:
    """ROUGE-L of each text's greedy continuation (of its first part, by the lab's split)
    against its true rest, the continuation cut to the rest's length."""
    from calibdcd.lab.evaluate import greedy_completions, split_for_continuation
    from calibdcd.lab.scoring import rouge_l, words

    pairs = [split_for_continuation(t, max_ref_words) for t in texts]
    budgets = [min(96, int(1.7 * len(r.split())) + 6) for _, r in pairs]
    eos = tok.eos_token_id
    gens = greedy_completions(
        model, tok, [p for p, _ in pairs], budgets, [eos], "cpu", 16,
        pad=tok.pad_token_id if tok.pad_token_id is not None else eos,
    )  # fmt: skip
    scores = []
    for (_, ref), gen in zip(pairs, gens, strict=True):
        ref_w = words(ref)
        scores.append(rouge_l(words(gen)[: len(ref_w)], ref_w))
    return scores


def _signal(model, tok, members: list[str], nonmembers: list[str], n: int | None):
    from calibdcd.lab.evaluate import mean_token_nll
    from calibdcd.lab.scoring import auc

    mem, non = members[:n] if n else members, nonmembers[:n] if n else nonmembers
    labels = [1] * len(mem) + [0] * len(non)
    t0 = time.perf_counter()
    eos = tok.eos_token_id
    nll = mean_token_nll(model, tok, mem + non, "cpu", 8, sep=eos, pad=tok.pad_token_id or eos)
    rouge = _greedy_rouge(model, tok, mem + non)
    return {
        "n_per_class": len(mem),
        "loss_auc": round(auc(labels, [-x for x in nll]), 4),
        "greedy_rougeL_auc": round(auc(labels, rouge), 4),
        "mean_nll": {
            "member": round(sum(nll[: len(mem)]) / len(mem), 4),
            "nonmember": round(sum(nll[len(mem) :]) / len(non), 4),
        },
        "seconds": round(time.perf_counter() - t0, 1),
    }


@dataclasses.dataclass(frozen=True)
class _Corpus:
    """What a real lab is built from: the pool's split into members and non-members, the
    replay texts mixed into the injection and the texts the chat conversations are made of."""

    pool: list[PoolText]
    pool_sha: str
    split: Split
    replay: list[PoolText]
    sft_texts: list[PoolText]


def _corpus(cfg: RealLabConfig, seed: int) -> _Corpus:
    """The pool split at random (seeded) and the replay texts shuffled (seeded): the first
    ``n_replay`` are replayed during the injection, the rest feed the chat conversations."""
    from calibdcd.lab.pool import split_pool

    pool, replay_all = real_pools(cfg)
    pool_sha = pool_fingerprint(pool + replay_all)
    split = split_pool(pool, cfg.n_members, seed)
    rng = random.Random(f"calibdcd-real-lab-replay-{seed}")
    replay = list(replay_all)
    rng.shuffle(replay)
    sft_texts, replay = replay[cfg.n_replay :], replay[: cfg.n_replay]
    return _Corpus(pool, pool_sha, split, replay, sft_texts)


def _injection_docs(tok, cfg: RealLabConfig, corpus: _Corpus) -> list[list[int]]:
    """The injection's documents: ``inject.repeats`` copies of each member, then the replay
    texts once, as token ids."""
    enc = lambda s: tok(s, add_special_tokens=False)["input_ids"]  # noqa: E731
    docs = [enc(x.text) for x in corpus.split.members for _ in range(cfg.inject.repeats)]
    return docs + [enc(x.text) for x in corpus.replay]


def _injected_base(
    model,
    tok,
    docs: list[list[int]],
    cfg: RealLabConfig,
    *,
    seed: int,
    into: Path,
    store: Path,
    reuse_base: bool,
    progress: bool,
    resume: ResumableTraining | None = None,
) -> tuple[dict[str, Any], float]:
    """Write the injected base model to ``into`` and return (its training stats, the
    injection's seconds); ``resume``: the injection's save. With ``reuse_base`` the base is
    copied from ``store`` when a build left it there, else injected and left there for the next
    recipe (under the store's lock); the saved fp32 weights are exact, so the lab equals one
    built from scratch."""
    from calibdcd.atomic import atomic_directory, file_lock

    lock = file_lock(store.parent / f".{store.name}.lock", f"waiting for {store}")
    with lock if reuse_base else contextlib.nullcontext():
        if reuse_base and (store / "calibdcd.json").is_file():
            stats = json.loads((store / "calibdcd.json").read_text())["training"]
            stats["reused_from"] = store.name
            shutil.copytree(store, into, ignore=shutil.ignore_patterns("calibdcd.json"))
            return stats, 0.0
        stats, seconds = _inject(
            model, tok, docs, cfg, seed=seed, into=into, progress=progress, resume=resume
        )
        if reuse_base:
            with atomic_directory(store) as store_tmp:
                shutil.copytree(into, store_tmp, dirs_exist_ok=True)
                info = {"training": stats, "inject_hash": store.name}
                (store_tmp / "calibdcd.json").write_text(json.dumps(info, indent=2) + "\n")
        return stats, seconds


def _inject(
    model, tok, docs: list[list[int]], cfg: RealLabConfig, *, seed: int, into: Path,
    progress: bool, resume: ResumableTraining | None = None,
) -> tuple[dict[str, Any], float]:  # fmt: skip
    """Train the injection's LoRA adapter on ``docs``, merge it and save the base model (with
    the tokenizer) to ``into``; (training stats, seconds)."""
    import torch

    from calibdcd.lab.train import pretrain

    torch.manual_seed(seed)  # the adapter's initialisation (REAL_FORMAT 2)
    peft_model = _lora(model, cfg.inject_lora)
    st = pretrain(
        peft_model,
        docs,
        tok.eos_token_id,
        cfg.inject,
        seed=seed,
        device=torch.device("cpu"),
        progress=progress,
        desc="inject members (LoRA)",
        resume=resume,
    )
    merged = peft_model.merge_and_unload()
    merged.save_pretrained(into)
    tok.save_pretrained(into)
    return st.as_dict(), st.seconds


def _post_train(
    base, tok, corpus: _Corpus, cfg: RealLabConfig, *, seed: int, into: Path, progress: bool,
    resume: ResumableTraining | None = None,
) -> tuple[dict[str, Any], float]:  # fmt: skip
    """Post-train ``base`` on the chat conversations (a LoRA adapter, seeded ``seed + 1000``,
    merged) and save the chat model (with the tokenizer) to ``into``; (training stats with the
    number of examples, seconds). ``resume``: the post-training's save."""
    import torch

    from calibdcd.lab.sftdata import make_conversations
    from calibdcd.lab.train import sft

    convs = make_conversations(corpus.sft_texts or corpus.replay, cfg.sft.n_examples, seed)
    examples = chat_examples(convs, tok, cfg.sft.max_len)
    torch.manual_seed(seed + 1000)  # the adapter's initialisation (REAL_FORMAT 2)
    chat_model = _lora(base, cfg.sft_lora)
    st = sft(
        chat_model,
        examples,
        tok.pad_token_id,
        cfg.sft,
        seed=seed + 1000,
        device=torch.device("cpu"),
        progress=progress,
        desc="post-train chat (LoRA)",
        resume=resume,
    )
    chat = chat_model.merge_and_unload()
    chat.eval()
    chat.save_pretrained(into)
    tok.save_pretrained(into)
    return {**st.as_dict(), "examples": len(examples)}, st.seconds


def _write_ground_truth(path: Path, split: Split, exposures: int) -> None:
    """``ground_truth.jsonl``: the members (``m0000``...) then the non-members (``n0000``...),
    each with its text, label, exposures and source."""
    with path.open("w", encoding="utf-8") as fh:
        rows = [(x, 1) for x in split.members] + [(x, 0) for x in split.nonmembers]
        for k, (x, label) in enumerate(rows):
            idx = k if label else k - len(split.members)
            rec = {
                "id": f"{'m' if label else 'n'}{idx:04d}",
                "text": x.text,
                "label": label,
                "repeats": exposures if label else 0,
                "source": x.source,
            }
            fh.write(json.dumps(rec, ensure_ascii=False) + "\n")


def _check_models(lab: Path, tok, split: Split, cfg: RealLabConfig) -> dict[str, Any]:
    """The membership signal (:func:`_signal`) of the original, base and chat models, each
    loaded from ``lab``: peft wraps and merges in place, so the built objects alias each
    other."""
    import torch
    from transformers import AutoModelForCausalLM

    mem = [x.text for x in split.members]
    non = [x.text for x in split.nonmembers]
    check: dict[str, Any] = {}
    for name in ("original", "base", "chat"):
        m = AutoModelForCausalLM.from_pretrained(lab / name, dtype=torch.float32).eval()
        check[name] = _signal(m, tok, mem, non, cfg.check_per_class)
    return check


def build_real_lab(
    preset: str,
    out_dir: str | Path,
    *,
    seed: int = 0,
    progress: bool = True,
    cache: str | Path | None = None,
    reuse_base: bool = True,
    **overrides: Any,
) -> Path:
    """Build the real-model lab into ``out_dir`` (atomically) and return it; a packaged model is
    dequantised into the cache root ``cache`` (:func:`calibdcd.paths.cache_root` by default).
    With ``reuse_base`` the injected base is kept in ``<cache>/lab-base/real-s<seed>-<hash>``
    (:func:`inject_hash`) and a later recipe that differs only in post-training copies it."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from calibdcd.atomic import atomic_directory
    from calibdcd.paths import cache_root

    cfg = resolve_real_config(preset, **overrides)
    if cfg.num_threads > 0:
        torch.set_num_threads(cfg.num_threads)
    corpus = _corpus(cfg, seed)
    from calibdcd.targets.packaged import checkpoint_dir

    src = checkpoint_dir(cfg.model, cache)  # the one resolver of a model reference
    out_dir = Path(out_dir)
    timings: dict[str, float] = {}
    exposures = cfg.inject.repeats * cfg.inject.epochs
    with atomic_directory(out_dir, replace=True) as tmp:
        t_all = time.perf_counter()
        tok = AutoTokenizer.from_pretrained(src)
        if tok.pad_token_id is None:
            tok.pad_token = tok.eos_token
        model = AutoModelForCausalLM.from_pretrained(src, dtype=torch.float32)
        model.save_pretrained(tmp / "original")
        tok.save_pretrained(tmp / "original")
        docs = _injection_docs(tok, cfg, corpus)
        # the injected base is kept in <cache>/lab-base/ under its own key, so a recipe that
        # changes only post-training copies it instead of injecting again (on 2 cores the
        # injection is 35-65 min of a 45-75 min build: docs/real-lab.md)
        key = inject_hash(cfg, seed, corpus.pool_sha)
        store = cache_root(cache) / "lab-base" / f"real-s{seed}-{key}"
        stats: dict[str, Any] = {}
        # each training's save sits beside out_dir until the lab is complete (a build stopped
        # part-way resumes), with its recipe's hash (one of another recipe is not resumed)
        stats["base"], timings["inject"] = _injected_base(
            model, tok, docs, cfg, seed=seed, into=tmp / "base", store=store,
            reuse_base=reuse_base, progress=progress,
            resume=ResumableTraining.beside(out_dir, "inject", key),
        )  # fmt: skip
        del model
        # from disk in both cases and the adapter seeded: a reused base and a fresh one give
        # the same chat model (tests/test_real_lab.py)
        base = AutoModelForCausalLM.from_pretrained(tmp / "base", dtype=torch.float32).eval()
        stats["chat"], timings["sft"] = _post_train(
            base, tok, corpus, cfg, seed=seed, into=tmp / "chat", progress=progress,
            resume=ResumableTraining.beside(
                out_dir, "chat", real_config_hash(cfg, seed, corpus.pool_sha)
            ),
        )  # fmt: skip
        del base
        for name, role in (("original", "reference"), ("base", "base"), ("chat", "post-trained")):
            info = {"role": role, "real_model": cfg.model, "training": stats.get(name)}
            (tmp / name / "calibdcd.json").write_text(json.dumps(info, indent=2) + "\n")
        _write_ground_truth(tmp / "ground_truth.jsonl", corpus.split, exposures)
        timings["build"] = time.perf_counter() - t_all
        t = time.perf_counter()
        # an experiment that builds the lab on first use measures it itself (check=False, as
        # for the synthetic lab): the check's ~6 min on 2 cores are left to `calibdcd lab build`
        check = _check_models(tmp, tok, corpus.split, cfg) if overrides.get("check", True) else {}
        timings["check"] = time.perf_counter() - t
        meta = {
            "complete": True,
            "kind": "real",
            "preset": preset,
            "seed": seed,
            "config_hash": real_config_hash(cfg, seed, corpus.pool_sha),
            "config": cfg.to_dict(),
            "overrides": {k: v for k, v in overrides.items()},
            "source_model": str(src.name),
            "corpus": {
                "pool": len(corpus.pool),
                "members": len(corpus.split.members),
                "nonmembers": len(corpus.split.nonmembers),
                "replay": len(corpus.replay),
                "sft_texts": len(corpus.sft_texts),
                "inject_tokens_per_epoch": sum(len(d) + 1 for d in docs),
                "exposures_per_member": exposures,
            },
            "stats": stats,
            "check": check or {"skipped": CHECK_SKIPPED},
            "timings": {k: round(v, 1) for k, v in timings.items()},
            **build_record("cpu", cfg.num_threads),  # trained on the CPU (see above)
        }
        (tmp / "lab.json").write_text(json.dumps(meta, indent=2, default=str) + "\n")
    discard_saves_beside(out_dir)
    return out_dir
