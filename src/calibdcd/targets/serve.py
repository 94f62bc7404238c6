"""A local OpenAI-compatible server for a checkpoint: ``transformers serve`` on loopback.

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

__all__ = ["ServerError", "free_port", "sampling_copy", "served_model_id", "transformers_serve"]


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
    import httpx

    model_dir = Path(model_dir)
    if not (model_dir / "config.json").is_file():
        raise ServerError(f"model_dir: {str(model_dir)!r} is not a transformers checkpoint")
    port = port or free_port()
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    if threads is not None:
        env["OMP_NUM_THREADS"] = str(threads)
    cmd = [str(_cli()), "serve", "--host", "127.0.0.1", "--port", str(port), "--device", "cpu"]
    cmd += [*extra_args, str(model_dir)]
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
                    f"transformers serve exited with code {proc.returncode} during start-up"
                    + (f" (its output: {log})" if log is not None else "")
                )
            if time.monotonic() > deadline:
                raise ServerError(
                    f"transformers serve did not answer /health in {startup_timeout} s"
                )
            time.sleep(0.5)
        yield url
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=20)
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
    dst.mkdir(parents=True, exist_ok=True)
    for f in src.iterdir():
        if not f.is_file() or f.name == "generation_config.json":
            continue
        target = dst / f.name
        if target.exists():
            target.unlink()
        try:
            os.link(f, target)
        except OSError:
            shutil.copy2(f, target)
    gc_path = src / "generation_config.json"
    gc = json.loads(gc_path.read_text()) if gc_path.is_file() else {}
    gc["do_sample"] = True
    (dst / "generation_config.json").write_text(json.dumps(gc, indent=2, sort_keys=True) + "\n")
    return dst
