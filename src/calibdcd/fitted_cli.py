"""``calibdcd fit CONFIG --out DIR`` and ``calibdcd score DIR TEXTS --out scores.jsonl``.

``fit`` builds the target and the detector of a fit config (:mod:`calibdcd.fitted.config`),
splits the known members and non-members into supervised / calibration / held-out parts and
saves the fitted bundle. ``score`` loads a bundle, checks the target's identity, scores a file of
texts and writes one JSON line per text (score, empirical p-value, decision at the bundle's FPR)
after a summary line (threshold, set-level test, distribution check, warnings), and a
self-contained HTML page beside it (:mod:`calibdcd.fitted.report`: ``scores.jsonl`` ->
``scores.html``). Warnings also go to stderr. Both show one status line naming the step they are
in, above the inner bars of its waits (count, rate, ETA: :mod:`calibdcd.progress`).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Annotated, Any

import typer

from calibdcd.detectors.registry import registered_detectors
from calibdcd.errors import CommandError
from calibdcd.paths import cache_root

#: ``--detector``'s choices, as registered (the paper's, the overlap baseline, the attacks)
_DETECTORS = " / ".join(registered_detectors())

__all__ = ["fit_command", "fit_dry_run", "score_command"]


def _target_help() -> str:
    """``--target``'s example and every backend's options (read from the backends' signatures,
    as the option check reads them), for ``fit --help``."""
    from calibdcd.fitted.config import TARGET_FIELDS
    from calibdcd.targets.base import available_backends, backend_options

    lines = [
        "Without a config, --target gives the target as BACKEND:key=value,..., for example",
        "",
        "  openai:base_url=http://127.0.0.1:8000/v1,model=my-model,family=qwen2.5,dialect=vllm",
        "",
        f"Its keys {', '.join(TARGET_FIELDS)} are the target's fields; every other key is an "
        "option of the backend:",
        "",
    ]
    for b in available_backends():
        names = [n for n in backend_options(b) if n not in TARGET_FIELDS]
        lines.append(f"  {b}: {', '.join(names)}")
    return "\n".join(lines)


def _status(job: str, enabled: bool) -> Any:
    """The command's status line (:func:`calibdcd.progress.status_line`)."""
    from calibdcd.progress import status_line

    return status_line(job, enabled=enabled)


def _target_parts(
    cfg: Any, cache_dir: Path, *, with_views: bool = True, progress: bool | None = None
) -> tuple[Any, dict[str, Any], list[Any] | None]:
    """(cached target, its identity record, its view bank: None unless ``with_views``) for a fit
    config's target section (score keeps the bundle's views and asks for none); ``progress``:
    the target's generation bar (requests, rate, ETA)."""
    from calibdcd.experiment.target_entries import build_target, target_views

    entry = _target_entry(cfg.target)
    record = _target_record(cfg.target, cache_dir)
    target = build_target(entry, cache_dir / "generations.sqlite", cache_dir, progress=progress)
    views = (
        None
        if not with_views
        else target_views(
            entry,
            cfg.view_system,
            root=cache_dir,
            loaded_family=lambda: getattr(target, "family", None),
        )
    )
    return target, record, views


def _target_record(t: Any, cache_dir: Path, *, build_lab: bool = True) -> dict[str, Any]:
    """A fit config's (or a bundle's) target section's identity record, without building the
    target; its lab is built when ``build_lab`` (a dry run's is not: a lab model not built here
    is identified by its name, as check_target compares a record without content)."""
    from calibdcd.experiment.target_entries import model_path
    from calibdcd.targets.identity import target_record

    # an unbuilt lab's model comes back as its name, which target_record reads as a name
    local = Path(model_path(_target_entry(t), build_lab=build_lab, root=cache_dir))
    return target_record(
        t.backend, t.model, model_dir=local if local.exists() else None, family=t.family,
        lab=t.lab, options=t.options, root=cache_dir,
    )  # fmt: skip


