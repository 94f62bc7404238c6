"""The `openai` backend against a real third-party server vs the in-process `hf` backend.

One checkpoint, served by `transformers serve` on loopback (`calibdcd.targets.serve`) and loaded
in process. Measured, on the first halves of the lab's texts (members and non-members alike):

1. greedy texts: the share of prompts whose server completion equals the in-process one;
2. sampled texts (temperature 1, top-p 1, the checkpoint's top-k): equal in distribution? Per
   completion: its word count, its ROUGE-1 recall of the true second half and the model's mean
   token NLL of prompt + completion. Server draws vs in-process draws, beside a second set of
   in-process draws with other seeds (the null: how far two honest draws differ). KS tests and
   paired bootstrap intervals of the mean difference;
3. client throughput (completions/s) on the same prompts: in process at two batch sizes, and
   through the server at several concurrencies (the server and the client share the cores);
4. AUC: with ``--auc CONFIG``, `calibdcd run` of CONFIG's Overlap detector (and CalibDCD) on
   its first target in process and on the served copy, CONFIG's seeds; the AUCs side by side.

    python benchmarks/server_compare.py --model lab:real-smollm2/chat --out DIR \
        [--auc configs/real-lab.yaml]

Writes DIR/server_compare.json; `--markdown` prints the tables docs/serving.md shows. A single
run on 2 cores takes ~15 min without `--auc` (measured times are in the JSON).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]


def resolve_model(spec: str) -> Path:
    """A checkpoint directory for ``spec``: a path, ``lab:<preset>[@seed]/<model>`` or
    ``packaged:<name>``."""
    if spec.startswith("lab:"):
        from calibdcd.experiment.labs import resolve_lab

        lab, model = spec[4:].split("/", 1)
        return resolve_lab(lab) / model
    if spec.startswith("packaged:"):
        from calibdcd.targets.packaged import packaged_checkpoint

        return packaged_checkpoint(spec)
    return Path(spec)


def prompt_set(lab_dir: Path | None, n: int, seed: int) -> list[tuple[str, list[str], int]]:
    """(first half, words of the true second half, label) for ``n`` texts of the lab, half of
    them members, drawn with ``seed``; the halves as the Overlap detector splits them."""
    from calibdcd.detectors.overlap import OverlapConfig, _split
    from calibdcd.lab import load_ground_truth

    if lab_dir is None or not (lab_dir / "ground_truth.jsonl").is_file():
        raise SystemExit(
            "--model must name a lab model (lab:<preset>/<model>) for its texts, or --texts a "
            "ground_truth.jsonl"
        )
    rows = load_ground_truth(lab_dir)
    rng = np.random.default_rng(seed)
    picked = []
    for label in (1, 0):
        idx = [i for i, r in enumerate(rows) if r.label == label]
        picked += [rows[i] for i in rng.choice(idx, size=n // 2, replace=False)]
    cfg = OverlapConfig()
    out = []
    for r in picked:
        prompt, truth = _split(r.text, cfg)
        out.append((prompt, truth, r.label))
    return out


def timed(fn, *args):
    t0 = time.perf_counter()
    out = fn(*args)
    return out, time.perf_counter() - t0


def bootstrap_mean(d: np.ndarray, n_boot: int = 2000, seed: int = 0) -> dict:
    rng = np.random.default_rng(seed)
    means = d[rng.integers(0, len(d), size=(n_boot, len(d)))].mean(axis=1)
    lo, hi = np.quantile(means, [0.025, 0.975])
    return {"mean": float(d.mean()), "low": float(lo), "high": float(hi)}


def completion_stats(local, prompts, truths, completions) -> dict[str, np.ndarray]:
    """Per completion: word count, ROUGE-1 recall of the true continuation, mean token NLL of
    prompt + completion under the in-process model."""
    from calibdcd.detectors.overlap import _words, overlap_features
    from calibdcd.lab.evaluate import mean_token_nll

    tok = local.tokenizer
    p = 16
    rec = [overlap_features(c, t, p)[p] for c, t in zip(completions, truths, strict=True)]
    texts = [f"{q} {c.strip()}" for q, c in zip(prompts, completions, strict=True)]
    nll = mean_token_nll(
        local.model, tok, texts, local.device, 32, sep=tok.eos_token_id, pad=tok.pad_token_id
    )
    return {
        "words": np.array([len(_words(c)) for c in completions], dtype=float),
        "rouge1_recall": np.array(rec, dtype=float),
        "nll": np.array(nll, dtype=float),
    }


#: result key -> (--parts name, top_k, the client's dialect, table title)
SAMPLED = {
    "sampled": (
        "sampled", "inherit", "transformers",
        "Sampled, top-k inherited by both (the checkpoint's: 50), dialect `transformers`",
    ),
    "sampled_topk_none": (
        "sampled", None, "transformers",
        "Sampled, top-k None (no top-k on both: the client sends `top_k: 0` inside "
        "`generation_config`), dialect `transformers`",
    ),
    "sampled_topk_none_openai": (
        "sampled-openai", None, "openai",
        "Sampled, top-k None, dialect `openai` (the client cannot send it, so the server's "
        "default top-k 50 applies; in process: no top-k)",
    ),
}  # fmt: skip


def compare_sampled(local, server, prompts, truths, max_new_tokens: int, top_k) -> dict:
    """``top_k``: ``"inherit"`` (both backends use the checkpoint's, here transformers' default
    50) or None (no top-k: what the server does with it depends on the client's dialect,
    ``SAMPLED``)."""
    from scipy.stats import ks_2samp

    from calibdcd.targets.base import GenerationParams

    def draw(target, seed):
        p = GenerationParams(
            max_new_tokens=max_new_tokens, temperature=1.0, top_p=1.0, top_k=top_k, seed=seed
        )
        return [c[0] for c in target.generate(prompts, p)]

    a = completion_stats(local, prompts, truths, draw(local, 11))
    b = completion_stats(local, prompts, truths, draw(local, 12))  # the null
    s = completion_stats(local, prompts, truths, draw(server, 11))
    out = {}
    for k in a:
        out[k] = {
            "mean_local": float(a[k].mean()),
            "mean_server": float(s[k].mean()),
            "server_minus_local": bootstrap_mean(s[k] - a[k]),
            "local2_minus_local": bootstrap_mean(b[k] - a[k]),
            "ks_server_vs_local": {
                "stat": float(ks_2samp(s[k], a[k]).statistic),
                "p": float(ks_2samp(s[k], a[k]).pvalue),
            },
            "ks_local2_vs_local": {
                "stat": float(ks_2samp(b[k], a[k]).statistic),
                "p": float(ks_2samp(b[k], a[k]).pvalue),
            },
        }
    return out


def throughput(
    make_local, make_server, label, prompts, max_new_tokens, batches, concurrencies
) -> list:
    from calibdcd.targets.base import GenerationParams

    params = GenerationParams(max_new_tokens=max_new_tokens, temperature=1.0, top_p=1.0, seed=5)
    runs = [("hf (in process)", f"batch {b}", lambda b=b: make_local(b)) for b in batches]
    runs += [(label, f"concurrency {c}", lambda c=c: make_server(c)) for c in concurrencies]
    rows = []
    for backend, setting, make in runs:
        t = make()
        t.generate(prompts[:4], params)  # warm-up
        _, dt = timed(t.generate, prompts, params)
        rows.append(
            {
                "backend": backend,
                "setting": setting,
                "seconds": dt,
                "completions_per_s": len(prompts) / dt,
            }
        )
    return rows


def run_auc(
    config: Path, served: Path, url: str, out: Path, model: str | None = None,
    dialect: str = "transformers", concurrency: int = 4,
) -> dict:  # fmt: skip
    """`calibdcd run` of ``config`` (its benchmark, split and seeds) with its Overlap detector
    on its first target in process and on the served copy of that target's model."""
    import yaml

    cfg = yaml.safe_load(config.read_text())
    hf = {k: v for k, v in cfg["targets"][0].items() if k != "base"}  # its base is not run
    srv = {
        "name": f"{hf['name']}-server",
        "backend": "openai",
        # the served checkpoint's own chat template gives CalibDCD's views, as in process
        "tokenizer": str(served),
        "model": model or str(served),
        "options": {
            "base_url": url,
            "concurrency": concurrency,
            "timeout": 600,
            "dialect": dialect,
        },
    }
    cfg.update(
        name=f"{cfg['name']}-server",
        targets=[hf, srv],
        detectors=[d for d in cfg["detectors"] if d["name"] == "overlap"],
        output=str(out / "auc-run"),
    )
    path = out / "server-compare.yaml"
    path.write_text(yaml.safe_dump(cfg, sort_keys=False))
    t0 = time.perf_counter()
    exe = Path(sys.executable).parent / "calibdcd"
    subprocess.run([str(exe), "run", str(path), "--no-progress"], check=True)
    seconds = time.perf_counter() - t0
    from calibdcd.report.aggregate import load_results  # the report's one reader of a run

    table = [
        {
            "target": r.target,
            "seed": r.seed,
            "auc_before": r.before.auc.model_dump(exclude_none=True),
            "auc_after": r.after.auc.model_dump(exclude_none=True),
        }
        for r in load_results(out / "auc-run")
    ]
    return {"seconds": seconds, "config": path.name, "results": table}  # no machine path


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="lab:real-smollm2/chat")
    ap.add_argument("--n", type=int, default=100, help="prompts (half members)")
    ap.add_argument(
        "--texts",
        type=Path,
        help="a ground_truth.jsonl (text, label) for the prompts when --model is no lab model "
        "(e.g. a built lab's)",
    )
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--greedy-tokens", type=int, default=32)
    ap.add_argument("--sampled-tokens", type=int, default=48)
    ap.add_argument("--batches", type=int, nargs="+", default=[16, 64])
    ap.add_argument("--concurrency", type=int, nargs="+", default=[1, 4, 16])
    ap.add_argument("--server-args", default="", help="extra server arguments")
    ap.add_argument(
        "--engine",
        choices=["transformers", "vllm"],
        default="transformers",
        help="the server: `transformers serve` (this venv) or vLLM (its own environment: "
        "CALIBDCD_VLLM_PYTHON, else ../vllm-env)",
    )
    ap.add_argument(
        "--auc",
        type=Path,
        metavar="CONFIG",
        help="also run CONFIG's Overlap detector on its first target, in process and served "
        "(configs/real-lab.yaml: the target --model names)",
    )
    ap.add_argument(
        "--parts",
        nargs="+",
        default=["greedy", "sampled", "throughput"],
        choices=["greedy", "sampled", "sampled-openai", "throughput", "none"],
        help="what to measure (an existing DIR/server_compare.json keeps the other parts; "
        "none: only --auc)",
    )
    ap.add_argument("--out", type=Path, help="output directory (required unless --markdown)")
    ap.add_argument("--markdown", type=Path, help="print the tables of an existing JSON")
    args = ap.parse_args(argv)
    if args.markdown:
        print(markdown(json.loads(args.markdown.read_text())))
        return 0
    if args.out is None:
        ap.error("--out is required")

    from calibdcd.provenance import measured_on, save_measurement
    from calibdcd.targets.hf import HFTarget
    from calibdcd.targets.openai import OpenAITarget
    from calibdcd.targets.serve import (
        sampling_copy,
        served_model_id,
        transformers_serve,
        vllm_serve,
    )

    args.out.mkdir(parents=True, exist_ok=True)
    model_dir = resolve_model(args.model)
    items = prompt_set(args.texts.parent if args.texts else model_dir.parent, args.n, args.seed)
    prompts = [p for p, _, _ in items]
    truths = [t for _, t, _ in items]
    served = sampling_copy(model_dir, args.out / "served-model")
    t_all = time.perf_counter()
    out_json = args.out / "server_compare.json"
    result: dict = json.loads(out_json.read_text()) if out_json.is_file() else {}
    result |= {
        "model": args.model,
        "served_copy": served.name,  # (inside --out; no machine path in results)
        "n_prompts": len(prompts),
        **measured_on(),
        "server": f"{'transformers serve' if args.engine == 'transformers' else 'vllm'} "
        + args.server_args,
    }

    def save() -> None:  # after every part: a crash (or a killed session) keeps what was measured
        save_measurement(out_json, result)

    local = HFTarget(served, device="cpu", batch_size=64)
    extra = args.server_args.split()
    if args.engine == "vllm":  # vLLM honours each request's temperature and seed itself
        serve = vllm_serve(
            served, served_name="served", extra_args=extra, log=args.out / "server.log"
        )
    else:
        serve = transformers_serve(served, extra_args=extra, log=args.out / "server.log")
    engine_dialect = "vllm" if args.engine == "vllm" else "transformers"
    with serve as url:
        mid = "served" if args.engine == "vllm" else served_model_id(served)

        def server(c: int, dialect: str = engine_dialect) -> OpenAITarget:
            if dialect == "transformers":  # SAMPLED's dialect is transformers serve's
                dialect = engine_dialect
            return OpenAITarget(url, mid, concurrency=c, timeout=600, dialect=dialect)

        if "greedy" in args.parts:
            result["greedy"] = compare_greedy(local, server(4), prompts, args.greedy_tokens)
            save()
        for key, (part, top_k, dialect, _) in SAMPLED.items():
            if part in args.parts:
                result[key] = compare_sampled(
                    local, server(4, dialect), prompts, truths, args.sampled_tokens, top_k
                )
                print(key, json.dumps(result[key], indent=1), flush=True)
                save()
        if "throughput" in args.parts:
            result["throughput"] = throughput(
                lambda bs: HFTarget(served, device="cpu", batch_size=bs),
                server,
                f"openai ({result['server'].strip()})",
                prompts[:64],
                args.sampled_tokens,
                args.batches,
                args.concurrency,
            )
            print("throughput:", json.dumps(result["throughput"], indent=1), flush=True)
            save()
        if args.auc:
            result["auc"] = run_auc(
                args.auc, served, url, args.out, mid, engine_dialect, max(args.concurrency)
            )
    result["seconds"] = time.perf_counter() - t_all + result.get("seconds", 0.0)
    result.setdefault("runs", []).append(
        {"parts": args.parts, "auc": bool(args.auc), "commit": result["commit"]}
    )
    save()
    print(markdown(result))
    return 0


