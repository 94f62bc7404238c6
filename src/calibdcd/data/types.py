"""The data types every other part of calibdcd sees: :class:`Sample` and :class:`Benchmark`.

Labels follow the project convention everywhere: ``1`` = member (the text was in the target's
pre-training data), ``0`` = non-member.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import numpy as np

__all__ = ["Benchmark", "LoadReport", "Sample", "TextList"]


@dataclasses.dataclass(frozen=True)
class Sample:
    """One benchmark text.

    ``id`` is unique within its benchmark and stable across loads of the same file (by default
    the 0-based position of the record in the source, counted before any record is dropped).
    ``meta`` holds everything else the source provides (book title, paraphrases, ...).
    """

    id: str
    text: str
    label: int
    meta: Mapping[str, Any] = dataclasses.field(default_factory=dict, compare=False)

    def __post_init__(self) -> None:
        if not isinstance(self.id, str) or not self.id:
            raise ValueError(f"Sample.id must be a non-empty string, got {self.id!r}")
        if not isinstance(self.text, str) or not self.text.strip():
            raise ValueError(f"Sample {self.id!r}: text must be a non-empty string")
        if isinstance(self.label, bool) or self.label not in (0, 1):
            raise ValueError(
                f"Sample {self.id!r}: label must be the int 0 or 1, got {self.label!r}"
            )


@dataclasses.dataclass(frozen=True)
class TextList:
    """An unlabelled list of texts read from a file (``fit``'s members or non-members,
    ``score``'s suspect texts): each text with its id (None without an id column) and where it
    was read (``unit`` ``line``, ``item`` or ``row``, 1-based)."""

    source: str
    texts: tuple[str, ...]
    ids: tuple[str | None, ...]
    lines: tuple[int, ...]
    unit: str = "line"

    def __len__(self) -> int:
        return len(self.texts)


@dataclasses.dataclass(frozen=True)
class LoadReport:
    """What happened while a benchmark was read: how many records, what was dropped and why.

    Line numbers are 1-based physical lines of the file (for parquet and the hub: 1-based rows).
    """

    n_records: int = 0
    #: (line, line of the first occurrence) for every repeated text, in file order
    duplicates: tuple[tuple[int, int], ...] = ()
    #: lines of texts that occur with both labels
    conflicting_duplicates: tuple[int, ...] = ()
    #: lines dropped because the text was empty (only with ``on_empty="drop"``)
    dropped_empty: tuple[int, ...] = ()
    #: lines dropped by ``dedupe=True``
    dropped_duplicates: tuple[int, ...] = ()
    #: lines skipped because they belong to another subset (e.g. BookTection's ``Length`` column)
    n_filtered: int = 0


@dataclasses.dataclass(frozen=True)
class Benchmark:
    """A labelled set of texts plus where it came from.

    ``default_length`` is the detector length ``L`` (DPDLLM's sequence length / the length bucket
    in words): WikiMIA-style benchmarks use their length bucket (WikiMIA length-64 -> 64), the
    others 128 (see research/detectors.md, "Datasets and L").
    """

    name: str
    samples: tuple[Sample, ...]
    source: str
    default_length: int = 128
    subset: str | None = None
    report: LoadReport = dataclasses.field(default_factory=LoadReport, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "samples", tuple(self.samples))
        if not self.samples:
            raise ValueError(f"benchmark {self.name!r} from {self.source}: no samples")
        seen: dict[str, int] = {}
        for i, s in enumerate(self.samples):
            if not isinstance(s, Sample):
                raise ValueError(f"benchmark {self.name!r}: samples[{i}] is not a Sample")
            if s.id in seen:
                raise ValueError(
                    f"benchmark {self.name!r}: sample id {s.id!r} occurs at positions "
                    f"{seen[s.id]} and {i}; ids must be unique"
                )
            seen[s.id] = i
        if not isinstance(self.default_length, int) or self.default_length < 1:
            raise ValueError(f"default_length must be a positive int, got {self.default_length!r}")

    # --- convenient views -------------------------------------------------------------------
    def __len__(self) -> int:
        return len(self.samples)

    def __iter__(self) -> Iterator[Sample]:
        return iter(self.samples)

    def __getitem__(self, i: int) -> Sample:
        return self.samples[i]

    @property
    def key(self) -> str:
        """``name`` or ``name/subset``: a short label for tables and cache keys."""
        return self.name if self.subset is None else f"{self.name}/{self.subset}"

    @property
    def texts(self) -> list[str]:
        return [s.text for s in self.samples]

    @property
    def ids(self) -> list[str]:
        return [s.id for s in self.samples]

    @functools.cached_property
    def labels(self) -> np.ndarray:
        """Labels as a read-only int64 array (1 = member)."""
        arr = np.fromiter((s.label for s in self.samples), dtype=np.int64, count=len(self))
        arr.setflags(write=False)
        return arr

    def counts(self) -> dict[int, int]:
        """``{1: n_members, 0: n_non_members}``."""
        n1 = int(self.labels.sum())
        return {1: n1, 0: len(self) - n1}

    def select(self, indices: Sequence[int] | np.ndarray) -> list[Sample]:
        """The samples at ``indices`` (e.g. one part of a :class:`~calibdcd.data.Split`)."""
        return [self.samples[int(i)] for i in indices]
