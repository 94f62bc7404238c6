"""A mapping-model training stopped part-way resumes from its last save and ends with the very
bytes of a training that was never stopped (dropout, data order, AdamW moments, the learning-rate
schedule); an unusable save is named and ignored; two processes asking for one model train it once.
Real tiny BERT2BERT trainings on the CPU, no mocks."""

from __future__ import annotations

import dataclasses
import json
import math
import multiprocessing as mp
from pathlib import Path

import pytest

from calibdcd.detectors.veilprobe import VeilProbeConfig
from calibdcd.detectors.veilprobe.mapping import train_mapping_model
from veilprobe_support import STANDIN_CORPUS

SUFFIXES = [[STANDIN_CORPUS[(i + 1) % 8], STANDIN_CORPUS[(i + 3) % 8][:30]] for i in range(8)]
PER_EPOCH = 8  # 16 pairs at batch 2
STEPS = 2 * PER_EPOCH


class Stop(Exception):
    """Stands for the process being killed at a step."""


def tiny_cfg():
    """The paper preset's mapping options (dropout 0.1, AdamW, linear decay, clipping, two
    epochs) at a tiny size, with a tokenizer trained on the pairs."""
    return dataclasses.replace(
        VeilProbeConfig.preset("paper").mapping,
        vocab_size=300,
        hidden_size=32,
        num_layers=1,
        num_heads=2,
        intermediate_size=64,
        max_length=32,
        epochs=2,
        batch_size=2,
        tokenizer=None,
        device="cpu",
    )


def train(cache: Path, *, stop_at: int | None = None, every: float = 0.0, seen=None):
    def on_step(st):
        if seen is not None:
            seen.append(st.step)
        if st.step == stop_at:
            raise Stop

    return train_mapping_model(
        STANDIN_CORPUS,
        SUFFIXES,
        tiny_cfg(),
        cache,
        progress=False,
        on_step=on_step,
        save_every=every,
    )


def weights(mm) -> dict:
    return {k: v.detach().clone() for k, v in mm.model.state_dict().items()}


def assert_same_bytes(a: dict, b: dict) -> None:
    import torch

    assert a.keys() == b.keys()
    differ = [k for k in a if not torch.equal(a[k], b[k])]
    assert not differ, f"{len(differ)} of {len(a)} tensors differ, e.g. {differ[:3]}"


@pytest.fixture(scope="module")
def unbroken(tmp_path_factory):
    mm = train(tmp_path_factory.mktemp("unbroken"), every=math.inf)
    return weights(mm)


def saves(cache: Path) -> list[Path]:
    return sorted((cache / "mapping").glob("*.resume.pt"))


@pytest.mark.parametrize(
    "stop_at",
    [1, PER_EPOCH, PER_EPOCH + 3],
    ids=["first-epoch", "epoch-boundary", "second-epoch"],
)
def test_a_stopped_training_resumes_to_the_unbroken_bytes(tmp_path, unbroken, stop_at):
    seen: list[int] = []
    with pytest.raises(Stop):
        train(tmp_path, stop_at=stop_at, seen=seen)
    assert seen[-1] == stop_at
    assert len(saves(tmp_path)) == 1, "no save left behind by the stopped training"
    assert not list((tmp_path / "mapping").glob("*/done.json"))

    again: list[int] = []
    mm = train(tmp_path, seen=again)
    assert again == list(range(stop_at, STEPS)), "did not resume at the stopped step"
    assert_same_bytes(weights(mm), unbroken)
    done = json.loads((mm.path / "done.json").read_text())
    assert done["resumed"] == 1
    assert saves(tmp_path) == [], "the save outlived the trained model"
    # and the stored model loads as the same bytes
    assert_same_bytes(weights(train(tmp_path)), unbroken)


def test_an_unusable_save_is_named_and_the_training_starts_over(tmp_path, unbroken):
    with pytest.raises(Stop):
        train(tmp_path, stop_at=5)
    (save,) = saves(tmp_path)
    save.write_bytes(save.read_bytes()[:1000])  # a torn file (a disk fault, not our writer)
    seen: list[int] = []
    with pytest.warns(UserWarning, match=r"resume\.pt: saved training state not usable"):
        mm = train(tmp_path, seen=seen)
    assert seen[0] == 0
    assert_same_bytes(weights(mm), unbroken)
    assert json.loads((mm.path / "done.json").read_text())["resumed"] == 0


def test_saving_off_leaves_nothing_and_a_rerun_starts_over(tmp_path, unbroken):
    with pytest.raises(Stop):
        train(tmp_path, stop_at=5, every=math.inf)
    assert saves(tmp_path) == []
    seen: list[int] = []
    assert_same_bytes(weights(train(tmp_path, seen=seen, every=math.inf)), unbroken)
    assert seen[0] == 0


def _train_in_child(cache: str, out: str) -> None:
    steps: list[int] = []
    train_mapping_model(
        STANDIN_CORPUS,
        SUFFIXES,
        tiny_cfg(),
        cache,
        progress=False,
        on_step=lambda st: steps.append(st.step),
        save_every=math.inf,
    )
    Path(out).write_text(json.dumps(len(steps)))


