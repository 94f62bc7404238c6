"""The one error path: every user mistake on every command is one line (no traceback), naming
the file, line and field where there is one; ``-o`` never overwrites an input or a bundle.

A real fit (the overlap detector through a real OpenAI-compatible server on loopback) gives the
bundle the score cases use; each case is one bad input of a kind a user meets."""

from __future__ import annotations

import json
import random

import pytest
from typer.testing import CliRunner

from test_openai_target import FaultServer, _memorising_answer


def _one_line_error(res, *needles: str, code: int = 2) -> str:
    out = res.output
    assert res.exit_code == code, out
    assert "Traceback" not in out, out
    errors = [ln for ln in out.splitlines() if ln.startswith("error:")]
    assert len(errors) == 1, out
    for n in needles:
        assert n in errors[0], out
    return errors[0]


@pytest.fixture(scope="module")
def audit(tmp_path_factory):
    """A fitted overlap bundle through a loopback server (texts memorised by it), with the
    files and server the cases use."""
    from calibdcd.cli import app

    d = tmp_path_factory.mktemp("errors")
    rng = random.Random(3)
    words = [f"w{i}" for i in range(300)]
    texts = [" ".join(rng.choice(words) for _ in range(40)) for _ in range(200)]
    labels = [i % 2 for i in range(200)]
    m = [t for t, y in zip(texts, labels, strict=True) if y]
    n = [t for t, y in zip(texts, labels, strict=True) if not y]
    (d / "m.txt").write_text("".join(t + "\n" for t in m[:70]))
    (d / "n.txt").write_text("".join(t + "\n" for t in n[:80]))
    (d / "suspect.jsonl").write_text("".join(json.dumps({"text": t}) + "\n" for t in m[70:90]))
    srv = FaultServer(lambda p, a: "ok", answer=_memorising_answer(texts, labels),
                      served_model="tiny")  # fmt: skip
    srv.__enter__()
    url = srv.url + "/v1"
    spec = f"openai:base_url={url},model=tiny,family=qwen2.5,dialect=vllm"
    res = CliRunner().invoke(
        app,
        ["fit", "--target", spec, "--members", str(d / "m.txt"), "--nonmembers",
         str(d / "n.txt"), "--detector", "overlap", "-o", str(d / "bundle"), "--cache-dir",
         str(d / "cache"), "--no-progress"],
    )  # fmt: skip
    assert res.exit_code == 0, res.output
    yield {"dir": d, "url": url, "spec": spec, "server": srv}
    srv.__exit__(None, None, None)


def _invoke(*args: str, env: dict | None = None):
    from calibdcd.cli import app

    return CliRunner().invoke(app, list(args), env=env)


def _score(a, *more: str, texts=None, out=None, env=None, bundle=None):
    d = a["dir"]
    return _invoke(
        "score", str(bundle or d / "bundle"), str(texts or d / "suspect.jsonl"), "--cache-dir",
        str(d / "cache"), "--no-progress", "-o", str(out or d / "scores.jsonl"), *more, env=env,
    )  # fmt: skip


def test_score_never_overwrites_its_input_or_the_bundle(audit):
    d = audit["dir"]
    before = (d / "suspect.jsonl").read_bytes()
    res = _score(audit, out=str(d / "suspect.jsonl"))
    _one_line_error(res, "suspect.jsonl", "input of this command")
    assert (d / "suspect.jsonl").read_bytes() == before
    header = (d / "bundle" / "bundle.json").read_bytes()
    res = _score(audit, out=str(d / "bundle" / "bundle.json"))
    _one_line_error(res, "lies inside", "bundle")
    assert (d / "bundle" / "bundle.json").read_bytes() == header
    res = _score(audit, out=str(d / "bundle"))
    _one_line_error(res, "is a directory")


