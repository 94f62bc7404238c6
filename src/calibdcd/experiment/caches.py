"""The feature and model caches: content-addressed ``.npz`` arrays and models under the run's
cache root, keyed by :func:`calibdcd.keys.digest` of everything an entry depends on.

Nothing here unpickles: cached models are ``.npz`` files of arrays plus a JSON header (format
version, class, JSON-able meta), loaded with ``allow_pickle=False`` and rebuilt by the class's own
``from_state``. A cache entry that cannot be read is a miss with a warning naming the file.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, TypeVar

import numpy as np

from calibdcd.atomic import atomic_savez, atomic_write_bytes
from calibdcd.persist import (
    Persistable,
    cache_miss_warning,
    pack_state,
    read_cached_arrays,
    unpack_state,
)

__all__ = ["ArrayCache", "cache_miss_warning"]


P = TypeVar("P")


class ArrayCache:
    """Content-addressed ``.npz`` arrays and models (``state()`` + JSON header, no pickle) under
    one directory.

    Keys are hex digests (see :func:`digest`) of everything the artefact depends on. Writes are
    atomic, so a crash never leaves a truncated entry; a corrupt entry (e.g. truncated by a full
    disk or edited by hand) is a miss with a warning naming the file.
    """

    def __init__(self, root: str | Path):
        self.root = Path(root)
        self.hits = 0
        self.misses = 0

    def _path(self, kind: str, key: str, ext: str) -> Path:
        return self.root / kind / key[:2] / f"{key}.{ext}"

    def load_arrays(
        self, kind: str, key: str, require: Sequence[str] = ()
    ) -> dict[str, np.ndarray] | None:
        """The arrays stored under ``key``, else None (a miss); an unreadable file or one
        without every ``require``d array is a miss with a warning naming the file."""
        out = read_cached_arrays(self._path(kind, key, "npz"), require)
        if out is None:
            self.misses += 1
        else:
            self.hits += 1
        return out

    def save_arrays(self, kind: str, key: str, arrays: Mapping[str, np.ndarray]) -> None:
        atomic_savez(self._path(kind, key, "npz"), arrays)

    def load_model(self, kind: str, key: str, cls: type[P]) -> P | None:
        """The cached ``cls`` under ``key`` (rebuilt with ``cls.from_state``), else None."""
        p = self._path(kind, key, "model.npz")
        if not p.is_file():
            self.misses += 1
            return None
        try:
            obj = unpack_state(p, cls)
        except Exception as exc:
            cache_miss_warning(p, exc)
            self.misses += 1
            return None
        self.hits += 1
        return obj

    def save_model(self, kind: str, key: str, obj: Any) -> bool:
        """Store ``obj``'s ``state()``; returns False (and stores nothing) when it has none."""
        if not isinstance(obj, Persistable):
            return False
        atomic_write_bytes(self._path(kind, key, "model.npz"), pack_state(obj))
        return True
