"""The one atomic file writer: every cache and run-directory file goes through it.

A write goes to a temporary file in the same directory (:func:`atomic_file`, which also serves
writers that take a path), is fsynced, and then replaces the target with ``os.replace``: a
reader (or a run resumed after ``kill -9`` or a full disk) sees the old file or the new one,
never half of one. A directory artefact (a checkpoint, a lab) is built in a temporary sibling
and renamed into place by :func:`atomic_directory`."""

from __future__ import annotations

import contextlib
import csv
import io
import json
import os
import shutil
import tempfile
from collections.abc import Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

__all__ = [
    "atomic_directory",
    "atomic_file",
    "atomic_savez",
    "atomic_write_bytes",
    "atomic_write_text",
    "file_lock",
    "json_default",
    "read_json",
    "write_csv",
    "write_json",
]


@contextlib.contextmanager
def atomic_file(final: str | Path) -> Iterator[Path]:
    """A temporary sibling path of ``final`` for a writer that takes a path (ours, or a
    package's); when the block ends without an error the file is fsynced and replaces ``final``
    with ``os.replace``, so ``final`` is the old file or the whole new one, never part of it.
    On an error the temporary file is removed."""
    final = Path(final)
    final.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{final.name}.", suffix=".tmp", dir=final.parent)
    os.close(fd)
    try:
        yield Path(tmp)
        with open(tmp, "rb") as fh:
            os.fsync(fh.fileno())
        os.replace(tmp, final)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise


def atomic_write_bytes(path: str | Path, data: bytes) -> None:
    """Write ``data`` to ``path`` via a temporary file and ``os.replace`` (never half-written)."""
    with atomic_file(path) as tmp:
        tmp.write_bytes(data)


def atomic_write_text(path: str | Path, text: str) -> None:
    atomic_write_bytes(path, text.encode("utf-8"))


def atomic_savez(path: str | Path, arrays: Mapping[str, np.ndarray]) -> None:
    """``np.savez`` of ``arrays`` to ``path``, atomically."""
    buf = io.BytesIO()
    np.savez(buf, **{k: np.asarray(v) for k, v in arrays.items()})
    atomic_write_bytes(path, buf.getvalue())


def json_default(x: Any) -> Any:
    if isinstance(x, np.generic):
        return x.item()
    if isinstance(x, np.ndarray):
        return x.tolist()
    if isinstance(x, Path):
        return str(x)
    if isinstance(x, (set, frozenset)):
        return sorted(x)
    raise TypeError(f"not JSON serialisable: {type(x).__name__}")


def write_json(path: str | Path, obj: Any) -> None:
    """``obj`` as indented JSON (numpy scalars and arrays, paths and sets converted), atomically."""
    atomic_write_text(path, json.dumps(obj, indent=2, default=json_default, allow_nan=True) + "\n")


def write_csv(path: str | Path, header: Sequence[str], rows: Iterable[Sequence[Any]]) -> None:
    """``header`` and ``rows`` as CSV (floats written exactly, ``None`` empty), atomically."""
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow(header)
    for r in rows:
        # floats round-trip exactly (repr), so thresholds recomputed from the file agree
        w.writerow(
            ["" if v is None else (repr(float(v)) if isinstance(v, float) else v) for v in r]
        )
    atomic_write_text(path, buf.getvalue())


@contextlib.contextmanager
def atomic_directory(final: str | Path, *, replace: bool = False) -> Iterator[Path]:
    """A temporary sibling directory of ``final`` to fill; when the block ends without an error
    it is renamed to ``final`` (mode 0755), so ``final`` is complete or absent, never partial.
    On an error it is removed. When ``final`` exists by then (built concurrently by another
    process) the new copy is dropped, unless ``replace``: then the old one is swapped out."""
    final = Path(final)
    final.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{final.name}.tmp-", dir=final.parent))
    try:
        yield tmp
        tmp.chmod(0o755)
        if final.exists() and replace:
            old = Path(tempfile.mkdtemp(prefix=f".{final.name}.old-", dir=final.parent))
            old.rmdir()
            final.rename(old)
            tmp.rename(final)
            shutil.rmtree(old, ignore_errors=True)
        elif not final.exists():
            try:
                tmp.rename(final)
            except OSError:  # published concurrently by another process: keep theirs
                pass
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def read_json(path: str | Path) -> Any:
    """Parse a JSON file; a file that is not valid JSON (or UTF-8) raises ValueError naming it."""
    path = Path(path)
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise ValueError(f"{path}: not valid JSON ({exc})") from None


@contextlib.contextmanager
def file_lock(path: Path, waiting: str | None = None) -> Iterator[None]:
    """An exclusive lock on ``path`` (``filelock.FileLock``) for a build that two processes must
    not both do (a lab, a lab's clean reference LM); ``waiting`` is printed to stderr when
    another process holds it, so a second run says why it is idle instead of looking hung."""
    import sys

    from filelock import FileLock, Timeout

    path.parent.mkdir(parents=True, exist_ok=True)
    lock = FileLock(str(path))
    try:
        lock.acquire(timeout=0)
    except Timeout:
        if waiting:
            print(waiting, file=sys.stderr, flush=True)
        lock.acquire()
    try:
        yield
    finally:
        lock.release()
