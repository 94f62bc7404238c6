"""The grid runner: benchmarks x targets x detectors x seeds, resumable, with a run directory.

Run directory layout::

    RUN_DIR/
      config.yaml          the resolved config (defaults filled in; paths relative to RUN_DIR)
      environment.json     package versions, python, platform/CPU, torch threads, device and
                           dtype per target, git commit (+ dirty flag) and host of the latest
                           start, and ``starts``: every start (commit, dirty, host, time) of a
                           resumed run; calibdcd.provenance
      grid.json            the settings in run order
      models.json          every model the config names: where, ref, hub repo id and commit
      settings/<id>/       result.json (written last, atomically), scores.csv, split.json,
                           digests.json (the digests of result.json and scores.csv as written)
      benchmarks.json      each benchmark read: source, size, digest of its texts/labels/ids
      inputs.json          the digests of the target models and detectors the run used
      results.jsonl        one line per completed setting (rewritten after each setting)
      results.csv          the headline numbers per setting
      settings/.stale/<id> settings of an earlier config that are not in this grid (moved aside)
      .lock                the writing process (pid, host, start time) while a run is going

The directory reflects exactly its config: settings not in the grid are moved aside (and the
report reads only the grid's settings). One process writes a run directory at a time (see
:mod:`calibdcd.experiment.rundir`). Secrets (see :mod:`calibdcd.redact`) are redacted in
``config.yaml`` and ``environment.json``.

A setting whose ``result.json`` matches its ``setting_hash`` is skipped, so re-running after a
crash (or with more seeds/targets) computes only what is missing. Settings run target by target,
so each target model is loaded once.
"""

from __future__ import annotations

import dataclasses
import json
import os
import time
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml

from calibdcd.atomic import atomic_write_text, write_csv, write_json
from calibdcd.experiment.config import ExperimentConfig, lab_spec
from calibdcd.experiment.detector_entries import DETECTORS, detector_available
from calibdcd.experiment.model_uses import hub_dataset_of, models_in_plan, resolve_uses
from calibdcd.experiment.plan import RunPlan, grid, materialize, resolve, shard_of
from calibdcd.experiment.resources import RunContext
from calibdcd.experiment.rundir import (
    INPUTS_NAME,
    check_shards,
    lock_run_dir,
    set_aside_stale,
    verify_setting,
    write_inputs,
)
from calibdcd.experiment.setting import run_setting
from calibdcd.experiment.target_entries import logprobs_needed, preflight_target
from calibdcd.integrity import checkpoint_problems
from calibdcd.model_refs import (
    MissingModelError,
    MissingModelsError,
    ModelUse,
    ResolvedModel,
    models_record,
    resolve_model,
)
from calibdcd.options import OptionsError
from calibdcd.provenance import record_start, setting_provenance, start_record
from calibdcd.redact import redact_tree
from calibdcd.results import RESULT_FILE, SettingResult

__all__ = [
    "DetectorRequests",
    "count_requests",
    "describe_grid",
    "dry_run",
    "environment",
    "grid",
    "merge_runs",
    "parse_shard",
    "portable_config",
    "require_models",
    "run_experiment",
    "shard_of",
    "summary_rows",
]


def parse_shard(text: str) -> tuple[int, int]:
    """``"i/n"`` (``--shard``; 0 <= i < n) -> ``(i, n)``."""
    i, sep, n = text.partition("/")
    try:
        index, count = int(i), int(n)
    except ValueError:
        index = count = -1
    if not sep or count < 1 or not 0 <= index < count:
        raise ValueError(f"--shard {text!r}: expected i/n with 0 <= i < n (e.g. 0/4)")
    return index, count


