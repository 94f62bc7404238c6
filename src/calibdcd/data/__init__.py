"""Benchmarks for pre-training data detection: types, loaders, validation and the paper's split
protocol.

>>> from calibdcd.data import load_benchmark, split_benchmark, SplitConfig
>>> bench = load_benchmark("wikimia", path="../shared/data/WikiMIA")      # doctest: +SKIP
>>> split = split_benchmark(bench, SplitConfig(protocol="strict"), seed=0)  # doctest: +SKIP

Labels: 1 = member, 0 = non-member. Nothing here imports torch; the Hugging Face ``datasets``
package is imported only when a benchmark is fetched from the hub.
"""

from calibdcd.data.benchmarks import (
    BENCHMARKS,
    PAPER_SIZES,
    BenchmarkSpec,
    benchmark_spec,
    load_benchmark,
)
from calibdcd.data.files import load_table, load_texts
from calibdcd.data.hub import HubUnavailableError
from calibdcd.data.protocol import Split, SplitConfig, make_split, split_benchmark, subsample
from calibdcd.data.textkey import text_key
from calibdcd.data.types import Benchmark, LoadReport, Sample, TextList
from calibdcd.data.validation import DataError, DuplicateTextWarning, parse_label

__all__ = [
    "BENCHMARKS",
    "PAPER_SIZES",
    "Benchmark",
    "BenchmarkSpec",
    "DataError",
    "DuplicateTextWarning",
    "HubUnavailableError",
    "LoadReport",
    "Sample",
    "Split",
    "SplitConfig",
    "TextList",
    "benchmark_spec",
    "load_benchmark",
    "load_table",
    "load_texts",
    "make_split",
    "parse_label",
    "split_benchmark",
    "subsample",
    "text_key",
]