def _target_entry(section: Any) -> Any:
    """A fit config's (or a bundle's) target section as the run's target entry."""
    from calibdcd.experiment.fit_config import target_entry

    return target_entry(section)


def _preflight(section: Any, spec: Mapping[str, Any], cache: Path) -> None:
    """A served target's server answers and serves the model (and returns token
    log-probabilities when the detector of ``spec`` reads them), before any work (one line if
    not: exit 2)."""
    from calibdcd.experiment.target_entries import preflight_target

    try:
        said = preflight_target(_target_entry(section), _planned_detector(spec, cache).logprobs)
    except ValueError as exc:
        raise CommandError(f"target: {exc}") from exc
    if said is not None:
        typer.echo(f"target: {said}", err=True)


def _fit_texts(cfg: Any, cache: Path) -> Any:
    from calibdcd.data import load_table, load_texts
    from calibdcd.fitted import FitTexts

    d, sp = cfg.data, cfg.split

    def texts_of(name: str) -> list[str]:
        return list(load_texts(cfg.resolve(name), text_field=d.text_field).texts)

    def labelled(path: Path) -> tuple[list[str], list[int]]:
        bench = load_table(path, text_field=d.text_field, label_field=d.label_field)
        return bench.texts, [int(y) for y in bench.labels]

    if d.supervised is not None:
        sup, labels = labelled(cfg.resolve(d.supervised))
        return FitTexts(
            supervised=tuple(sup), labels=tuple(labels),
            calibration=tuple(texts_of(d.calibration) if d.calibration else ()),
            heldout=tuple(texts_of(d.heldout)),
            pool=tuple(texts_of(d.pool) if d.pool else ()),
        )  # fmt: skip
    if d.members is not None:
        members, nonmembers = texts_of(d.members), texts_of(d.nonmembers)
    else:
        if d.lab is not None:
            from calibdcd.experiment.labs import resolve_lab

            lab = resolve_lab(d.lab, root=cache)
            assert lab is not None
            path = lab / "ground_truth.jsonl"
        else:
            path = cfg.resolve(d.path)
        texts, labels = labelled(path)
        members = [t for t, y in zip(texts, labels, strict=True) if y == 1]
        nonmembers = [t for t, y in zip(texts, labels, strict=True) if y == 0]
    members, nonmembers = _at_most(members, nonmembers, d.max_members, d.max_nonmembers, cfg.seed)
    return FitTexts.split(
        members, nonmembers, heldout_fraction=sp.heldout_fraction,
        calibration_fraction=sp.calibration_fraction,
        n_supervised_per_class=sp.n_supervised_per_class, seed=cfg.seed,
    )  # fmt: skip


def _at_most(
    members: list[str], nonmembers: list[str], k_m: int | None, k_n: int | None, seed: int
) -> tuple[list[str], list[str]]:
    """``max_members`` / ``max_nonmembers``: a seeded draw of each, in their order, by the
    project's one splitting primitive (:func:`calibdcd.data.protocol.stratified_draw`; a list
    no longer than its count is kept whole and draws nothing)."""
    import numpy as np

    from calibdcd.data.protocol import stratified_draw

    m, n = len(members), len(nonmembers)
    pools = [np.arange(m), m + np.arange(n)]
    counts = [m if k_m is None else k_m, n if k_n is None else k_n]
    idx = stratified_draw(np.random.default_rng([seed, 0x5E1]), pools, counts)
    both = [*members, *nonmembers]
    return [both[i] for i in idx if i < m], [both[i] for i in idx if i >= m]


def _check_fit_output(cfg: Any, config: Path, out: Path) -> None:
    """``fit -o``: a directory that is not a file, not an input's directory, and holds no
    bundle yet (fit never replaces a bundle)."""
    from calibdcd.paths import check_output

    d = cfg.data
    files = [d.path, d.members, d.nonmembers, d.supervised, d.calibration, d.heldout, d.pool]
    inputs = [cfg.resolve(f) for f in files if f] + ([config] if config.is_file() else [])
    check_output(out, "directory", inputs=inputs)
    from calibdcd.fitted.detector import BUNDLE

    if (out / BUNDLE).exists():
        raise FileExistsError(
            f"-o {out}: holds a bundle already; fit never replaces one: remove it or choose "
            "another directory"
        )