def merge_runs(
    run_dirs: list[Path], out: Path, *, log: Callable[[str], None] | None = None
) -> Path:
    """One run directory at ``out`` from the run directories of the shards of one config
    (``calibdcd run --shard i/n``): every setting of the grid from the shard that computed it
    (the same setting twice must carry the same hashes), the config, grid and models of the
    first, the benchmarks and input digests of all, an ``environment.json`` naming the shards,
    and the run's summaries. The report of the merged directory is the report of the unsharded
    run.

    Refused (ValueError, one line naming the shard and what differs): shards of another grid,
    shards whose recorded inputs differ (a benchmark's digest, a model's commit, a target
    model's or a detector's digest: :func:`calibdcd.experiment.rundir.check_shards`), a result
    whose files were changed after its run wrote them (:func:`~calibdcd.experiment.rundir.
    verify_setting`), a setting that is in none of the shards. Shards or results written before
    calibdcd recorded digests are merged unverified, with a note to ``log``."""
    import shutil

    from calibdcd.atomic import read_json
    from calibdcd.results import read_result

    say = log or (lambda s: None)
    if not run_dirs:
        raise ValueError("merge needs at least one run directory")
    notes = check_shards(run_dirs)
    grid_rows = read_json(run_dirs[0] / "grid.json")
    ids = [e["id"] for e in grid_rows]
    want = {e["id"]: e["setting_hash"] for e in grid_rows}
    found: dict[str, Path] = {}
    for d in run_dirs:
        for sid in ids:
            res = d / "settings" / sid / RESULT_FILE
            if not res.is_file():
                continue
            h = read_result(res).setting_hash
            if h != want[sid]:
                raise ValueError(f"{res}: setting hash {h} is not the grid's {want[sid]}")
            verify_setting(res.parent)  # an edited result is refused (one without digests: the
            # report notes it unverified)
            found.setdefault(sid, d / "settings" / sid)
    missing = [sid for sid in ids if sid not in found]
    if missing:
        raise ValueError(
            f"{len(missing)} setting(s) of the grid are in none of the shards: {', '.join(missing)}"
        )
    if out.exists() and any(out.iterdir()):
        raise FileExistsError(f"{out}: exists and is not empty; merge into a new directory")
    for note in notes:
        say(note)
    (out / "settings").mkdir(parents=True, exist_ok=True)
    for name in ("config.yaml", "grid.json", "models.json"):
        if (run_dirs[0] / name).is_file():
            shutil.copy2(run_dirs[0] / name, out / name)
    # every shard's benchmarks and input digests (check_shards found them to agree)
    benches: dict[str, Any] = {}
    inputs: dict[str, dict[str, str]] = {"targets": {}, "detectors": {}}
    for d in run_dirs:
        if (d / "benchmarks.json").is_file():
            for row in read_json(d / "benchmarks.json"):
                benches.setdefault(row["label"], row)
        if (d / INPUTS_NAME).is_file():
            rec = read_json(d / INPUTS_NAME)
            for key in inputs:
                for name, value in (rec.get(key) or {}).items():
                    inputs[key].setdefault(name, value)
    if benches:
        write_json(out / "benchmarks.json", list(benches.values()))
    if any(inputs.values()):
        write_inputs(out, inputs)
    env = (
        read_json(run_dirs[0] / "environment.json")
        if (run_dirs[0] / "environment.json").is_file()
        else {}
    )
    env["starts"] = _all_starts(run_dirs)  # every shard's starts (commit, host, time)
    env["merged_from"] = [
        {
            "dir": d.name,
            "shard": read_json(d / "shard.json") if (d / "shard.json").is_file() else None,
        }
        for d in run_dirs
    ]
    write_json(out / "environment.json", env)
    for sid in ids:
        shutil.copytree(found[sid], out / "settings" / sid)
    _write_summaries(out, [read_result(out / "settings" / sid / RESULT_FILE) for sid in ids])
    return out


def _previous_environment(run_dir: Path) -> dict[str, Any] | None:
    """The ``environment.json`` an earlier start left in ``run_dir`` (None: none, or unreadable:
    its history is then lost, not the run)."""
    from calibdcd.atomic import read_json

    path = run_dir / "environment.json"
    if not path.is_file():
        return None
    try:
        env = read_json(path)
    except (OSError, ValueError):
        return None
    return env if isinstance(env, dict) else None


def _all_starts(run_dirs: list[Path]) -> list[dict[str, Any]]:
    """The starts of every shard's ``environment.json`` (:func:`calibdcd.provenance.
    record_start`; a shard written before the list counts as its one start), in time order."""
    starts: list[dict[str, Any]] = []
    for d in run_dirs:
        env = _previous_environment(d)
        if env is None:
            continue
        own = env.get("starts")
        for s in own if isinstance(own, list) else [start_record(env)]:
            if s not in starts:
                starts.append(s)
    return sorted(starts, key=lambda s: str(s.get("started") or ""))


def portable_config(cfg: ExperimentConfig, run_dir: Path) -> dict[str, Any]:
    """The resolved config with its absolute paths made relative to the run directory (where
    ``config.yaml`` is written, so ``load_config`` resolves them back to the same files)."""
    base = Path(run_dir).resolve()

    def rel(p: Any) -> Any:
        if isinstance(p, str) and os.path.isabs(p):
            return os.path.relpath(p, base)
        return p

    d = cfg.as_dict()
    d["cache_dir"] = rel(d.get("cache_dir"))
    if "output" in d:
        d["output"] = rel(d["output"])
    for b in d["benchmarks"]:
        if "lab" not in b and "path" in b:
            b["path"] = rel(b["path"])
    for t in d["targets"]:
        if "lab" not in t:
            t["model"] = rel(t["model"])
    return d


def _target_runtime(cfg: ExperimentConfig) -> dict[str, Any]:
    """Each target's device and dtype as its options resolve here (``auto`` made explicit)."""
    from calibdcd.device import default_device_type

    out: dict[str, Any] = {}
    for t in cfg.targets:
        if t.backend != "hf":
            out[t.name] = {"backend": t.backend}
            continue
        device = str(t.options.get("device", "auto"))
        device = default_device_type() if device == "auto" else device
        dtype = str(t.options.get("dtype", "auto"))
        if dtype == "auto":
            dtype = "bfloat16" if device.startswith("cuda") else "float32"
        out[t.name] = {"backend": t.backend, "device": device, "dtype": dtype}
    return out


def uses_torch(cfg: ExperimentConfig) -> bool:
    """Whether a run of ``cfg`` loads a torch model: an in-process target, or a detector
    registered as using torch (an unknown one counts as using it)."""
    if any(t.backend == "hf" for t in cfg.targets):
        return True
    return any(d.name not in DETECTORS or DETECTORS[d.name].uses_torch for d in cfg.detectors)


