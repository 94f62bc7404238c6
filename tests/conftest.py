"""Shared fixtures: the lab models and paths to the shared benchmark copies."""

from __future__ import annotations

import atexit
import os
import shutil
import tempfile
from pathlib import Path

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

# Everything the suite builds (the tiny LM, the micro lab, generations, features) goes under one
# cache root of its own, never the user's: $CALIBDCD_TEST_CACHE when set (a developer reusing
# builds across runs), else a fresh temporary directory removed when the session ends. Tests
# that exercise the cache-root rule itself set their own $CALIBDCD_CACHE and $HOME.
_TEST_CACHE = os.environ.get("CALIBDCD_TEST_CACHE")
if not _TEST_CACHE:
    _TEST_CACHE = tempfile.mkdtemp(prefix="calibdcd-tests-")
    atexit.register(shutil.rmtree, _TEST_CACHE, True)
os.environ["CALIBDCD_CACHE"] = _TEST_CACHE


def shared_dir() -> Path:
    """``$CALIBDCD_SHARED``, else a ``shared`` directory beside the repository or one of its
    parents (tests that need it skip when it is absent)."""
    from calibdcd.experiment.config import default_shared

    found = default_shared()
    return Path(found) if found else Path("shared-data-not-found")


def shared_data(*parts: str) -> Path:
    """A path under the shared benchmark data directory (``shared_data("WikiMIA", "x.jsonl")``)."""
    return shared_dir().joinpath("data", *parts)


@pytest.fixture(scope="module")
def model_dir() -> Path:
    """The tiny random causal LM checkpoint (built once into the cache) for target tests."""
    import torch

    from calibdcd.targets.tiny import cached_tiny_lm

    torch.set_num_threads(2)
    return cached_tiny_lm()


@pytest.fixture(scope="module")
def target(model_dir):
    """An in-process HF target on :func:`model_dir` (CPU, batch 8)."""
    from calibdcd.targets.hf import HFTarget

    return HFTarget(model_dir, device="cpu", batch_size=8)


@pytest.fixture(scope="session")
def shared_data_dir() -> Path:
    """The shared benchmark copies (``<shared>/data``); skips the test when absent."""
    path = shared_data()
    if not path.is_dir():
        pytest.skip(f"shared benchmark data not found at {path}")
    return path


@pytest.fixture(scope="session")
def lab_micro() -> Path:
    """The micro lab (base + chat-qwen/chat-llama/chat-reasoning), built once into the suite's
    cache root (``$CALIBDCD_TEST_CACHE``, else a temporary one) and reused by every test.
    Built without its ``lab check`` (64 s of a cold suite's 11 min on 2 cores), as experiments
    build it: the check's measurements are tested on their own (test_lab.py), and the cache key
    ignores ``check``."""
    from calibdcd.lab import ensure_lab

    return ensure_lab("micro", progress=False, check=False)
