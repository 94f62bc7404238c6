"""Results written into a Markdown file from a run's files, never typed by hand.

The file is any Markdown document: the project keeps its result blocks in ``docs/results.md``
(``calibdcd report RUN_DIR --readme docs/results.md``) and its one verdict table in
``README.md`` (``benchmarks/verdict.py``). A marked block in the file::

    <!-- calibdcd:results lab-micro -->
    (anything; replaced)
    <!-- /calibdcd:results -->

is replaced by the run's main report tables (the tables whose key ends in ``_main`` unless
others are asked for) under one line saying where they came from: config, commit (and whether
the tree was dirty), machine, Python and torch, seeds and date, all read from the run's
``environment.json``. Text outside the block is left byte for byte as it was.
:func:`replace_verdict` does the same for the one ``<!-- calibdcd:verdict -->`` block.

>>> write_readme("runs/lab-micro", "docs/results.md")       # doctest: +SKIP
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from calibdcd.atomic import read_json

__all__ = [
    "README_TABLES",
    "VERDICT_CLOSE",
    "VERDICT_OPEN",
    "BlockError",
    "provenance_line",
    "readme_block",
    "replace_block",
    "replace_verdict",
    "results_block",
    "setting_provenances",
    "verdict_block",
    "write_block",
    "write_readme",
]

#: the report tables a results block holds by default (the rest are in the run's report)
README_TABLES = (
    "auc_main",
    "paired",
    "variants",
    "base_vs_post",
    "selection_rank_strength",
    "selection_why",
)

_OPEN = "<!-- calibdcd:results {name} -->"
_CLOSE = "<!-- /calibdcd:results -->"
_ANY_OPEN = re.compile(r"<!-- calibdcd:results (\S+) -->")
#: the markers of the one verdict block (``benchmarks/verdict.py`` writes it into README.md)
VERDICT_OPEN = "<!-- calibdcd:verdict -->"
VERDICT_CLOSE = "<!-- /calibdcd:verdict -->"


class BlockError(ValueError):
    """The file has no usable results block of that name (message says what is wrong)."""


def _span(
    text: str, opener: str, closer: str, what: str, source: str, nested: re.Pattern[str]
) -> tuple[int, int]:
    """Where the body of the one block ``opener`` ... ``closer`` starts and ends in ``text``."""
    starts = [m.start() for m in re.finditer(re.escape(opener), text)]
    if len(starts) > 1:
        lines = [text.count("\n", 0, s) + 1 for s in starts]
        raise BlockError(f"{source}: {what} opens more than once (lines {lines})")
    body_start = starts[0] + len(opener)
    end = text.find(closer, body_start)
    inner = nested.search(text, body_start, end if end >= 0 else len(text))
    if end < 0 or inner is not None:
        line = text.count("\n", 0, starts[0]) + 1
        raise BlockError(
            f"{source}:{line}: {what} is not closed by {closer} "
            "before the next block or the end of the file"
        )
    return body_start, end


def _put(text: str, span: tuple[int, int], content: str) -> str:
    return text[: span[0]] + "\n" + content.strip("\n") + "\n" + text[span[1] :]


def replace_block(text: str, name: str, content: str, *, source: str = "<text>") -> str:
    """``text`` with the block ``name`` holding ``content`` (everything else unchanged)."""
    opener = _OPEN.format(name=name)
    if opener not in text:
        found = sorted(set(_ANY_OPEN.findall(text)))
        hint = f" (blocks found: {', '.join(found)})" if found else ""
        raise BlockError(
            f"{source}: no results block {name!r}: add the lines\n  {opener}\n  {_CLOSE}\n"
            f"where the tables should go{hint}"
        )
    span = _span(text, opener, _CLOSE, f"results block {name!r}", source, _ANY_OPEN)
    return _put(text, span, content)


def write_block(path: str | Path, name: str, content: str) -> None:
    """Rewrite the block ``name`` of the Markdown file ``path`` with ``content``, atomically
    (the file is left as it is when nothing changes); :class:`BlockError` when it has no such
    block. What every command that writes a docs block from a run or a record calls."""
    from calibdcd.atomic import atomic_write_text

    path = Path(path)
    text = path.read_text(encoding="utf-8")
    new = replace_block(text, name, content, source=str(path))
    if new != text:
        atomic_write_text(path, new)


def results_block(text: str, name: str, *, source: str = "<text>") -> str:
    """The body of the results block ``name`` of ``text`` (what :func:`replace_block` put
    there), e.g. to read a block whose run directory was not kept."""
    opener = _OPEN.format(name=name)
    if opener not in text:
        raise BlockError(f"{source}: no results block {name!r}")
    start, end = _span(text, opener, _CLOSE, f"results block {name!r}", source, _ANY_OPEN)
    return text[start:end].strip("\n")


def verdict_block(text: str, *, source: str = "<text>") -> str:
    """The body of the verdict block of ``text`` (between its markers, stripped of the blank
    line the writer puts at each end)."""
    if VERDICT_OPEN not in text:
        raise BlockError(f"{source}: no verdict block ({VERDICT_OPEN} ... {VERDICT_CLOSE})")
    nested = re.compile(re.escape(VERDICT_OPEN))
    start, end = _span(text, VERDICT_OPEN, VERDICT_CLOSE, "the verdict block", source, nested)
    return text[start:end].strip("\n")


def replace_verdict(text: str, content: str, *, source: str = "<text>") -> str:
    """``text`` with its verdict block holding ``content`` (everything else unchanged)."""
    if VERDICT_OPEN not in text:
        raise BlockError(
            f"{source}: no verdict block: add the lines\n  {VERDICT_OPEN}\n  {VERDICT_CLOSE}\n"
            "where the table should go"
        )
    nested = re.compile(re.escape(VERDICT_OPEN))
    span = _span(text, VERDICT_OPEN, VERDICT_CLOSE, "the verdict block", source, nested)
    return _put(text, span, content)


def provenance_line(
    run_dir: Path,
    env: dict[str, Any] | None,
    n_settings: int,
    provenances: Sequence[dict[str, Any] | None] = (),
    prefix: str = "Written by `calibdcd report RUN_DIR --readme` from the run's files: ",
) -> str:
    """The one provenance line; ``provenances``: each setting's ``result.json`` record of the
    commit that computed it (None: not recorded), for "resumed across N commits: ..."
    (:func:`calibdcd.provenance.resumed_phrase`). The HTML report shows it too."""
    from calibdcd.provenance import commit_label, resumed_phrase

    resumed = resumed_phrase(env, provenances)
    if env is None:
        return (
            f"From run `{run_dir.name}` ({n_settings} settings; no environment.json recorded"
            + (f"; {resumed}" if resumed else "")
            + ")."
        )
    commit = commit_label(env.get("git"))
    versions = env.get("versions") or {}
    torch_info = env.get("torch") or {}
    machine = env.get("cpu") or env.get("machine") or "unknown CPU"
    if env.get("cpu_count"):
        machine += f", {env['cpu_count']} cores"
    threads = torch_info.get("threads")
    devices = sorted(
        {
            f"{t.get('device')} {t.get('dtype')}"
            for t in (env.get("targets") or {}).values()
            if t.get("device")
        }
    )
    parts = [
        f"config `{env.get('config', run_dir.name)}`",
        f"seeds {env.get('seeds', '?')}",
        f"commit {commit}",
        *([resumed] if resumed else []),
        f"{machine}, {env.get('platform', '?')}",
        f"Python {env.get('python', '?')}, torch {versions.get('torch', '?')}"
        + (f" ({threads} threads)" if threads else "")
        + (" (not loaded: no torch model in this run)" if torch_info.get("loaded") is False else "")
        + (f", {', '.join(devices)}" if devices else ""),
        f"run started {env.get('started', '?')}",
        f"{n_settings} settings",
    ]
    return prefix + "; ".join(parts) + "."


def setting_provenances(results: Sequence[Any]) -> list[dict[str, Any] | None]:
    """Each result's record of the commit and host that computed it (None: not recorded)."""
    return [None if r.provenance is None else r.provenance.model_dump() for r in results]