def environment(cfg: ExperimentConfig | None = None) -> dict[str, Any]:
    """What ``environment.json`` records: versions, Python, platform/CPU, torch threads, git
    commit + dirty flag, each target's device and dtype, the config's name (no absolute path)."""
    from calibdcd.provenance import run_environment

    env = run_environment(torch=cfg is None or uses_torch(cfg))
    if cfg is not None:
        env["config"] = cfg.name
        env["seeds"] = list(cfg.seeds)
        env["targets"] = _target_runtime(cfg)
    env["started"] = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    return env


#: the paired comparisons of ``results.csv`` (``result.json``'s ``paired`` keys), as columns
_PAIRED_COLUMNS = (("calibdcd_vs_original", "calibdcd"), ("calibdcd_vs_placebo", "vs_placebo"))


def summary_rows(results: list[SettingResult]) -> tuple[list[str], list[list[Any]]]:
    """``results.csv``: one row per setting, every number in its own column (fractions):
    the headline metrics with their bootstrap interval, CalibDCD's selection and why it changed
    nothing where it did, and the paired differences (CalibDCD vs the detector and vs the
    placebo: estimate, interval, half-width, p)."""
    header = [
        "id", "benchmark", "target", "detector", "seed", "n_pool",
        "auc_before", "auc_after", "tpr_before", "tpr_after",
        "rank", "strength", "selected_views",
        "auc_before_low", "auc_before_high", "auc_after_low", "auc_after_high",
        "tpr_before_low", "tpr_before_high", "tpr_after_low", "tpr_after_high",
        "corrected", "no_correction_reason",
    ]  # fmt: skip
    for _, name in _PAIRED_COLUMNS:
        for metric in ("auc", "tpr"):
            header += [
                f"{name}_delta_{metric}", f"{name}_delta_{metric}_low",
                f"{name}_delta_{metric}_high", f"{name}_delta_{metric}_half_width",
            ]  # fmt: skip
        header.append(f"{name}_delta_auc_p")
    rows = []
    for r in results:
        c = r.calibration
        row = [
            r.id, r.benchmark, r.target, r.detector, r.seed,
            r.sizes.evaluation[0],
            r.before.auc.estimate, r.after.auc.estimate,
            r.before.tpr.estimate, r.after.tpr.estimate,
            c["rank"], c["strength"], " ".join(c["selected_views"]),
            r.before.auc.low, r.before.auc.high, r.after.auc.low, r.after.auc.high,
            r.before.tpr.low, r.before.tpr.high, r.after.tpr.low, r.after.tpr.high,
            c.get("corrected", c["rank"] is not None),
            (c.get("diagnostics") or {}).get("reason"),
        ]  # fmt: skip
        for key, _ in _PAIRED_COLUMNS:
            comp = r.paired.get(key) or {}
            for metric in ("auc", "tpr"):
                d = comp.get(metric) or {}
                row += [d.get("estimate"), d.get("low"), d.get("high"), d.get("half_width")]
            row.append((comp.get("auc") or {}).get("p_value"))
        rows.append(row)
    return header, rows


def _write_summaries(run_dir: Path, results: list[SettingResult]) -> None:
    lines = "".join(json.dumps(r.to_json(), default=str) + "\n" for r in results)
    atomic_write_text(run_dir / "results.jsonl", lines)
    header, rows = summary_rows(results)
    write_csv(run_dir / "results.csv", header, rows)


def _add_note(exc: BaseException, note: str) -> None:
    """``exc.add_note(note)`` (Python >= 3.11), kept in ``__notes__`` on 3.10 too."""
    if hasattr(exc, "add_note"):
        exc.add_note(note)
    else:  # pragma: no cover - Python 3.10
        exc.__notes__ = [*getattr(exc, "__notes__", []), note]  # type: ignore[attr-defined]


def _quiet_hub_bars() -> None:
    """transformers draws a bar for every model load/save (dozens per run); the run's own
    settings bar says where it is."""
    try:
        from transformers.utils import logging as hf_logging
    except ImportError:
        return
    hf_logging.disable_progress_bar()


def run_experiment(
    cfg: ExperimentConfig,
    out_dir: str | Path | None = None,
    *,
    progress: bool = True,
    log: Callable[[str], None] | None = None,
    stop_after: int | None = None,
    shard: tuple[int, int] | None = None,
    log_samples: bool = False,
) -> Path:
    """Run (or resume) the grid; returns the run directory. ``stop_after`` ends after that many
    newly computed settings (for tests and staged runs). ``shard`` = (i, n): only the i-th of n
    parts of the grid (:func:`shard_of`; :func:`merge_runs` joins the parts' directories).
    ``log_samples``: each setting also writes ``samples.jsonl``, every completion its features
    used (a complete setting without one is run again, from the caches).
    Raises :class:`RunDirLocked` when another live process writes the same run directory."""
    plan = resolve(cfg, out_dir, shard=shard)  # builds nothing
    models = require_models(plan)  # before the run directory, any generation or lab build
    _preflight(plan, log)
    with lock_run_dir(plan.run_dir):
        # the labs and reference LMs the settings need, built here and nowhere else
        plan = materialize(plan, progress=progress, log=log)
        return _run_locked(
            plan, models, progress=progress, log=log, stop_after=stop_after,
            log_samples=log_samples,
        )  # fmt: skip


