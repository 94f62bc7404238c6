"""Shared fixtures: the lab models and paths to the shared benchmark copies.

The micro lab (2-3 minutes of training on 2 cores) is built by a background process started
once the tests are collected, while the tests that do not use it run first: see
:func:`pytest_collection_modifyitems` and :func:`lab_micro`.
"""

from __future__ import annotations

import atexit
import inspect
import os
import re
import shutil
import subprocess
import sys
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
    from calibdcd.paths import default_shared

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


# --------------------------------------------------------------------------- the micro lab

# The micro lab is built by ``ensure_lab("micro", check=False)``: by the process below when the
# session collected a test that uses it, else by the first test asking for it. Either way the
# lab is the same, bit for bit (the build sets its own torch threads, and its seeds are fixed).
# The process runs at the lowest CPU priority: the tests beside it keep their speed (on 2 cores,
# two processes' torch threads at equal priority stalled each other's parallel regions: tests
# of 0.3 s took 30 s) and the build takes what they leave, then both cores. Measured from an
# empty test cache on the 2-core EPYC (pytest's time): 470 s building in the first test that
# asks, 399 s in this process, 393 s with its threads sleeping when idle (the lab built beside
# the tests was byte for byte the one built alone).
_BUILD_MICRO = """
import os, signal, sys
os.nice(19)
signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # unwinds: no half-built lab is left
from calibdcd.lab import ensure_lab
lab = ensure_lab("micro", progress=False, check=False)
if "clean-reference" in sys.argv[1:]:  # DPDLLM's reference on the lab (tests/test_dpdllm.py)
    from calibdcd.lab.clean_reference import CleanReferenceConfig, ensure_clean_reference
    ensure_clean_reference(lab, CleanReferenceConfig(), progress=False)
"""

# what marks a test (its source, a fixture it uses or a function of its module it calls) as one
# that needs the micro lab
_USES_MICRO = re.compile(
    r"lab_micro|micro_run|micro_seeds_run|micro_config_text|lab-micro|lab: ?micro|"
    r"lab-clean-reference:micro|[\"']micro[\"']"
)
_builds: list[tuple[subprocess.Popen, str]] = []  # (process, its log)
_NEEDS_MICRO = pytest.StashKey[bool]()
_NEEDS_REFERENCE = pytest.StashKey[bool]()


def _source(obj) -> str:
    try:
        return inspect.getsource(obj)
    except (OSError, TypeError):
        return ""


def _micro_helpers(module) -> re.Pattern | None:
    """A pattern for calls of the functions of ``module`` that name the micro lab, directly or
    through one another (``_target_config`` calling ``lab_micro()``)."""
    funcs = {
        name: _source(f)
        for name, f in vars(module).items()
        if inspect.isfunction(f) and f.__module__ == module.__name__
    }
    found: set[str] = set()
    while True:
        calls = re.compile(rf"\b({'|'.join(map(re.escape, found))})\(") if found else None
        more = {
            name
            for name, src in funcs.items()
            if name not in found and (_USES_MICRO.search(src) or (calls and calls.search(src)))
        }
        if not more:
            return calls
        found |= more


def _uses_micro(item: pytest.Item, helpers: dict) -> bool:
    """Whether ``item`` (or a fixture it depends on, or a function of its module it calls)
    names the micro lab. A test this misses still gets the lab (it waits for the build); it
    only runs after the build instead of during it."""
    if "lab_micro" in getattr(item, "fixturenames", ()):
        return True
    if item.get_closest_marker("own_lab") is not None:  # "micro" names only its preset
        return False
    funcs = [getattr(item, "function", None)]
    info = getattr(item, "_fixtureinfo", None)
    for defs in getattr(info, "name2fixturedefs", {}).values():
        funcs += [d.func for d in defs]
    module = getattr(item, "module", None)
    if module is not None and module not in helpers:
        helpers[module] = _micro_helpers(module)
    calls = helpers.get(module)
    for f in funcs:
        src = _source(f) if f is not None else ""
        if _USES_MICRO.search(src) or (calls is not None and calls.search(src)):
            return True
    return False


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(session, config, items):
    """The tests that use the micro lab go last (stable order otherwise), so that the others run
    while the lab builds in the background (:func:`pytest_collection_finish`): a cold suite on
    2 cores spends more than two minutes building it."""
    helpers: dict = {}
    needs = {id(item): _uses_micro(item, helpers) for item in items}
    items[:] = sorted(items, key=lambda item: needs[id(item)])
    config.stash[_NEEDS_MICRO] = any(needs.values())
    config.stash[_NEEDS_REFERENCE] = any(
        "clean_reference" in getattr(item, "fixturenames", ()) for item in items
    )


