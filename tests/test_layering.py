"""The import layering of pyproject.toml's ``[tool.importlinter]`` contracts holds (no cycle, no
back-edge such as report -> experiment): ``lint-imports`` runs here, so the fast suite and CI
enforce it. docs/layout.md describes the layers."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def _lint_imports(root: Path) -> subprocess.CompletedProcess[str]:
    exe = Path(sys.executable).with_name("lint-imports")
    assert exe.exists(), (
        "lint-imports not found beside this Python: install the dev extra "
        "(pip install -e '.[dev]', which includes import-linter)"
    )
    env = dict(os.environ, PYTHONPATH=str(root / "src"))
    return subprocess.run(
        [str(exe), "--config", str(root / "pyproject.toml"), "--no-cache"],
        cwd=root,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )


def test_import_contracts_hold():
    proc = _lint_imports(REPO)
    assert proc.returncode == 0, proc.stdout[-6000:] + proc.stderr[-2000:]
    assert "0 broken" in proc.stdout, proc.stdout[-3000:]


def test_a_back_edge_breaks_the_contracts(tmp_path):
    """The check is live: the report importing the experiment's caches again (the cycle this
    layering removed) is reported, naming the import."""
    root = tmp_path / "repo"
    shutil.copytree(REPO / "src", root / "src", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(REPO / "pyproject.toml", root / "pyproject.toml")
    html = root / "src" / "calibdcd" / "report" / "html.py"
    html.write_text(html.read_text() + "\nfrom calibdcd.experiment import caches  # noqa\n")
    proc = _lint_imports(root)
    assert proc.returncode != 0
    assert "calibdcd.report.html -> calibdcd.experiment.caches" in proc.stdout, proc.stdout[-3000:]
