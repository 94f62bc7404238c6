"""The known DCD benchmarks and :func:`load_benchmark`, the single entry point for loading data.

Each benchmark loads from a local file or directory (``path=...``) or, when no path is given,
from its Hugging Face hub dataset's snapshot in the local hub cache, downloaded there first when
absent (:func:`calibdcd.data.hub.dataset_snapshot`; network access once, offline after).

File formats and label conventions (1 = member everywhere; see ``shared/data/*/SOURCE.md``):

* ``wikimia`` (hub ``swj0419/WikiMIA``): ``WikiMIA_length{32,64,128,256}.{jsonl,csv,parquet}``,
  text ``input`` (or ``text``), ``label``. The subset is the length.
* ``wikimia-24`` (hub ``wjfu99/WikiMIA-24``): ``WikiMIA-24_length{32,64,128,256}.jsonl``, same
  fields. Repeats texts (use ``dedupe=True``).
* ``bookmia`` (hub ``swj0419/BookMIA``): ``BookMIA*.jsonl``, text ``snippet`` (``input`` in the
  trevorjung02 copy), ``label``. The 512-word snippets are kept whole; detectors cut their own
  prompt windows.
* ``booktection`` (hub ``avduarte333/BookTection``): ``BookTection*.csv`` in DE-COP format:
  ``Example_A..D``, ``Answer`` (the verbatim option), ``ID`` (book), ``Label``, ``Length`` in
  small/medium/large (= the subset; rows of other lengths are skipped).
* ``arxivtection`` (hub ``avduarte333/arXivTection``): ``arXivTection*.csv``, DE-COP format
  without ``Length``. One passage (ID "RESEE") is whitespace-only; it is dropped with a warning
  by default, which gives the paper's 1,548.
* ``arxivmia`` (hub ``zhliu/ArxivMIA``): ``arxiv_mia{,_dev,_test,_train_real}.jsonl``, ``text``,
  ``label``, ``field``. Subset ``arxiv_mia`` (2,000 abstracts) is the benchmark.

DE-COP-format rows become one sample each: the text is the verbatim option
(``Example_<Answer>``), and ``meta`` keeps ``source_id`` (book/paper), ``paraphrases`` (the
other three options, in column order) and ``answer``. A DE-COP file without ``Example_*``
columns (e.g. the derived ``*_passages.jsonl``) is read with the plain ``text``/``label`` columns.

Groups (for the group-aware split, ``split.group_by: group``): every sample of BookTection,
arXivTection and BookMIA gets ``meta["group"]``, the book or paper it comes from: DE-COP ``ID``
(``title_-_author`` for books), ``book``/``paper`` in the derived passage files, BookMIA's
``book_id``. WikiMIA, WikiMIA-24 and ArxivMIA have no group above the text (one abstract or event
per text); generic files keep their columns in ``meta`` (the lab's ``source``).
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from calibdcd.data.assemble import (
    DEFAULT_LABEL_FIELDS,
    DEFAULT_TEXT_FIELDS,
    OnEmpty,
    build_benchmark,
)
from calibdcd.data.files import load_table
from calibdcd.data.hub import dataset_snapshot, hub_source, read_snapshot
from calibdcd.data.readers import Record, file_format, read_records, rows_as_records
from calibdcd.data.types import Benchmark
from calibdcd.data.validation import DataError, Location, Problem

__all__ = [
    "BENCHMARKS",
    "PAPER_POOLS",
    "PAPER_SIZES",
    "BenchmarkSpec",
    "benchmark_name",
    "benchmark_spec",
    "load_benchmark",
    "load_hub_benchmark",
]

#: total sizes of the paper's data table ("Statistics of the DCD benchmarks")
PAPER_SIZES: Mapping[str, int] = {
    "booktection": 2000,
    "bookmia": 2000,
    "arxivtection": 1548,
    "wikimia": 542,
}

#: evaluation pools (members, non-members) of the same table, for comparison in reports
PAPER_POOLS: Mapping[str, tuple[int, int]] = {
    "booktection": (950, 950),
    "bookmia": (950, 950),
    "arxivtection": (712, 736),
    "wikimia": (234, 208),
}

_WIKI_LENGTHS = ("length32", "length64", "length128", "length256")
_BOOKTECTION_LENGTHS = {"small": 64, "medium": 128, "large": 256}
_ARXIVMIA_SUBSETS = ("arxiv_mia", "dev", "test", "train_real")


def _norm(name: str) -> str:
    return re.sub(r"[^a-z0-9]", "", name.lower())


@dataclasses.dataclass(frozen=True)
class BenchmarkSpec:
    """How to find, read and describe one known benchmark."""

    name: str
    hf_repo: str
    description: str
    aliases: tuple[str, ...] = ()
    #: accepted subsets (canonical spelling); empty = the benchmark has no subsets
    subsets: tuple[str, ...] = ()
    default_subset: str | None = None
    text_fields: tuple[str, ...] = DEFAULT_TEXT_FIELDS
    label_fields: tuple[str, ...] = DEFAULT_LABEL_FIELDS
    decop: bool = False
    on_empty: OnEmpty = "error"
    #: file-name glob patterns tried in a directory, ``{subset}`` is substituted
    local_patterns: tuple[str, ...] = ()
    subset_parser: Callable[[str], str] | None = None
    length_of: Callable[[str | None], int] = lambda subset: 128
    #: meta fields naming a text's group (book, paper), first present wins -> ``meta["group"]``
    group_fields: tuple[str, ...] = ()
    #: (config, split) of the hub dataset's card for a subset: read with ``datasets`` when the
    #: snapshot holds no file the patterns name
    hub_args: Callable[[str | None], tuple[str | None, str]] = lambda subset: (None, "train")

    @property
    def paper_size(self) -> int | None:
        return PAPER_SIZES.get(self.name)

    def canonical_subset(self, subset: str | int | None) -> str | None:
        if not self.subsets:
            if subset is not None:
                raise ValueError(f"benchmark {self.name!r} has no subsets; got split={subset!r}")
            return None
        if subset is None:
            return self.default_subset
        raw = str(subset).strip()
        parsed = self.subset_parser(raw) if self.subset_parser else raw
        if parsed not in self.subsets:
            raise ValueError(
                f"benchmark {self.name!r}: unknown split {subset!r}; "
                f"choose one of {list(self.subsets)}"
            )
        return parsed


def _parse_wiki_length(raw: str) -> str:
    m = re.fullmatch(r"(?:wikimia_?)?(?:length)?_?(\d+)", raw.lower())
    return f"length{m.group(1)}" if m else raw


def _parse_arxivmia(raw: str) -> str:
    s = raw.lower()
    if s.startswith("arxiv_mia_"):
        s = s[len("arxiv_mia_") :]
    return s


def _wiki_length(subset: str | None) -> int:
    return int(subset[len("length") :]) if subset else 64


BENCHMARKS: dict[str, BenchmarkSpec] = {
    spec.name: spec
    for spec in (
        BenchmarkSpec(
            name="wikimia",
            hf_repo="swj0419/WikiMIA",
            description="Wikipedia event snippets; members before 2017, non-members after 2023",
            subsets=_WIKI_LENGTHS,
            default_subset="length64",
            text_fields=("input", "text"),
            local_patterns=("WikiMIA_{subset}.*", "WikiMIA_{subset}-*.parquet"),
            subset_parser=_parse_wiki_length,
            length_of=_wiki_length,
            hub_args=lambda s: (None, f"WikiMIA_{s}"),
        ),
        BenchmarkSpec(
            name="wikimia-24",
            aliases=("wikimia24", "wikimia_24"),
            hf_repo="wjfu99/WikiMIA-24",
            description="WikiMIA refresh; members 2015-16 events, non-members 2024 events",
            subsets=_WIKI_LENGTHS,
            default_subset="length64",
            text_fields=("input", "text"),
            local_patterns=(
                "WikiMIA-24_{subset}.*",
                "WikiMIA_{subset}.*",
                "WikiMIA_{subset}-*.parquet",
            ),
            subset_parser=_parse_wiki_length,
            length_of=_wiki_length,
            hub_args=lambda s: (None, f"WikiMIA_{s}"),
        ),
        BenchmarkSpec(
            name="bookmia",
            hf_repo="swj0419/BookMIA",
            description="512-word book snippets; members older books, non-members 2023 books",
            text_fields=("snippet", "input", "text"),
            local_patterns=("BookMIA.*", "bookmia.*", "BookMIA*.*", "train-*.parquet"),
            group_fields=("book_id", "book"),
        ),
        BenchmarkSpec(
            name="booktection",
            hf_repo="avduarte333/BookTection",
            description="book passages + paraphrases (DE-COP); members pre-2022, non-members 2023",
            subsets=tuple(_BOOKTECTION_LENGTHS),
            default_subset="medium",
            decop=True,
            local_patterns=("BookTection_{subset}.*", "BookTection.*", "BookTection*.csv"),
            subset_parser=str.lower,
            length_of=lambda s: _BOOKTECTION_LENGTHS[s or "medium"],
            group_fields=("source_id", "book"),
        ),
        BenchmarkSpec(
            name="arxivtection",
            hf_repo="avduarte333/arXivTection",
            description="arXiv passages + paraphrases (DE-COP); members pre-2022, non-members 2023",
            decop=True,
            on_empty="drop",
            local_patterns=("arXivTection.*", "arXivTection*.csv", "arxivtection*.*"),
            group_fields=("source_id", "paper"),
        ),
        BenchmarkSpec(
            name="arxivmia",
            aliases=("arxiv-mia",),
            hf_repo="zhliu/ArxivMIA",
            description="arXiv abstracts (cs, math); members older papers, non-members recent",
            subsets=_ARXIVMIA_SUBSETS,
            default_subset="arxiv_mia",
            text_fields=("text", "input"),
            local_patterns=("{file}.*",),
            subset_parser=_parse_arxivmia,
            # the hub layout could not be checked offline: where its files are not named as
            # locally, the 2,000-row benchmark is read as the default config's "train" split,
            # the other files as configs "arxiv_mia_<subset>"
            hub_args=lambda s: (None if s == "arxiv_mia" else f"arxiv_mia_{s}", "train"),
        ),
    )
}

_ALIASES = {_norm(a): spec.name for spec in BENCHMARKS.values() for a in (spec.name, *spec.aliases)}


def benchmark_spec(name: str) -> BenchmarkSpec | None:
    """The spec of a known benchmark (case, ``-`` and ``_`` ignored), or None."""
    key = _ALIASES.get(_norm(name))
    return BENCHMARKS[key] if key else None


# --- local files ----------------------------------------------------------------------------
def _subset_from_filename(spec: BenchmarkSpec, path: Path) -> str | None:
    name = path.name.lower()
    if spec.subset_parser is _parse_wiki_length:
        m = re.search(r"length_?(\d+)", name)
        return f"length{m.group(1)}" if m else None
    if spec.name == "booktection":
        m = re.search(r"(small|medium|large)", name)
        return m.group(1) if m else None
    if spec.name == "arxivmia":
        for sub in ("dev", "test", "train_real"):
            if name.startswith(f"arxiv_mia_{sub}"):
                return sub
        return "arxiv_mia" if name.startswith("arxiv_mia") else None
    return None


def _is_data_file(p: Path) -> bool:
    try:
        file_format(p)
    except ValueError:
        return False
    return p.is_file()


def _file_patterns(spec: BenchmarkSpec, subset: str | None, recursive: bool) -> list[str]:
    """The glob patterns that name the benchmark's files for ``subset``, in order of choice."""
    file_stem = "arxiv_mia" if subset == "arxiv_mia" else f"arxiv_mia_{subset}"
    patterns = [p.format(subset=subset, file=file_stem) for p in spec.local_patterns]
    return patterns + ([f"**/{p}" for p in patterns] if recursive else [])


