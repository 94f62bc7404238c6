"""Tests for calibdcd.data: loaders on the real benchmark copies, validation on hand-made bad
files, and the paper's split protocol."""

from __future__ import annotations

import csv
import gzip
import json
import subprocess
import sys
import warnings
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from calibdcd.cli import app
from calibdcd.data import (
    PAPER_SIZES,
    Benchmark,
    DataError,
    DuplicateTextWarning,
    HubUnavailableError,
    Sample,
    Split,
    SplitConfig,
    load_benchmark,
    load_table,
    make_split,
    parse_label,
    split_benchmark,
    subsample,
)
from calibdcd.data.benchmarks import PAPER_POOLS
from conftest import shared_dir

# --- where the shared benchmark copies are ---------------------------------------------------
DATA = shared_dir() / "data"
needs_data = pytest.mark.skipif(
    not DATA.is_dir(),
    reason=f"benchmark copies not found at {DATA} (set CALIBDCD_SHARED to the shared directory)",
)


def load_quiet(*args, **kwargs) -> Benchmark:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return load_benchmark(*args, **kwargs)


@pytest.fixture(scope="module")
def booktection() -> Benchmark:
    if not DATA.is_dir():
        pytest.skip(f"benchmark copies not found at {DATA}")
    return load_benchmark("booktection", path=DATA / "BookTection")


# --- real benchmark files ----------------------------------------------------------------------
@needs_data
@pytest.mark.parametrize(
    ("name", "rel", "split", "n1", "n0", "length"),
    [
        ("wikimia", "WikiMIA", None, 284, 258, 64),
        ("wikimia", "WikiMIA", 128, 139, 111, 128),
        ("wikimia", "WikiMIA/WikiMIA_length128.jsonl", None, 139, 111, 128),
        ("wikimia", "WikiMIA/WikiMIA_length64.csv", None, 284, 258, 64),
        ("wikimia-24", "WikiMIA-24", "32", 779, 779, 32),
        ("wikimia-24", "WikiMIA-24", "WikiMIA_length256", 253, 253, 256),
        ("bookmia", "BookMIA", None, 100, 100, 128),
        ("arxivmia", "ArxivMIA", None, 1000, 1000, 128),
        ("arxivmia", "ArxivMIA", "dev", 201, 199, 128),
        ("arxivmia", "ArxivMIA/arxiv_mia_test.jsonl", None, 799, 801, 128),
    ],
)
def test_real_benchmark_counts(name, rel, split, n1, n0, length):
    bench = load_quiet(name, path=DATA / rel, split=split)
    assert bench.counts() == {1: n1, 0: n0}
    assert bench.default_length == length
    assert len(set(bench.ids)) == len(bench)
    assert all(s.text.strip() for s in bench)


@needs_data
def test_wikimia_csv_and_jsonl_agree():
    a = load_benchmark("wikimia", path=DATA / "WikiMIA")
    assert Path(a.source).name == "WikiMIA_length64.jsonl"  # jsonl preferred over csv
    b = load_benchmark("wikimia", path=DATA / "WikiMIA" / "WikiMIA_length64.csv")
    assert a.texts == b.texts
    assert a.labels.tolist() == b.labels.tolist()
    assert b.samples[0].meta == {"text_id": "0"}


@needs_data
def test_booktection_decop_format(booktection):
    assert booktection.key == "booktection/medium"
    assert booktection.counts() == {1: 3499, 0: 1985}
    s = booktection.samples[0]
    assert s.meta["answer"] == "A"
    assert len(s.meta["paraphrases"]) == 3
    assert s.text not in s.meta["paraphrases"]
    assert s.meta["source_id"] == "A_Day_of_Fallen_Night_-_Samantha_Shannon"
    assert s.text.startswith("Wulf said, Was I really the only one who lived?")
    # the derived passages file holds the same verbatim passages in the same order
    passages = load_benchmark(
        "booktection", path=DATA / "BookTection" / "BookTection_medium_passages.jsonl"
    )
    assert passages.texts == booktection.texts
    assert passages.labels.tolist() == booktection.labels.tolist()


@needs_data
def test_booktection_other_length_is_a_clear_error():
    with pytest.raises(DataError, match=r"no rows with Length == 'small'.*medium"):
        load_benchmark(
            "booktection", path=DATA / "BookTection" / "BookTection_medium.csv", split="small"
        )


@needs_data
def test_arxivtection_drops_the_blank_passage_with_a_warning():
    with pytest.warns(UserWarning, match=r"dropped 1 record\(s\) with empty text \(line 615\)"):
        bench = load_benchmark("arxivtection", path=DATA / "arXivTection")
    assert len(bench) == PAPER_SIZES["arxivtection"] == 1548
    assert bench.counts() == {1: 762, 0: 786}
    assert bench.report.dropped_empty == (615,)
    # the strict policy reports it as an error naming the file and line
    with pytest.raises(DataError, match=r"arXivTection\.csv, line 615: empty text"):
        load_benchmark("arxivtection", path=DATA / "arXivTection", on_empty="error")


@needs_data
def test_wikimia24_duplicates_reported_and_deduped():
    path = DATA / "WikiMIA-24" / "WikiMIA-24_length32.jsonl"
    with pytest.warns(DuplicateTextWarning, match=r"172 duplicate text\(s\)"):
        bench = load_benchmark("wikimia-24", path=path)
    assert len(bench) == 1558 and len(bench.report.duplicates) == 172
    with pytest.warns(DuplicateTextWarning):
        deduped = load_benchmark("wikimia-24", path=path, dedupe=True)
    assert len(deduped) == len(set(bench.texts)) == 1386
    assert deduped.report.conflicting_duplicates == ()
    assert len(deduped.report.dropped_duplicates) == 172