def _preflight(plan: RunPlan, log: Callable[[str], None] | None) -> None:
    """Each served target's server answers and serves its model, and CalibDCD has its views:
    found now, not after the work of every target before it (an in-process target's views come
    with its checkpoint)."""
    for t in plan.targets:
        line = preflight_target(t.entry, _logprobs_asked(plan, t))
        if line is not None and log is not None:
            log(f"target {t.entry.name}: {line}")
        if t.entry.backend != "hf":
            try:
                dry_view_bank(t, plan.procedure.view_system, plan.cache_root)
            except (ValueError, OSError) as exc:
                raise ValueError(
                    f"target {t.entry.name}: cannot build CalibDCD's views: {exc}"
                ) from None


def _logprobs_asked(plan: RunPlan, t: Any) -> int | None:
    """What this process's settings on target ``t`` ask of its token log-probabilities
    (:func:`~calibdcd.experiment.target_entries.logprobs_needed`)."""
    name = t.entry.name
    return logprobs_needed(
        s.detector for s in plan.settings if s.target is not None and s.target.entry.name == name
    )


def _run_locked(
    plan: RunPlan,
    models: list[tuple[ModelUse, ResolvedModel]],
    *,
    progress: bool,
    log: Callable[[str], None] | None,
    stop_after: int | None,
    log_samples: bool = False,
) -> Path:
    from tqdm.auto import tqdm

    cfg, run_dir, shard = plan.config, plan.run_dir, plan.shard

    run_dir.mkdir(parents=True, exist_ok=True)
    write_json(run_dir / "models.json", models_record(models))
    say = log or (lambda s: None)
    atomic_write_text(
        run_dir / "config.yaml",
        yaml.safe_dump(
            redact_tree(portable_config(cfg, run_dir)), sort_keys=False, allow_unicode=True
        ),
    )
    # this start added to the directory's earlier ones (a resumed run keeps its history); each
    # setting computed now records this start's commit and host in its result.json
    env = redact_tree(record_start(environment(cfg), _previous_environment(run_dir)))
    write_json(run_dir / "environment.json", env)
    write_json(
        run_dir / "grid.json", [{"id": p.id, "setting_hash": p.setting_hash} for p in plan.grid]
    )
    stale = set_aside_stale(run_dir, [p.id for p in plan.grid])
    planned = plan.settings
    if shard is not None:  # the grid.json above is the whole grid: a shard runs its part
        write_json(run_dir / "shard.json", {"index": shard[0], "count": shard[1]})
        say(f"shard {shard[0]}/{shard[1]}: {len(planned)} setting(s) of the grid")
    else:
        (run_dir / "shard.json").unlink(missing_ok=True)
    if stale:
        say(
            f"{len(stale)} setting(s) not in this config moved to settings/.stale/ "
            f"(not in results or the report): {', '.join(stale)}"
        )
    _quiet_hub_bars()
    ctx = RunContext(plan, progress=progress, log_samples=log_samples)
    ctx.provenance = setting_provenance(env)
    results: list[SettingResult] = []
    computed = 0
    # counted by hand: a bar that iterates shows its count only when it next redraws on time (a
    # resumed run read 0/N while the first setting left to compute ran), and a setting found
    # complete leaves the total, named in the label, so the rate and ETA are those of computing
    bar = tqdm(
        total=len(planned),
        desc="settings",
        unit="setting",
        disable=not progress,
        dynamic_ncols=True,
    )
    try:
        for p in planned:
            bar.set_postfix_str(p.id, refresh=True)
            try:
                inputs = ctx.inputs(p)  # the run loads, the setting computes
                res = run_setting(
                    p, inputs, status=lambda m, i=p.id: bar.set_postfix_str(f"{i}: {m}")
                )
            except Exception as exc:
                _add_note(exc, f"in setting {p.id}")  # `calibdcd run` names it in its error
                raise
            s = p.setting
            results.append(res)
            if res.skipped:
                say(f"skip {s.id} (complete)")
                bar.total -= 1
                bar.set_description(f"settings ({len(results) - computed} complete)")
            else:
                bar.update(1)
                computed += 1
                say(
                    f"done {s.id}: AUC {res.before.auc.estimate:.3f} -> "
                    f"{res.after.auc.estimate:.3f}, "
                    f"TPR {res.before.tpr.estimate:.3f} -> {res.after.tpr.estimate:.3f}"
                )
                for w in res.warnings:
                    say(f"WARNING {s.id}: {w}")
            _write_summaries(run_dir, results)
            if stop_after is not None and computed >= stop_after:
                break
    finally:
        bar.close()
        ctx.release_target()
        _write_benchmarks(run_dir, plan, ctx)
        _write_inputs(run_dir, plan, ctx)
    return run_dir


