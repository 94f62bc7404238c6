"""One reader for every text input: a suspect file, fit's members and non-members and a
benchmark give the same texts whatever their format; near-duplicates are one text."""

from __future__ import annotations

import csv
import gzip
import json

import pytest

from calibdcd.data import DataError, load_table, load_texts, text_key

TEXTS = [
    "The first text, with a comma.",
    'A text with "quotes" and ünïcödé.',
    "  leading spaces kept",
    "third\ttabbed text",
]


def _write_all(tmp_path, texts, ids=None):
    ids = ids or [f"t{i}" for i in range(len(texts))]
    rows = [{"id": i, "text": t} for i, t in zip(ids, texts, strict=True)]
    files = {}
    p = tmp_path / "s.jsonl"
    p.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    files["jsonl"] = p
    p = tmp_path / "s.json"
    p.write_text(json.dumps(rows, indent=2), encoding="utf-8")
    files["json"] = p
    p = tmp_path / "s.csv"
    with p.open("w", newline="", encoding="utf-8") as fh:
        w = csv.DictWriter(fh, ["id", "text"])
        w.writeheader()
        w.writerows(rows)
    files["csv"] = p
    p = tmp_path / "s.txt"
    p.write_text("".join(t + "\n" for t in texts), encoding="utf-8")
    files["txt"] = p
    p = tmp_path / "s.jsonl.gz"
    with gzip.open(p, "wt", encoding="utf-8") as fh:
        fh.write("".join(json.dumps(r) + "\n" for r in rows))
    files["jsonl.gz"] = p
    p = tmp_path / "s.txt.gz"
    with gzip.open(p, "wt", encoding="utf-8") as fh:
        fh.write("".join(t + "\n" for t in texts))
    files["txt.gz"] = p
    return files


def test_every_format_gives_the_same_texts(tmp_path):
    files = _write_all(tmp_path, TEXTS)
    for fmt, path in files.items():
        got = load_texts(path)
        assert got.texts == tuple(TEXTS), fmt
        if fmt.startswith("txt"):
            assert got.ids == (None,) * len(TEXTS)
        else:
            assert got.ids == tuple(f"t{i}" for i in range(len(TEXTS))), fmt


def test_parquet_gives_the_same_texts(tmp_path):
    pa = pytest.importorskip("pyarrow")
    import pyarrow.parquet as pq

    path = tmp_path / "s.parquet"
    pq.write_table(pa.table({"text": TEXTS}), path)
    assert load_texts(path).texts == tuple(TEXTS)


def test_an_unknown_suffix_is_one_line_naming_the_supported_ones(tmp_path):
    p = tmp_path / "s.dat"
    p.write_text("a\nb\n")
    with pytest.raises(ValueError) as e:
        load_texts(p)
    msg = str(e.value)
    assert "\n" not in msg and "s.dat: unsupported file type" in msg
    for suffix in (".jsonl", ".json", ".csv", ".parquet", ".txt"):
        assert suffix in msg
    # a benchmark (labelled) is never read from .txt
    t = tmp_path / "b.txt"
    t.write_text("a\n")
    with pytest.raises(ValueError, match="unsupported file type") as e:
        load_table(t)
    assert "expected one of" in str(e.value) and ", .txt" not in str(e.value)


def test_every_problem_of_a_text_file_at_once(tmp_path):
    p = tmp_path / "s.jsonl"
    p.write_text(
        json.dumps({"text": "fine"}) + "\n"
        + json.dumps({"text": ""}) + "\n"
        + json.dumps({"text": 3}) + "\n"
        + json.dumps({"other": "x"}) + "\n"
    )  # fmt: skip
    with pytest.raises(DataError) as e:
        load_texts(p)
    lines = [pr.location.line for pr in e.value.problems]
    assert lines == [2, 3, 4]
    assert "'text': empty text" in str(e.value)
    j = tmp_path / "s.json"
    j.write_text(json.dumps([{"body": "a"}, {"body": "b"}]))
    with pytest.raises(DataError, match=r"no text column: looked for .*'body'"):
        load_texts(j)
    assert load_texts(j, text_field="body").texts == ("a", "b")


def test_text_key_collapses_whitespace_and_composes_unicode_but_keeps_case():
    assert text_key("a  b\tc\n") == text_key("a b c") == "a b c"
    assert text_key("caf\u0065\u0301") == text_key("caf\u00e9")  # NFD == NFC
    assert text_key("Abc") != text_key("abc")


def test_fit_texts_compare_near_copies_as_one_text():
    from calibdcd.fitted import FitTexts

    members = [f"member text number {i}" for i in range(20)]
    nonmembers = [f"other text number {i}" for i in range(60)]
    # 7 whitespace variants of non-members: dropped with a warning, never counted twice
    variants = [t.replace(" ", "  ") + "\n" for t in nonmembers[:7]]
    with pytest.warns(UserWarning, match=r"nonmembers: 7 repeated text\(s\) dropped"):
        ft = FitTexts.split(members, nonmembers + variants, heldout_fraction=0.5, seed=1)
    assert len(ft.heldout) == 30 and len({text_key(t) for t in ft.heldout}) == 30
    # a fit text with a trailing newline is the fit's text
    assert ft.part_of([ft.heldout[0] + "\n", " " + ft.supervised[0], "new"]) == [
        "heldout", "supervised", None,
    ]  # fmt: skip
    # a held-out text with a near-copy in another part is refused, naming it
    with pytest.raises(ValueError, match=r"heldout and supervised share 1 text"):
        FitTexts(
            supervised=("a text", "b text"), labels=(1, 0), heldout=("a  text ",),
        )  # fmt: skip
    with pytest.raises(ValueError, match=r"both members and non-members"):
        FitTexts.split(["x y z", "p q"], ["x  y z", "r s", "t u", "v w"])


def test_fit_texts_from_files_read_every_format(tmp_path):
    from calibdcd.fitted import FitTexts

    m = _write_all(tmp_path, [f"member {i}" for i in range(6)])
    (tmp_path / "n").mkdir()
    n = _write_all(tmp_path / "n", [f"non-member {i}" for i in range(9)])
    a = FitTexts.from_files(m["json"], n["csv"], seed=0)
    b = FitTexts.from_files(m["txt"], n["jsonl.gz"], seed=0)
    assert a == b


def test_veilprobes_local_model_pool_is_read_by_the_one_reader(tmp_path):
    """`calibdcd veilprobe train-local-models --pool` reads its texts as fit and score do: a
    JSON array is its rows (it was read as raw lines, brackets and all, and trained on), and a
    file without a text column stops before any training with one line naming file and line."""
    from typer.testing import CliRunner

    from calibdcd.cli import app

    rows = [{"body": t} for t in TEXTS]
    p = tmp_path / "pool.json"
    p.write_text(json.dumps(rows, indent=2), encoding="utf-8")
    cache = tmp_path / "cache"
    args = ["veilprobe", "train-local-models", "--pool", str(p), "--cache-dir", str(cache)]
    res = CliRunner().invoke(app, args)
    assert res.exit_code == 2, res.output
    [line] = [ln for ln in res.output.splitlines() if ln.startswith("error: ")]
    assert str(p) in line and "no text column" in line, line
    assert not cache.exists()  # nothing trained
    res = CliRunner().invoke(app, [*args[:3], str(tmp_path / "absent.txt")])
    assert res.exit_code == 2 and "absent.txt" in res.output and "Traceback" not in res.output
