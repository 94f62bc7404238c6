"""Read raw records (dicts) from jsonl / json / csv / tsv / parquet files, with their locations;
and, for lists of texts only (``calibdcd fit``'s members, ``score``'s suspect texts, a lab's or
VeilProbe's pool), ``.txt``: one text per line, as the record ``{"text": line}``, and JSON
strings as texts.

This is the one reader of every text input: benchmarks, fit texts, suspect texts and pools. A
file is read by its name's suffix (``.gz`` allowed except for parquet); an unknown suffix is an
error naming the supported ones, never raw lines by default.

Readers do not interpret fields; they only report structural problems (a line that is not valid
JSON, a JSON value that is not an object, a CSV row with the wrong number of fields). All such
problems of a file are collected and raised together as one :class:`DataError`.
"""

from __future__ import annotations

import csv
import dataclasses
import gzip
import io
import json
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from calibdcd.data.validation import DataError, Location, Problem

__all__ = ["SUPPORTED_SUFFIXES", "TEXT_LIST_SUFFIXES", "Record", "file_format", "read_records"]

SUPPORTED_SUFFIXES = (".jsonl", ".ndjson", ".json", ".csv", ".tsv", ".parquet")
#: a list of texts may also be plain text, one per line (never a benchmark: it has no labels)
TEXT_LIST_SUFFIXES = (*SUPPORTED_SUFFIXES, ".txt")

# Some benchmark texts (BookMIA snippets, full papers) exceed csv's default 128 KiB field limit.
csv.field_size_limit(2**31 - 1)


@dataclasses.dataclass(frozen=True)
class Record:
    location: Location
    #: 0-based position of the record among the file's records (header excluded)
    index: int
    fields: dict[str, Any]


def file_format(path: Path, *, text_list: bool = False) -> tuple[str, bool]:
    """``(format, gzipped)`` from the file name, e.g. ``("jsonl", True)`` for ``x.jsonl.gz``;
    ``text_list``: a list of texts, which may also be ``.txt`` (one text per line)."""
    name = path.name.lower()
    gz = name.endswith(".gz")
    if gz:
        name = name[:-3]
    suffixes = TEXT_LIST_SUFFIXES if text_list else SUPPORTED_SUFFIXES
    for suffix in suffixes:
        if name.endswith(suffix):
            fmt = suffix[1:]
            return ("jsonl" if fmt == "ndjson" else fmt), gz
    raise ValueError(
        f"{path}: unsupported file type; expected one of "
        f"{', '.join(suffixes)} (optionally .gz, except parquet)"
    )


def _open_text(path: Path, gz: bool) -> io.TextIOBase:
    # utf-8-sig drops a byte-order mark (arXivTection.csv starts with one)
    if gz:
        return io.TextIOWrapper(gzip.open(path, "rb"), encoding="utf-8-sig", newline="")
    return open(path, encoding="utf-8-sig", newline="")


def _read_jsonl(
    path: Path, gz: bool, text_list: bool = False
) -> tuple[list[Record], list[Problem], list[str]]:
    records: list[Record] = []
    problems: list[Problem] = []
    columns: list[str] = []
    # positions count every non-blank line, valid or not, so ids stay stable after a fix
    position = -1
    with _open_text(path, gz) as fh:
        for lineno, raw in enumerate(fh, start=1):
            if not raw.strip():
                continue  # blank lines (e.g. a trailing newline) are not records
            position += 1
            loc = Location(str(path), lineno)
            try:
                obj = json.loads(raw)
            except json.JSONDecodeError as e:
                problems.append(Problem(loc, f"bad JSON line ({e.msg} at column {e.colno})"))
                continue
            if text_list and isinstance(obj, str):
                obj = {"text": obj}  # a list of texts may hold the texts themselves
            if not isinstance(obj, dict):
                expected = "an object or a string" if text_list else "an object"
                problems.append(
                    Problem(loc, f"JSON line is a {type(obj).__name__}, expected {expected}")
                )
                continue
            if not columns:
                columns = list(obj)
            records.append(Record(loc, position, obj))
    return records, problems, columns


def jsonl_columns(path: str | Path) -> list[str] | None:
    """The columns of a JSON-lines file (``.jsonl``/``.ndjson``, gzipped or not) as
    :func:`read_records` names them, its first object's keys (blank lines and a byte-order mark
    skipped), reading no further than that object; None for another format, a file that cannot
    be read or one without an object (reading it says why)."""
    path = Path(path)
    try:
        fmt, gz = file_format(path)
    except ValueError:
        return None
    if fmt != "jsonl" or not path.is_file():
        return None
    try:
        with _open_text(path, gz) as fh:
            for raw in fh:
                if not raw.strip():
                    continue
                try:
                    obj = json.loads(raw)
                except json.JSONDecodeError:
                    continue
                if isinstance(obj, dict):
                    return list(obj)
    except (OSError, EOFError, UnicodeDecodeError):
        return None
    return None


def _read_txt(path: Path, gz: bool) -> tuple[list[Record], list[Problem], list[str]]:
    """One text per line (the line without its end), blank lines skipped."""
    records: list[Record] = []
    with _open_text(path, gz) as fh:
        for lineno, raw in enumerate(fh, start=1):
            line = raw.rstrip("\r\n")
            if not line.strip():
                continue
            records.append(Record(Location(str(path), lineno), len(records), {"text": line}))
    return records, [], ["text"]