def _start_build(reference: bool) -> None:
    """A background process running :data:`_BUILD_MICRO` (``reference``: then DPDLLM's clean
    reference on the lab), logging to a temporary file; :func:`lab_micro` waits for it."""
    log = tempfile.NamedTemporaryFile(prefix="calibdcd-lab-micro-", suffix=".log", delete=False)
    atexit.register(lambda: Path(log.name).unlink(missing_ok=True))
    src = str(Path(__file__).resolve().parents[1] / "src")
    path = os.pathsep.join(p for p in (src, os.environ.get("PYTHONPATH")) if p)
    proc = subprocess.Popen(
        [sys.executable, "-c", _BUILD_MICRO] + (["clean-reference"] if reference else []),
        # the code under test, as in-process; its idle threads sleep instead of spinning on the
        # cores the tests use (the waiting policy changes no result)
        env=dict(os.environ, PYTHONPATH=path, OMP_WAIT_POLICY="PASSIVE"),
        stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
    )  # fmt: skip
    log.close()
    _builds.append((proc, log.name))


def _stop_builds() -> None:
    while _builds:
        proc, _ = _builds.pop()
        if proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


def pytest_sessionstart(session):
    """A session over whole directories (``make test``: no file or test named) starts the micro
    lab's build now, during collection (6-7 s of the cold suite's critical path, the tests after
    the build); :func:`pytest_collection_finish` stops it when no collected test uses the lab.
    Not for ``--collect-only``, nor in an xdist worker."""
    config = session.config
    if config.option.collectonly or os.environ.get("PYTEST_XDIST_WORKER"):
        return
    here = config.invocation_params.dir
    if config.args and all((here / a).is_dir() for a in config.args):
        _start_build(reference=False)


def pytest_collection_finish(session):
    """Start building the micro lab in a background process when a collected test uses it (or
    keep the one :func:`pytest_sessionstart` started, adding DPDLLM's clean reference when a test
    uses it: a second process that waits for the lab's lock, then trains it); stop it when none
    does."""
    config = session.config
    if config.option.collectonly or os.environ.get("PYTEST_XDIST_WORKER"):
        return
    if not config.stash.get(_NEEDS_MICRO, False):
        _stop_builds()
        return
    reference = config.stash.get(_NEEDS_REFERENCE, False)
    if not _builds:
        _start_build(reference)
    elif reference:
        _start_build(reference=True)


def pytest_sessionfinish(session, exitstatus):
    """Stops a build no test waited for (a session ended by -x, -k or Ctrl-C)."""
    _stop_builds()


@pytest.fixture(scope="session")
def lab_micro() -> Path:
    """The micro lab (base + chat-qwen/chat-llama/chat-reasoning), built once into the suite's
    cache root (``$CALIBDCD_TEST_CACHE``, else a temporary one) and reused by every test.
    Built without its ``lab check`` (64 s of a cold suite's 11 min on 2 cores), as experiments
    build it: the check's measurements are tested on their own (test_lab.py), and the cache key
    ignores ``check``. Waits for the background build of :func:`pytest_collection_finish`;
    when that failed, the build here says why."""
    from calibdcd.lab import ensure_lab

    for proc, log in list(_builds):
        if proc.wait() != 0:
            tail = Path(log).read_text(errors="replace")[-3000:]
            print(f"background build of the micro lab failed ({proc.returncode}):\n{tail}")
    return ensure_lab("micro", progress=False, check=False)
