"""The lab's text pool and its member / non-member / background split.

Default pool: English prose that ships with CPython itself, so every machine with Python has it
and nothing is downloaded or committed: the paragraphs of ``pydoc_data.topics`` (the language
reference topics behind ``help()``) and the prose paragraphs of the standard library's module,
class and function docstrings (read with :mod:`ast`, nothing is imported). PSF licence.
The exact pool therefore depends on the Python version; ``lab.json`` records it.

``--pool`` takes any ``.jsonl``/``.json``/``.csv`` of texts instead (labels in it are ignored).

Split: candidates for evaluation are drawn uniformly at random (seeded) from the cleaned pool;
the first half of a random permutation of them are members, the rest non-members, so members
and non-members are i.i.d. from one distribution. Everything else is background: seen once per
epoch in pre-training, used to train the tokenizer and to build the post-training data. Neither
the tokenizer nor the post-training ever sees a candidate.
"""

from __future__ import annotations

import ast
import dataclasses
import functools
import hashlib
import json
import os
import random
import re
import sys
import sysconfig
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from calibdcd.data.assemble import DEFAULT_TEXT_FIELDS, resolve_field
from calibdcd.lab.config import PoolConfig

__all__ = [
    "POOL_TEXT_FIELDS",
    "PoolText",
    "Split",
    "clean_pool",
    "default_pool",
    "load_pool",
    "pool_fingerprint",
    "split_pool",
]

#: a pool's text column when none is named: the benchmarks' candidates, then those of other
#: corpora (BookTection's passages, DE-COP's Example_A); resolved by the benchmarks' resolver
POOL_TEXT_FIELDS = (*DEFAULT_TEXT_FIELDS, "passage", "content", "document", "Example_A")


@dataclasses.dataclass(frozen=True)
class PoolText:
    text: str
    source: str  # where it came from (file:line, or stdlib module / pydoc topic)


@dataclasses.dataclass(frozen=True)
class Split:
    members: list[PoolText]
    nonmembers: list[PoolText]
    background: list[PoolText]  # all non-candidate texts (tokenizer, pre-training, SFT)


# --------------------------------------------------------------------------- default pool

_SKIP_DIRS = ("test/", "idlelib/", "lib2to3/", "site-packages/", "dist-packages/", "turtledemo/")


def _is_prose(paragraph: str) -> bool:
    lines = paragraph.strip().splitlines()
    if not lines:
        return False
    if any(
        line.lstrip().startswith((">>>", "...", "$", "|", "+-", "*", "-", ":")) for line in lines
    ):
        return False
    words = paragraph.split()
    if len(words) < 12:
        return False
    plain = sum(c.isalpha() or c.isspace() or c in ",.;'\"()-?!" for c in paragraph)
    if plain / len(paragraph) < 0.93:
        return False
    return bool(re.search(r"[.!?]['\")]?$", paragraph.strip()))


def _paragraphs(text: str) -> list[str]:
    return [p for p in re.split(r"\n\s*\n", text) if p.strip()]


def _stdlib_files() -> Iterable[tuple[str, Path]]:
    """(relative name, path) of the standard library's modules the pool reads, in order."""
    root = Path(sysconfig.get_paths()["stdlib"])
    found = []
    for here, dirs, names in os.walk(root):
        if Path(here) == root:  # never descend into a skipped top-level directory
            dirs[:] = [d for d in dirs if f"{d}/" not in _SKIP_DIRS]
        found += [Path(here, n) for n in names if n.endswith(".py")]
    for path in sorted(found):  # (the order of ``sorted(root.rglob("*.py"))``)
        rel = path.relative_to(root).as_posix()
        if not (rel.startswith(_SKIP_DIRS) or "/test" in rel):
            yield rel, path


def _stdlib_docstring_paragraphs() -> Iterable[tuple[str, str]]:
    for rel, path in _stdlib_files():
        try:
            tree = ast.parse(path.read_text(encoding="utf-8"))
        except (SyntaxError, UnicodeDecodeError, ValueError, OSError):
            continue
        for node in ast.walk(tree):
            if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
                doc = ast.get_docstring(node)
                if doc:
                    name = getattr(node, "name", "")
                    for para in _paragraphs(doc):
                        yield (f"{rel}:{name}" if name else rel), para


