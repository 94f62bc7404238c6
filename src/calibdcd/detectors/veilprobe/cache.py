"""Content-addressed cache keys and small file helpers for VeilProbe artefacts."""

from __future__ import annotations

import hashlib
import json
from typing import Any

from calibdcd.atomic import atomic_write_text  # the project's one (fsyncing) atomic writer

__all__ = ["CACHE_FORMAT", "atomic_write_text", "content_key"]


#: salted into every key: bump when an artefact's recipe changes so stale ones are not reused
#: (2: reproducible tokenizers, see ``tokenization.train_wordpiece``)
CACHE_FORMAT = 2


def content_key(*parts: Any, length: int = 20) -> str:
    """A stable hex key of JSON-serialisable ``parts`` (dataclasses must be passed as dicts)."""
    h = hashlib.sha256()
    h.update(f"veilprobe-cache-{CACHE_FORMAT}\x1e".encode())
    for part in parts:
        h.update(json.dumps(part, sort_keys=True, ensure_ascii=False, default=str).encode("utf-8"))
        h.update(b"\x1e")
    return h.hexdigest()[:length]