def _planned_detector(
    spec: Mapping[str, Any], cache: Path, progress: bool | None = None, *, build: bool = False
) -> Any:
    """The one way ``fit``, ``score`` and their dry runs resolve their detector: ``spec`` (a fit
    config's detector section, or a bundle's ``detector_spec``: name, preset, options,
    benchmark) planned as a run's plan plans one
    (:func:`calibdcd.experiment.detector_entries.plan_detector`, seed 0: one setting);
    ``build``: the labs and clean reference LMs its options name are built first under the
    cache root ``cache`` (the command's ``materialize``), with ``progress``'s bars."""
    from calibdcd.experiment.config import DetectorEntry
    from calibdcd.experiment.detector_entries import plan_detector
    from calibdcd.experiment.labs import resolve_lab_refs

    opts = dict(spec.get("options") or {})
    if build:
        opts = resolve_lab_refs(opts, build=True, root=cache, progress=bool(progress))
    # ``progress`` is the build's (PlannedDetector.build: only to a detector registered to
    # take it), never an option: a detector without bars has no such field
    entry = DetectorEntry(name=spec["name"], preset=spec.get("preset"), options=opts)
    return plan_detector(entry, spec.get("benchmark") or "", 0, str(cache))


def _section_spec(section: Any) -> dict[str, Any]:
    """A fit config's detector section as the spec a bundle keeps (``detector_spec``)."""
    return {"name": section.name, "preset": section.preset, "options": dict(section.options),
            "benchmark": section.benchmark}  # fmt: skip


def _generations_line(detector: Any, texts: int, note: str = "") -> str:
    """The dry run's estimate of the target's work: at most texts x completions per text."""
    from calibdcd.detectors.base import completions_per_text

    per = None if detector is None else completions_per_text(detector)
    if per is None:
        return (
            f"  target: generates for {texts:,} texts{note}; those already in the cache are not "
            "asked again"
        )
    k, how = per
    return (
        f"  target: at most {texts * k:,} completions, one request each through a server "
        f"({texts:,} texts x {k} per text: {how}{note}); those already in the cache are not "
        "asked again"
    )


def _estimate_detector(planned: Any) -> Any:
    """The planned detector built for a dry run's estimate only (lab references left unresolved,
    nothing trained or loaded); None when it cannot be built so."""
    try:
        return planned.build()
    except Exception:  # the dry run's other checks name the problem
        return None