def _pydoc_topic_paragraphs() -> Iterable[tuple[str, str]]:
    try:
        from pydoc_data.topics import topics
    except ImportError:  # some distributions strip pydoc_data
        return
    for key in sorted(topics):
        for para in _paragraphs(topics[key]):
            yield f"pydoc:{key}", para


def default_pool(min_words: int = 40, max_words: int = 120) -> list[PoolText]:
    """Prose paragraphs from CPython's own documentation, merged into texts of at least
    ``min_words`` words (cached per process; see :func:`_default_pool`)."""
    return list(_default_pool(min_words, max_words))


@functools.lru_cache(maxsize=4)
def _default_pool(min_words: int, max_words: int) -> tuple[PoolText, ...]:
    """:func:`_read_default_pool`, kept in the cache root (``lab-pool/``) under a key of what it
    is read from: reading the standard library's sources takes about 6 s, and every process that
    resolves a lab on the default pool (a run, its dry run, a test's subprocess) needs the pool
    for the lab's key. The key is this module's source, the Python version, the standard
    library's directory and the name, size and modification time of every file read, so an
    edited or another standard library reads afresh; a damaged file is read afresh too."""
    from calibdcd.atomic import atomic_write_text
    from calibdcd.paths import cache_root

    h = hashlib.sha256(Path(__file__).read_bytes())
    h.update(f"{sys.version}|{sysconfig.get_paths()['stdlib']}|{min_words}|{max_words}".encode())
    files = list(_stdlib_files())
    try:
        from pydoc_data import topics

        files.append(("pydoc_data.topics", Path(topics.__file__)))
    except ImportError:
        pass
    for rel, path in files:
        st = path.stat()
        h.update(f"|{rel}:{st.st_size}:{st.st_mtime_ns}".encode())
    stored = cache_root(None) / "lab-pool" / f"default-{h.hexdigest()[:20]}.json"
    try:
        return tuple(PoolText(t, src) for t, src in json.loads(stored.read_text("utf-8")))
    except (OSError, ValueError, TypeError):
        pass
    pool = _read_default_pool(min_words, max_words)
    try:
        stored.parent.mkdir(parents=True, exist_ok=True)
        atomic_write_text(stored, json.dumps([[p.text, p.source] for p in pool]))
    except OSError:  # a read-only cache: read the sources again next time
        pass
    return pool


def _read_default_pool(min_words: int, max_words: int) -> tuple[PoolText, ...]:
    """Prose paragraphs of ``pydoc_data.topics`` and of stdlib docstrings.

    Consecutive prose paragraphs of one docstring / topic are joined until a text has at least
    ``min_words`` words; texts never cross sources. Deterministic for a Python version.
    """
    out: list[PoolText] = []
    groups: dict[str, list[str]] = {}
    order: list[str] = []
    for source, para in [*_pydoc_topic_paragraphs(), *_stdlib_docstring_paragraphs()]:
        if not _is_prose(para):
            continue
        if source not in groups:
            groups[source] = []
            order.append(source)
        groups[source].append(" ".join(para.split()))
    for source in order:
        buf: list[str] = []
        for para in groups[source]:
            buf.append(para)
            if sum(len(p.split()) for p in buf) >= min_words:
                out.append(PoolText(" ".join(buf), source))
                buf = []
    return tuple(out)


# --------------------------------------------------------------------------- user pools