def readme_block(run_dir: str | Path, tables: Sequence[str] | None = None) -> str:
    """The Markdown that goes into a results block: provenance line + the chosen tables."""
    import calibdcd.report.aggregate as agg
    from calibdcd.report.tables import build_tables

    run = Path(run_dir)
    results = agg.load_results(run)
    built = build_tables(results)
    if tables:
        by_key = {t.key: t for t in built}
        missing = [k for k in tables if k not in by_key]
        if missing:
            raise ValueError(
                f"{run}: no table(s) {missing} in this run's report; have {sorted(by_key)}"
            )
        chosen = [by_key[k] for k in tables]
    else:
        chosen = [t for t in built if t.key in README_TABLES]
    if not chosen:
        raise ValueError(f"{run}: the report has no main tables (no completed settings?)")
    env_path = run / "environment.json"
    env = read_json(env_path) if env_path.is_file() else None
    md = [provenance_line(run, env, len(results), setting_provenances(results)), ""]
    md += [t.markdown() for t in chosen]
    return "\n".join(md)


def write_readme(
    run_dir: str | Path,
    readme: str | Path,
    name: str | None = None,
    tables: Sequence[str] | None = None,
) -> str:
    """Rewrite the block ``name`` (default: the run's config name) of the Markdown file
    ``readme`` (e.g. ``docs/results.md``) with the run's tables; returns the name used. Raises
    :class:`BlockError` when the block is missing."""
    run = Path(run_dir)
    if name is None:
        env_path = run / "environment.json"
        env = read_json(env_path) if env_path.is_file() else {}
        name = env.get("config") or run.name
    write_block(readme, name, readme_block(run, tables))
    return name
