"""An audit you can look at: ``score`` writes a self-contained HTML page beside its scores,
``fit`` reports (and records, and warns on) how well the detector separates the known texts it
did not train on, the status lines read as sentences with counts and rates, and the dry runs
estimate the target's work.

The fits run the overlap detector through a real OpenAI-compatible server on loopback (the
pattern of ``tests/test_error_path.py``): one that memorised the members, one that answers
everyone with random words."""

from __future__ import annotations

import base64
import hashlib
import html
import json
import random
import re

import numpy as np
import pytest
from typer.testing import CliRunner

from test_openai_target import FaultServer, _memorising_answer


def _invoke(*args: str, env: dict | None = None):
    from calibdcd.cli import app

    return CliRunner().invoke(app, list(args), env=env)


def _corpus(seed: int, n: int = 200) -> tuple[list[str], list[int]]:
    rng = random.Random(seed)
    words = [f"w{i}" for i in range(300)]
    texts = [" ".join(rng.choice(words) for _ in range(40)) for _ in range(n)]
    return texts, [i % 2 for i in range(n)]


@pytest.fixture(scope="module")
def audit(tmp_path_factory):
    """A fit (with its progress shown) through a server that memorised the members, behind a
    URL with credentials; the suspect file holds members the fit never saw and one text with
    HTML in it."""
    d = tmp_path_factory.mktemp("audit")
    texts, labels = _corpus(3)
    m = [t for t, y in zip(texts, labels, strict=True) if y]
    n = [t for t, y in zip(texts, labels, strict=True) if not y]
    (d / "m.txt").write_text("".join(t + "\n" for t in m[:70]))
    (d / "n.txt").write_text("".join(t + "\n" for t in n[:80]))
    suspect = [{"text": t, "id": f"doc-{i}"} for i, t in enumerate(m[70:90])]
    suspect.append({"text": "<script>alert(1)</script> & " + n[95], "id": "<odd & id>"})
    (d / "suspect.jsonl").write_text("".join(json.dumps(r) + "\n" for r in suspect))
    srv = FaultServer(lambda p, a: "ok", answer=_memorising_answer(texts, labels),
                      served_model="tiny")  # fmt: skip
    srv.__enter__()
    host = srv.url.removeprefix("http://")
    url = f"http://auditor:s3cret-pw@{host}/v1"
    spec = f"openai:base_url={url},model=tiny,family=qwen2.5,dialect=vllm"
    fit = _invoke("fit", "--target", spec, "--members", str(d / "m.txt"), "--nonmembers",
                  str(d / "n.txt"), "--detector", "overlap", "-o", str(d / "bundle"),
                  "--cache-dir", str(d / "cache"), "--progress")  # fmt: skip
    assert fit.exit_code == 0, fit.output
    score = _invoke("score", str(d / "bundle"), str(d / "suspect.jsonl"), "--cache-dir",
                    str(d / "cache"), "--base-url", url, "-o", str(d / "scores.jsonl"),
                    "--progress")  # fmt: skip
    assert score.exit_code == 0, score.output
    yield {"dir": d, "url": url, "spec": spec, "fit": fit.output, "score": score.output}
    srv.__exit__(None, None, None)


# --------------------------------------------------------------------------------------------
# fit: the cross-validated AUC on the known texts
# --------------------------------------------------------------------------------------------