def _write_benchmarks(run_dir: Path, plan: RunPlan, ctx: RunContext) -> None:
    """``benchmarks.json``: each benchmark the run read, where from (a file's name, or the hub
    repository and commit) and a digest of its texts, labels and ids, so two runs can tell
    whether they saw the same data."""
    rows = []
    loaded = ctx.loaded_benchmarks()  # only those this run (or shard) loaded
    for planned in plan.benchmarks:
        entry = planned.entry
        bench = loaded.get(entry.label)
        if bench is None:
            continue
        src = str(bench.source)
        portable = src if src.startswith("hf://") else Path(src.split(" (")[0]).name
        rows.append(
            {
                "label": entry.label,
                "name": bench.name,
                "source": portable,
                "n_texts": len(bench),
                "n_members": int(sum(bench.labels)),
                "content_digest": ctx.benchmark_digest(planned),
            }
        )
    if rows:
        write_json(run_dir / "benchmarks.json", rows)


def _write_inputs(run_dir: Path, plan: RunPlan, ctx: RunContext) -> None:
    """``inputs.json`` (:func:`calibdcd.experiment.rundir.write_inputs`): the digest of each
    target's model (a local checkpoint's content, a hub id's commit; no device or path) and
    each detector's fingerprint, for those this run (or shard) used, so that a merge of shards
    can tell whether they used the same ones (the data's digests are in ``benchmarks.json``)."""
    from calibdcd.keys import digest
    from calibdcd.targets.identity import model_fields

    used = ctx.target_keys()
    targets: dict[str, str] = {}
    for t in plan.targets:
        if t.entry.name not in used:
            continue
        try:
            fields = model_fields(t.entry.backend, t.path or t.entry.model, root=ctx.cache_root)
        except (OSError, ValueError):  # reported by the run, if it matters
            continue
        targets[t.entry.name] = digest(t.entry.backend, fields)[:16]
    detectors = ctx.detector_keys()
    if targets or detectors:
        write_inputs(run_dir, {"targets": targets, "detectors": detectors})


# --------------------------------------------------------------------------------------------
# Models
# --------------------------------------------------------------------------------------------


def require_models(plan: RunPlan) -> list[tuple[ModelUse, ResolvedModel]]:
    """Resolve every model the plan names (targets, detector models and their defaults) in
    the local hub cache, loading no weights and downloading nothing. Raises one
    :class:`~calibdcd.model_refs.MissingModelsError` listing every missing model, where it is used
    and the command that fetches them all."""
    return resolve_uses(models_in_plan(plan), plan.config.source or "CONFIG")


def _dry_run_models(plan: RunPlan, lines: list[str], problems: list[str]) -> None:
    dry_run_models(models_in_plan(plan), plan.config.source or "CONFIG", lines, problems)


def dry_run_models(
    uses: list[ModelUse], source: str, lines: list[str], problems: list[str]
) -> None:
    """The dry runs' check of every model and hub dataset ``uses`` names (``run``'s and
    ``fit``'s): each resolved here (one list of the missing ones, less those a target check
    named already), each local checkpoint's files whole."""
    try:
        resolved = resolve_uses(uses, source)
    except MissingModelsError as exc:
        # a use the target checks named already (a local checkpoint that is not there, with its
        # line in the config) is not listed a second time
        named = {p.split(": ", 1)[0] for p in problems}
        left = [(use, err) for use, err in exc.missing if use.describe() not in named]
        if left:
            problems.append(str(MissingModelsError(left, exc.config)))
        return
    except ValueError:  # a detector that does not build: reported with the detectors
        return
    lines.append(f"models and hub datasets: {len(resolved)} named, all available here")
    for use, rm in resolved:
        if use.need != "dataset":
            problems.extend(f"{use.describe()}: {m}" for m in checkpoint_problems(rm.path))
        what = f"hub {rm.repo_id} @ {rm.revision[:12]}" if rm.is_hub else "local"
        lines.append(f"  {use.describe()}: {use.ref} ({what})")


# --------------------------------------------------------------------------------------------
# Dry run
# --------------------------------------------------------------------------------------------