def test_fit_refuses_a_file_an_input_directory_or_an_existing_bundle_as_its_output(audit):
    d = audit["dir"]
    base = ["fit", "--target", audit["spec"], "--members", str(d / "m.txt"), "--nonmembers",
            str(d / "n.txt"), "--detector", "overlap", "--cache-dir", str(d / "cache"),
            "--no-progress"]  # fmt: skip
    for dry in ([], ["--dry-run"]):
        _one_line_error(_invoke(*base, *dry, "-o", str(d / "m.txt")), "is a file")
        _one_line_error(_invoke(*base, *dry, "-o", str(d)), "the directory of an input")
        _one_line_error(_invoke(*base, *dry, "-o", str(d / "bundle")), "holds a bundle already")


def test_missing_and_bad_text_files_are_one_line_in_fit_and_score(audit, tmp_path):
    d = audit["dir"]
    # fit without --dry-run on a missing data file
    res = _invoke("fit", "--target", audit["spec"], "--members", str(tmp_path / "nope.txt"),
                  "--nonmembers", str(d / "n.txt"), "-o", str(tmp_path / "b"), "--cache-dir",
                  str(d / "cache"), "--no-progress")  # fmt: skip
    _one_line_error(res, "nope.txt: no such file")
    # an empty text inside a suspect file: the dry run names its line, as the real score does
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps({"text": "fine text"}) + "\n" + json.dumps({"text": " "}) + "\n")
    for dry in ([], ["--dry-run"]):
        res = _score(audit, *dry, texts=str(bad), out=str(tmp_path / "s.jsonl"))
        _one_line_error(res, "bad.jsonl, line 2", "'text': empty text")
    # an unknown suffix
    odd = tmp_path / "s.dat"
    odd.write_text("a text\n")
    _one_line_error(_score(audit, texts=str(odd), out=str(tmp_path / "s.jsonl")),
                    "unsupported file type")  # fmt: skip


def test_a_cache_root_that_is_a_file_is_one_line(audit, tmp_path):
    f = tmp_path / "cachefile"
    f.write_text("not a directory")
    d = audit["dir"]
    res = _invoke("score", str(d / "bundle"), str(d / "suspect.jsonl"), "--no-progress", "-o",
                  str(tmp_path / "s.jsonl"), env={"CALIBDCD_CACHE": str(f)})  # fmt: skip
    _one_line_error(res, "cachefile", "$CALIBDCD_CACHE", "not a directory")


def test_a_truncated_bundle_file_is_one_line_even_unverified(audit, tmp_path):
    import shutil

    d = audit["dir"]
    b = tmp_path / "bundle"
    shutil.copytree(d / "bundle", b)
    null = b / "null.npz"
    null.write_bytes(null.read_bytes()[:40])
    out = tmp_path / "s.jsonl"
    _one_line_error(_score(audit, bundle=b, out=out), "null.npz")
    _one_line_error(_score(audit, "--allow-unverified", bundle=b, out=out), "null.npz")
    # an older bundle without digests, loaded unchecked: the truncated file is still named
    header = json.loads((b / "bundle.json").read_text())
    bare = {k: v for k, v in header.items() if k not in ("files_sha256", "header_sha256")}
    (b / "bundle.json").write_text(json.dumps(bare))
    _one_line_error(_score(audit, "--allow-unverified", bundle=b, out=out), "null.npz")


def test_fit_dry_run_reports_an_unreachable_server_beside_the_other_problems(tmp_path):
    """All of a config's problems at once, the server's included (it was found only once the
    others were fixed)."""
    import socket

    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    (tmp_path / "m.txt").write_text("a\nb\n")
    (tmp_path / "n.txt").write_text("c\nd\n")
    cfg = tmp_path / "fit.yaml"
    cfg.write_text(
        f'target: {{backend: openai, model: tiny, options: {{base_url: "http://127.0.0.1:{port}/v1"}}}}\n'
        "detector: {name: overlap, bogus: 1}\n"
        "data: {members: m.txt, nonmembers: n.txt}\n"
        "fpr: 2\n"
    )  # fmt: skip
    res = _invoke("fit", str(cfg), "--dry-run", "-o", str(tmp_path / "b"))
    assert res.exit_code == 2 and "Traceback" not in res.output, res.output
    assert "3 problems" in res.output, res.output
    for where in ("fit.yaml:1: target.options.base_url", "fit.yaml:2: detector.bogus",
                  "fit.yaml:4: fpr"):  # fmt: skip
        assert where in res.output, res.output