def _matching_files(
    spec: BenchmarkSpec, directory: Path, subset: str | None, *, recursive: bool = False
) -> list[Path]:
    """The benchmark's files in ``directory`` (``recursive``: also below it, as a hub dataset
    repository keeps them under ``data/``); none when no pattern matches."""
    for pat in _file_patterns(spec, subset, recursive):
        hits = sorted(p for p in directory.glob(pat) if _is_data_file(p))
        if not hits:
            continue
        if pat.endswith(".parquet") and "*" in pat:
            return hits  # shards of one split
        # several formats of one file (e.g. WikiMIA_length64.jsonl and .csv): prefer jsonl
        order = {"jsonl": 0, "csv": 1, "tsv": 2, "parquet": 3, "json": 4}
        hits.sort(key=lambda p: (order[file_format(p)[0]], p.name))
        return [hits[0]]
    return []


def _no_file(spec: BenchmarkSpec, subset: str | None, recursive: bool) -> str:
    return (
        f"no file for benchmark {spec.name!r}"
        + (f" split {subset!r}" if subset else "")
        + f" (looked for {_file_patterns(spec, subset, recursive)})"
    )


def _find_local_files(spec: BenchmarkSpec, directory: Path, subset: str | None) -> list[Path]:
    """The benchmark's files in a local ``directory``, or an error naming what was looked for."""
    files = _matching_files(spec, directory, subset)
    if not files:
        raise FileNotFoundError(
            f"{directory}: {_no_file(spec, subset, False)}; pass the file itself as path"
        )
    return files