def fit_dry_run(cfg: Any, source: Path, out: Path, cache: Path) -> tuple[list[str], list[str]]:
    """What ``fit`` would do, checked without loading any model: the texts and their split,
    the target's backend and lab, every model and dataset it needs. (lines, problems)."""
    from calibdcd.experiment.labs import resolve_lab
    from calibdcd.experiment.model_uses import models_in_fit_config
    from calibdcd.experiment.plan import plan_target
    from calibdcd.experiment.runner import dry_run_models, target_where
    from calibdcd.experiment.runner import dry_view_bank as _dry_view_bank
    from calibdcd.experiment.target_entries import preflight_target
    from calibdcd.targets.base import available_backends

    named = f"fit config {source}" if source.is_file() else f"fit from {source}"
    lines = [f"{named}: cache {cache}; bundle: {out}"]
    problems: list[str] = []
    planned = _planned_detector(_section_spec(cfg.detector), cache)
    codes: list[str] | None = None
    t, d = cfg.target, cfg.detector
    unbuilt = {
        x for x in (t.lab, cfg.data.lab) if x and resolve_lab(x, build=False, root=cache) is None
    }
    lines += [f"  lab {lab!r}: not built yet (built on first use)" for lab in sorted(unbuilt)]
    try:
        texts = None if cfg.data.lab in unbuilt else _fit_texts(cfg, cache)
    except (OSError, ValueError) as exc:
        problems.append(f"data: {exc}")
        texts = None
    if texts is not None:
        n_m = sum(texts.labels)
        lines.append(
            f"  texts: supervised {len(texts.supervised)} ({n_m} members), calibration "
            f"{len(texts.calibration)}, held-out {len(texts.heldout)} known non-members, pool "
            f"{len(texts.pool)}"
        )
    if t.backend not in available_backends():
        problems.append(
            f"target.backend: {t.backend!r} is not available here "
            f"({', '.join(available_backends())})"
        )
    else:
        lines.append(f"  target: {t.backend} {t.model}" + (f" (lab {t.lab})" if t.lab else ""))
        try:
            said = preflight_target(_target_entry(t), planned.logprobs)
        except ValueError as exc:
            problems.append(f"target: {exc}")
        else:
            if said is not None:
                lines.append(f"  target: {said}")
            # CalibDCD's views, resolved as fit resolves them (a served model's chat template
            # from its server included), so a template that cannot be had is found here
            try:
                codes = (
                    None  # from the lab's checkpoint, once it is built
                    if t.lab in unbuilt
                    else _dry_view_bank(_target_entry(t), cfg.view_system, cache)
                )
            except ValueError as exc:
                problems.append(f"target views: {exc}")
            else:
                lines.append(
                    "  views: "
                    + (" ".join(codes) if codes else "from the checkpoint, once it is here")
                )
    lines.append(f"  {planned.describe()}" + (f" (preset {d.preset})" if d.preset else ""))
    if planned.problem is not None:
        problems.append(f"detector: {planned.problem}")
    elif texts is not None:
        det = _estimate_detector(planned)
        n = len(texts.supervised) + len(texts.calibration) + len(texts.heldout) + len(texts.pool)
        n_views = len(codes) if cfg.calibration_config() is not None and codes else 0
        again = len(texts.calibration) * n_views
        note = (
            f"; the {len(texts.calibration):,} calibration non-members count once more under "
            f"each of {n_views} views"
            if again
            else ""
        )
        lines.append(_generations_line(det, n + again, note))
    # the target's model where a run's dry run looks for it (a lab's model, a local checkpoint),
    # then every model the fit needs, as the run's dry run checks them
    target_where(plan_target(_target_entry(t), cache), "target", problems, cache)
    try:
        uses = models_in_fit_config(cfg, cache)
    except ValueError as exc:  # a detector that does not build
        problems.append(str(exc))
    else:
        models: list[str] = []
        dry_run_models(uses, str(source), models, problems)
        lines += [f"  {line}" for line in models]
    return lines, problems