def test_a_server_answering_as_another_model_is_one_line(audit, tmp_path):
    d = audit["dir"]
    with FaultServer(lambda p, a: "ok", served_model="other") as srv:
        srv.models = (200, ["tiny"])  # lists the model, answers as another
        res = _score(audit, "--base-url", srv.url + "/v1", out=str(tmp_path / "s.jsonl"),
                     texts=str(d / "suspect.jsonl"))  # fmt: skip
        _one_line_error(res, "answered as model 'other', not 'tiny'", code=1)
        assert not (tmp_path / "s.jsonl").exists()


def test_empty_completions_are_warned_and_recorded_by_fit_and_score(audit, tmp_path):
    """The check ``run`` makes (targets.cache.empty_completions_warning), in fit and score."""
    d = audit["dir"]
    with FaultServer(lambda p, a: "emptytext", served_model="tiny") as srv:
        spec = f"openai:base_url={srv.url}/v1,model=tiny,family=qwen2.5,dialect=vllm"
        res = _invoke("fit", "--target", spec, "--members", str(d / "m.txt"), "--nonmembers",
                      str(d / "n.txt"), "--detector", "overlap", "-o", str(tmp_path / "b"),
                      "--cache-dir", str(tmp_path / "cache"), "--no-progress")  # fmt: skip
        assert res.exit_code == 0, res.output
        assert "warning: all" in res.output and "completions of the target were empty" in (
            res.output
        ), res.output
        header = json.loads((tmp_path / "b" / "bundle.json").read_text())
        rec = header["generation"]["completions"]
        assert rec["served"] > 0 and rec["empty"] == rec["served"] and rec["warning"]
        res = _invoke(
            "score",
            str(tmp_path / "b"),
            str(d / "suspect.jsonl"),
            "--cache-dir",
            str(tmp_path / "cache"),
            "--no-progress",
            "-o",
            str(tmp_path / "s.jsonl"),
        )
        assert res.exit_code == 0, res.output
        summary = json.loads((tmp_path / "s.jsonl").read_text().splitlines()[0])
        assert any("were empty" in w for w in summary["warnings"]), summary


def test_a_diagnosed_mistake_is_redacted_with_its_cause_in_the_debug_traceback(tmp_path):
    """A mistake a command explains itself (here `data show` of a file with a bad label) leaves
    on the one error path: one line without the traceback hint, a URL's password masked (the
    command's own handler printed it as it was), and with CALIBDCD_DEBUG=1 the traceback of
    the error it explains."""
    bad = tmp_path / "bad.jsonl"
    rows = [{"text": "a b c", "label": "http://user:hunter2@host/x"}, {"text": "d", "label": 0}]
    bad.write_text("".join(json.dumps(r) + "\n" for r in rows))
    res = _invoke("data", "show", str(bad))
    _one_line_error(res, f"{bad}, line 1: label 'http://***@host/x' is not 0/1")
    assert "hunter2" not in res.output and "CALIBDCD_DEBUG" not in res.output, res.output
    res = _invoke("data", "show", str(bad), env={"CALIBDCD_DEBUG": "1"})
    assert res.exit_code == 2 and "hunter2" not in res.output
    assert "Traceback" in res.output and "DataError" in res.output, res.output


def test_a_command_error_keeps_what_the_error_it_explains_said(monkeypatch):
    """CommandError keeps the explained error's notes (the setting it arose in) and its own exit
    code (the list of missing models exits 1); rendered as one block, without the hint."""
    from calibdcd.errors import CommandError, exit_code, render

    monkeypatch.delenv("CALIBDCD_DEBUG", raising=False)
    err = ValueError("no such view")
    err.add_note("in setting lab__chat__VeilProbe__s0")
    wrapped = CommandError(err)
    assert render(wrapped) == ["error: no such view (in setting lab__chat__VeilProbe__s0)"]
    assert exit_code(wrapped) == 2

    class Own(ValueError):
        exit_code = 1

    assert exit_code(CommandError(Own("models missing"))) == 1
    assert exit_code(CommandError("raced", exit_code=3)) == 3
