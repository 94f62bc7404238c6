"""Fitted objects stored without pickle: arrays plus a JSON header in one ``.npz``.

A :class:`Persistable` object has ``state()`` (name -> ndarray, JSON-able meta) and
``from_state(arrays, meta)``. :func:`pack_state` writes the arrays and a ``__header__`` (format
version, class, meta); :func:`unpack_state` reads it with ``allow_pickle=False`` and rebuilds the
class it is given (which must be the recorded one). Used by the experiment's model cache
(:class:`calibdcd.experiment.caches.ArrayCache`) and the fitted-detector bundles.

:func:`read_cached_arrays` is the one reader of a cached ``.npz`` of arrays (the experiment's
feature cache, VeilProbe's features): a file that cannot be read is a miss with
:func:`cache_miss_warning`, never an error.
"""

from __future__ import annotations

import json
import warnings
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Protocol, TypeVar, runtime_checkable

import numpy as np

from calibdcd.atomic import json_default

__all__ = [
    "MODEL_FORMAT",
    "Persistable",
    "cache_miss_warning",
    "class_name",
    "json_default",
    "pack_state",
    "read_cached_arrays",
    "unpack_state",
]


#: version of the cached-model file layout (``__header__`` JSON + arrays in one ``.npz``)
MODEL_FORMAT = 1


@runtime_checkable
class Persistable(Protocol):
    """A fitted object that can be stored without pickle: ``state()`` returns its arrays (name ->
    ndarray) and a JSON-able meta dict; ``from_state(arrays, meta)`` rebuilds it."""

    def state(self) -> tuple[dict[str, np.ndarray], dict[str, Any]]: ...

    @classmethod
    def from_state(cls, arrays: Mapping[str, np.ndarray], meta: Mapping[str, Any]) -> Any: ...


P = TypeVar("P")


def class_name(cls: type) -> str:
    return f"{cls.__module__}.{cls.__qualname__}"


def pack_state(obj: Persistable) -> bytes:
    """``obj``'s state as the bytes of one ``.npz``: its arrays and a JSON ``__header__``."""
    import io

    arrays, meta = obj.state()
    if "__header__" in arrays:
        raise ValueError("'__header__' is reserved")
    header = {"format": MODEL_FORMAT, "class": class_name(type(obj)), "meta": meta}
    raw = json.dumps(header, sort_keys=True, default=json_default).encode("utf-8")
    buf = io.BytesIO()
    np.savez(
        buf,
        __header__=np.frombuffer(raw, dtype=np.uint8),
        **{k: np.asarray(v) for k, v in arrays.items()},
    )
    return buf.getvalue()


def unpack_state(path: Path, cls: type[P]) -> P:
    """Rebuild a ``cls`` saved by :func:`pack_state` (no pickle; the class must match)."""
    with np.load(path, allow_pickle=False) as f:
        arrays = {k: f[k] for k in f.files}
    if "__header__" not in arrays:
        raise ValueError("no __header__ (not a calibdcd model file)")
    header = json.loads(arrays.pop("__header__").tobytes().decode("utf-8"))
    if header.get("format") != MODEL_FORMAT:
        raise ValueError(f"model format {header.get('format')!r}, this code reads {MODEL_FORMAT}")
    if header.get("class") != class_name(cls):
        raise ValueError(f"holds a {header.get('class')!r}, expected {class_name(cls)!r}")
    return cls.from_state(arrays, header["meta"])  # type: ignore[attr-defined]


def cache_miss_warning(path: Path, exc: BaseException) -> None:
    """The one warning for a cache entry that exists but cannot be read (it is recomputed)."""
    warnings.warn(
        f"{path}: corrupt cache entry ignored, recomputing ({type(exc).__name__}: {exc})",
        RuntimeWarning,
        stacklevel=3,
    )


def read_cached_arrays(path: Path, require: Sequence[str] = ()) -> dict[str, np.ndarray] | None:
    """The arrays of the cached ``.npz`` at ``path``, or None: when it is absent, and (with
    :func:`cache_miss_warning`) when it cannot be read (truncated, edited by hand, pickled
    content) or lacks an array named in ``require``."""
    if not path.is_file():
        return None
    try:
        with np.load(path, allow_pickle=False) as f:
            out = {k: f[k] for k in f.files}
        lacking = [k for k in require if k not in out]
        if lacking:
            raise ValueError(f"no array {', '.join(map(repr, lacking))} in the file")
    except Exception as exc:  # BadZipFile, zlib/EOF errors, pickled content, ...
        cache_miss_warning(path, exc)
        return None
    return out