def dry_run(
    cfg: ExperimentConfig,
    *,
    options: bool = True,
    out: str | Path | None = None,
    shard: tuple[int, int] | None = None,
) -> tuple[list[str], list[str]]:
    """Check the plan of a run of ``cfg`` without loading any model: benchmark files and the
    split protocol, target backends and local checkpoints (and the integrity of their weight
    files), detector names/presets/options, the models, the grid; then print the plan. Every
    check reads what the plan resolved (:func:`~calibdcd.experiment.plan.resolve`). Returns
    (report lines, problems); an empty problems list means the config can run.
    ``options=False``: the targets' and detectors' options were checked with the config
    (``read_config``) and are not repeated. ``out``: the run directory a run would use instead
    of the config's output (``--out``); ``shard``: the part of the grid a ``--shard i/n`` run
    would run (its plan's settings)."""
    lines: list[str] = [f"config {cfg.name}" + (f" ({cfg.source})" if cfg.source else "")]
    problems: list[str] = []
    lines.append(
        f"protocol {cfg.protocol}; supervised {cfg.n_supervised_per_class} + "
        f"{cfg.n_supervised_per_class};"
        f" calibration fraction {cfg.calibration_fraction}; seeds {list(cfg.seeds)}"
    )
    try:
        plan = resolve(cfg, out, shard=shard)
    except Exception as exc:  # a plan that cannot be resolved is a problem, not a traceback
        return lines, [f"plan: {exc}"]
    sizes: dict[str, tuple[int, int]] = {}  # label -> (subsample, calibration), when read
    for i, b in enumerate(plan.benchmarks):
        _check_benchmark(plan, i, b, lines, problems, sizes)
    banks: list[int] = []  # the view bank's size per target, when the dry run could build it
    for i, t in enumerate(plan.targets):
        _check_target(plan, i, t, options, lines, problems, banks)
    for i, d in enumerate(cfg.detectors):
        _check_detector(plan, i, d, options, lines, problems)
    _dry_run_models(plan, lines, problems)
    c = cfg.calibration
    if cfg.view_system != "none" and banks and c.n_views > min(banks):
        problems.append(
            f"calibration.n_views: {c.n_views} views asked for, the view bank has {min(banks)}"
        )
    lines.append(
        f"CalibDCD: ranks {list(c.ranks)} x strengths {list(c.strengths)} "
        f"({len(c.ranks) * len(c.strengths)} candidates), tau {c.tau}, {c.n_views} of 10 views"
    )
    lines.append(
        f"grid: {len(cfg.benchmarks)} benchmarks x {len(cfg.targets)} targets x "
        f"{len(cfg.detectors)} detectors x {len(cfg.seeds)} seeds = {cfg.grid_size} settings"
    )
    lines.append(f"cache: {plan.cache_root}; output: {plan.run_dir}")
    lines += _requests_estimate(plan, sizes)
    lines += plan.describe()
    return lines, list(dict.fromkeys(problems))  # a target's damaged file is also a model's


def _check_benchmark(
    plan: RunPlan,
    i: int,
    planned: Any,
    lines: list[str],
    problems: list[str],
    sizes: dict[str, tuple[int, int]],
) -> None:
    """A benchmark of the plan: its file read (or its lab not built yet), its split's sizes
    (recorded in ``sizes``: label -> subsample, calibration texts of the first seed)."""
    from calibdcd.data import split_benchmark
    from calibdcd.experiment.benchmark_entries import load_benchmark_file

    b = planned.entry
    key = f"benchmarks[{i}] ({b.label})"
    if b.lab is not None and plan.lab_dir(b.lab) is None:
        ok = _lab_preset_known(b.lab, plan.cache_root)
        if ok is not True:
            problems.append(f"{key}.lab: {ok}")
        else:
            lines.append(f"  {key}: lab {b.lab!r} not built yet (built on first run)")
        return
    repo = hub_dataset_of(b)
    if repo is not None:
        try:
            resolve_model(repo, need="dataset")
        except MissingModelError:  # named once, with the command, under models
            lines.append(f"  {key}: hub dataset {repo} not fetched yet (see models below)")
            return
    seed = plan.config.seeds[0]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            bench = load_benchmark_file(b, planned.path, planned.id_field)
            split = split_benchmark(bench, planned.split, seed=seed)
        except Exception as exc:
            problems.append(f"{key}: {exc}")
            if caught:  # not lost: under the benchmark's line, as a read one's are
                lines.append(f"  {key}: not read (its problem is below)")
                lines.extend(f"    warning: {w.message}" for w in caught)
            return
    sz = split.sizes()
    sizes[b.label] = (int(sz["subsample"][0]), int(sz["calibration"][0]))
    lines.append(
        f"  {key}: {len(bench)} texts from {bench.source}; subsample {sz['subsample'][0]}, "
        f"supervised {sz['supervised'][0]}, calibration {sz['calibration'][0]}, "
        f"pool {sz['evaluation'][0]} ({sz['evaluation'][1]} m / {sz['evaluation'][2]} nm)"
        + (f", {len(split.excluded)} left out by group" if plan.config.group_by else "")
    )
    for w in caught:
        lines.append(f"    warning: {w.message}")
    problems.extend(f"{key}: {m}" for m in split_size_problems(sz, seed))


@dataclasses.dataclass
class DetectorRequests:
    """One config detector's share of a plan's target work (:func:`count_requests`): its
    settings, the texts they extract (a text under a view counted again), the completions they
    ask for at most, the completions a text costs and why, and the built detector."""

    label: str
    settings: int = 0
    texts: int = 0
    completions: int = 0
    per_text: tuple[int, str] = (0, "")
    detector: Any = None


def count_requests(
    plan: RunPlan, sizes: dict[str, tuple[int, int]]
) -> tuple[dict[str, DetectorRequests], int]:
    """Per detector label, at most (subsample texts + calibration non-members x views) x the
    completions a text costs it (:func:`calibdcd.detectors.base.completions_per_text`), summed
    over this process's settings (``sizes``: benchmark label -> subsample, calibration texts);
    and how many settings could not be counted (a benchmark not read, a detector that states
    no decoding or does not build). What the dry run prints and
    ``benchmarks/time_to_verdict.py`` prices."""
    from calibdcd.detectors.base import completions_per_text

    cfg = plan.config
    n_views = 0 if cfg.view_system == "none" else cfg.calibration.n_views
    out: dict[str, DetectorRequests] = {}
    unknown = 0
    built: dict[tuple[str, str, int], Any] = {}
    for p in plan.settings:
        size = sizes.get(p.setting.benchmark.label)
        det = p.detector
        if det is not None and det.key not in built:
            try:
                d = det.build()
                built[det.key] = (d, completions_per_text(d))
            except Exception:  # the detector's check names why it does not build
                built[det.key] = (None, None)
        d, per = (None, None) if det is None else built[det.key]
        if size is None or per is None:
            unknown += 1
            continue
        label = p.setting.detector.label
        texts = size[0] + size[1] * n_views
        r = out.setdefault(label, DetectorRequests(label, per_text=per, detector=d))
        r.settings += 1
        r.texts += texts
        r.completions += per[0] * texts
    return out, unknown


