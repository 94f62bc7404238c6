"""One file of texts: a labelled table as a validated :class:`Benchmark` (:func:`load_table`)
or an unlabelled :class:`TextList` (:func:`load_texts`: ``fit``'s members and non-members,
``score``'s suspect texts), both read by the one reader :mod:`calibdcd.data.readers`, so a file
gives the same texts whatever its format.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

from calibdcd.data.assemble import (
    DEFAULT_LABEL_FIELDS,
    DEFAULT_TEXT_FIELDS,
    OnEmpty,
    build_benchmark,
    resolve_field,
)
from calibdcd.data.readers import read_records
from calibdcd.data.types import Benchmark, TextList
from calibdcd.data.validation import DataError, Location, Problem, check_text

__all__ = ["load_table", "load_texts"]


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
