"""One redaction: a secret planted in every place a config can carry one (a ``${..._KEY}``
variable, a URL's password, the Authorization header (``api_key_env``), ``extra_body``, a
variable listed under ``secrets:``) appears in no file that ``run``, ``report``, ``fit`` and
``score`` write, nor in what they print. Real commands in-process against a real
OpenAI-compatible server on loopback."""

from __future__ import annotations

import base64
import json
import random

from typer.testing import CliRunner

from test_openai_target import FaultServer, _memorising_answer

SECRETS = {
    "CALIBDCD_T_PASSWORD": "pw-9c1e77-url",  # a URL's password
    "CALIBDCD_T_TOKEN": "tok-4d2b91-header",  # the Authorization header (api_key_env)
    "CALIBDCD_T_EXTRA_KEY": "key-77aa10-extra",  # extra_body's api_key
    "CALIBDCD_T_PLAIN": "plain-0b8d3f-listed",  # any name, listed under secrets:
}


def _target_yaml(host: str) -> str:
    return (
        "    backend: openai\n"
        "    model: tiny\n"
        "    family: llama3\n"
        "    options:\n"
        '      base_url: "http://auditor:${CALIBDCD_T_PASSWORD}@' + host + '/v1"\n'
        "      api_key_env: CALIBDCD_T_TOKEN\n"
        '      extra_body: {api_key: "${CALIBDCD_T_EXTRA_KEY}", note: "${CALIBDCD_T_PLAIN}"}\n'
        "      max_retries: 0\n"
    )


def test_no_planted_secret_reaches_a_written_file_or_a_message(tmp_path, monkeypatch):
    from calibdcd.cli import app

    for k, v in SECRETS.items():
        monkeypatch.setenv(k, v)
    monkeypatch.chdir(tmp_path)
    rng = random.Random(5)
    words = [f"w{i}" for i in range(300)]
    texts = [" ".join(rng.choice(words) for _ in range(40)) for _ in range(160)]
    labels = [i % 2 for i in range(160)]
    (tmp_path / "bench.jsonl").write_text(
        "".join(json.dumps({"text": t, "label": y}) + "\n" for t, y in zip(texts, labels,
                                                                            strict=True))
    )  # fmt: skip
    m = [t for t, y in zip(texts, labels, strict=True) if y]
    n = [t for t, y in zip(texts, labels, strict=True) if not y]
    (tmp_path / "m.txt").write_text("".join(t + "\n" for t in m[:60]))
    (tmp_path / "n.txt").write_text("".join(t + "\n" for t in n[:70]))
    (tmp_path / "suspect.txt").write_text("".join(t + "\n" for t in m[60:80]))
    runner = CliRunner()
    printed = []
    with FaultServer(lambda p, a: "ok", answer=_memorising_answer(texts, labels)) as srv:
        host = srv.url.removeprefix("http://")
        (tmp_path / "run.yaml").write_text(
            "name: secrets\n"
            "secrets: [CALIBDCD_T_PLAIN]\n"
            "benchmarks: [{name: lab, path: bench.jsonl, label: lab}]\n"
            "targets:\n  - name: remote\n" + _target_yaml(host)
            + "detectors:\n"
            "  - {name: overlap, label: Overlap, options: {max_new_tokens: 4, positions: 4}}\n"
            "split: {n_supervised_per_class: 20}\n"
            "analyses: {ablations: false, adaptive_vs_fixed: false, fp_recovery: false}\n"
            "evaluation: {n_boot: 20}\n"
            "cache_dir: cache\n"
        )  # fmt: skip
        res = runner.invoke(app, ["run", "run.yaml", "-o", "run", "--no-progress"])
        assert res.exit_code == 0, res.output
        printed.append(res.output)
        res = runner.invoke(app, ["report", "run", "-o", "report"])
        assert res.exit_code == 0, res.output
        printed.append(res.output)
        (tmp_path / "fit.yaml").write_text(
            "secrets: [CALIBDCD_T_PLAIN]\n"
            "target:\n" + _target_yaml(host)
            + "detector: {name: overlap, options: {max_new_tokens: 4, positions: 4}}\n"
            "data: {members: m.txt, nonmembers: n.txt}\n"
            "cache_dir: cache\n"
        )  # fmt: skip
        res = runner.invoke(app, ["fit", "fit.yaml", "-o", "bundle", "--no-progress"])
        assert res.exit_code == 0, res.output
        printed.append(res.output)
        url = f"http://auditor:{SECRETS['CALIBDCD_T_PASSWORD']}@{host}/v1"
        res = runner.invoke(
            app,
            ["score", "bundle", "suspect.txt", "--base-url", url, "--cache-dir", "cache",
             "--no-progress", "-o", "scores.jsonl"],
        )  # fmt: skip
        assert res.exit_code == 0, res.output
        printed.append(res.output)
        # the server did receive them: they were planted where they act
        assert any(b.get("api_key") == SECRETS["CALIBDCD_T_EXTRA_KEY"] for b in srv.bodies)
        basic = base64.b64encode(f"auditor:{SECRETS['CALIBDCD_T_PASSWORD']}".encode()).decode()
        assert f"Basic {basic}" in srv.auth
    written = [p for p in tmp_path.rglob("*") if p.is_file()]
    written = [p for p in written if p.name not in ("run.yaml", "fit.yaml")]
    assert any(p.name == "bundle.json" for p in written)
    assert any(p.name == "result.json" for p in written)
    assert any(p.name == "index.html" for p in written)
    for p in written:
        data = p.read_bytes()
        for name, value in [*SECRETS.items(), ("the basic-auth pair", basic)]:
            assert value.encode() not in data, f"{name}'s value in {p}"
    for out in printed:
        for name, value in SECRETS.items():
            assert value not in out, f"{name}'s value printed: {out}"