def fit_command(
    out: Annotated[Path, typer.Option("--out", "-o", help="bundle directory to write")],
    config: Annotated[
        Path | None,
        typer.Argument(help="fit config (YAML; see docs/fitted.md); or the flags below"),
    ] = None,
    target: Annotated[
        str | None,
        typer.Option(
            help="without a config: the target as BACKEND:key=value,... (the example and "
            "each backend's options are above)"
        ),
    ] = None,
    members: Annotated[
        Path | None,
        typer.Option(help="without a config: known members (.jsonl with text, or .txt)"),
    ] = None,
    nonmembers: Annotated[
        Path | None, typer.Option(help="without a config: known non-members (.jsonl or .txt)")
    ] = None,
    detector: Annotated[str, typer.Option(help=f"without a config: {_DETECTORS}")] = "overlap",
    preset: Annotated[
        str | None, typer.Option(help="without a config: the detector's preset")
    ] = None,
    fpr: Annotated[float, typer.Option(help="without a config: the decision FPR")] = 0.05,
    cache_dir: Annotated[
        Path | None,
        typer.Option(
            help="cache root (default: the config's cache_dir, else $CALIBDCD_CACHE, else the "
            "user cache)"
        ),
    ] = None,
    progress: Annotated[bool, typer.Option(help="progress bars")] = True,
    dry_run: Annotated[
        bool,
        typer.Option(
            "--dry-run", help="check the config, the texts, the target and its models; load none"
        ),
    ] = False,
) -> None:
    try:
        cfg, config = _fit_config(
            config, target=target, members=members, nonmembers=nonmembers, detector=detector,
            preset=preset, fpr=fpr, reach=dry_run,
        )  # fmt: skip
        # the one rule (paths.cache_root): --cache-dir, else the config's, else the shared one
        cache_dir = (
            cache_root(cache_dir.expanduser().resolve()) if cache_dir is not None
            else cfg.cache_root()
        )  # fmt: skip
    except (OSError, ValueError) as exc:
        raise CommandError(exc) from exc
    _check_fit_output(cfg, config, out)  # in the dry run as in the real one
    if dry_run:
        _echo_fit_dry_run(cfg, config, out, cache_dir)
        return
    from calibdcd.experiment.model_uses import models_in_fit_config, resolve_uses

    # every model the fit needs is here before any work, or one list of those that are not
    # (exit 1), as `calibdcd run` checks its config's
    resolve_uses(models_in_fit_config(cfg, cache_dir), str(config))
    fitted = _fit(cfg, cache_dir, progress)
    fitted.save(out)
    _echo_fitted(fitted, cfg, out)


def _fit_config(
    config: Path | None,
    *,
    target: str | None,
    members: Path | None,
    nonmembers: Path | None,
    detector: str,
    preset: str | None,
    fpr: float,
    reach: bool,
) -> tuple[Any, Path]:
    """(the fit config, where it came from: its file or ``command line``) from ``fit``'s
    config argument or its flags, never both; ``reach``: the dry run's reachability checks."""
    from calibdcd.experiment.fit_config import fit_config_from, load_fit_config
    from calibdcd.fitted.config import parse_target_spec

    flags = {"--target": target, "--members": members, "--nonmembers": nonmembers}
    if config is not None:
        given = [k for k, v in flags.items() if v is not None]
        if given:
            raise ValueError(f"give a config or {', '.join(flags)}, not both ({given[0]})")
        return load_fit_config(config, reach=reach), config
    missing = [k for k, v in flags.items() if v is None]
    if missing:
        raise ValueError(
            f"without a config, fit needs {', '.join(missing)} (e.g. calibdcd fit "
            "--target openai:base_url=http://127.0.0.1:8000/v1,model=m --members m.jsonl "
            "--nonmembers n.jsonl -o bundle)"
        )
    assert target is not None and members is not None and nonmembers is not None
    data: dict[str, Any] = {
        "target": parse_target_spec(target),
        "detector": {"name": detector, **({"preset": preset} if preset else {})},
        "data": {"members": str(members), "nonmembers": str(nonmembers)},
        "fpr": fpr,
    }
    cfg = fit_config_from(data, source="command line", base_dir=Path.cwd(), reach=reach)
    return cfg, Path("the command line")


def _echo_fit_dry_run(cfg: Any, config: Path, out: Path, cache_dir: Path) -> None:
    """``fit --dry-run``: :func:`fit_dry_run`'s lines, then its problems (each with its line in
    the fit config) on stderr and exit 1, or ``dry run: OK``."""
    from calibdcd.experiment.cli import finish_dry_run

    lines, problems = fit_dry_run(cfg, config, out, cache_dir)
    if config.is_file():  # each problem with its line in the fit config
        from calibdcd.experiment.config import locate

        problems = [locate(p, config) for p in problems]
    finish_dry_run(lines, problems)


