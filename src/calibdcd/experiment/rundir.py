"""One writer per run directory, and a run directory that reflects exactly its config.

* ``lock_run_dir``: ``RUN_DIR/.lock`` (created with ``O_EXCL``) names the process writing the
  directory (pid, host, start time). A second run into the same directory stops at once with a
  message naming the holder; a lock left by a process that no longer runs (same host, pid gone,
  e.g. after ``kill -9``) is taken over with a warning.
* ``set_aside_stale``: settings of an earlier config that are not in this run's grid are moved to
  ``settings/.stale/<id>`` (nothing is deleted); the report reads only the grid's settings and
  lists the stale ones.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import socket
import time
import warnings
from collections.abc import Iterable, Iterator
from pathlib import Path

__all__ = ["LOCK_NAME", "STALE_DIR", "RunDirLocked", "lock_run_dir", "set_aside_stale"]

LOCK_NAME = ".lock"
STALE_DIR = ".stale"


class RunDirLocked(RuntimeError):
    """Another live process is writing the run directory."""


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # exists, owned by someone else
        return True
    return True


def _holder(path: Path) -> dict[str, object] | None:
    try:
        info = json.loads(path.read_text(encoding="utf-8"))
        return info if isinstance(info, dict) else None
    except (OSError, ValueError):
        return None


@contextlib.contextmanager
def lock_run_dir(run_dir: str | Path) -> Iterator[Path]:
    """Hold ``run_dir/.lock`` for the duration of the block (see the module docstring)."""
    run = Path(run_dir)
    run.mkdir(parents=True, exist_ok=True)
    path = run / LOCK_NAME
    me = {
        "pid": os.getpid(),
        "host": socket.gethostname(),
        "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }
    for _ in range(3):
        try:
            fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
        except FileExistsError:
            info = _holder(path)
            if info is None:  # being written right now, or garbage: look again shortly
                time.sleep(0.2)
                info = _holder(path) or {}
            pid, host = info.get("pid"), info.get("host")
            dead = host == me["host"] and isinstance(pid, int) and not _alive(pid)
            if not dead:
                raise RunDirLocked(
                    f"{run} is being written by another run (pid {pid}, host {host}, started "
                    f"{info.get('started')}; lock file {path}). Wait for it to finish, use "
                    "another --out, or delete the lock file if that process is gone."
                ) from None
            warnings.warn(
                f"{path}: taking over the lock of pid {pid} (started {info.get('started')}), "
                "which is no longer running",
                RuntimeWarning,
                stacklevel=3,
            )
            with contextlib.suppress(FileNotFoundError):
                path.unlink()
            continue
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            json.dump(me, fh)
        break
    else:
        raise RunDirLocked(f"{run}: could not take the lock file {path}")
    try:
        yield path
    finally:
        if (_holder(path) or {}).get("pid") == me["pid"]:
            with contextlib.suppress(FileNotFoundError):
                path.unlink()


def set_aside_stale(run_dir: str | Path, grid_ids: Iterable[str]) -> list[str]:
    """Move ``settings/<id>`` directories whose id is not in ``grid_ids`` to
    ``settings/.stale/<id>``; returns the ids moved (sorted). A grid setting found only in
    ``.stale`` is moved back (its result is reused when its hashes still match)."""
    settings = Path(run_dir) / "settings"
    if not settings.is_dir():
        return []
    keep = set(grid_ids)
    for i in sorted(keep):
        old = settings / STALE_DIR / i
        if old.is_dir() and not (settings / i).exists():
            os.replace(old, settings / i)
    moved = []
    for d in sorted(settings.iterdir()):
        if d.name.startswith(".") or not d.is_dir() or d.name in keep:
            continue
        dest = settings / STALE_DIR / d.name
        dest.parent.mkdir(exist_ok=True)
        if dest.exists():
            shutil.rmtree(dest)
        os.replace(d, dest)
        moved.append(d.name)
    return moved