def _read_many(files: Sequence[Path]) -> tuple[list[Record], list[str]]:
    records: list[Record] = []
    columns: list[str] = []
    for f in files:
        recs, cols = read_records(f)
        offset = len(records)
        records.extend(dataclasses.replace(r, index=r.index + offset) for r in recs)
        columns = columns or cols
    return records, columns


def _read_snapshot_files(
    spec: BenchmarkSpec, snapshot: Path, subset: str | None
) -> tuple[list[Record], list[str], str]:
    """A known benchmark's records from its dataset snapshot: the files its patterns name, read
    as a local directory's; where none match (a layout the patterns do not know), the split
    the dataset's card defines (``spec.hub_args``), read by ``datasets``."""
    files = _matching_files(spec, snapshot, subset, recursive=True)
    if not files:
        config, hf_split = spec.hub_args(subset)
        try:
            ds, source = read_snapshot(spec.hf_repo, snapshot, config, hf_split)
        except ValueError as exc:
            held = sorted(
                f.relative_to(snapshot).as_posix() for f in snapshot.rglob("*") if f.is_file()
            )
            raise FileNotFoundError(
                f"{hub_source(spec.hf_repo, snapshot)}: {_no_file(spec, subset, True)}, and "
                f"`datasets` could not read it either ({exc}); the snapshot holds "
                + (", ".join(held[:12]) or "no file")
                + (f" and {len(held) - 12} more" if len(held) > 12 else "")
                + f"; pass a local copy: load_benchmark({spec.name!r}, path=...)"
            ) from None
        records, columns = rows_as_records((dict(r) for r in ds), source)
        return records, columns, source
    records, columns = _read_many(files)
    first = files[0].relative_to(snapshot).as_posix()  # the file, as the repository names it
    where = first if len(files) == 1 else f"{Path(first).parent.as_posix()} ({len(files)} files)"
    return records, columns, hub_source(spec.hf_repo, snapshot, where)