def load_pool(
    path: str | Path, text_field: str | None = None, where: dict[str, Any] | None = None
) -> list[PoolText]:
    """Texts from any file the one text reader takes (:func:`calibdcd.data.readers.read_records`
    with ``text_list``): ``.jsonl`` (one object or string per line), ``.json`` (a list),
    ``.csv``/``.tsv``, ``.parquet`` or ``.txt`` (one text per line), ``.gz`` allowed.

    ``text_field`` names the column; by default the first of :data:`POOL_TEXT_FIELDS` the
    first row has (:func:`calibdcd.data.assemble.resolve_field`, as for a benchmark). ``where``
    keeps only the objects whose fields equal its values (e.g. ``{"label": 0}``, which also
    matches a CSV field ``"0"``; no matching row is an error); a text keeps its line as its
    source either way. Rows without the field, or with a non-string in it, are one
    :class:`~calibdcd.data.validation.DataError` listing each.
    """
    from calibdcd.data.readers import file_format, read_records
    from calibdcd.data.validation import DataError, Location, Problem

    path = Path(path)
    # the one reader of text files (every structural problem at once, as one DataError); each
    # text's source is its place in the file, spelled as this function always has
    records, _ = read_records(path, text_list=True)
    fmt = file_format(path, text_list=True)[0]

    def place(rec: Any) -> str:
        if fmt == "json":
            return f"{path.name}[{rec.index}]"
        if fmt in ("csv", "tsv", "parquet"):
            return f"{path.name}:{rec.index + 2}"  # the header is line 1
        return f"{path.name}:{rec.location.line}"

    if not records:
        empty = "no texts (empty file, or only blank lines)"
        raise DataError(Problem(Location(str(path), 1), empty))
    if where:
        records = [r for r in records if _matches(r.fields, where)]
        if not records:
            raise ValueError(f"pool file {path}: no row has {where}")
    # the column as every other reader picks it (the first candidate the first row has)
    field = resolve_field(
        list(records[0].fields), text_field or POOL_TEXT_FIELDS, "text", str(path)
    )
    problems = [
        Problem(
            r.location,
            f"{field!r}: missing" if field not in r.fields else f"{field!r}: not a string",
        )
        for r in records
        if not isinstance(r.fields.get(field), str)
    ]
    if problems:
        raise DataError(problems)  # every bad row at once, each with its line
    return [PoolText(r.fields[field], place(r)) for r in records]


def _matches(row: dict[str, Any], where: dict[str, Any]) -> bool:
    """Field equality; a CSV field is a string, so ``"0"`` matches ``0`` (its ``str``)."""
    return all(
        k in row and (row[k] == v or (isinstance(row[k], str) and row[k] == str(v)))
        for k, v in where.items()
    )


# --------------------------------------------------------------------------- cleaning, split


def _words(text: str) -> list[str]:
    return text.split()


def _cut(text: str, min_words: int, max_words: int) -> str | None:
    words = _words(text)
    if len(words) < min_words:
        return None
    if len(words) <= max_words:
        return " ".join(words)
    # cut at the last sentence end within [min_words, max_words], else hard at max_words
    for end in range(max_words, min_words - 1, -1):
        if re.search(r"[.!?]['\")]?$", words[end - 1]):
            return " ".join(words[:end])
    return " ".join(words[:max_words])


def clean_pool(texts: Sequence[PoolText], cfg: PoolConfig) -> list[PoolText]:
    """Normalise, length-filter and de-duplicate (first/last ``dedup_words`` words), in order."""
    seen_head: set[str] = set()
    seen_tail: set[str] = set()
    out: list[PoolText] = []
    for item in texts:
        text = _cut(item.text, cfg.min_words, cfg.max_words)
        if text is None:
            continue
        low = text.lower().split()
        head = " ".join(low[: cfg.dedup_words])
        tail = " ".join(low[-cfg.dedup_words :])
        if head in seen_head or tail in seen_tail:
            continue
        seen_head.add(head)
        seen_tail.add(tail)
        out.append(PoolText(text, item.source))
    return out


def pool_fingerprint(texts: Sequence[PoolText]) -> str:
    h = hashlib.sha256()
    for t in texts:
        h.update(t.text.encode())
        h.update(b"\0")
    return h.hexdigest()[:16]


def split_pool(texts: Sequence[PoolText], n_members: int, seed: int) -> Split:
    """Draw ``2 * n_members`` candidates at random; half members, half non-members (i.i.d.).

    An unlabelled draw with Python's seeded shuffle, not the protocol's
    :func:`calibdcd.data.protocol.stratified_draw`: a built lab's cache key covers its config
    and pool but not this draw, so another draw would silently disagree with every built lab
    (changing it needs a lab format bump, i.e. rebuilding every lab)."""
    if n_members < 1:
        raise ValueError(f"n_members must be >= 1, got {n_members}")
    if len(texts) < 2 * n_members + 1:
        raise ValueError(
            f"the pool has {len(texts)} usable texts after cleaning, but n_members={n_members} "
            f"needs more than {2 * n_members}; lower pretrain.n_members or use a bigger pool"
        )
    rng = random.Random(f"calibdcd-lab-split-{seed}")
    order = list(range(len(texts)))
    rng.shuffle(order)
    cand = order[: 2 * n_members]
    members = [texts[i] for i in cand[:n_members]]
    nonmembers = [texts[i] for i in cand[n_members:]]
    background = [texts[i] for i in sorted(order[2 * n_members :])]
    return Split(members, nonmembers, background)
