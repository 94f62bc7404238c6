"""Assemble raw records (:mod:`calibdcd.data.readers`) into a validated :class:`Benchmark`
(:func:`build_benchmark`: every labelled file, local or from the hub, goes through it).

Validation (all problems of a file are reported together, each with file and line):

* missing label, label not 0/1 (see :func:`calibdcd.data.validation.parse_label`),
* empty or non-string text (``on_empty="drop"`` drops empty texts with a warning instead),
* duplicate texts: a :class:`DuplicateTextWarning` with the count and the first few line pairs;
  texts repeated with *different* labels are listed separately. ``dedupe=True`` keeps the first
  occurrence of each text and drops every copy of a text whose labels conflict (there is no way
  to tell which label is right).
"""

from __future__ import annotations

import dataclasses
import warnings
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Literal

from calibdcd.data.readers import Record
from calibdcd.data.types import Benchmark, LoadReport, Sample
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
    "resolve_field",
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
    read = text_of if text_of is not None else (lambda f: f.get(tfield))
    kept, dropped_empty = _labelled_texts(records, read, lfield, label_map, on_empty)
    unit = records[0].location.unit  # "line" for text files, "row" for parquet / the hub
    if dropped_empty:
        warnings.warn(
            f"{source}: dropped {len(dropped_empty)} record(s) with empty text "
            f"({unit} {_line_list(dropped_empty)})",
            UserWarning,
            stacklevel=3,
        )
    dupes = _Duplicates.of(kept)
    if dupes.pairs:
        warnings.warn(dupes.message(source, unit, dedupe), DuplicateTextWarning, stacklevel=3)
    dropped_dupes: list[int] = []
    if dedupe and dupes.pairs:
        kept, dropped_dupes = dupes.dedupe(kept)
    if meta_of is None:
        reserved = {tfield, lfield, ifield}
        meta_of = (
            (lambda f: {k: f.get(k) for k in meta_fields})
            if meta_fields is not None
            else (lambda f: {k: v for k, v in f.items() if k not in reserved})
        )
    samples = _samples(kept, ifield, meta_of, unit)
    if not samples:
        raise DataError(Problem(Location(source, 1), "no usable records"))
    report = LoadReport(
        n_records=len(records),
        duplicates=tuple(dupes.pairs),
        conflicting_duplicates=dupes.conflict_lines,
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


#: a validated record: (the record, its text, its 0/1 label)
_Kept = tuple[Record, str, int]


def _labelled_texts(
    records: Sequence[Record],
    text_of: Callable[[dict[str, Any]], Any],
    lfield: str,
    label_map: Mapping[str, int] | None,
    on_empty: OnEmpty,
) -> tuple[list[_Kept], list[int]]:
    """Each record's checked text and parsed label, and the lines of the records dropped for an
    empty text (``on_empty="drop"``); every problem of the records raised at once."""
    problems: list[Problem] = []
    kept: list[_Kept] = []
    dropped_empty: list[int] = []
    for rec in records:
        f = rec.fields
        bad = False
        try:
            text = check_text(text_of(f))
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
    return kept, dropped_empty


@dataclasses.dataclass(frozen=True)
class _Duplicates:
    """The repeated texts among validated records: ``pairs`` (line, line of its first
    occurrence) per repeat, the texts that occur with both labels and their lines."""

    pairs: list[tuple[int, int]]
    conflicting: set[str]
    conflict_lines: tuple[int, ...]

    @classmethod
    def of(cls, kept: Sequence[_Kept]) -> _Duplicates:
        first: dict[str, int] = {}  # text -> line of its first occurrence
        labels_of: dict[str, set[int]] = {}
        pairs: list[tuple[int, int]] = []
        for rec, text, label in kept:
            labels_of.setdefault(text, set()).add(label)
            if text in first:
                pairs.append((rec.location.line, first[text]))
            else:
                first[text] = rec.location.line
        conflicting = {t for t, ls in labels_of.items() if len(ls) > 1}
        lines = tuple(rec.location.line for rec, t, _ in kept if t in conflicting)
        return cls(pairs, conflicting, lines)

    def message(self, source: str, unit: str, dedupe: bool) -> str:
        """The :class:`DuplicateTextWarning`'s text: the count, the first few pairs, the texts
        with both labels, and what ``dedupe`` does."""
        shown = ", ".join(f"{unit} {a} repeats {unit} {b}" for a, b in self.pairs[:_SHOWN])
        msg = f"{source}: {len(self.pairs)} duplicate text(s) ({shown}"
        msg += ", ...)" if len(self.pairs) > _SHOWN else ")"
        if self.conflicting:
            msg += (
                f"; {len(self.conflicting)} text(s) occur with both labels "
                f"({unit}s {_line_list(self.conflict_lines)})"
            )
        msg += "; dropped (dedupe=True)" if dedupe else "; pass dedupe=True to drop them"
        return msg

    def dedupe(self, kept: Sequence[_Kept]) -> tuple[list[_Kept], list[int]]:
        """The first occurrence of each text whose labels agree; the lines of the others."""
        seen: set[str] = set()
        deduped: list[_Kept] = []
        dropped: list[int] = []
        for rec, text, label in kept:
            if text in self.conflicting or text in seen:
                dropped.append(rec.location.line)
                continue
            seen.add(text)
            deduped.append((rec, text, label))
        return deduped, dropped


def _samples(
    kept: Sequence[_Kept],
    ifield: str | None,
    meta_of: Callable[[dict[str, Any]], dict[str, Any]],
    unit: str,
) -> list[Sample]:
    """One :class:`Sample` per validated record, its id ``record[ifield]`` (else the record's
    position in the source); a missing or repeated id is a problem, all raised at once."""
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
        samples.append(Sample(id=sid, text=text, label=label, meta=meta_of(f)))
    if id_problems:
        raise DataError(id_problems)
    return samples
