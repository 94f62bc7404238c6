"""Benchmarks from config entries: a named benchmark, a local file (a lab's ground truth
included) or a hub dataset, loaded through :mod:`calibdcd.data`."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from calibdcd.experiment.config import BenchmarkEntry
from calibdcd.experiment.labs import resolve_lab

__all__ = [
    "entry_benchmark_name",
    "entry_id_field",
    "entry_path",
    "load_benchmark_entry",
    "load_benchmark_file",
]


def entry_benchmark_name(entry: BenchmarkEntry) -> str:
    """The name :func:`load_benchmark_entry` gives ``entry``'s benchmark, nothing read (a lab's
    ground truth need not be built): what the run's plan configures its detectors for."""
    from calibdcd.data.benchmarks import benchmark_name

    if entry.hub is not None:
        return entry.name
    path = entry.path if entry.lab is None else (entry.path or "ground_truth.jsonl")
    return benchmark_name(entry.name, path)


def entry_path(
    entry: BenchmarkEntry,
    *,
    build_lab: bool = True,
    root: str | Path | None = None,
    progress: bool = True,
) -> str | None:
    """The file ``entry``'s benchmark is read from: a path inside its lab (built on first use
    when ``build_lab``, under the cache root ``root``; None while it is not built), its
    ``path``, or None for a hub dataset or a named benchmark read from its known source."""
    if entry.lab is None:
        return entry.path
    lab = resolve_lab(entry.lab, build=build_lab, root=root, progress=progress)
    return None if lab is None else str(lab / (entry.path or "ground_truth.jsonl"))


def load_benchmark_entry(
    entry: BenchmarkEntry,
    *,
    build_lab: bool = True,
    root: str | Path | None = None,
    progress: bool = True,
) -> Any:
    """``entry``'s benchmark, its file and id field resolved here (:func:`entry_path`,
    :func:`entry_id_field`: what a run's plan resolves)."""
    path = entry_path(entry, build_lab=build_lab, root=root, progress=progress)
    if entry.lab is not None and path is None:
        raise FileNotFoundError(f"lab {entry.lab!r} is not built yet")
    return load_benchmark_file(entry, path, entry_id_field(entry, path))


def entry_id_field(entry: BenchmarkEntry, path: str | None) -> str | None:
    """The column ``entry``'s texts take their ids from: the entry's ``id_field``; for a file
    that is not a known benchmark's, ``id`` when its first JSON line has one (the lab's ground
    truth keeps its ids); else None (the reader's own rule)."""
    from calibdcd.data import benchmark_spec

    if entry.id_field is not None or entry.hub is not None:
        return entry.id_field
    if benchmark_spec(entry.name) is None and path:
        return _guess_id_field(path)
    return None


def load_benchmark_file(entry: BenchmarkEntry, path: str | None, id_field: str | None) -> Any:
    """``entry``'s benchmark read from ``path`` with its ids from ``id_field`` (as a run's plan
    resolved them: :func:`entry_path`, :func:`entry_id_field`) or, for a hub dataset, from the
    hub."""
    from calibdcd.data import load_benchmark

    if entry.hub is not None:
        from calibdcd.data.benchmarks import load_hub_benchmark

        return load_hub_benchmark(
            entry.hub, name=entry.name, config=entry.config, split=entry.split,
            revision=entry.revision, text_field=entry.text_field, label_field=entry.label_field,
            id_field=entry.id_field, dedupe=entry.dedupe,
            pair_fields=(
                (entry.member_field, entry.nonmember_field)
                if entry.member_field and entry.nonmember_field else None
            ),
        )  # fmt: skip
    kw: dict[str, Any] = {"path": path, "split": entry.split, "dedupe": entry.dedupe}
    if entry.text_field:
        kw["text_field"] = entry.text_field
    if entry.label_field:
        kw["label_field"] = entry.label_field
    if id_field:
        kw["id_field"] = id_field
    return load_benchmark(entry.name, **kw)


def _guess_id_field(path: str) -> str | None:
    """Generic JSON-lines files with an ``id`` column (the lab's ground truth) keep their ids:
    the columns as the one reader names them (:func:`calibdcd.data.readers.jsonl_columns`:
    ``.jsonl``, ``.ndjson``, gzipped, a byte-order mark or leading blank lines alike)."""
    from calibdcd.data.readers import jsonl_columns

    columns = jsonl_columns(path)
    return "id" if columns is not None and "id" in columns else None