def _fit(cfg: Any, cache_dir: Path, progress: bool) -> Any:
    """The fitted detector of a fit config: its texts, target (with its views) and detector
    built under the cache root ``cache_dir``, then :func:`calibdcd.fitted.fit_detector`."""
    from calibdcd.fitted import fit_detector
    from calibdcd.targets.server_template import ServerTemplateError

    _preflight(cfg.target, _section_spec(cfg.detector), cache_dir)
    texts = _fit_texts(cfg, cache_dir)
    try:
        target, record, views = _target_parts(cfg, cache_dir, progress=progress)
    except ServerTemplateError as exc:  # the served chat template cannot be had: one line
        raise CommandError(f"target views: {exc}") from exc
    dt = cfg.detector
    spec = _section_spec(dt)
    # lab references resolve (and build) under this fit's cache root, in the build
    detector = _planned_detector(spec, cache_dir, progress, build=True).build(progress=progress)
    n_known = len(texts.supervised) + len(texts.calibration) + len(texts.heldout)
    with _status(f"fitting {dt.name} on {n_known:,} known texts", progress) as status:
        return fit_detector(
            detector, target, texts, views=views, calibration=cfg.calibration_config(),
            space=cfg.space, fpr=cfg.fpr, mode=cfg.mode, seed=cfg.seed, detector_spec=spec,
            target_record=record, status=status,
        )  # fmt: skip


def _echo_fitted(fitted: Any, cfg: Any, out: Path) -> None:
    """``fit``'s closing lines: the known texts' separation, then the sizes, the correction and
    the threshold."""
    s = fitted.sizes
    if fitted.separation is not None:
        from calibdcd.fitted.audit import Separation

        sep = Separation(**{k: v for k, v in fitted.separation.items() if k != "calibdcd"})
        low = "" if sep.beats_chance is not False else "; NOT above chance (see the warning)"
        typer.echo(f"known texts: {sep.line()}{low}")
    typer.echo(
        f"fitted {cfg.detector.name} ({cfg.mode}) on {s['supervised']} supervised texts "
        f"({s['supervised_members']} members), {s['calibration']} calibration and "
        f"{s['heldout']} held-out non-members; CalibDCD "
        f"{'corrected' if fitted.scorer.corrected else 'no correction'}; threshold at FPR "
        f"{cfg.fpr}: {fitted.threshold:.6g}; bundle: {out}"
    )


def score_command(
    bundle: Annotated[Path, typer.Argument(help="a bundle written by calibdcd fit")],
    texts: Annotated[Path, typer.Argument(help="texts: .jsonl (text, optional id) or .txt")],
    out: Annotated[Path, typer.Option("--out", "-o", help="scores.jsonl to write")],
    report: Annotated[
        Path | None,
        typer.Option(
            help="the HTML page to write (default: -o's path with .html for its suffix, e.g. "
            "scores.html)"
        ),
    ] = None,
    model: Annotated[
        str | None,
        typer.Option(help="the target's checkpoint here, or its served name (default: as fitted)"),
    ] = None,
    base_url: Annotated[
        str | None,
        typer.Option(help="a served target's URL here (default: as fitted); still checked"),
    ] = None,
    cache_dir: Annotated[
        Path | None,
        typer.Option(
            help="cache root (default, as every command: $CALIBDCD_CACHE, else the user cache)"
        ),
    ] = None,
    alpha: Annotated[float, typer.Option(help="level of the set-level test")] = 0.05,
    allow_unverified: Annotated[
        bool,
        typer.Option(help="score a bundle that carries no digests (an older calibdcd's) unchecked"),
    ] = False,
    dry_run: Annotated[
        bool,
        typer.Option("--dry-run", help="check the bundle, its target and the texts; score nothing"),
    ] = False,
    progress: Annotated[bool, typer.Option(help="progress bars")] = True,
) -> None:
    """Score texts with a fitted bundle: per-text score, p-value, decision; set-level test;
    an HTML report beside the scores."""
    if not 0.0 < alpha < 1.0:
        raise CommandError(f"--alpha must lie in (0, 1), got {alpha:g}")

    from calibdcd.fitted.report import report_path, write_report
    from calibdcd.paths import check_output

    check_output(out, "file", inputs=[texts], protected=[bundle])
    page = report_path(out) if report is None else report
    check_output(page, "file", inputs=[texts, out], protected=[bundle], option="--report")
    header, tsec = _bundle_target(bundle, model=model, base_url=base_url)
    cache = cache_root(cache_dir)  # the one rule: --cache-dir, $CALIBDCD_CACHE, user cache
    _preflight(tsec, header["detector"], cache)
    if dry_run:  # every check of a real score, nothing built, generated or written
        record = _target_record(tsec, cache, build_lab=False)
    else:
        target, record, _ = _bundle_target_parts(header, tsec, cache, progress)
    fitted = _load_bundle(bundle, record, allow_unverified)
    items, ids = _suspect_texts(texts)
    if dry_run:
        _echo_score_dry_run(fitted, bundle, tsec, cache, texts, items, out, page)
        return
    # the bundle's detector, planned as fit planned it (a transductive bundle's references
    # are trained again here when this cache lacks them)
    planned = _planned_detector(
        fitted.detector_spec, cache, progress, build=fitted.mode == "transductive"
    )
    detector = planned.build(progress=progress)
    with _status(f"scoring {len(items):,} texts", progress) as status:
        res = fitted.score(items, target, detector, set_alpha=alpha, status=status)
    for w in res.warnings:
        typer.secho(f"WARNING: {w}", err=True, fg=typer.colors.RED, bold=True)
    summary = _write_scores(out, fitted, res, ids)
    write_report(
        page, header=header, null=fitted.null, result=res, summary=summary, texts=items,
        ids=ids, alpha=alpha, sources={"bundle": str(bundle), "texts": str(texts),
                                       "scores": str(out)},
    )  # fmt: skip
    typer.echo(
        f"{len(items)} texts scored; {summary['n_members_declared']} declared members at FPR "
        f"{res.fpr}; {_set_verdict(res.set_test or {})}; written to {out}; the report: {page}"
    )