def test_fit_prints_and_records_a_cross_validated_auc_with_its_interval(audit):
    from calibdcd.fitted.detector import read_bundle_header

    header = read_bundle_header(audit["dir"] / "bundle")  # its digest covers the record
    sep = header["separation"]
    assert sep["folds"] == 5 and sep["n_members"] == 70 and sep["calibdcd"] is True
    assert 0.5 < sep["low"] <= sep["auc"] <= sep["high"] <= 1.0
    assert sep["beats_chance"] is True and sep["warning"] is None
    assert "cross-validation" in sep["method"] and "CalibDCD" in sep["method"]
    assert re.match(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\+00:00$", header["fitted_at"])
    line = [ln for ln in _frames(audit["fit"]) if ln.startswith("known texts:")]
    assert len(line) == 1, audit["fit"]
    assert (
        f"cross-validated AUC on the known texts {sep['auc']:.3f} [{sep['low']:.3f}, " in (line[0])
    )
    assert "5-fold over 70 members" in line[0] and "NOT above chance" not in line[0]
    assert "does not separate" not in audit["fit"]


def test_fit_warns_when_the_detector_reads_the_known_texts_at_chance(tmp_path):
    """A server answering every prompt with random words: the overlap features carry nothing
    about membership, and fit says so in one warning line and in the bundle."""
    texts, labels = _corpus(5, 120)
    pairs = list(zip(texts, labels, strict=True))
    (tmp_path / "m.txt").write_text("".join(t + "\n" for t, y in pairs if y))
    (tmp_path / "n.txt").write_text("".join(t + "\n" for t, y in pairs if not y))
    vocab = sorted({w for t in texts for w in t.split()})

    def noise(req: dict) -> str:
        h = hashlib.sha256(f"{req['prompt']}|{req['seed']}".encode()).digest()
        return " " + " ".join(vocab[b % len(vocab)] for b in h[:12])

    with FaultServer(lambda p, a: "ok", answer=noise, served_model="tiny") as srv:
        spec = f"openai:base_url={srv.url}/v1,model=tiny,family=qwen2.5,dialect=vllm"
        res = _invoke("fit", "--target", spec, "--members", str(tmp_path / "m.txt"),
                      "--nonmembers", str(tmp_path / "n.txt"), "--detector", "overlap",
                      "-o", str(tmp_path / "b"), "--cache-dir", str(tmp_path / "cache"),
                      "--no-progress")  # fmt: skip
    assert res.exit_code == 0, res.output
    warned = [ln for ln in res.output.splitlines() if "does not separate the known" in ln]
    assert len(warned) == 1 and warned[0].startswith("warning: "), res.output
    assert "does not exclude chance (0.5)" in warned[0] and ".py" not in warned[0]
    assert "NOT above chance" in res.output
    sep = json.loads((tmp_path / "b" / "bundle.json").read_text())["separation"]
    assert sep["beats_chance"] is False and sep["low"] <= 0.5 and sep["warning"]


def test_the_cross_validated_separation_on_features():
    """The check itself: separable features beat chance, reversed ones are named as ranking
    members below non-members, too few texts are skipped (and said why)."""
    from calibdcd.fitted.audit import cross_validated_separation

    rng = np.random.default_rng(0)
    y = np.r_[np.ones(40, int), np.zeros(40, int)]
    z = rng.normal(size=(80, 3)) + 1.5 * y[:, None]

    def fit(sign: float):
        def f(ztr, ytr):
            w = ztr[ytr == 1].mean(0) - ztr[ytr == 0].mean(0)
            return lambda zte: sign * zte @ w

        return f

    good = cross_validated_separation(z, y, fit(1.0))
    assert good.beats_chance and good.low > 0.8 and good.folds == 5 and good.warning is None
    bad = cross_validated_separation(z, y, fit(-1.0))
    assert not bad.beats_chance and bad.high < 0.5
    assert bad.warning and "BELOW" in bad.warning
    few = cross_validated_separation(z[:6], np.array([1, 1, 1, 0, 0, 0]), fit(1.0),
                                     min_train_per_class=3)  # fmt: skip
    assert few.auc is None and "too few" in (few.skipped or "") and few.warning is None
    assert "no cross-validated AUC" in few.line()


# --------------------------------------------------------------------------------------------
# score: the page
# --------------------------------------------------------------------------------------------


def _page(audit) -> str:
    return (audit["dir"] / "scores.html").read_text(encoding="utf-8")


def test_score_writes_a_self_contained_page_with_embedded_figures(audit):
    page = _page(audit)
    assert "written to" in audit["score"] and "scores.html" in audit["score"]
    pngs = re.findall(r"src='data:image/png;base64,([A-Za-z0-9+/=]+)'", page)
    assert len(pngs) >= 1
    for data in pngs:
        assert base64.b64decode(data)[:8] == b"\x89PNG\r\n\x1a\n"
    # nothing is fetched from elsewhere, nothing runs
    assert "<script" not in page and "http-equiv" not in page
    assert not re.search(r"(src|href)=['\"](?!data:)", page)


def test_the_page_states_the_set_test_and_the_check_with_their_numbers(audit):
    page = _page(audit)
    summary = json.loads((audit["dir"] / "scores.jsonl").read_text().splitlines()[0])
    st, dc = summary["set_test"], summary["distribution_check"]
    assert f"AUC {st['auc']:.3f}" in page and f"{st['p_value']:.4g}" in page
    assert f"U = {st['statistic']:.1f}" in page
    assert "MORE member-like" in page  # the memorised members are found
    assert f"AUC {dc['auc']:.3f} [{dc['low']:.3f}, {dc['high']:.3f}]" in page
    assert f"{summary['n_members_declared']} of {summary['n_texts']} texts declared" in page


def test_the_table_is_sorted_by_p_value_and_escapes_the_texts(audit):
    page = _page(audit)
    table = page.split("<table id='texts'>", 1)[1].split("</table>", 1)[0]
    rows = re.findall(r"<tr(?: class=member)?><td>(\d+)</td><td>([^<]+)</td>", table)
    assert len(rows) == 21
    p = [float(v) for _, v in rows]
    assert p == sorted(p)
    lines = (audit["dir"] / "scores.jsonl").read_text().splitlines()[1:]
    by_p = sorted((json.loads(ln) for ln in lines), key=lambda r: (r["p_value"], -r["score"]))
    first = by_p[0]
    assert f"<td class='l'>{first['id']}</td><td>{first['index']}</td>" in table
    # the text with HTML in it is shown escaped, cut to its first 80 characters
    assert "<script>" not in page and "&lt;script&gt;alert(1)&lt;/script&gt; &amp; " in table
    assert "&lt;odd &amp; id&gt;" in table
    cells = re.findall(r"<td class='text'>([^<]*)</td>", table)
    assert all(len(html.unescape(c)) <= 80 for c in cells) and any(c.endswith("…") for c in cells)


def test_the_page_names_the_bundles_provenance_without_credentials(audit):
    page = _page(audit)
    header = json.loads((audit["dir"] / "bundle" / "bundle.json").read_text())
    for said in ("overlap", "<code>tiny</code>", "openai", "dialect", header["fitted_at"],
                 "CalibDCD", "decision FPR", "70 members", "known-text check",
                 f"{header['separation']['auc']:.3f}"):  # fmt: skip
        assert html.escape(said, quote=False) in page or said in page, said
    assert "s3cret-pw" not in page and "auditor:" not in page
    assert "***@" in page


def test_the_page_path_and_its_check():
    from calibdcd.fitted.report import report_path

    assert report_path("out/scores.jsonl").as_posix() == "out/scores.html"
    assert report_path("scores").as_posix() == "scores.html"
    assert report_path("a.html").as_posix() == "a.report.html"


def test_a_page_over_an_input_is_refused_in_one_line(audit, tmp_path):
    d = audit["dir"]
    res = _invoke("score", str(d / "bundle"), str(d / "suspect.jsonl"), "--cache-dir",
                  str(d / "cache"), "--base-url", audit["url"], "--no-progress", "-o",
                  str(tmp_path / "s.jsonl"), "--report", str(d / "suspect.jsonl"))  # fmt: skip
    assert res.exit_code == 2 and "Traceback" not in res.output, res.output
    assert "--report" in res.output and "input of this command" in res.output
    assert not (tmp_path / "s.jsonl").exists()


# --------------------------------------------------------------------------------------------
# Progress, dry runs, help
# --------------------------------------------------------------------------------------------


def _frames(output: str) -> list[str]:
    return [f.strip() for f in re.split(r"[\r\n]", output) if f.strip()]


def test_the_status_lines_read_as_sentences(audit):
    fit = _frames(audit["fit"])
    head = "fitting overlap on 150 known texts: step 1 of 14: features of the"
    assert any(f.startswith(head) for f in fit), fit
    assert any("step 14 of 14: cross-validating the fit" in f for f in fit), fit
    held = r"step \d+ of 14: features of the 24 held-out non-members"
    assert any(re.search(held, f) for f in fit), fit
    score = _frames(audit["score"])
    assert any(
        f.startswith("scoring 21 texts: step 1 of 2: features of the 21 texts to score")
        for f in score
    ), score
    assert any(f.startswith("scoring 21 texts: step 2 of 2: the distribution check") for f in score)
    # the target's own wait: a count and a rate of requests
    assert any(re.search(r"requests: .*\d+/21 \[.*request/s\]", f) for f in score), score
    for out in (audit["fit"], audit["score"]):
        assert "0step" not in out and "?step/s" not in out and ": :" not in out
    # a warning shown during the fit (24 held-out texts spend 4 % of 5 %) clears the status
    # line first instead of being appended to it
    assert any(f.startswith("warning: 24 held-out non-members") for f in fit), fit
    assert "so far]warning" not in audit["fit"]


def test_dry_runs_estimate_the_completions_to_generate(audit):
    d = audit["dir"]
    res = _invoke("score", str(d / "bundle"), str(d / "suspect.jsonl"), "--cache-dir",
                  str(d / "cache"), "--base-url", audit["url"], "-o", str(d / "x.jsonl"),
                  "--dry-run")  # fmt: skip
    assert res.exit_code == 0, res.output
    assert "at most 21 completions" in res.output and "continuation: 1 greedy" in res.output
    assert "report: " in res.output and not (d / "x.html").exists()
    res = _invoke("fit", "--target", audit["spec"], "--members", str(d / "m.txt"),
                  "--nonmembers", str(d / "n.txt"), "--detector", "overlap", "-o",
                  str(d / "b2"), "--cache-dir", str(d / "cache"), "--dry-run")  # fmt: skip
    assert res.exit_code == 0, res.output
    # 150 known texts, and the 24 calibration non-members again under each of qwen2.5's 10 views
    assert "at most 390 completions" in res.output, res.output
    assert "under each of 10 views" in res.output


def test_completions_per_text_follow_the_detectors_decoding():
    from calibdcd.detectors.base import completions_per_text
    from calibdcd.targets.base import GenerationParams

    class Sampled:
        queries_per_text = 2

        @property
        def generation_kinds(self) -> dict:
            return {"suffix": GenerationParams(max_new_tokens=4, temperature=1.0, n=8)}

    assert completions_per_text(Sampled()) == (16, "suffix: 8 sampled, for each of 2 queries "
                                                "per text")  # fmt: skip

    class Nothing:
        generation_kinds = None

    assert completions_per_text(Nothing()) is None


def test_fit_help_lists_the_backends_options_and_the_whole_example():
    res = _invoke("fit", "--help", env={"COLUMNS": "100"})
    assert res.exit_code == 0
    out = res.output
    example = "openai:base_url=http://127.0.0.1:8000/v1,model=my-model,family=qwen2.5,dialect=vllm"
    assert example in out
    assert "…" not in out
    for option in ("concurrency", "dialect", "api_key_env", "dtype", "batch_size"):
        assert option in out, option
