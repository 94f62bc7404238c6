"""Turn raw records into a validated :class:`Benchmark` (:func:`load_table` for any labelled
file) or into an unlabelled :class:`TextList` (:func:`load_texts`: ``fit``'s members and
non-members, ``score``'s suspect texts), both from the one reader :mod:`calibdcd.data.readers`.

Validation (all problems of a file are reported together, each with file and line):

* missing label, label not 0/1 (see :func:`calibdcd.data.validation.parse_label`),
* empty or non-string text (``on_empty="drop"`` drops empty texts with a warning instead),
* duplicate texts: a :class:`DuplicateTextWarning` with the count and the first few line pairs;
  texts repeated with *different* labels are listed separately. ``dedupe=True`` keeps the first
  occurrence of each text and drops every copy of a text whose labels conflict (there is no way
  to tell which label is right).
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, Literal

from calibdcd.data.readers import Record, read_records
from calibdcd.data.types import Benchmark, LoadReport, Sample, TextList
from calibdcd.data.validation import (
    DataError,
    DuplicateTextWarning,
    Location,
    Problem,
    check_text,
    parse_label,
)

__all__ = [
    "DEFAULT_LABEL_FIELDS",
    "DEFAULT_TEXT_FIELDS",
    "build_benchmark",
    "load_table",
    "load_texts",
]

#: column names tried, in order, when no text / label column is given
DEFAULT_TEXT_FIELDS = ("text", "input", "snippet")
DEFAULT_LABEL_FIELDS = ("label", "Label")

OnEmpty = Literal["error", "drop"]
_SHOWN = 5


def resolve_field(
    columns: Sequence[str], wanted: str | Sequence[str], what: str, source: str
) -> str:
    """The first of ``wanted`` present in ``columns`` (exact match first, then any case)."""
    candidates = [wanted] if isinstance(wanted, str) else list(wanted)
    for c in candidates:
        if c in columns:
            return c
    lower = {col.lower(): col for col in columns}
    for c in candidates:
        if c.lower() in lower:
            return lower[c.lower()]
    raise DataError(
        Problem(
            Location(source, 1),
            f"no {what} column: looked for {candidates}, the file has {list(columns)}",
        )
    )


def _line_list(lines: Sequence[int]) -> str:
    shown = ", ".join(str(x) for x in lines[:_SHOWN])
    return shown + (f", ... ({len(lines)} in all)" if len(lines) > _SHOWN else "")


def build_benchmark(
    records: Sequence[Record],
    columns: Sequence[str],
    *,
    name: str,
    source: str,
    text_field: str | Sequence[str] = DEFAULT_TEXT_FIELDS,
    label_field: str | Sequence[str] = DEFAULT_LABEL_FIELDS,
    id_field: str | None = None,
    meta_fields: Sequence[str] | None = None,
    label_map: Mapping[str, int] | None = None,
    on_empty: OnEmpty = "error",
    dedupe: bool = False,
    default_length: int = 128,
    subset: str | None = None,
    text_of: Callable[[dict[str, Any]], Any] | None = None,
    meta_of: Callable[[dict[str, Any]], dict[str, Any]] | None = None,
    n_filtered: int = 0,
) -> Benchmark:
    """Validate ``records`` and build a :class:`Benchmark`.

    ``text_of`` / ``meta_of`` override how the text and the meta data are taken from a record
    (used by the DE-COP-format loaders); by default the text is ``record[text_field]`` and the
    meta data are ``meta_fields`` (``None`` = every column except text, label and id).
    Sample ids are ``record[id_field]`` or the record's 0-based position in the source.
    """
    if on_empty not in ("error", "drop"):
        raise ValueError(f"on_empty must be 'error' or 'drop', got {on_empty!r}")
    if not records:
        raise DataError(Problem(Location(source, 1), "no records"))
    tfield = None if text_of is not None else resolve_field(columns, text_field, "text", source)
    lfield = resolve_field(columns, label_field, "label", source)
    ifield = resolve_field(columns, id_field, "id", source) if id_field is not None else None

    problems: list[Problem] = []
    kept: list[tuple[Record, str, int]] = []
    dropped_empty: list[int] = []
    for rec in records:
        f = rec.fields
        bad = False
        try:
            raw_text = text_of(f) if text_of is not None else f.get(tfield)
            text = check_text(raw_text)
        except ValueError as e:
            if on_empty == "drop" and str(e).startswith("empty text"):
                dropped_empty.append(rec.location.line)
            else:
                problems.append(Problem(rec.location, str(e)))
                bad = True
            text = None
        try:
            label = parse_label(f.get(lfield), label_map=label_map)
        except ValueError as e:
            problems.append(Problem(rec.location, str(e)))
            bad = True
        if bad or text is None:
            continue
        kept.append((rec, text, label))
    if problems:
        raise DataError(problems)
    unit = records[0].location.unit  # "line" for text files, "row" for parquet / the hub
    if dropped_empty:
        warnings.warn(
            f"{source}: dropped {len(dropped_empty)} record(s) with empty text "
            f"({unit} {_line_list(dropped_empty)})",
            UserWarning,
            stacklevel=3,
        )

    # duplicates --------------------------------------------------------------------------
    first: dict[str, tuple[int, int]] = {}  # text -> (line, label) of its first occurrence
    labels_of: dict[str, set[int]] = {}
    duplicates: list[tuple[int, int]] = []
    for rec, text, label in kept:
        labels_of.setdefault(text, set()).add(label)
        if text in first:
            duplicates.append((rec.location.line, first[text][0]))
        else:
            first[text] = (rec.location.line, label)
    conflicting = {t for t, ls in labels_of.items() if len(ls) > 1}
    conflict_lines = tuple(rec.location.line for rec, t, _ in kept if t in conflicting)
    dropped_dupes: list[int] = []
    if duplicates:
        pairs = ", ".join(f"{unit} {a} repeats {unit} {b}" for a, b in duplicates[:_SHOWN])
        msg = f"{source}: {len(duplicates)} duplicate text(s) ({pairs}"
        msg += ", ...)" if len(duplicates) > _SHOWN else ")"
        if conflicting:
            msg += (
                f"; {len(conflicting)} text(s) occur with both labels "
                f"({unit}s {_line_list(conflict_lines)})"
            )
        msg += "; dropped (dedupe=True)" if dedupe else "; pass dedupe=True to drop them"
        warnings.warn(msg, DuplicateTextWarning, stacklevel=3)
    if dedupe and duplicates:
        seen: set[str] = set()
        deduped = []
        for rec, text, label in kept:
            if text in conflicting or text in seen:
                dropped_dupes.append(rec.location.line)
                continue
            seen.add(text)
            deduped.append((rec, text, label))
        kept = deduped

    # samples -----------------------------------------------------------------------------
    reserved = {tfield, lfield, ifield}
    samples = []
    id_problems: list[Problem] = []
    ids_seen: dict[str, int] = {}
    for rec, text, label in kept:
        f = rec.fields
        if ifield is not None:
            raw_id = f.get(ifield)
            if raw_id is None or not str(raw_id).strip():
                id_problems.append(Problem(rec.location, f"missing id ({ifield!r})"))
                continue
            sid = str(raw_id).strip()
        else:
            sid = str(rec.index)
        if sid in ids_seen:
            id_problems.append(
                Problem(rec.location, f"id {sid!r} already used on {unit} {ids_seen[sid]}")
            )
            continue
        ids_seen[sid] = rec.location.line
        if meta_of is not None:
            meta = meta_of(f)
        elif meta_fields is not None:
            meta = {k: f.get(k) for k in meta_fields}
        else:
            meta = {k: v for k, v in f.items() if k not in reserved}
        samples.append(Sample(id=sid, text=text, label=label, meta=meta))
    if id_problems:
        raise DataError(id_problems)
    if not samples:
        raise DataError(Problem(Location(source, 1), "no usable records"))

    report = LoadReport(
        n_records=len(records),
        duplicates=tuple(duplicates),
        conflicting_duplicates=conflict_lines,
        dropped_empty=tuple(dropped_empty),
        dropped_duplicates=tuple(dropped_dupes),
        n_filtered=n_filtered,
    )
    return Benchmark(
        name=name,
        samples=tuple(samples),
        source=source,
        default_length=default_length,
        subset=subset,
        report=report,
    )


def load_table(
    path: str | Path,
    *,
    text_field: str | Sequence[str] = DEFAULT_TEXT_FIELDS,
    label_field: str | Sequence[str] = DEFAULT_LABEL_FIELDS,
    id_field: str | None = None,
    meta_fields: Sequence[str] | None = None,
    label_map: Mapping[str, int] | None = None,
    name: str | None = None,
    on_empty: OnEmpty = "error",
    dedupe: bool = False,
    default_length: int = 128,
) -> Benchmark:
    """Load any jsonl / json / csv / tsv / parquet file (``.gz`` allowed except for parquet)
    with a text column and a 0/1 label column (1 = member).

    ``text_field`` / ``label_field`` may be one name or a list of candidates (the first present
    wins; default ``text``/``input``/``snippet`` and ``label``/``Label``). ``name`` defaults to
    the file stem.
    """
    path = Path(path)
    records, columns = read_records(path)
    return build_benchmark(
        records,
        columns,
        name=name or path.name.split(".")[0],
        source=str(path),
        text_field=text_field,
        label_field=label_field,
        id_field=id_field,
        meta_fields=meta_fields,
        label_map=label_map,
        on_empty=on_empty,
        dedupe=dedupe,
        default_length=default_length,
    )


def load_texts(
    path: str | Path,
    *,
    text_field: str | Sequence[str] = DEFAULT_TEXT_FIELDS,
    id_field: str | None = None,
) -> TextList:
    """An unlabelled list of texts from any jsonl / json / csv / tsv / parquet file, or a
    ``.txt`` file (one text per line), ``.gz`` allowed except for parquet; read by the reader
    benchmarks use, so a file gives the same texts whatever its format.

    ``text_field``: the text column (one name or candidates, as :func:`load_table`);
    ``id_field``: the id column (default: ``id`` when the file has one, else no ids). Every
    problem of the file (a missing or empty text, a repeated id) is raised at once as one
    :class:`DataError` naming file and line.
    """
    path = Path(path)
    records, columns = read_records(path, text_list=True)
    source = str(path)
    if not records:
        raise DataError(Problem(Location(source, 1), "no texts (empty file, or only blank lines)"))
    tfield = resolve_field(columns, text_field, "text", source)
    if id_field is not None:
        ifield: str | None = resolve_field(columns, id_field, "id", source)
    else:
        ifield = "id" if "id" in columns else None
    problems: list[Problem] = []
    texts: list[str] = []
    ids: list[str | None] = []
    lines: list[int] = []
    ids_seen: dict[str, int] = {}
    for rec in records:
        try:
            text = check_text(rec.fields.get(tfield))
        except ValueError as e:
            problems.append(Problem(rec.location, f"{tfield!r}: {e}"))
            continue
        sid = None
        if ifield is not None and rec.fields.get(ifield) is not None:
            sid = str(rec.fields[ifield]).strip() or None
            if sid is not None and sid in ids_seen:
                problems.append(
                    Problem(rec.location, f"id {sid!r} already used on {rec.location.unit} "
                            f"{ids_seen[sid]}")
                )  # fmt: skip
                continue
            if sid is not None:
                ids_seen[sid] = rec.location.line
        texts.append(text)
        ids.append(sid)
        lines.append(rec.location.line)
    if problems:
        raise DataError(problems)
    return TextList(
        source=source, texts=tuple(texts), ids=tuple(ids), lines=tuple(lines),
        unit=records[0].location.unit,
    )  # fmt: skip