def _requests_estimate(plan: RunPlan, sizes: dict[str, tuple[int, int]]) -> list[str]:
    """The dry run's estimate of the targets' work (:func:`count_requests`) in lines."""
    counted, unknown = count_requests(plan, sizes)
    n_views = 0 if plan.config.view_system == "none" else plan.config.calibration.n_views
    per_detector = {k: r.completions for k, r in counted.items()}
    how = {k: f"{r.per_text[0]} per text: {r.per_text[1]}" for k, r in counted.items()}
    if not per_detector:
        return (
            []
            if not unknown
            else [
                f"requests: not estimated for the {unknown} setting(s) (a benchmark not read yet, "
                "e.g. its lab not built, or a detector that states no decoding)"
            ]
        )
    total = sum(per_detector.values())
    lines = [
        f"requests: at most {total:,} completions, one request each through a server (subsample"
        f" texts + calibration non-members x {n_views} views, per setting; completions already "
        "in the cache, or shared by settings with the same texts, are not asked again)"
    ]
    lines += [f"  {k}: {v:,} ({how[k]})" for k, v in per_detector.items()]
    if unknown:
        lines.append(
            f"  {unknown} setting(s) not estimated (a benchmark not read yet, or a detector "
            "that states no decoding)"
        )
    return lines


def target_where(t: Any, key: str, problems: list[str], root: Path) -> str | None:
    """Where a planned target's model is, in words (its lab under the cache root ``root``);
    None with its problem when it is not (the run's and fit's dry runs)."""
    from calibdcd.experiment.labs import resolve_lab
    from calibdcd.experiment.target_entries import lab_model_problem

    e = t.entry
    if e.lab is not None:
        lab = resolve_lab(e.lab, build=False, root=root)
        ok = True if lab is not None else _lab_preset_known(e.lab, root)
        if ok is not True:
            problems.append(f"{key}.lab: {ok}")
            return None
        missing = (
            lab_model_problem(lab, e.model)
            if lab is not None
            else _unbuilt_lab_model_problem(e.lab, e.model)
        )
        if missing:
            problems.append(f"{key}.model: {missing}")
            return None
        return f"lab {e.lab}/{e.model}" + ("" if lab is not None else " (lab built on first run)")
    if e.backend == "hf":
        if t.problem is not None:  # a packaged model whose package is not installed
            problems.append(f"{key}.{t.problem}")
            return None
        p = Path(t.path)
        looks_local = e.model.startswith(("/", ".", "~")) or p.suffix == ".gguf"
        if looks_local and not p.exists():
            problems.append(f"{key}.model: no such local checkpoint {e.model!r}")
            return None
        return str(p) if p.exists() else f"hub id {e.model}"
    if "base_url" not in e.options:
        problems.append(f"{key}.options.base_url: required by backend {e.backend!r}")
        return None
    return f"{e.options['base_url']} model {e.model}"


def _check_target(
    plan: RunPlan,
    i: int,
    t: Any,
    options: bool,
    lines: list[str],
    problems: list[str],
    banks: list[int],
) -> None:
    """A target of the plan: its backend and options, its model, its server, its checkpoint's
    files and CalibDCD's view bank for it."""
    from calibdcd.targets.base import (
        available_backends,
        option_problems,
        unknown_options,
        value_problem_of,
    )

    e = t.entry
    key = f"targets[{i}] ({e.name})"
    backends = available_backends()
    if e.backend not in backends:
        problems.append(
            f"{key}.backend: {e.backend!r} is not available here ({', '.join(backends) or 'none'})"
        )
        return
    bad_options = unknown_options(e.backend, e.options) if options else []
    if bad_options:
        problems.extend(f"{key}.options: {m}" for m in bad_options)
        return
    where = target_where(t, key, problems, plan.cache_root)
    if where is None:
        return
    # (with the config's option checks, read_config reported it already)
    value_problem = value_problem_of(e.backend, e.model, e.options) if options else None
    if value_problem is not None:  # the run would fail building it, after earlier targets
        problems.append(f"{key}.options: {value_problem}")
        return
    said = None
    try:  # a served target: the server answers and serves this model (once its options are
        # right: wrong ones are reported by the config check)
        if not option_problems(e.backend, e.options) and (
            value_problem_of(e.backend, e.model, e.options) is None
        ):
            said = preflight_target(e, _logprobs_asked(plan, t))
    except ValueError as exc:  # reported; the target's other checks still run
        problems.append(f"{key}: {exc}")
    if said is not None:
        lines.append(f"  {key}: {said}")
    damaged = checkpoint_problems(t.path or e.model)
    if damaged:  # the run would fail loading it, after everything before it
        problems.extend(f"{key}.model: {m}" for m in damaged)
        return
    fam = e.family or "from the checkpoint"
    try:
        codes = dry_view_bank(t, plan.procedure.view_system, plan.cache_root)
    except ImportError:
        codes = None
    except Exception as exc:  # the run would fail here after all its generations
        problems.append(f"{key}.family: cannot build the view bank: {exc}")
        return
    if codes is not None:
        fam += f" (views {' '.join(codes)})"
        banks.append(len(codes))
    lines.append(f"  {key}: {e.backend} {where}; family {fam}; base {e.base or '-'}")


