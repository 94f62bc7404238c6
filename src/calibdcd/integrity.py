"""File integrity without loading: a safetensors file's header against its size.

A ``.safetensors`` file is an 8-byte little-endian header length ``N``, ``N`` bytes of JSON
(each tensor's dtype, shape and ``data_offsets`` into the data that follows), then the data.
A truncated or damaged file is found by reading the header alone: the file must be exactly
``8 + N + max(end offset)`` bytes and every tensor's byte range must match its dtype and shape.
No tensor is read.
"""

from __future__ import annotations

import json
import math
import struct
from pathlib import Path

__all__ = ["checkpoint_problems", "safetensors_problem"]

_DTYPE_BYTES = {
    "BOOL": 1, "U8": 1, "I8": 1, "F8_E4M3": 1, "F8_E5M2": 1,
    "I16": 2, "U16": 2, "F16": 2, "BF16": 2,
    "I32": 4, "U32": 4, "F32": 4, "I64": 8, "U64": 8, "F64": 8,
}  # fmt: skip
_MAX_HEADER = 100 * 1024 * 1024


def safetensors_problem(path: str | Path) -> str | None:
    """Why the safetensors file at ``path`` is damaged (naming it), or None when its header
    parses and accounts for exactly the file's bytes."""
    p = Path(path)
    try:
        size = p.stat().st_size
        with p.open("rb") as fh:
            head = fh.read(8)
            if len(head) < 8:
                return f"{p}: truncated safetensors file ({size} bytes, no header)"
            (n,) = struct.unpack("<Q", head)
            if n > min(size - 8, _MAX_HEADER):
                return (
                    f"{p}: truncated safetensors file ({size} bytes; header says {n} header bytes)"
                )
            header = json.loads(fh.read(n))
    except OSError as exc:
        return f"{p}: cannot read ({exc.strerror or exc})"
    except (json.JSONDecodeError, UnicodeDecodeError):
        return f"{p}: damaged safetensors header (not valid JSON)"
    if not isinstance(header, dict):
        return f"{p}: damaged safetensors header (not a mapping)"
    end = 0
    for name, info in header.items():
        if name == "__metadata__":
            continue
        try:
            begin, stop = info["data_offsets"]
            want = math.prod(info["shape"]) * _DTYPE_BYTES.get(info["dtype"], 0)
        except (KeyError, TypeError, ValueError):
            return f"{p}: damaged safetensors header (tensor {name!r})"
        if _DTYPE_BYTES.get(info["dtype"]) and stop - begin != want:
            return (
                f"{p}: damaged safetensors header (tensor {name!r} spans {stop - begin} bytes, "
                f"its shape needs {want})"
            )
        end = max(end, stop)
    expected = 8 + n + end
    if size != expected:
        what = "truncated" if size < expected else "damaged"
        return f"{p}: {what} safetensors file ({size} bytes; its header describes {expected})"
    return None


def checkpoint_problems(path: str | Path) -> list[str]:
    """The damaged weight files of a checkpoint (a directory or one file): every
    ``*.safetensors`` in it, and every shard a ``model.safetensors.index.json`` names."""
    p = Path(path)
    if p.is_file():
        return [m for m in [safetensors_problem(p)] if m] if p.suffix == ".safetensors" else []
    if not p.is_dir():
        return []
    out = [m for f in sorted(p.glob("*.safetensors")) if (m := safetensors_problem(f))]
    index = p / "model.safetensors.index.json"
    if index.is_file():
        try:
            shards = set(json.loads(index.read_text()).get("weight_map", {}).values())
        except (OSError, ValueError):
            return [*out, f"{index}: not valid JSON"]
        out += [
            f"{p / s}: missing (named by {index.name})"
            for s in sorted(shards)
            if not (p / s).is_file()
        ]
    return out
