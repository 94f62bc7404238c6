"""Content-addressed cache keys and small file helpers for VeilProbe artefacts."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from calibdcd.atomic import atomic_directory, atomic_write_text, file_lock

__all__ = ["CACHE_FORMAT", "atomic_write_text", "build_once", "content_key"]


#: salted into every key: bump when an artefact's recipe changes so stale ones are not reused
#: (2: reproducible tokenizers, see ``tokenization.train_wordpiece``)
CACHE_FORMAT = 2


def build_once(
    path: Path, marker: str, build: Callable[[Path], None], *, waiting: str | None = None
) -> Path:
    """``path``, a cached artefact directory complete when it holds ``marker``: when it does
    not, ``build(tmp)`` fills a temporary sibling under a lock beside it and the sibling is
    renamed into place (:func:`calibdcd.atomic.atomic_directory`). A crash leaves no
    half-written directory, a second process waits for the first's build (``waiting`` says so)
    instead of writing into it, and a leftover without its marker is replaced."""
    if (path / marker).exists():
        return path
    with file_lock(path.parent / f"{path.name}.lock", waiting=waiting):
        if not (path / marker).exists():  # built meanwhile by the process we waited for
            with atomic_directory(path, replace=True) as tmp:
                build(tmp)
    return path


def content_key(*parts: Any, length: int = 20) -> str:
    """A stable hex key of JSON-serialisable ``parts`` (dataclasses must be passed as dicts)."""
    h = hashlib.sha256()
    h.update(f"veilprobe-cache-{CACHE_FORMAT}\x1e".encode())
    for part in parts:
        h.update(json.dumps(part, sort_keys=True, ensure_ascii=False, default=str).encode("utf-8"))
        h.update(b"\x1e")
    return h.hexdigest()[:length]