def _read_json(
    path: Path, gz: bool, text_list: bool = False
) -> tuple[list[Record], list[Problem], list[str]]:
    with _open_text(path, gz) as fh:
        text = fh.read()
    try:
        obj = json.loads(text)
    except json.JSONDecodeError as e:
        raise DataError(Problem(Location(str(path), e.lineno), f"bad JSON ({e.msg})")) from None
    if isinstance(obj, dict) and isinstance(obj.get("data"), list):
        obj = obj["data"]
    if not isinstance(obj, list):
        raise DataError(
            Problem(Location(str(path), 1), "expected a JSON array of objects (or {'data': [...]})")
        )
    records, problems = [], []
    columns: list[str] = []
    for i, item in enumerate(obj):
        loc = Location(str(path), i + 1, unit="item")
        if text_list and isinstance(item, str):
            item = {"text": item}
        if not isinstance(item, dict):
            expected = "an object or a string" if text_list else "an object"
            problems.append(Problem(loc, f"item is a {type(item).__name__}, expected {expected}"))
            continue
        if not columns:
            columns = list(item)
        records.append(Record(loc, i, item))
    return records, problems, columns


def _read_csv(
    path: Path, gz: bool, delimiter: str
) -> tuple[list[Record], list[Problem], list[str]]:
    records: list[Record] = []
    problems: list[Problem] = []
    with _open_text(path, gz) as fh:
        reader = csv.reader(fh, delimiter=delimiter)
        try:
            header = next(reader)
        except StopIteration:
            raise DataError(Problem(Location(str(path), 1), "empty file (no header)")) from None
        except csv.Error as e:
            raise DataError(Problem(Location(str(path), 1), f"bad CSV header ({e})")) from None
        header = [h.strip() for h in header]
        dupes = {h for h in header if header.count(h) > 1}
        if dupes:
            raise DataError(
                Problem(Location(str(path), 1), f"header repeats column(s) {sorted(dupes)}")
            )
        index = 0
        while True:
            start = reader.line_num + 1  # a quoted field may span several physical lines
            try:
                row = next(reader)
            except StopIteration:
                break
            except csv.Error as e:
                problems.append(Problem(Location(str(path), start), f"bad CSV row ({e})"))
                break  # the reader cannot resynchronise reliably after a quoting error
            if not row or (len(row) == 1 and not row[0].strip()):
                continue  # blank line
            loc = Location(str(path), start)
            if len(row) != len(header):
                problems.append(
                    Problem(loc, f"row has {len(row)} fields but the header has {len(header)}")
                )
                index += 1
                continue
            records.append(Record(loc, index, dict(zip(header, row, strict=True))))
            index += 1
    return records, problems, header


def _read_parquet(path: Path) -> tuple[list[Record], list[Problem], list[str]]:
    try:
        import pyarrow.parquet as pq
    except ImportError as e:  # pragma: no cover - depends on the environment
        raise ImportError(
            f"reading {path} needs pyarrow: pip install 'calibdcd[data]' (or pyarrow)"
        ) from e
    table = pq.read_table(path)
    columns = list(table.column_names)
    records = [
        Record(Location(str(path), i + 1, unit="row"), i, row)
        for i, row in enumerate(table.to_pylist())
    ]
    return records, [], columns


def read_records(path: str | Path, *, text_list: bool = False) -> tuple[list[Record], list[str]]:
    """All records of ``path`` and its column names (CSV header / first object's keys);
    ``text_list``: the file is a list of texts, so ``.txt`` (one text per line) is read too,
    and a JSON string in a .jsonl line or a .json array is the record ``{"text": string}``.

    Raises :class:`DataError` listing every structural problem of the file.
    """
    path = Path(path)
    if path.is_dir():
        raise IsADirectoryError(f"{path}: is a directory, expected a file")
    if not path.is_file():
        raise FileNotFoundError(f"{path}: no such file")
    fmt, gz = file_format(path, text_list=text_list)
    try:
        if fmt == "txt":
            records, problems, columns = _read_txt(path, gz)
        elif fmt == "jsonl":
            records, problems, columns = _read_jsonl(path, gz, text_list)
        elif fmt == "json":
            records, problems, columns = _read_json(path, gz, text_list)
        elif fmt in ("csv", "tsv"):
            records, problems, columns = _read_csv(path, gz, "," if fmt == "csv" else "\t")
    except UnicodeDecodeError:
        raise DataError(_utf8_problem(path, gz)) from None
    if fmt == "parquet":
        if gz:
            raise ValueError(f"{path}: gzipped parquet is not supported (parquet is compressed)")
        records, problems, columns = _read_parquet(path)
    if problems:
        raise DataError(problems)
    return records, columns


def _utf8_problem(path: Path, gz: bool) -> Problem:
    """Where a text file stops being UTF-8: its line and column."""
    if gz:
        with gzip.open(path, "rb") as fh:
            data = fh.read()
    else:
        data = path.read_bytes()
    try:
        data.decode("utf-8-sig")
    except UnicodeDecodeError as e:
        start = e.start + (3 if data.startswith(b"\xef\xbb\xbf") else 0)
        line = data.count(b"\n", 0, start) + 1
        col = start - (data.rfind(b"\n", 0, start) + 1) + 1
        bad = data[start : start + 1].hex()
        return Problem(
            Location(str(path), line),
            f"not valid UTF-8 (byte 0x{bad} at column {col}); re-encode the file as UTF-8",
        )
    return Problem(Location(str(path), 1), "not valid UTF-8")  # pragma: no cover


def rows_as_records(rows: Iterable[dict[str, Any]], source: str) -> tuple[list[Record], list[str]]:
    """Wrap in-memory rows (e.g. from the Hugging Face hub) as records located by 1-based row."""
    records = [Record(Location(source, i + 1, unit="row"), i, dict(r)) for i, r in enumerate(rows)]
    columns = list(records[0].fields) if records else []
    return records, columns