def compare_greedy(local, server, prompts, max_new_tokens: int) -> dict:
    from calibdcd.targets.base import GenerationParams

    g = GenerationParams(max_new_tokens=max_new_tokens, temperature=0.0)
    lg = local.generate(prompts, g)
    sg = server.generate(prompts, g)
    same = [a[0] == b[0] for a, b in zip(lg, sg, strict=True)]
    diffs = [
        {"prompt": p, "local": a[0], "server": b[0]}
        for p, a, b, ok in zip(prompts, lg, sg, same, strict=True)
        if not ok
    ]
    print(f"greedy: {sum(same)}/{len(same)} identical", flush=True)
    return {
        "max_new_tokens": max_new_tokens,
        "identical": int(sum(same)),
        "n": len(same),
        "rate": sum(same) / len(same),
        "examples_differing": diffs[:3],
    }


def _ci(x: dict) -> str:
    return f"{x['mean']:+.3f} [{x['low']:+.3f}, {x['high']:+.3f}]"


def markdown(r: dict) -> str:
    g = r["greedy"]
    lines = [
        f"Model `{r['model']}`, {r['n_prompts']} prompts, commit {r['commit']}, "
        f"{r['machine']['cpus']} CPUs; {r['seconds'] / 60:.1f} min in all "
        f"(over {max(1, len(r.get('runs', [])))} invocation(s)).",
        "",
        f"Greedy ({g['max_new_tokens']} new tokens): {g['identical']} of {g['n']} completions "
        f"identical ({100 * g['rate']:.0f}%).",
        "",
    ]
    vllm = str(r.get("server", "")).startswith("vllm")
    for key, (*_, title) in SAMPLED.items():
        if key not in r:
            continue
        if vllm:  # the same requests in vLLM's dialect: "inherit" means vLLM's default there
            title = {
                "sampled": "Sampled, top-k inherited (in process: transformers' default 50 for a "
                "checkpoint that sets none; vLLM: no top-k), dialect `vllm`",
                "sampled_topk_none": "Sampled, top-k None on both (the client sends "
                "`top_k: -1`), dialect `vllm`",
            }.get(key, title)
        lines += [
            f"{title}, temperature 1, top-p 1:",
            "",
            "| statistic | mean in process | mean server | server − in process (95% CI) "
            "| in process − in process, other seeds (null) | KS p (server) | KS p (null) |",
            "|---|---|---|---|---|---|---|",
        ]
        for k, v in r[key].items():
            lines.append(
                f"| {k} | {v['mean_local']:.3f} | {v['mean_server']:.3f} "
                f"| {_ci(v['server_minus_local'])} | {_ci(v['local2_minus_local'])} "
                f"| {v['ks_server_vs_local']['p']:.2f} | {v['ks_local2_vs_local']['p']:.2f} |"
            )
        lines.append("")
    lines += ["", "| backend | setting | completions / s |", "|---|---|---|"]
    for t in r["throughput"]:
        lines.append(f"| {t['backend']} | {t['setting']} | {t['completions_per_s']:.2f} |")
    if "auc" in r:
        lines += ["", "| target | seed | AUC | AUC + CalibDCD |", "|---|---|---|---|"]
        for row in r["auc"]["results"]:
            b, a = row["auc_before"], row["auc_after"]
            lines.append(
                f"| {row['target']} | {row['seed']} | {100 * b['estimate']:.1f} "
                f"[{100 * b['low']:.1f}, {100 * b['high']:.1f}] | {100 * a['estimate']:.1f} "
                f"[{100 * a['low']:.1f}, {100 * a['high']:.1f}] |"
            )
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
