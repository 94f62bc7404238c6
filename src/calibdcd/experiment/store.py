"""On-disk artefacts: content-addressed array and model caches, atomic JSON/CSV writes, hashing."""

from __future__ import annotations

import contextlib
import csv
import hashlib
import json
import os
import pickle
import tempfile
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

__all__ = [
    "ArrayCache",
    "atomic_write_bytes",
    "atomic_write_text",
    "digest",
    "read_json",
    "write_csv",
    "write_json",
]


def digest(*parts: Any) -> str:
    """sha256 of a JSON rendering of ``parts`` (sequences of strings hash their items in order)."""
    h = hashlib.sha256()
    for p in parts:
        if isinstance(p, np.ndarray):
            h.update(repr((p.dtype.str, p.shape)).encode())
            h.update(np.ascontiguousarray(p).tobytes())
        else:
            h.update(json.dumps(p, sort_keys=True, default=str).encode())
        h.update(b"\x00")
    return h.hexdigest()


def atomic_write_bytes(path: Path, data: bytes) -> None:
    """Write ``data`` to ``path`` via a temporary file and ``os.replace`` (never half-written)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise


def atomic_write_text(path: Path, text: str) -> None:
    atomic_write_bytes(path, text.encode("utf-8"))


def _json_default(x: Any) -> Any:
    if isinstance(x, np.generic):
        return x.item()
    if isinstance(x, np.ndarray):
        return x.tolist()
    if isinstance(x, Path):
        return str(x)
    if isinstance(x, (set, frozenset)):
        return sorted(x)
    raise TypeError(f"not JSON serialisable: {type(x).__name__}")


def write_json(path: Path, obj: Any) -> None:
    atomic_write_text(path, json.dumps(obj, indent=2, default=_json_default, allow_nan=True) + "\n")


def read_json(path: Path) -> Any:
    return json.loads(Path(path).read_text(encoding="utf-8"))


def write_csv(path: Path, header: Sequence[str], rows: Iterable[Sequence[Any]]) -> None:
    import io

    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow(header)
    for r in rows:
        # floats round-trip exactly (repr), so thresholds recomputed from the file agree
        w.writerow(
            ["" if v is None else (repr(float(v)) if isinstance(v, float) else v) for v in r]
        )
    atomic_write_text(path, buf.getvalue())


class ArrayCache:
    """Content-addressed ``.npz`` arrays and pickled models under one directory.

    Keys are hex digests (see :func:`digest`) of everything the artefact depends on. Writes are
    atomic, so a crash never leaves a truncated entry; a corrupt entry is treated as a miss.
    """

    def __init__(self, root: str | Path):
        self.root = Path(root)
        self.hits = 0
        self.misses = 0

    def _path(self, kind: str, key: str, ext: str) -> Path:
        return self.root / kind / key[:2] / f"{key}.{ext}"

    def load_arrays(self, kind: str, key: str) -> dict[str, np.ndarray] | None:
        p = self._path(kind, key, "npz")
        if not p.is_file():
            self.misses += 1
            return None
        try:
            with np.load(p, allow_pickle=False) as f:
                out = {k: f[k] for k in f.files}
        except (OSError, ValueError):
            self.misses += 1
            return None
        self.hits += 1
        return out

    def save_arrays(self, kind: str, key: str, arrays: Mapping[str, np.ndarray]) -> None:
        import io

        buf = io.BytesIO()
        np.savez(buf, **{k: np.asarray(v) for k, v in arrays.items()})
        atomic_write_bytes(self._path(kind, key, "npz"), buf.getvalue())

    def load_object(self, kind: str, key: str) -> Any | None:
        p = self._path(kind, key, "pkl")
        if not p.is_file():
            self.misses += 1
            return None
        try:
            with p.open("rb") as fh:
                obj = pickle.load(fh)
        except Exception:
            self.misses += 1
            return None
        self.hits += 1
        return obj

    def save_object(self, kind: str, key: str, obj: Any) -> bool:
        """Pickle ``obj``; returns False (and stores nothing) when it cannot be pickled."""
        try:
            data = pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)
        except Exception:
            return False
        atomic_write_bytes(self._path(kind, key, "pkl"), data)
        return True