def _bundle_target(bundle: Path, *, model: str | None, base_url: str | None) -> tuple[Any, Any]:
    """(the bundle's header, its target section) with ``score``'s ``--model`` and
    ``--base-url`` applied; exit 2 for an unreadable bundle, a ``--base-url`` for a backend that
    takes none, or a fit's base URL whose credentials the bundle did not keep and no
    ``--base-url``."""
    from calibdcd.fitted.config import TargetSection
    from calibdcd.fitted.detector import BundleIntegrityError, read_bundle_header
    from calibdcd.redact import MASK
    from calibdcd.targets.base import backend_options

    try:
        header = read_bundle_header(bundle)
    except (OSError, BundleIntegrityError) as exc:
        raise CommandError(exc) from exc
    t = dict(header["target"])
    if base_url is None and MASK in json.dumps(t["options"].get("base_url")):
        raise CommandError(
            f"{bundle}: the fit's base_url held credentials, which a bundle does not "
            "keep; pass the server with --base-url"
        )
    if base_url is not None:
        if "base_url" not in backend_options(t["backend"]):
            raise CommandError(f"--base-url is for served targets; this one is {t['backend']}")
        t["options"] = {**t["options"], "base_url": base_url}
    tsec = TargetSection(
        name="target", backend=t["backend"], model=model or t["model"],
        lab=None if model else t["lab"], family=t["family"], options=t["options"],
    )  # fmt: skip
    return header, tsec


def _bundle_target_parts(
    header: dict[str, Any], tsec: Any, cache: Path, progress: bool
) -> tuple[Any, dict[str, Any], Any]:
    """The bundle's target built exactly as ``fit`` built it (through a fit config shell), its
    identity record; no views (the bundle keeps its own)."""
    from calibdcd.fitted.config import DetectorSection, FitConfig

    shell = FitConfig(
        target=tsec, detector=DetectorSection(name=header["detector"]["name"]),
        data={"heldout": "-", "supervised": "-"},
    )  # fmt: skip
    return _target_parts(shell, cache, with_views=False, progress=progress)