def test_two_processes_asking_for_one_model_train_it_once(tmp_path, unbroken):
    ctx = mp.get_context("spawn")
    outs = [tmp_path / f"{i}.json" for i in range(2)]
    procs = [ctx.Process(target=_train_in_child, args=(str(tmp_path), str(o))) for o in outs]
    for p in procs:
        p.start()
    for p in procs:
        p.join(timeout=300)
        assert p.exitcode == 0
    ran = sorted(json.loads(o.read_text()) for o in outs)
    assert ran == [0, STEPS], f"steps trained by each process: {ran}"
    assert_same_bytes(weights(train(tmp_path)), unbroken)


# -- the lab's training loop (pre-training, SFT; the real lab's LoRA injection and chat) ----------


def tiny_llama():
    from calibdcd.lab.config import ModelConfig
    from calibdcd.lab.train import build_model

    cfg = ModelConfig(
        hidden_size=32, num_layers=1, num_heads=2, intermediate_size=64, vocab_size=96
    )
    return build_model(cfg, 96, {"bos": 1, "eos": 1, "pad": 0}, seed=0)


def lab_train(kind: str, save: Path | None, *, stop_at: int | None = None, seen=None):
    """A tiny Llama pre-trained (two epochs, repacked) or fine-tuned (two epochs, reshuffled)
    from its seeded initialisation; returns (model, stats)."""
    import random

    from calibdcd.lab.config import PretrainConfig, SFTConfig
    from calibdcd.lab.train import SFTExample, pretrain, sft
    from calibdcd.resumable import ResumableTraining

    def on_step(step):
        if seen is not None:
            seen.append(step)
        if step == stop_at:
            raise Stop

    rng = random.Random(7)
    model = tiny_llama()
    if kind == "pretrain-lora":  # the real lab's injection: a LoRA adapter with dropout
        import torch

        from calibdcd.lab.real import LoraSpec, _lora

        torch.manual_seed(5)
        model = _lora(model, LoraSpec(r=4, alpha=8, dropout=0.1))
    resume = None if save is None else ResumableTraining(save, every_seconds=0, meta={"k": kind})
    common = dict(seed=3, device=_cpu(), progress=False, resume=resume, on_step=on_step)
    if kind.startswith("pretrain"):
        docs = [[rng.randrange(2, 96) for _ in range(rng.randrange(5, 30))] for _ in range(24)]
        cfg = PretrainConfig(epochs=2, batch_size=2, seq_len=16, warmup_steps=2)
        stats = pretrain(model, docs, 1, cfg, **common)
    else:
        examples = []
        for _ in range(20):
            ids = [rng.randrange(2, 96) for _ in range(rng.randrange(6, 20))]
            examples.append(SFTExample(ids, [-100] * 3 + ids[3:]))
        cfg = SFTConfig(epochs=2, batch_size=4, warmup_steps=1)
        stats = sft(model, examples, 0, cfg, **common)
    return model, stats


def _cpu():
    import torch

    return torch.device("cpu")


@pytest.mark.parametrize("kind", ["pretrain", "sft", "pretrain-lora"])
def test_a_stopped_lab_training_resumes_to_the_unbroken_bytes(tmp_path, kind):
    if kind == "pretrain-lora":
        pytest.importorskip(
            "peft", reason="the real lab's LoRA needs peft (pip install -e .[reallab])"
        )
    model, stats = lab_train(kind, None)
    total = stats.steps
    assert total >= 8
    save = tmp_path / "state.pt"
    stop_at = total // 2 + 1  # in the second epoch
    with pytest.raises(Stop):
        lab_train(kind, save, stop_at=stop_at)
    assert save.is_file()
    seen: list[int] = []
    again, again_stats = lab_train(kind, save, seen=seen)
    assert seen == list(range(stop_at, total)), "did not resume at the stopped step"
    assert_same_bytes(weights_of(again), weights_of(model))
    for field in ("steps", "tokens", "first_loss", "last_loss"):
        assert getattr(again_stats, field) == getattr(stats, field), field
    # the loop leaves its last save (after the last step) for the caller to discard once the
    # model is stored: a run stopped before that trains nothing again
    rerun: list[int] = []
    done, done_stats = lab_train(kind, save, seen=rerun)
    assert rerun == [] and done_stats.resumed_at == total
    assert_same_bytes(weights_of(done), weights_of(model))
    if kind == "pretrain-lora":  # the frozen base is rebuilt, not saved
        import torch

        saved = torch.load(save, weights_only=True)["model"]
        assert saved and all("lora_" in k for k in saved), sorted(saved)[:3]
    save.unlink()
    # a save of another training at the same place is named and not used
    with pytest.raises(Stop):
        lab_train(kind, save, stop_at=3)
    from calibdcd.resumable import ResumableTraining

    other = ResumableTraining(save, every_seconds=0, meta={"k": "other"})
    with pytest.warns(UserWarning, match="saved for"):
        fresh = tiny_llama()
        assert other.restore(fresh, _adamw(fresh)) is None
    assert not save.exists()


def _adamw(model):
    import torch

    return torch.optim.AdamW(model.parameters())


def weights_of(model) -> dict:
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def test_a_save_that_cannot_be_written_costs_the_save_not_the_training(tmp_path):
    model, _ = lab_train("pretrain", None)
    (tmp_path / "file").write_text("not a directory")
    with pytest.warns(UserWarning, match="training state not saved, training goes on"):
        again, _ = lab_train("pretrain", tmp_path / "file" / "state.pt")
    assert_same_bytes(weights_of(again), weights_of(model))