# --- DE-COP format ---------------------------------------------------------------------------
_OPTIONS = ("A", "B", "C", "D")


def _decop_text(fields: dict[str, Any]) -> Any:
    answer = str(fields.get("Answer") or "A").strip().upper()
    if answer not in _OPTIONS:
        raise ValueError(f"Answer {fields.get('Answer')!r} is not one of A/B/C/D")
    return fields.get(f"Example_{answer}")


def _decop_meta(fields: dict[str, Any]) -> dict[str, Any]:
    answer = str(fields.get("Answer") or "A").strip().upper()
    meta = {
        "source_id": fields.get("ID"),
        "answer": answer,
        "paraphrases": [fields.get(f"Example_{o}") for o in _OPTIONS if o != answer],
    }
    if "Length" in fields:
        meta["length"] = fields.get("Length")
    return meta


def _filter_length(
    records: list[Record], columns: Sequence[str], subset: str | None, source: str
) -> tuple[list[Record], int]:
    if subset is None or "Length" not in columns:
        return records, 0
    kept = [r for r in records if str(r.fields.get("Length", "")).strip().lower() == subset]
    if not kept:
        present = sorted({str(r.fields.get("Length")) for r in records})
        raise DataError(
            Problem(
                Location(source, 1),
                f"no rows with Length == {subset!r} (lengths present: {present})",
            )
        )
    return kept, len(records) - len(kept)