def _load_bundle(bundle: Path, record: dict[str, Any], allow_unverified: bool) -> Any:
    """The fitted detector of ``bundle``, its digests and target identity (``record``)
    checked; exit 2 when they do not hold."""
    from calibdcd.fitted import FittedDetector, TargetMismatchError
    from calibdcd.fitted.detector import BundleIntegrityError

    try:
        return FittedDetector.load(bundle, target=record, allow_unverified=allow_unverified)
    except (TargetMismatchError, BundleIntegrityError) as exc:
        raise CommandError(exc) from exc


def _suspect_texts(texts: Path) -> tuple[list[str], list[str | None]]:
    """(texts, ids) of ``score``'s texts file; exit 2 when it cannot be read."""
    from calibdcd.data import load_texts

    try:
        suspect = load_texts(texts)
    except (OSError, ValueError) as exc:
        raise CommandError(exc) from exc
    return list(suspect.texts), list(suspect.ids)


def _echo_score_dry_run(
    fitted: Any, bundle: Path, tsec: Any, cache: Path, texts: Path, items: list[str], out: Path,
    page: Path,
) -> None:  # fmt: skip
    """``score --dry-run``: the bundle, its target, the texts, the target's work ahead and
    where the scores and the report would go."""
    from calibdcd.data.textkey import keys

    typer.echo(
        f"bundle {bundle}: {fitted.detector_spec['name']} ({fitted.mode}), fpr {fitted.fpr}, "
        f"threshold {fitted.threshold:.6g}; digests and target identity checked"
    )
    typer.echo(f"  target: {tsec.backend} {tsec.model}; cache {cache}")
    typer.echo(f"  texts: {len(items)} from {texts} ({len(keys(items))} distinct)")
    det = _estimate_detector(_planned_detector(fitted.detector_spec, cache))
    note = (
        "; transductive: the fit's texts are scored again too, from the fit's cache"
        if fitted.mode == "transductive"
        else ""
    )
    typer.echo(_generations_line(det, len(items), note))
    typer.echo(f"  scores: {out}; report: {page}")
    typer.echo("dry run: OK")


def _write_scores(out: Path, fitted: Any, res: Any, ids: list[str | None]) -> dict[str, Any]:
    """Write ``scores.jsonl`` (atomically): the summary line, then one line per text (score,
    p-value, decision, whether it was a fit text); return the summary."""
    import numpy as np

    from calibdcd.atomic import atomic_write_text

    summary = {
        "kind": "summary",
        "bundle_format": fitted.format_version,
        "detector": fitted.detector_spec["name"],
        "mode": fitted.mode,
        "fpr": res.fpr,
        "threshold": res.threshold,
        "n_null": int(fitted.null.size),
        "n_texts": len(ids),
        "n_members_declared": int(np.sum(res.decisions)),
        "set_test": res.set_test,
        "distribution_check": res.distribution,
        "warnings": res.warnings,
    }
    lines = [json.dumps(summary, default=float)]
    for i, (s, p, dec) in enumerate(zip(res.scores, res.p_values, res.decisions, strict=True)):
        rec = {
            "kind": "text",
            "index": i,
            "id": ids[i],
            "score": None if not np.isfinite(s) else float(s),
            "p_value": None if not np.isfinite(p) else float(p),
            "member": bool(dec),
            "in_fit": res.in_fit[i] if res.in_fit else None,
        }
        lines.append(json.dumps(rec))
    atomic_write_text(out, "\n".join(lines) + "\n")
    return summary


def _set_verdict(st: dict[str, Any]) -> str:
    """The set-level test's verdict in words, with its p-value and AUC."""
    if st.get("reject"):
        verdict = "the set is MORE member-like than the known non-members"
    else:
        verdict = "the set is not distinguishable from the known non-members"
    return verdict + (
        f" (one-sided Mann-Whitney p = {st.get('p_value', float('nan')):.3g}, "
        f"AUC {st.get('auc', float('nan')):.3f})"
    )


fit_command.__doc__ = (
    "Fit a detector (+ CalibDCD) on known members and non-members and save the bundle.\n\n"
    + _target_help()
)