def _check_detector(
    plan: RunPlan, i: int, d: Any, options: bool, lines: list[str], problems: list[str]
) -> None:
    """A detector entry: registered, installed, and its planned detectors (one per benchmark)
    built (nothing trained or loaded), with enough supervised texts per class."""
    from calibdcd.detectors.adapter import DetectorAdapter

    key = f"detectors[{i}] ({d.label})"
    if d.name not in DETECTORS:
        problems.append(
            f"{key}.name: unknown detector {d.name!r}; known: {', '.join(sorted(DETECTORS))}"
        )
        return
    if not detector_available(d.name):
        lines.append(f"  {key}: WARNING module {DETECTORS[d.name].module} is not installed here")
        return
    cfg = plan.config
    try:
        det = None
        for planned in plan.planned_detectors(d.label):
            det = planned.build()
        if det is None:  # none of this process's settings uses it
            return
        lines.append(
            f"  {key}: {DETECTORS[d.name].description}; correctable blocks "
            f"{det.calibration_blocks or 'all'}"
        )
        need = DetectorAdapter(det).min_supervised_per_class
        if cfg.n_supervised_per_class < need:
            problems.append(
                f"split.n_supervised_per_class: {cfg.n_supervised_per_class} is fewer than "
                f"{key} needs per class ({need})"
            )
    except OptionsError as exc:
        if options:
            problems.append(f"{key}: {exc}")
    except Exception as exc:
        problems.append(f"{key}: {exc}")


#: the smallest parts a setting can run with: CalibDCD needs two calibration non-members
#: (``calibrate``), the classifier both classes, the metrics both classes in the pool
MIN_CALIBRATION = 2


def split_size_problems(sizes: dict[str, tuple[int, int, int]], seed: int) -> list[str]:
    """What a split of these sizes would fail on after all its generations (seed ``seed``)."""
    out = []
    n_cal = sizes["calibration"][2]
    if n_cal < MIN_CALIBRATION:
        out.append(
            f"the split (seed {seed}) leaves {n_cal} calibration non-member(s); CalibDCD needs at "
            f"least {MIN_CALIBRATION} (more texts, fewer split.n_supervised_per_class, or a "
            "larger split.calibration_fraction)"
        )
    for part in ("supervised", "evaluation"):
        _, m, nm = sizes[part]
        if m < 1 or nm < 1:
            out.append(
                f"the split (seed {seed}) leaves the {part} part with {m} member(s) and {nm} "
                "non-member(s); it needs both"
            )
    return out


def dry_view_bank(t: Any, system: str, root: Path) -> list[str] | None:
    """The view codes the run will use for target ``t`` (a planned target, or a target entry
    a fit resolves alone), as the run finds them (:func:`calibdcd.experiment.target_entries.
    target_views`: a local checkpoint's tokenizer and chat template, never its weights); None
    when that needs a model that is not here yet."""
    from calibdcd.experiment.target_entries import view_source, views_of
    from calibdcd.model_refs import MissingModelError

    entry, source = (t.entry, t.view_source) if hasattr(t, "entry") else (t, None)
    try:
        if source is None:  # an entry resolved alone, or a planned target not resolved here
            source = view_source(entry, root)
        views = views_of(source, entry, system, dry=True)
    except MissingModelError:  # named with the models to fetch, once
        return None
    except OSError as exc:
        if entry.tokenizer is None:
            raise ValueError(str(exc)) from None
        raise ValueError(f"tokenizer {entry.tokenizer!r}: {exc}") from None
    return None if views is None else [v.code for v in views]


def _lab_preset_known(spec: str, root: Path) -> bool | str:
    """True when the lab ``spec`` resolves here (built or not), else why not: the one resolver
    (:func:`calibdcd.experiment.config.resolve_lab_ref`) the config was loaded with."""
    from calibdcd.experiment.config import resolve_lab_ref

    ref = resolve_lab_ref(spec, cache_dir=root)
    return ref if isinstance(ref, str) else True


def _unbuilt_lab_model_problem(spec: str, model: str) -> str | None:
    """None when the unbuilt lab ``spec`` (a known preset) will hold ``model``
    (:func:`calibdcd.lab.config.preset_models`; a real-model lab's models are checked once it is
    built), else what is wrong."""
    try:
        from calibdcd.lab.config import preset_models  # type: ignore[attr-defined]
    except ImportError:
        return None
    preset, _ = lab_spec(spec)
    has = preset_models(preset)
    if has is None or model in has:
        return None
    return f"lab preset {preset!r} has no model {model!r}; it has {', '.join(has)}"


def describe_grid(cfg: ExperimentConfig) -> list[str]:
    return [s.id for s in grid(cfg)]