# --- the entry point -------------------------------------------------------------------------
def benchmark_name(name_or_path: str | Path, path: str | Path | None = None) -> str:
    """The name :func:`load_benchmark` gives the benchmark it loads, known without loading it:
    a known benchmark's canonical name; a file given with a name (``path=``), that name; a bare
    file path, its file name up to the first dot. (A detector is configured for this name, e.g.
    DPDLLM's per-benchmark settings, so a run's plan needs it before any file is read.)"""
    spec = benchmark_spec(str(name_or_path)) if isinstance(name_or_path, str) else None
    if spec is not None:
        return spec.name
    if path is not None:
        return str(name_or_path)
    return Path(name_or_path).name.split(".")[0]


def load_benchmark(
    name_or_path: str | Path,
    *,
    path: str | Path | None = None,
    split: str | int | None = None,
    text_field: str | Sequence[str] | None = None,
    label_field: str | Sequence[str] | None = None,
    id_field: str | None = None,
    label_map: Mapping[str, int] | None = None,
    on_empty: OnEmpty | None = None,
    dedupe: bool = False,
    revision: str | None = None,
) -> Benchmark:
    """Load a benchmark by name (see the module table) or any data file by path.

    * ``load_benchmark("wikimia", path="shared/data/WikiMIA")``: a known benchmark from a local
      directory (the file for ``split`` is found by name) or a local file;
    * ``load_benchmark("wikimia", split=128)``: from the Hugging Face hub (its snapshot in the
      local hub cache, fetched once);
    * ``load_benchmark("my.jsonl", text_field="text", label_field="label")``: any file.

    ``split`` is the subset: WikiMIA / WikiMIA-24 length (``64``, ``"length64"``,
    ``"WikiMIA_length64"``; default 64, or taken from a file name like ``*_length128.jsonl``),
    BookTection length (small/medium/large, default medium), ArxivMIA file
    (arxiv_mia/dev/test/train_real). ``on_empty`` defaults to the benchmark's policy ("drop" for
    arXivTection, whose source has one whitespace-only passage; "error" otherwise).
    ``dedupe=True`` drops repeated texts (see :mod:`calibdcd.data.assemble`).
    """
    spec = benchmark_spec(str(name_or_path)) if isinstance(name_or_path, str) else None
    if revision is not None and (spec is None or path is not None):
        raise ValueError(
            f"revision {revision!r} applies to a benchmark read from the hub; a local file "
            "has none (leave out the path to read the benchmark's hub dataset at it)"
        )
    if spec is None:
        file = Path(path) if path is not None else Path(name_or_path)
        if not file.exists():
            known = ", ".join(sorted(BENCHMARKS))
            raise ValueError(
                f"{file}: no such file, and {str(name_or_path)!r} is not a known benchmark "
                f"({known}); pass a jsonl/json/csv/tsv/parquet path"
            )
        if file.is_dir():
            raise ValueError(f"{file} is a directory; pass a file for a generic dataset")
        if split is not None:
            raise ValueError("split applies to known benchmarks only; pass the file of the split")
        name = benchmark_name(name_or_path, path)
        return load_table(
            file,
            text_field=text_field or DEFAULT_TEXT_FIELDS,
            label_field=label_field or DEFAULT_LABEL_FIELDS,
            id_field=id_field,
            label_map=label_map,
            name=name,
            on_empty=on_empty or "error",
            dedupe=dedupe,
        )

    if path is not None:
        p = Path(path)
        if not p.exists():
            raise FileNotFoundError(f"{p}: no such file or directory (benchmark {spec.name!r})")
        if p.is_dir():
            subset = spec.canonical_subset(split)
            files = _find_local_files(spec, p, subset)
        else:
            subset = spec.canonical_subset(
                split if split is not None else _subset_from_filename(spec, p)
            )
            files = [p]
        records, columns = _read_many(files)
        source = str(files[0]) if len(files) == 1 else f"{p} ({len(files)} files)"
    else:
        # the dataset repository's snapshot in the local hub cache (fetched there once when
        # absent, as `calibdcd models fetch` does): its files read as a local directory's
        subset = spec.canonical_subset(split)
        snapshot = dataset_snapshot(spec.hf_repo, revision=revision, benchmark=spec.name)
        records, columns, source = _read_snapshot_files(spec, snapshot, subset)

    n_filtered = 0
    text_of = meta_of = None
    if spec.decop:
        records, n_filtered = _filter_length(records, columns, subset, source)
        if "Example_A" in columns and text_field is None:
            text_of, meta_of = _decop_text, _decop_meta
    bench = build_benchmark(
        records,
        columns,
        name=spec.name,
        source=source,
        text_field=text_field or spec.text_fields,
        label_field=label_field or spec.label_fields,
        id_field=id_field,
        label_map=label_map,
        on_empty=on_empty or spec.on_empty,
        dedupe=dedupe,
        default_length=spec.length_of(subset),
        subset=subset,
        text_of=text_of,
        meta_of=meta_of,
        n_filtered=n_filtered,
    )
    return _with_groups(bench, spec.group_fields)