@needs_data
@pytest.mark.parametrize("name", ["booktection", "arxivtection", "wikimia"])
@pytest.mark.parametrize("seed", [0, 7])
def test_paper_table_reproduced(name, seed, booktection):
    dirs = {"arxivtection": "arXivTection", "wikimia": "WikiMIA"}
    bench = booktection if name == "booktection" else load_quiet(name, path=DATA / dirs[name])
    sp = split_benchmark(bench, seed=seed)
    sizes = sp.sizes()
    m, nm = PAPER_POOLS[name]
    assert sizes["subsample"][0] == PAPER_SIZES[name]
    assert sizes["supervised"] == (100, 50, 50)
    assert sizes["evaluation"] == (m + nm, m, nm)
    remaining_nm = nm  # paper protocol: the pool holds every non-supervised non-member
    assert sizes["calibration"] == (remaining_nm // 2, 0, remaining_nm // 2)
    strict = split_benchmark(bench, SplitConfig(protocol="strict"), seed=seed)
    assert strict.sizes()["evaluation"] == (m + nm - nm // 2, m, nm - nm // 2)
    np.testing.assert_array_equal(strict.supervised, sp.supervised)


@needs_data
def test_bookmia_local_subset_is_smaller_than_the_paper():
    bench = load_benchmark("bookmia", path=DATA / "BookMIA")
    assert bench.samples[0].meta["book"] == "The Call of the Wild.txt"
    with pytest.warns(UserWarning, match="fewer than the requested subsample of 2000"):
        sp = split_benchmark(bench, seed=0)
    assert sp.sizes()["evaluation"] == (100, 50, 50)


@needs_data
def test_directory_without_the_split_file():
    with pytest.raises(
        FileNotFoundError, match=r"no file for benchmark 'wikimia' split 'length32'"
    ):
        load_benchmark("wikimia", path=DATA / "WikiMIA", split=32)
    with pytest.raises(ValueError, match=r"unknown split 48; choose one of"):
        load_benchmark("wikimia", path=DATA / "WikiMIA", split=48)


# --- hub and registry --------------------------------------------------------------------------
def test_hub_offline_error_names_a_local_path(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(HubUnavailableError, match=r"swj0419/WikiMIA.*HF_HUB_OFFLINE is set.*path="):
        load_benchmark("WikiMIA", split=128)
    with pytest.raises(HubUnavailableError, match="avduarte333/BookTection"):
        load_benchmark("booktection")


def test_hub_dataset_without_datasets_package_says_what_to_install(tmp_path, monkeypatch):
    """A `hub:` dataset is read with `datasets` (its card's configs and splits); a named
    benchmark is read with the project's own readers and needs no `datasets`."""
    from calibdcd.data.benchmarks import load_hub_benchmark

    _fake_hub_dataset(tmp_path / "hub", "someone/my-mia")
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    monkeypatch.setitem(sys.modules, "datasets", None)  # as if not installed: import fails
    with pytest.raises(
        HubUnavailableError, match=r"needs the `datasets` package.*calibdcd\[data\]"
    ):
        load_hub_benchmark("someone/my-mia", text_field="input", label_field="is_member")


def test_unknown_name_lists_known_benchmarks():
    with pytest.raises(
        ValueError,
        match=r"nope: no such file, and 'nope' is not a known benchmark.*arxivtection.*wikimia",
    ):
        load_benchmark("nope")


def test_import_is_light():
    code = (
        "import sys, calibdcd.data, calibdcd.cli; "
        "print('torch' in sys.modules, 'datasets' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["False", "False"]


# --- validation on hand-made files -------------------------------------------------------------
def write_jsonl(path: Path, rows: list) -> Path:
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows))
    return path


def test_generic_jsonl_with_custom_columns(tmp_path):
    f = write_jsonl(
        tmp_path / "mine.jsonl",
        [{"body": "alpha text", "is_member": 1, "src": "x"}, {"body": "beta", "is_member": 0}],
    )
    bench = load_benchmark(f, text_field="body", label_field="is_member")
    assert bench.name == "mine"
    assert bench.texts == ["alpha text", "beta"]
    assert bench.samples[0].meta == {"src": "x"}
    assert bench.ids == ["0", "1"]


def test_missing_label_names_file_and_line(tmp_path):
    f = write_jsonl(tmp_path / "a.jsonl", [{"text": "ok", "label": 1}, {"text": "no label here"}])
    with pytest.raises(DataError, match=r"a\.jsonl, line 2: missing label") as ei:
        load_table(f)
    assert (Path(ei.value.file).name, ei.value.line, ei.value.problem) == (
        "a.jsonl",
        2,
        "missing label",
    )


@pytest.mark.parametrize("bad", [2, -1, 0.5, "yes", "member", [1]])
def test_label_not_0_1(tmp_path, bad):
    f = write_jsonl(
        tmp_path / "b.jsonl", [{"text": "t1", "label": 0}, {"text": "t2", "label": bad}]
    )
    with pytest.raises(DataError, match=r"b\.jsonl, line 2: label .* is not 0/1"):
        load_table(f)


@pytest.mark.parametrize(
    ("raw", "want"),
    [
        (1, 1),
        (0, 0),
        (True, 1),
        (False, 0),
        (1.0, 1),
        (0.0, 0),
        ("1", 1),
        (" 0 ", 0),
        ("1.0", 1),
        ("TRUE", 1),
        ("false", 0),
    ],
)
def test_accepted_labels(raw, want):
    assert parse_label(raw) == want


@pytest.mark.parametrize("raw", [None, "", "  ", float("nan")])
def test_missing_labels(raw):
    with pytest.raises(ValueError, match="missing label"):
        parse_label(raw)


def test_label_map(tmp_path):
    f = write_jsonl(
        tmp_path / "m.jsonl", [{"text": "a", "y": "member"}, {"text": "b", "y": "non-member"}]
    )
    bench = load_table(f, label_field="y", label_map={"member": 1, "non-member": 0})
    assert bench.labels.tolist() == [1, 0]
    with pytest.raises(ValueError, match="not 0 or 1"):
        parse_label("x", label_map={"x": 3})


@pytest.mark.parametrize(
    ("text", "problem"),
    [("", "empty text"), ("  \n", "empty text (whitespace only)"), (None, "empty text (missing)")],
)
def test_empty_text(tmp_path, text, problem):
    f = write_jsonl(
        tmp_path / "e.jsonl",
        [{"text": "fine", "label": 1}, {"text": text, "label": 0}, {"text": "x", "label": 0}],
    )
    with pytest.raises(DataError) as ei:
        load_table(f)
    assert (ei.value.line, ei.value.problem) == (2, problem)
    with pytest.warns(UserWarning, match=r"dropped 1 record\(s\) with empty text \(line 2\)"):
        bench = load_table(f, on_empty="drop")
    assert bench.texts == ["fine", "x"] and bench.ids == ["0", "2"]  # ids keep source positions


def test_text_not_a_string(tmp_path):
    f = write_jsonl(tmp_path / "n.jsonl", [{"text": 12, "label": 1}])
    with pytest.raises(DataError, match=r"line 1: text is not a string"):
        load_table(f)


def test_bad_json_lines_are_all_reported(tmp_path):
    f = write_jsonl(
        tmp_path / "j.jsonl",
        [
            {"text": "a", "label": 1},
            '{"text": "b", "label": 0',
            "",
            "[1, 2]",
            {"text": "c", "label": 0},
        ],
    )
    with pytest.raises(DataError) as ei:
        load_table(f)
    err = ei.value
    assert [(p.location.line, p.problem.split(" (")[0]) for p in err.problems] == [
        (2, "bad JSON line"),
        (4, "JSON line is a list, expected an object"),
    ]
    assert "2 problems in" in str(err)


def test_all_record_problems_in_one_error(tmp_path):
    f = write_jsonl(
        tmp_path / "many.jsonl",
        [
            {"text": "", "label": 1},
            {"text": "b", "label": 5},
            {"text": "c"},
            {"text": "d", "label": 0},
        ],
    )
    with pytest.raises(DataError) as ei:
        load_table(f)
    assert [(p.location.line, p.problem) for p in ei.value.problems] == [
        (1, "empty text"),
        (
            2,
            "label 5 is not 0/1 (accepted: 0, 1, true, false, '0', '1') "
            "(pass label_map to map other values)",
        ),
        (3, "missing label"),
    ]


def test_missing_text_column(tmp_path):
    f = write_jsonl(tmp_path / "c.jsonl", [{"content": "a", "label": 1}])
    with pytest.raises(
        DataError,
        match=r"no text column: looked for \['text', 'input', 'snippet'\], "
        r"the file has \['content', 'label'\]",
    ):
        load_table(f)


def test_duplicates_warn_and_dedupe(tmp_path):
    rows = [
        {"text": "same", "label": 1},
        {"text": "other", "label": 0},
        {"text": "same", "label": 1},
        {"text": "clash", "label": 1},
        {"text": "clash", "label": 0},
    ]
    f = write_jsonl(tmp_path / "d.jsonl", rows)
    with pytest.warns(
        DuplicateTextWarning,
        match=r"2 duplicate text\(s\) \(line 3 repeats line 1, line 5 repeats line 4\); "
        r"1 text\(s\) occur with both labels \(lines 4, 5\); pass dedupe=True",
    ):
        bench = load_table(f)
    assert len(bench) == 5
    with pytest.warns(DuplicateTextWarning, match="dropped"):
        deduped = load_table(f, dedupe=True)
    assert deduped.texts == ["same", "other"]  # first "same" kept, both "clash" dropped
    assert deduped.report.dropped_duplicates == (3, 4, 5)


def test_csv_line_numbers_count_multiline_fields(tmp_path):
    f = tmp_path / "t.csv"
    with open(f, "w", newline="", encoding="utf-8-sig") as fh:  # with a BOM, like arXivTection.csv
        w = csv.writer(fh)
        w.writerow(["text", "label"])
        w.writerow(["first line\nsecond line\nthird", "1"])  # lines 2-4
        w.writerow(["ok", "0"])  # line 5
        w.writerow(["no label", ""])  # line 6
    with pytest.raises(DataError, match=r"t\.csv, line 6: missing label"):
        load_table(f)


def test_csv_wrong_field_count(tmp_path):
    f = tmp_path / "w.csv"
    f.write_text("text,label\nhello,1\nbroken,0,extra\n")
    with pytest.raises(DataError, match=r"w\.csv, line 3: row has 3 fields but the header has 2"):
        load_table(f)


def test_tsv_and_gzip(tmp_path):
    f = tmp_path / "x.tsv"
    f.write_text("input\tlabel\nhello world\t1\nbye\tfalse\n")
    assert load_table(f).labels.tolist() == [1, 0]
    g = tmp_path / "x.jsonl.gz"
    with gzip.open(g, "wt") as fh:
        fh.write(json.dumps({"text": "z", "label": "1"}) + "\n")
    assert load_table(g).texts == ["z"]


def test_parquet(tmp_path):
    pa = pytest.importorskip("pyarrow")
    pq = pytest.importorskip("pyarrow.parquet")
    f = tmp_path / "p.parquet"
    pq.write_table(pa.table({"text": ["a", "b", "c"], "label": [True, False, None]}), f)
    with pytest.raises(DataError, match=r"p\.parquet, row 3: missing label"):
        load_table(f)
    pq.write_table(pa.table({"text": ["a", "b"], "label": [1.0, 0.0], "k": [5, 6]}), f)
    bench = load_table(f)
    assert bench.labels.tolist() == [1, 0] and bench.samples[1].meta == {"k": 6}


def test_id_field(tmp_path):
    f = write_jsonl(
        tmp_path / "i.jsonl",
        [{"uid": "a", "text": "x", "label": 1}, {"uid": "a", "text": "y", "label": 0}],
    )
    with pytest.raises(DataError, match=r"line 2: id 'a' already used on line 1"):
        load_table(f, id_field="uid")


def test_unsupported_suffix(tmp_path):
    f = tmp_path / "data.xlsx"
    f.write_text("x")
    with pytest.raises(ValueError, match="unsupported file type"):
        load_table(f)


def test_sample_and_benchmark_checks():
    with pytest.raises(ValueError, match="label must be the int 0 or 1"):
        Sample("a", "text", 2)
    with pytest.raises(ValueError, match="label must be the int 0 or 1"):
        Sample("a", "text", True)
    s = Sample("a", "t", 1)
    with pytest.raises(ValueError, match="sample id 'a' occurs at positions 0 and 1"):
        Benchmark("b", (s, Sample("a", "u", 0)), source="mem")


# --- the protocol --------------------------------------------------------------------------------
def labels_of(n1: int, n0: int, seed: int = 0) -> np.ndarray:
    lab = np.array([1] * n1 + [0] * n0)
    return np.random.default_rng(seed).permutation(lab)


def check_invariants(sp: Split, labels: np.ndarray) -> None:
    sup, cal, ev, sub = (
        set(a.tolist()) for a in (sp.supervised, sp.calibration, sp.evaluation, sp.subsample)
    )
    assert sup.isdisjoint(cal) and sup.isdisjoint(ev)
    assert sup | cal | ev <= sub
    assert (labels[sp.calibration] == 0).all()
    assert (labels[sp.supervised] == 1).sum() == (labels[sp.supervised] == 0).sum()
    if sp.protocol == "paper":
        assert cal <= ev and ev == sub - sup
    else:
        assert cal.isdisjoint(ev) and ev == sub - sup - cal
    for a in (sp.supervised, sp.calibration, sp.evaluation, sp.subsample):
        assert (np.diff(a) > 0).all()  # sorted, no repeats


@pytest.mark.parametrize("protocol", ["paper", "strict"])
@pytest.mark.parametrize(("n1", "n0"), [(284, 258), (3499, 1985), (51, 52), (300, 121)])
def test_split_invariants_and_sizes(protocol, n1, n0):
    labels = labels_of(n1, n0)
    sp = make_split(labels, SplitConfig(protocol=protocol), seed=3)
    check_invariants(sp, labels)
    remaining = n0 - 50
    assert len(sp.calibration) == remaining // 2  # floor of half the remaining non-members
    n_eval = n1 + n0 - 100 - (remaining // 2 if protocol == "strict" else 0)
    assert len(sp.evaluation) == n_eval


def test_split_is_deterministic_and_seed_dependent():
    labels = labels_of(400, 300)
    a = make_split(labels, seed=11)
    b = make_split(labels, seed=11)
    c = make_split(labels, seed=12)
    for part in ("supervised", "calibration", "evaluation"):
        np.testing.assert_array_equal(a.part(part), b.part(part))
    assert not np.array_equal(a.supervised, c.supervised)
    assert not np.array_equal(a.calibration, c.calibration)


def test_steps_use_independent_streams():
    labels = labels_of(400, 300)
    a = make_split(labels, SplitConfig(calibration_fraction=0.5), seed=5)
    b = make_split(labels, SplitConfig(calibration_fraction=0.3, protocol="strict"), seed=5)
    np.testing.assert_array_equal(a.supervised, b.supervised)
    assert len(b.calibration) == int(0.3 * 250)
    c = make_split(labels, SplitConfig(n_calibration=10), seed=5)
    assert len(c.calibration) == 10


def test_subsample_equal_and_stratified():
    labels = labels_of(3499, 1985)
    eq = subsample(labels, 2000, seed=0)
    assert len(eq) == 2000 and labels[eq].sum() == 1000
    st = subsample(labels, 2000, seed=0, balance="stratified")
    assert labels[st].sum() == round(2000 * 3499 / 5484)
    assert not np.array_equal(eq, subsample(labels, 2000, seed=1))
    np.testing.assert_array_equal(eq, subsample(labels, 2000, seed=0))
    with pytest.raises(ValueError, match=r"needs 2000 non-members but the benchmark has 1985"):
        subsample(labels, 4000, seed=0)
    with pytest.warns(UserWarning, match="fewer than the requested subsample"):
        assert len(subsample(labels, 10_000)) == len(labels)


def test_a_fixed_subsample_seed_keeps_the_texts_and_varies_the_split():
    labels = labels_of(700, 700)
    fixed = SplitConfig(subsample=400, subsample_seed=0)
    a, b = (
        make_split(labels, fixed, seed=1, subsample_size=400),
        make_split(labels, fixed, seed=2, subsample_size=400),
    )
    np.testing.assert_array_equal(a.subsample, b.subsample)  # the same 400 texts
    assert not np.array_equal(a.supervised, b.supervised)  # split differently
    assert not np.array_equal(a.calibration, b.calibration)
    # the paper's default: each seed draws its own subsample; the fixed one is seed 0's
    per_seed = SplitConfig(subsample=400)
    c = make_split(labels, per_seed, seed=2, subsample_size=400)
    assert not np.array_equal(c.subsample, b.subsample)
    zero = make_split(labels, per_seed, seed=0, subsample_size=400)
    np.testing.assert_array_equal(zero.subsample, a.subsample)
    with pytest.raises(ValueError, match="subsample_seed must be None or an int"):
        SplitConfig(subsample_seed="0")  # type: ignore[arg-type]


def test_subsample_config_resolution():
    labels = labels_of(1200, 1100)
    bench = Benchmark(
        "booktection",
        tuple(Sample(str(i), f"text {i}", int(y)) for i, y in enumerate(labels)),
        source="memory",
    )
    assert split_benchmark(bench, seed=0).sizes()["subsample"] == (2000, 1000, 1000)
    assert (
        split_benchmark(bench, SplitConfig(subsample=None), seed=0).sizes()["subsample"][0] == 2300
    )
    assert split_benchmark(bench, SplitConfig(subsample=600), seed=0).sizes()["subsample"] == (
        600,
        300,
        300,
    )
    sp = split_benchmark(bench, seed=0)
    assert sp.part_ids("supervised") == [bench.ids[i] for i in sp.supervised]


@pytest.mark.parametrize(
    ("n1", "n0", "config", "match"),
    [
        (49, 300, SplitConfig(), r"needs 50 members .* has 49"),
        (300, 50, SplitConfig(), r"needs 50 non-members \(plus at least 1 left for calibration\)"),
        (300, 51, SplitConfig(), r"leaves no calibration non-member"),
        (
            300,
            80,
            SplitConfig(n_calibration=31),
            r"n_calibration=31 but only 30 non-members remain",
        ),
        (50, 120, SplitConfig(), r"evaluation pool .* lacks a class"),
        (60, 52, SplitConfig(protocol="strict", n_calibration=2), r"lacks a class"),
    ],
)
def test_split_errors_when_a_class_is_too_small(n1, n0, config, match):
    with pytest.raises(ValueError, match=match):
        make_split(labels_of(n1, n0), config, seed=0)


def test_split_config_validation():
    with pytest.raises(ValueError, match="protocol must be"):
        SplitConfig(protocol="loose")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="calibration_fraction"):
        SplitConfig(calibration_fraction=1.0)
    with pytest.raises(ValueError, match="subsample must be"):
        SplitConfig(subsample=1)


def test_split_rejects_broken_invariants():
    labels = np.array([1, 1, 0, 0, 0])
    everything = np.arange(5)
    with pytest.raises(ValueError, match="supervised overlaps"):
        Split(
            everything, np.array([0, 2]), np.array([3]), np.array([0, 1, 3, 4]), labels, "paper", 0
        )
    with pytest.raises(ValueError, match="calibration contains members"):
        Split(everything, np.array([0, 2]), np.array([1]), np.array([1, 3, 4]), labels, "paper", 0)
    with pytest.raises(ValueError, match="'strict' removes calibration"):
        Split(everything, np.array([0, 2]), np.array([3]), np.array([1, 3, 4]), labels, "strict", 0)


# --- CLI ----------------------------------------------------------------------------------
@needs_data
def test_cli_show_wikimia():
    res = CliRunner().invoke(app, ["data", "show", "wikimia", "--path", str(DATA / "WikiMIA")])
    assert res.exit_code == 0, res.output
    lines = res.output.splitlines()
    assert "detector length  L = 64" in lines
    assert any(line.split() == ["evaluation", "442", "234", "208"] for line in lines)
    assert any(line.split() == ["calibration", "104", "0", "104"] for line in lines)
    assert any(line.split()[:3] == ["member", "(1)", "284"] for line in lines)


def test_cli_show_prints_a_warning_even_when_an_error_follows(tmp_path):
    """A warning raised while reading (repeated texts dropped) prints on the one warning line
    even when the command then stops on an error (it was recorded and lost)."""
    rows = [{"text": f"t{i % 8} words here", "label": i % 2} for i in range(16)]
    f = write_jsonl(tmp_path / "d.jsonl", rows)
    res = CliRunner().invoke(app, ["data", "show", str(f), "--dedupe", "--subsample", "lots"])
    assert res.exit_code == 2, res.output
    warned = [ln for ln in res.output.splitlines() if ln.startswith("warning: ")]
    assert len(warned) == 1 and "8 duplicate text(s)" in warned[0], res.output
    assert "expected 'paper', 'all' or an integer" in res.output  # the usage error itself


def test_cli_show_generic_file_and_errors(tmp_path, monkeypatch):
    rows = [{"text": f"t{i} word", "label": i % 2} for i in range(240)]
    f = write_jsonl(tmp_path / "g.jsonl", rows)
    runner = CliRunner()
    res = runner.invoke(app, ["data", "show", str(f), "--protocol", "strict"])
    assert res.exit_code == 0, res.output
    lines = [line.split() for line in res.output.splitlines()]
    # 120/120 texts: 50 + 50 supervised, 35 of the 70 remaining non-members calibrate (strict)
    assert ["evaluation", "105", "70", "35"] in lines
    assert ["calibration", "35", "0", "35"] in lines
    bad = write_jsonl(tmp_path / "bad.jsonl", [{"text": "x", "label": 3}])
    res = runner.invoke(app, ["data", "show", str(bad)])
    assert res.exit_code == 2 and "bad.jsonl, line 1: label 3 is not 0/1" in res.output
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    res = runner.invoke(app, ["data", "show", "bookmia"])
    assert res.exit_code == 2 and "--path" in res.output


def test_cli_list():
    res = CliRunner().invoke(app, ["data", "list"])
    assert res.exit_code == 0
    names = [line.split()[0] for line in res.output.splitlines()]
    assert names == ["wikimia", "wikimia-24", "bookmia", "booktection", "arxivtection", "arxivmia"]


# --- HF-style layouts ----------------------------------------------------------------------
def write_decop_csv(path: Path, rows: list[tuple[str, str, int, str]]) -> Path:
    """A BookTection.csv in the hub's full format: (verbatim, book, label, length) per row; the
    verbatim passage is placed at the option named by Answer."""
    with open(path, "w", newline="", encoding="utf-8") as fh:
        w = csv.writer(fh)
        w.writerow(
            ["ID", "Example_A", "Example_B", "Example_C", "Example_D", "Answer", "Label", "Length"]
        )
        for i, (text, book, label, length) in enumerate(rows):
            answer = "ABCD"[i % 4]
            options = [f"paraphrase {i}.{k}" for k in range(3)]
            options.insert("ABCD".index(answer), text)
            w.writerow([book, *options, answer, label, length])
    return path


def test_booktection_full_file_with_three_lengths(tmp_path):
    rows = [
        (f"{length} passage {i}", f"Book_{i % 3}", i % 2, length)
        for length in ("small", "medium", "large")
        for i in range(6)
    ]
    f = write_decop_csv(tmp_path / "BookTection.csv", rows)
    bench = load_benchmark("booktection", path=tmp_path, split="large")
    assert bench.key == "booktection/large" and bench.default_length == 256
    assert bench.texts == [f"large passage {i}" for i in range(6)]  # verbatim = Example_<Answer>
    assert bench.report.n_filtered == 12
    s = bench.samples[1]
    assert s.meta["answer"] == "B" and s.meta["length"] == "large"
    assert s.meta["paraphrases"] == ["paraphrase 13.0", "paraphrase 13.1", "paraphrase 13.2"]
    assert bench.ids == [str(i) for i in range(12, 18)]  # positions in the whole file
    medium = load_benchmark("booktection", path=f)  # default subset
    assert medium.texts[0] == "medium passage 0"
    # a per-length file name selects its subset when split is not given
    g = write_decop_csv(tmp_path / "BookTection_small.csv", rows[:6])
    assert load_benchmark("booktection", path=g).key == "booktection/small"


def test_parquet_shards_in_a_directory(tmp_path):
    pa = pytest.importorskip("pyarrow")
    pq = pytest.importorskip("pyarrow.parquet")
    for k in range(2):
        texts = [f"shard {k} text {i}" for i in range(3)]
        table = pa.table({"input": texts, "label": [1, 0, 1]})
        pq.write_table(table, tmp_path / f"WikiMIA_length32-0000{k}-of-00002.parquet")
    bench = load_benchmark("wikimia", path=tmp_path, split=32)
    assert len(bench) == 6 and bench.ids == [str(i) for i in range(6)]
    assert bench.texts[3] == "shard 1 text 0" and bench.default_length == 32


def _data_cli(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess:
    """`calibdcd data ...` in a fresh process (huggingface_hub reads its endpoint and offline
    switch at import), with ``env`` over this one's."""
    from experiment_support import calibdcd_cli

    return calibdcd_cli("data", *args, env=env, timeout=120)


def test_a_named_benchmark_is_fetched_once_into_the_hub_cache_then_read_offline(tmp_path):
    """A known benchmark named without a path, absent from the local hub cache, is downloaded
    into it (the fetch `calibdcd models fetch` does, from a hub served on loopback), read with
    the benchmark's own file reader, and names the snapshot's commit; the same command offline
    then reads the same texts from the cache without a request. Read errors name the file and
    line; a repository the hub lacks is one line that says how to fetch it or pass a copy."""
    from hub_support import FakeHub

    commit = "d" * 40
    books = [
        {"book_id": i // 2, "book": f"B{i // 2}.txt", "snippet_id": i, "label": i % 2,
         "snippet": f"snippet number {i} of a book, old or new words"}
        for i in range(12)
    ]  # fmt: skip
    wiki = [{"text_here": "no input column", "label": 1}]
    hub = FakeHub(
        {},
        datasets={
            "swj0419/BookMIA": (commit, {"data/BookMIA.jsonl": _jsonl_bytes(books)}),
            "swj0419/WikiMIA": (commit, {"data/WikiMIA_length128.jsonl": _jsonl_bytes(wiki)}),
        },
    )
    cache = tmp_path / "hub"
    online = {"HF_HUB_CACHE": str(cache), "HF_ENDPOINT": hub.url, "HF_HUB_OFFLINE": "0",
              "HF_DATASETS_OFFLINE": "0", "HF_TOKEN": ""}  # fmt: skip
    try:
        first = _data_cli("show", "bookmia", "--subsample", "all", env=online)
        wrong = _data_cli("show", "wikimia", "--split", "128", env=online)
        absent = _data_cli("show", "arxivmia", env=online)
        n_requests = len(hub.log)
        again = _data_cli("show", "bookmia", "--subsample", "all", env=online)
        assert len(hub.log) == n_requests  # in the cache: no request
    finally:
        hub.close()
    assert first.returncode == 0, first.stderr
    assert f"hf://datasets/swj0419/BookMIA@{commit}/data/BookMIA.jsonl" in first.stdout
    assert "member (1)            6" in first.stdout
    snap = cache / "datasets--swj0419--BookMIA" / "snapshots" / commit / "data" / "BookMIA.jsonl"
    assert snap.read_bytes() == _jsonl_bytes(books)
    offline = _data_cli("show", "bookmia", "--subsample", "all",
                        env={"HF_HUB_CACHE": str(cache), "HF_HUB_OFFLINE": "1"})  # fmt: skip
    assert offline.returncode == 0, offline.stderr
    assert offline.stdout == first.stdout == again.stdout
    assert wrong.returncode == 2
    [line] = wrong.stderr.strip().splitlines()[-1:]
    assert line.startswith(
        f"error: hf://datasets/swj0419/WikiMIA@{commit}/data/WikiMIA_length128.jsonl, "
        "line 1: no text column"
    ), wrong.stderr
    assert absent.returncode == 2
    [line] = absent.stderr.strip().splitlines()[-1:]
    assert line.startswith("error: could not fetch 'arxivmia' (hub dataset zhliu/ArxivMIA): ")
    assert "no such repository on the hub" in line
    assert "hf download zhliu/ArxivMIA --repo-type dataset" in line
    assert "calibdcd data show arxivmia --path" in line
    # no hub to reach (a closed port): one line at once, not minutes of retries
    gone = _data_cli("show", "bookmia", env={**online, "HF_HUB_CACHE": str(tmp_path / "none"),
                                             "HF_ENDPOINT": "http://127.0.0.1:9"})  # fmt: skip
    assert gone.returncode == 2
    assert "'bookmia' (hub dataset swj0419/BookMIA): the hub cannot be reached (" in gone.stderr


def test_a_hub_benchmark_in_a_layout_its_patterns_do_not_know_is_read_by_datasets(tmp_path):
    """A known benchmark's repository whose files are not named as the local copies are (here
    BookTection as `data/train-00000-of-00001.csv`) is read from its snapshot by `datasets`
    (the split its card defines), DE-COP handling and all; a snapshot holding no data at all
    is one line naming the repository, what was looked for and the files it holds."""
    pytest.importorskip("datasets")
    from hub_support import FakeHub

    commit = "e" * 40
    rows = [(f"medium passage {i}", f"Book_{i % 3}", i % 2, "medium") for i in range(8)]
    rows += [(f"small passage {i}", "Book_9", i % 2, "small") for i in range(4)]
    csv_bytes = write_decop_csv(tmp_path / "x.csv", rows).read_bytes()
    hub = FakeHub(
        {},
        datasets={
            "avduarte333/BookTection": (commit, {"data/train-00000-of-00001.csv": csv_bytes}),
            "avduarte333/arXivTection": (commit, {"README.md": b"# nothing here", "a.txt": b""}),
        },
    )
    online = {"HF_HUB_CACHE": str(tmp_path / "hub"), "HF_ENDPOINT": hub.url,
              "HF_HUB_OFFLINE": "0", "HF_DATASETS_OFFLINE": "0", "HF_TOKEN": "",
              "HF_DATASETS_CACHE": str(tmp_path / "datasets")}  # fmt: skip
    try:
        shown = _data_cli("show", "booktection", "--subsample", "all", env=online)
        empty = _data_cli("show", "arxivtection", env=online)
    finally:
        hub.close()
    assert shown.returncode == 0, shown.stderr
    assert f"hf://datasets/avduarte333/BookTection@{commit}/train" in shown.stdout
    assert "records read     8" in shown.stdout and "member (1)            4" in shown.stdout
    assert empty.returncode == 2
    [line] = empty.stderr.strip().splitlines()[-1:]
    assert line.startswith(f"error: hf://datasets/avduarte333/arXivTection@{commit}: no file "), (
        line
    )
    assert "the snapshot holds README.md, a.txt" in line


def _jsonl_bytes(rows: list[dict]) -> bytes:
    return "".join(json.dumps(r) + "\n" for r in rows).encode()


def test_split_to_dict_uses_ids():
    labels = labels_of(60, 80)
    bench = Benchmark(
        "x", tuple(Sample(f"s{i}", "t", int(y)) for i, y in enumerate(labels)), source="memory"
    )
    d = split_benchmark(bench, seed=2).to_dict()
    assert d["protocol"] == "paper" and d["seed"] == 2
    assert len(d["supervised"]) == 100 and all(i.startswith("s") for i in d["supervised"])
    json.dumps(d)


# --- group-aware split -------------------------------------------------------------------------
def _groups_of(bench: Benchmark, idx) -> set[str]:
    return {bench.samples[int(i)].meta["group"] for i in idx}


@needs_data
@pytest.mark.parametrize(
    ("name", "rel", "n_groups"),
    [("booktection", "BookTection", 165), ("arxivtection", "arXivTection", 50),
     ("bookmia", "BookMIA", 82), ("booktection", "BookTection/BookTection_medium_passages.jsonl",
                                 165)],
)  # fmt: skip
def test_loaders_expose_the_book_or_paper_as_group(name, rel, n_groups):
    bench = load_quiet(name, path=DATA / rel, split="medium" if "passages" in rel else None)
    groups = [s.meta.get("group") for s in bench]
    assert None not in groups and len(set(groups)) == n_groups
    if name == "booktection":  # DE-COP ID: title_-_author
        assert "_-_" in groups[0]


@needs_data
@pytest.mark.parametrize("name", ["booktection", "arxivtection"])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_group_aware_split_keeps_every_group_on_one_side(name, seed, booktection):
    bench = booktection if name == "booktection" else load_quiet(name, path=DATA / "arXivTection")
    plain = split_benchmark(bench, seed=seed)
    # the paper's split puts passages of one book / paper on both sides
    assert _groups_of(bench, plain.supervised) & _groups_of(bench, plain.evaluation)
    sp = split_benchmark(bench, SplitConfig(group_by="group"), seed=seed)
    sup, pool = _groups_of(bench, sp.supervised), _groups_of(bench, sp.evaluation)
    assert not sup & pool
    assert not sup & _groups_of(bench, sp.calibration)
    sizes = sp.sizes()
    assert sizes["subsample"] == plain.sizes()["subsample"]
    assert sizes["supervised"] == (100, 50, 50)
    # the pool is the subsample minus the supervised groups' texts, both classes present
    assert _groups_of(bench, sp.excluded) <= sup
    total = sizes["supervised"][0] + sizes["evaluation"][0] + len(sp.excluded)
    assert total == sizes["subsample"][0]
    assert sizes["evaluation"][1] > 0 and sizes["evaluation"][2] > 0
    assert sizes["calibration"][0] == (sizes["evaluation"][2]) // 2
    assert sp.to_dict()["excluded"] == [bench.ids[i] for i in sp.excluded]
    again = split_benchmark(bench, SplitConfig(group_by="group"), seed=seed)
    np.testing.assert_array_equal(again.supervised, sp.supervised)


def test_group_aware_split_on_hand_built_groups():
    # 3 member groups of 4, 3 non-member groups of 4; 5 supervised per class takes 2 groups each
    labels = np.array([1] * 12 + [0] * 12)
    groups = [f"g{i // 4}" for i in range(24)]
    sp = make_split(labels, SplitConfig(n_supervised_per_class=5), seed=3, groups=groups)
    g = np.array(groups)
    assert set(g[sp.supervised]).isdisjoint(g[sp.evaluation])
    assert len(sp.supervised) == 10 and len(sp.excluded) == 6
    assert sp.sizes()["evaluation"] == (8, 4, 4)
    # a class whose groups would all be consumed fails clearly
    with pytest.raises(ValueError, match="take all 3 member group"):
        make_split(labels, SplitConfig(n_supervised_per_class=9), seed=0, groups=groups)
    with pytest.raises(ValueError, match="none is left for calibration"):
        make_split(
            np.array([1] * 12 + [0] * 12),
            SplitConfig(n_supervised_per_class=5),
            groups=[f"g{i // 4}" for i in range(12)] + ["n0"] * 12,
        )


def test_group_by_needs_the_field_on_every_text():
    samples = [Sample(id=str(i), text=f"t {i}", label=i % 2, meta={"book": "b"} if i else {})
               for i in range(6)]  # fmt: skip
    bench = Benchmark(name="x", samples=tuple(samples), source="mem")
    with pytest.raises(ValueError, match=r"group_by='book' but 1 of 6 texts have no meta 'book'"):
        split_benchmark(bench, SplitConfig(group_by="book", n_supervised_per_class=1))


def test_hub_benchmark_reads_offline_from_a_fetched_dataset_snapshot(tmp_path, monkeypatch):
    """A benchmark named without ``path`` is read from its dataset repository in the local hub
    cache (huggingface_hub's layout, as `calibdcd models fetch` leaves it), offline; the source
    names the repository and the commit."""
    import hashlib
    import os

    cache = tmp_path / "hub"
    repo = cache / "datasets--swj0419--BookMIA"
    commit = "c" * 40
    snap = repo / "snapshots" / commit / "data"
    snap.mkdir(parents=True)
    (repo / "blobs").mkdir()
    rows = [
        {"book_id": i // 2, "book": f"Book {i // 2}.txt", "snippet_id": i,
         "snippet": f"snippet number {i} of a book, long enough to be a text", "label": i % 2}
        for i in range(12)
    ]  # fmt: skip
    data = "".join(json.dumps(r) + "\n" for r in rows).encode()
    blob = repo / "blobs" / hashlib.sha256(data).hexdigest()
    blob.write_bytes(data)
    (snap / "BookMIA.jsonl").symlink_to(os.path.relpath(blob, snap))
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(commit)
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    bench = load_benchmark("bookmia")
    assert len(bench) == 12 and sum(bench.labels) == 6
    assert bench.source == f"hf://datasets/swj0419/BookMIA@{commit}/data/BookMIA.jsonl"
    # not fetched: one line that says how to fetch it
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "empty"))
    with pytest.raises(HubUnavailableError, match=r"calibdcd models fetch CONFIG.*repo-type"):
        load_benchmark("bookmia")


def _fake_hub_dataset(hub: Path, repo: str, commit: str = "c0ffee" * 6 + "c0ff") -> None:
    """A dataset repository as `hf download --repo-type dataset` leaves it in the hub cache:
    two splits of jsonl rows and a card that names them."""
    import json

    root = hub / f"datasets--{repo.replace('/', '--')}"
    snap = root / "snapshots" / commit
    (snap / "data").mkdir(parents=True)
    (root / "refs").mkdir()
    (root / "refs" / "main").write_text(commit)
    for split, n in (("train", 40), ("test", 30)):
        rows = [
            {"input": f"{split} passage number {i} on a topic", "is_member": i % 2}
            for i in range(n)
        ]
        (snap / "data" / f"{split}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (snap / "README.md").write_text(
        "---\nconfigs:\n- config_name: default\n  data_files:\n"
        "  - split: train\n    path: data/train.jsonl\n  - split: test\n    path: data/test.jsonl\n"
        "---\n"
    )


def _fake_pairs_dataset(hub: Path, repo: str) -> None:
    """MIMIR's layout in the hub cache: configs per source, splits per n-gram filter, a member
    and a non-member text per row."""
    import json

    commit = "f00d" * 10
    root = hub / f"datasets--{repo.replace('/', '--')}"
    snap = root / "snapshots" / commit
    (snap / "arxiv").mkdir(parents=True)
    (root / "refs").mkdir()
    (root / "refs" / "main").write_text(commit)
    rows = [
        {"member": f"seen paper {i} text", "nonmember": f"new paper {i} text"} for i in range(25)
    ]
    (snap / "arxiv" / "ngram_13_0.8.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (snap / "README.md").write_text(
        "---\nconfigs:\n- config_name: arxiv\n  data_files:\n"
        "  - split: ngram_13_0.8\n    path: arxiv/ngram_13_0.8.jsonl\n---\n"
    )


def test_any_hub_dataset_loads_offline_from_the_local_hub_cache(tmp_path, monkeypatch):
    """A hub dataset that is no known benchmark (`owner/name`, its split, its columns), read with
    `datasets` from its snapshot in the local hub cache with the hub disabled: `data show`
    prints it, a run config names it with `hub:`, the dry run reads it and names a missing one
    with the command that fetches it."""
    pytest.importorskip("datasets")
    from typer.testing import CliRunner

    from calibdcd.cli import app
    from calibdcd.experiment import ConfigError, dry_run, load_config

    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    monkeypatch.setenv("HF_DATASETS_CACHE", str(tmp_path / "datasets"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    _fake_hub_dataset(tmp_path / "hub", "someone/my-mia")
    runner = CliRunner()
    args = ["data", "show", "someone/my-mia", "--split", "test", "--text-field", "input"]
    res = runner.invoke(app, [*args, "--label-field", "is_member", "--subsample", "all"])
    assert res.exit_code == 0, res.output
    assert (
        "hf://datasets/someone/my-mia@c0ffee" in res.output
        and "member (1)           15" in res.output
    )
    res = runner.invoke(app, ["data", "show", "someone/absent"])
    assert res.exit_code == 2 and "hf download someone/absent --repo-type dataset" in res.output
    # MIMIR's layout: a config per source, a member and a non-member text per row
    _fake_pairs_dataset(tmp_path / "hub", "someone/mimir-like")
    pairs = ["data", "show", "someone/mimir-like", "--config", "arxiv", "--split", "ngram_13_0.8"]
    res = runner.invoke(app, [*pairs, "--pairs", "member,nonmember", "--subsample", "all"])
    assert res.exit_code == 0, res.output
    assert "member (1)           25" in res.output and "non-member (0)       25" in res.output
    res = runner.invoke(app, [*pairs, "--pairs", "member,other"])
    assert res.exit_code == 2 and "no column 'other'" in res.output
    cfg = tmp_path / "c.yaml"
    cfg.write_text(
        "benchmarks:\n"
        "  - {name: mine, hub: someone/my-mia, split: train, text_field: input,"
        " label_field: is_member}\n"
        "  - {name: gone, hub: someone/absent}\n"
        "  - {name: both, hub: someone/my-mia, path: x.jsonl}\n"
        "targets: [{name: m, backend: openai, model: m, family: qwen2.5,"
        " options: {base_url: 'http://127.0.0.1:9/v1'}}]\n"
        "detectors: [overlap]\n"
        "split: {n_supervised_per_class: 5}\n"
    )
    with pytest.raises(ConfigError, match=r"benchmarks\[2\]\.path: cannot be given with hub"):
        load_config(cfg)
    cfg.write_text("\n".join(x for x in cfg.read_text().splitlines() if "both" not in x))
    lines, problems = dry_run(load_config(cfg))
    text = "\n".join(lines + problems)
    assert "benchmarks[0] (mine-train): 40 texts from hf://datasets/someone/my-mia@c0ffee" in text
    assert "benchmarks[1] (gone): hub dataset someone/absent not fetched yet" in text
    assert "someone/absent: not in the local hub cache; used by benchmarks[1]" in text


def test_dry_run_keeps_a_benchmarks_warning_beside_its_error(tmp_path):
    """The dry run names a benchmark's problem (too few texts for the split) and keeps the
    warning its reading raised before (repeated texts dropped), which it used to lose."""
    from calibdcd.experiment import dry_run, load_config

    rows = [{"text": f"t{i % 8} words here", "label": i % 2} for i in range(16)]
    write_jsonl(tmp_path / "d.jsonl", rows)
    cfg = tmp_path / "c.yaml"
    cfg.write_text(
        "benchmarks:\n  - {name: mine, path: d.jsonl, dedupe: true}\n"
        "targets: [{name: m, backend: openai, model: m, family: qwen2.5,"
        " options: {base_url: 'http://127.0.0.1:9/v1'}}]\n"
        "detectors: [overlap]\n"
    )
    lines, problems = dry_run(load_config(cfg))
    assert any(p.startswith("benchmarks[0] (mine): ") for p in problems), problems
    at = lines.index("  benchmarks[0] (mine): not read (its problem is below)")
    assert lines[at + 1].startswith("    warning: ") and "8 duplicate text(s)" in lines[at + 1]


def test_hub_offline_names_the_variable_that_forbids_the_hub(monkeypatch, tmp_path):
    """One check for models and datasets: HF_HUB_OFFLINE for both, each library's own switch
    for its kind only; the one that is set is named (the messages say which to unset)."""
    from calibdcd.data.hub import dataset_snapshot
    from calibdcd.model_refs import hub_offline

    for var in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE", "TRANSFORMERS_OFFLINE"):
        monkeypatch.delenv(var, raising=False)
    assert hub_offline("model") is None and hub_offline("dataset") is None
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "yes")
    assert hub_offline("dataset") == "HF_DATASETS_OFFLINE" and hub_offline("model") is None
    with pytest.raises(
        HubUnavailableError, match=r"hub is disabled \(HF_DATASETS_OFFLINE is set\)"
    ):
        dataset_snapshot("someone/nowhere-to-be-found")
    # the list of missing models names the switch that forbids fetching what is missing
    from calibdcd.model_refs import MissingModelError, MissingModelsError, ModelUse

    cfg = tmp_path / "c.yaml"
    cfg.write_text("")
    use = ModelUse("benchmarks[0] (wikimia)", "swj0419/WikiMIA", need="dataset")
    missing = MissingModelError("swj0419/WikiMIA", kind="dataset")
    text = str(MissingModelsError([(use, missing)], str(cfg)))
    assert (
        f"calibdcd models fetch {cfg} (with network access and HF_DATASETS_OFFLINE unset)" in text
    )
    monkeypatch.setenv("TRANSFORMERS_OFFLINE", "1")
    assert hub_offline("model") == "TRANSFORMERS_OFFLINE"
    monkeypatch.setenv("HF_HUB_OFFLINE", "ON")
    assert hub_offline("model") == hub_offline("dataset") == "HF_HUB_OFFLINE"


def test_a_generic_json_lines_benchmark_keeps_its_ids_in_every_spelling(tmp_path):
    """A run keeps the ids of a generic JSON-lines benchmark with an `id` column; the column
    was found by reading the first line of a `.jsonl` file by hand, so a gzipped or `.ndjson`
    file, a byte-order mark or a leading blank line lost the ids (positional ones instead).
    It is found as the one reader names the columns; other formats keep the reader's rule."""
    from calibdcd.experiment.benchmark_entries import entry_id_field, load_benchmark_file
    from calibdcd.experiment.config import BenchmarkEntry

    rows = [{"id": f"t{i}", "text": f"text number {i}", "label": i % 2} for i in range(6)]
    body = "".join(json.dumps(r) + "\n" for r in rows)
    files = {
        "plain.jsonl": body.encode(),
        "lines.ndjson": body.encode(),
        "bom.jsonl": b"\xef\xbb\xbf" + body.encode(),
        "blank.jsonl": b"\n\n" + body.encode(),
        "packed.jsonl.gz": gzip.compress(body.encode()),
    }
    for name, data in files.items():
        (tmp_path / name).write_bytes(data)
        entry = BenchmarkEntry(name="mine", path=str(tmp_path / name))
        field = entry_id_field(entry, str(tmp_path / name))
        assert field == "id", name
        bench = load_benchmark_file(entry, str(tmp_path / name), field)
        assert [s.id for s in bench.samples] == [r["id"] for r in rows], name
    (tmp_path / "table.csv").write_text("id,text,label\nt0,a text,1\nt1,b text,0\n")
    entry = BenchmarkEntry(name="mine", path=str(tmp_path / "table.csv"))
    assert entry_id_field(entry, str(tmp_path / "table.csv")) is None  # as before
