"""Speed of the target layer, as ratios (run with nothing else on the CPU):

    python benchmarks/targets.py [--quick] [--serve] [--device cuda] [--dtype auto] [--model DIR]
    python benchmarks/targets.py --parity packaged:smollm2-135m-instruct [--repeats 3]
        [--json OUT] [--write docs/scaling.md]

1. Batched generation (HFTarget, batch 32) against a one-prompt-at-a-time loop on the same model:
   HFTarget with batch_size=1, and ``model.generate`` called once per prompt with
   ``num_return_sequences=n`` (how the official VeilProbe/DPDLLM code queries models).
   Model: a lab-sized Llama (d256, 4 layers, vocab 2048) with random weights, so every completion
   runs to ``max_new_tokens`` like the detectors' 32-64-token suffixes. Goal: >= 5x.
2. A fully cached re-run (CachedTarget, SQLite) against fresh generation. Goal: >= 50x.
3. Concurrent (8 in flight) against sequential requests through OpenAITarget to a loopback
   server that answers after a fixed latency (a stand-in for a remote GPU server), and with
   ``--serve`` also to ``transformers serve`` running the tiny model on this CPU.
4. ``--parity MODEL`` (alone): HFTarget against batched ``model.generate`` on a real model, in
   generated tokens per second at batch 16, so the target's own decoding loop (per-row seeded
   sampling, finished rows dropped from the KV cache) costs no more than what a user would write
   instead. Goal: >= 0.8x.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

import torch

from calibdcd.provenance import commit_label, measured_on, save_measurement
from calibdcd.report.readme import write_block
from calibdcd.targets import GenerationParams
from calibdcd.targets.cache import CachedTarget
from calibdcd.targets.hf import HFTarget
from calibdcd.targets.openai import OpenAITarget
from calibdcd.targets.tiny import TinyLMConfig, cached_tiny_lm, synthetic_sentences

LAB_SIZED = TinyLMConfig(
    hidden_size=256,
    num_layers=4,
    num_heads=4,
    intermediate_size=704,
    vocab_size=2048,
    train_steps=0,  # random weights: every completion runs to max_new_tokens, as in the
    seq_len=64,  # detectors' generation (a briefly trained one stops after ~4 tokens)
)


def timed(fn):
    t0 = time.perf_counter()
    out = fn()
    return out, time.perf_counter() - t0


def prompts_for(k: int) -> list[str]:
    return [" ".join(s.split()[: max(2, len(s.split()) // 2)]) for s in synthetic_sentences(k, 7)]


def bench_batching(
    model_dir: Path, n_prompts: int, params: GenerationParams, device: str = "cpu",
    dtype: str = "auto",
) -> dict:  # fmt: skip
    prompts = prompts_for(n_prompts)
    # On a GPU the first calls pay seconds of one-off cost (measured on an H100, docs/scaling.md:
    # 6.1 s for 72 completions after a 4-prompt warm-up, 0.42 s for the same ones from a second
    # target), so there every path runs once untimed; on CPU a 4-prompt warm-up is enough.
    batched = HFTarget(model_dir, device=device, dtype=dtype, batch_size=32)
    warm_all = batched.device != "cpu"
    batched.generate(prompts if warm_all else prompts[:4], params)
    out_b, t_b = timed(lambda: batched.generate(prompts, params))
    single = HFTarget(model_dir, device=device, dtype=dtype, batch_size=1)
    if warm_all:
        single.generate(prompts, params)
    out_s, t_s = timed(lambda: single.generate(prompts, params))
    # on CPU in fp32 the batch never changes a completion (tests/test_targets_hf.py); on a GPU,
    # or in bf16, other batch shapes may pick other kernels: the agreement is reported instead
    agree = sum(a == b for a, b in zip(out_b, out_s, strict=True)) / len(prompts)
    if batched.device == "cpu" and batched.dtype == torch.float32:
        assert agree == 1.0, "batch size changed sampled completions"
    tok, model = batched.tokenizer, batched.model

    def hf_loop():
        for p in prompts:
            ids = tok(p, return_tensors="pt").to(model.device)
            model.generate(
                **ids,
                do_sample=True,
                temperature=params.temperature,
                top_p=params.top_p,
                top_k=params.top_k or 0,  # as HFTarget: no top-k unless asked (not HF's 50)
                max_new_tokens=params.max_new_tokens,
                num_return_sequences=params.n,
                pad_token_id=batched.pad_id,
            )

    with torch.inference_mode():
        if warm_all:
            hf_loop()
        _, t_hf = timed(hf_loop)
    n_new = sum(len(tok(c)["input_ids"]) for o in out_b for c in o)
    return {
        "device": batched.device,
        "dtype": str(batched.dtype).replace("torch.", ""),
        "prompts_equal_across_batch_sizes": agree,
        "completions": len(prompts) * params.n,
        "new_tokens": n_new,
        "batched_s": t_b,
        "one_at_a_time_s": t_s,
        "hf_generate_loop_s": t_hf,
        "speedup_vs_one_at_a_time": t_s / t_b,
        "speedup_vs_hf_generate_loop": t_hf / t_b,
        "batched_new_tok_per_s": n_new / t_b,
    }


def bench_cache(
    model_dir: Path, n_prompts: int, params: GenerationParams, device: str = "cpu",
    dtype: str = "auto",
) -> dict:  # fmt: skip
    prompts = prompts_for(n_prompts)
    target = HFTarget(model_dir, device=device, dtype=dtype, batch_size=32)
    if target.device != "cpu":
        target.generate(prompts, params)  # the one-off first-call cost (bench_batching)
    with tempfile.TemporaryDirectory() as d:
        with CachedTarget(target, Path(d) / "c.sqlite") as cached:
            fresh, t_fresh = timed(lambda: cached.generate(prompts, params))
        with CachedTarget(target, Path(d) / "c.sqlite") as cached:  # a new process's view
            again, t_hit = timed(lambda: cached.generate(prompts, params))
            stats = cached.stats
    assert again == fresh and stats.misses == 0
    return {
        "completions": len(prompts) * params.n,
        "fresh_s": t_fresh,
        "cached_s": t_hit,
        "speedup": t_fresh / t_hit,
    }


class LatencyServer:
    """Loopback /v1/completions that answers every request after ``latency`` seconds."""

    def __init__(self, latency: float):
        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"
            wbufsize = 1 << 16  # one write per response (no Nagle/delayed-ACK stalls)

            def log_message(self, *a):
                pass

            def do_POST(self):
                req = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                time.sleep(latency)
                body = json.dumps({"choices": [{"text": req["prompt"][::-1], "index": 0}]})
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body.encode())

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def close(self):
        self.httpd.shutdown()
        self.httpd.server_close()


def bench_concurrency(url: str, model: str, prompts: list[str], conc: int, p) -> dict:
    seq = OpenAITarget(url, model, concurrency=1)
    par = OpenAITarget(url, model, concurrency=conc)
    par.generate(prompts[:2], p)  # warm-up
    out_s, t_s = timed(lambda: seq.generate(prompts, p))
    out_c, t_c = timed(lambda: par.generate(prompts, p))
    assert len(out_s) == len(out_c) == len(prompts)
    return {
        "requests": len(prompts) * p.n,
        "sequential_s": t_s,
        "concurrent_s": t_c,
        "concurrency": conc,
        "speedup": t_s / t_c,
    }


def bench_parity(
    model_dir: Path, n_prompts: int, params: GenerationParams, batch: int = 16,
    device: str = "cpu", dtype: str = "auto",
) -> dict:  # fmt: skip
    """HFTarget against what a user would write instead on the same batches: ``model.generate``
    on left-padded batches of ``batch`` prompts (sampling, the same temperature, top-p and token
    limit). Both are rated in generated tokens per second (the two sample different tokens, so
    their completions end at different lengths); goal: HFTarget >= 0.8x."""
    prompts = prompts_for(n_prompts)
    target = HFTarget(model_dir, device=device, dtype=dtype, batch_size=batch)
    tok, model = target.tokenizer, target.model
    one = GenerationParams(
        max_new_tokens=params.max_new_tokens, temperature=params.temperature,
        top_p=params.top_p, n=1, seed=params.seed,
    )  # fmt: skip
    target.generate(prompts[:batch], one)  # warm-up (both paths share the loaded model)
    out, t_target = timed(lambda: target.generate(prompts, one))
    n_target = sum(len(tok(c[0], add_special_tokens=False)["input_ids"]) for c in out)
    tok.padding_side = "left"
    if tok.pad_token is None:
        tok.pad_token = tok.eos_token

    def raw() -> list[str]:
        texts = []
        for k in range(0, len(prompts), batch):
            enc = tok(prompts[k : k + batch], return_tensors="pt", padding=True).to(model.device)
            gen = model.generate(
                **enc, do_sample=True, temperature=one.temperature, top_p=one.top_p, top_k=0,
                max_new_tokens=one.max_new_tokens, pad_token_id=tok.pad_token_id,
            )  # fmt: skip
            texts += tok.batch_decode(gen[:, enc["input_ids"].shape[1] :], skip_special_tokens=True)
        return texts

    torch.manual_seed(0)
    with torch.inference_mode():
        enc = tok(prompts[:batch], return_tensors="pt", padding=True).to(model.device)
        model.generate(**enc, max_new_tokens=2, pad_token_id=tok.pad_token_id)  # warm-up
        texts, t_raw = timed(raw)
    # both counted alike: the completions' texts re-tokenized (the two sample different tokens,
    # so their completions end at different lengths)
    n_raw = sum(len(tok(t, add_special_tokens=False)["input_ids"]) for t in texts)
    return {
        "model": str(model_dir.name),
        "device": target.device,
        "dtype": str(target.dtype).replace("torch.", ""),
        "prompts": len(prompts),
        "batch": batch,
        "max_new_tokens": one.max_new_tokens,
        "hftarget_s": round(t_target, 2),
        "hftarget_new_tokens": n_target,
        "generate_s": round(t_raw, 2),
        "generate_new_tokens": n_raw,
        "hftarget_tok_per_s": round(n_target / t_target, 1),
        "generate_tok_per_s": round(n_raw / t_raw, 1),
        "ratio": round((n_target / t_target) / (n_raw / t_raw), 3),
    }


def parity_table(record: dict) -> str:
    """docs/scaling.md's block ``generation-parity`` for a stored ``--parity`` record."""
    commit = commit_label(record.get("git"))
    first = record["runs"][0]
    lines = [
        f"Written by `python benchmarks/targets.py --parity {record['reference']} --json "
        f"benchmarks/results/parity_smollm2.json --write docs/scaling.md` (commit {commit}; "
        f"{record['machine']}; torch {record['torch']}, {first['device']} {first['dtype']}; "
        f"{first['prompts']} prompts, batch {first['batch']}, {first['max_new_tokens']} new "
        "tokens, temperature 1). HFTarget / `model.generate` in generated tokens/s: median "
        f"**{record['ratio_median']:.2f}x** over {len(record['runs'])} runs (goal >= 0.8x).",
        "",
        "| run | HFTarget: s | tokens | tokens/s | model.generate: s | tokens | tokens/s | ratio |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for i, r in enumerate(record["runs"], 1):
        lines.append(
            f"| {i} | {r['hftarget_s']} | {r['hftarget_new_tokens']} | "
            f"{r['hftarget_tok_per_s']} | {r['generate_s']} | {r['generate_new_tokens']} | "
            f"{r['generate_tok_per_s']} | {r['ratio']} |"
        )
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="fewer prompts")
    ap.add_argument("--serve", action="store_true", help="also benchmark transformers serve")
    ap.add_argument(
        "--parity", metavar="MODEL", help="only HFTarget vs batched model.generate on MODEL "
        "(a checkpoint directory or packaged:smollm2-135m-instruct), batch 16",
    )  # fmt: skip
    ap.add_argument("--repeats", type=int, default=3, help="--parity: runs (median reported)")
    ap.add_argument("--write", type=Path, help="--parity: rewrite this doc's block "
                    "'generation-parity' (e.g. docs/scaling.md)")  # fmt: skip
    ap.add_argument("--json", type=Path, help="write the results here")
    ap.add_argument("--device", default="cpu", help="cpu (default), cuda[:i], mps or auto")
    ap.add_argument("--dtype", default="auto", help="auto (bf16 on CUDA, fp32 elsewhere), ...")
    ap.add_argument(
        "--model", type=Path, help="a checkpoint directory (e.g. a lab model) instead of the "
        "lab-sized random Llama",
    )  # fmt: skip
    args = ap.parse_args()
    torch.set_num_threads(2)
    if args.parity:
        from calibdcd.targets.packaged import checkpoint_dir

        p = GenerationParams(max_new_tokens=48, temperature=1.0, top_p=1.0, n=1, seed=0)
        model_dir = checkpoint_dir(args.parity)
        runs = [
            bench_parity(model_dir, 16 if args.quick else 48, p, 16, args.device, args.dtype)
            for _ in range(args.repeats)
        ]  # each a fresh target and model load; the ratio's spread is the run-to-run noise
        ratios = sorted(r["ratio"] for r in runs)
        row = {
            "reference": args.parity,
            "ratio_median": ratios[len(ratios) // 2],
            "ratio_range": [ratios[0], ratios[-1]],
            "runs": runs,
            **measured_on(torch=True),
        }
        print(json.dumps(row, indent=1))
        print(
            f"HFTarget / model.generate (tokens/s, batch 16): median {row['ratio_median']:.2f}x "
            f"over {len(runs)} runs, range {ratios[0]:.2f}-{ratios[-1]:.2f} (goal >= 0.8x)"
        )
        save_measurement(args.json, row)
        if args.write:
            write_block(args.write, "generation-parity", parity_table(row))
        return
    n = 24 if args.quick else 64
    params = GenerationParams(max_new_tokens=32, temperature=1.0, top_p=0.95, n=3, seed=0)
    if args.model is None:
        print("building/loading the lab-sized model ...", flush=True)
    model_dir = args.model or cached_tiny_lm(LAB_SIZED)
    results: dict = {"model": str(model_dir), **measured_on(torch=True)}

    def save() -> None:  # after every part: a run cut short keeps what it measured
        save_measurement(args.json, results)

    results["batching"] = bench_batching(model_dir, n, params, args.device, args.dtype)
    print("batching:", json.dumps(results["batching"], indent=1), flush=True)
    save()
    results["cache"] = bench_cache(model_dir, n, params, args.device, args.dtype)
    save()
    print("cache:", json.dumps(results["cache"], indent=1), flush=True)
    srv = LatencyServer(0.05)
    try:
        p1 = GenerationParams(max_new_tokens=16, temperature=1.0, n=1)
        results["concurrency_latency_server"] = bench_concurrency(
            srv.url, "m", prompts_for(64), 8, p1
        )
    finally:
        srv.close()
    print("concurrency (50 ms server):", json.dumps(results["concurrency_latency_server"]))
    if args.serve:
        from calibdcd.targets.serve import transformers_serve

        with transformers_serve(cached_tiny_lm()) as url:
            p2 = GenerationParams(max_new_tokens=16, temperature=1.0, n=1)
            results["concurrency_transformers_serve"] = bench_concurrency(
                url, str(cached_tiny_lm()), prompts_for(32), 4, p2
            )
        print("concurrency (transformers serve):", results["concurrency_transformers_serve"])
    b, c = results["batching"], results["cache"]
    print("\n=== ratios ===")
    print(f"batched vs one-at-a-time (HFTarget bs=1): {b['speedup_vs_one_at_a_time']:.1f}x")
    print(f"batched vs HF generate() loop per prompt: {b['speedup_vs_hf_generate_loop']:.1f}x")
    print(f"cached re-run vs fresh:                    {c['speedup']:.0f}x")
    for k, v in results.items():
        if k.startswith("concurrency"):
            print(f"{k}: {v['speedup']:.1f}x (concurrency {v['concurrency']})")
    save()


if __name__ == "__main__":
    main()