def _with_groups(bench: Benchmark, fields: Sequence[str]) -> Benchmark:
    """``meta["group"]`` = the first of ``fields`` present in a sample's meta (as a string)."""
    if not fields:
        return bench

    def group(meta: Mapping[str, Any]) -> str | None:
        for f in fields:
            if meta.get(f) not in (None, ""):
                return str(meta[f])
        return None

    samples = tuple(
        dataclasses.replace(s, meta={**s.meta, "group": g})
        if (g := group(s.meta)) is not None
        else s
        for s in bench.samples
    )
    return dataclasses.replace(bench, samples=samples)


def load_hub_benchmark(
    repo: str,
    *,
    name: str | None = None,
    config: str | None = None,
    split: str | None = None,
    revision: str | None = None,
    text_field: str | Sequence[str] | None = None,
    label_field: str | Sequence[str] | None = None,
    id_field: str | None = None,
    label_map: Mapping[str, int] | None = None,
    dedupe: bool = False,
    pair_fields: tuple[str, str] | None = None,
) -> Benchmark:
    """Any Hugging Face hub dataset as a benchmark: repository ``repo`` (``owner/name``), its
    ``config`` and ``split`` (default ``train``) as the dataset's card defines them, at
    ``revision``, one row per text with a text and a 0/1 label column (``text_field``,
    ``label_field``; defaults as for files), or, with ``pair_fields`` = (member column,
    non-member column), one member and one non-member text per row (MIMIR's layout: ids
    ``<row>-m`` and ``<row>-n``). Read with ``datasets`` from the dataset's snapshot
    in the local hub cache (``calibdcd models fetch`` puts it there, or any ``hf download
    --repo-type dataset``), so it loads offline; its source names the snapshot's commit, which
    with the run's content digest is the dataset's fingerprint (``benchmarks.json``)."""
    snapshot = dataset_snapshot(repo, revision=revision)
    ds, source = read_snapshot(repo, snapshot, config, split or "train")
    rows: Any = (dict(r) for r in ds)
    if pair_fields is not None:
        member, nonmember = pair_fields
        missing = [c for c in pair_fields if c not in ds.column_names]
        if missing:
            raise ValueError(
                f"hub dataset {repo}: no column {missing[0]!r} (columns: "
                f"{', '.join(ds.column_names)})"
            )
        rows = (
            {"id": f"{i}-{tag}", "text": r[col], "label": label}
            for i, r in enumerate(ds)
            for tag, col, label in (("m", member, 1), ("n", nonmember, 0))
        )
        text_field, label_field, id_field = "text", "label", "id"
    records, columns = rows_as_records(rows, source)
    return build_benchmark(
        records,
        columns,
        name=name or repo.split("/")[-1],
        source=source,
        text_field=text_field or DEFAULT_TEXT_FIELDS,
        label_field=label_field or DEFAULT_LABEL_FIELDS,
        id_field=id_field,
        label_map=label_map,
        on_empty="error",
        dedupe=dedupe,
    )
