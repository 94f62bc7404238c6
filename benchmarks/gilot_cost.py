"""What VeilProbe's key-token attribution costs per text on real causal proxies (issue 48 item 8):
GiLOT as the official code runs it (p + 1 beam searches of 10 beams x 10 tokens, then one IPOT
distance of 1,000 iterations per position) against leave-one-out (one batched forward, KL), so a
config can say from a measurement whether GiLOT fits the machine.

    python benchmarks/gilot_cost.py --texts <lab>/ground_truth.jsonl \\
        --proxies packaged:smollm2-135m-instruct packaged:gemma3-270m --json out.json

Each text is cut as VeilProbe queries it (``--prompt-fraction``, the detector's own
``query``). For GiLOT it times ``--beam-rows`` rows of the beam search (the text and its first
masked copies, in the attribution's own batches) and ``--ot-positions`` IPOT distances, and
extrapolates to the text's p + 1 rows and p positions (every row and position costs the same
work: the same width, the same support cap; on ``--device cuda`` every row and position of a
text is timed, its positions solved in batches as ``attribute`` solves them there, since a
batch's time does not grow in proportion to its size); leave-one-out is timed whole through
``attribute``. The proxies are loaded as the detector loads them (``packaged:`` refs converted
once into the cache). Attribution settings are the ``paper`` preset's except ``proxy_bos``
(``"tokenizer"``: each proxy as its tokenizer encodes a text).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import statistics
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")


def _texts(path: Path, n: int, prompt_fraction: float) -> tuple[list[str], int]:
    """The first ``n`` texts of ``path`` as VeilProbe queries them, and how many it holds."""
    from calibdcd.data.files import load_texts
    from calibdcd.detectors.veilprobe import VeilProbe, VeilProbeConfig

    cfg = VeilProbeConfig.preset("paper")
    cfg = dataclasses.replace(
        cfg, sampling=dataclasses.replace(cfg.sampling, prompt_fraction=prompt_fraction)
    )
    detector = VeilProbe(cfg)
    texts = load_texts(path).texts  # the one reader of a file of texts, any format
    return [detector.query(t) for t in texts[:n]], len(texts)


def measure(
    ref: str, texts: list[str], beam_rows: int, ot_positions: int, device: str = "cpu"
) -> dict:
    import torch

    from calibdcd.detectors.veilprobe import VeilProbeConfig
    from calibdcd.detectors.veilprobe.attribution import (
        _beam_distributions,
        _encode,
        _ot_all,
        _variants,
        attribute,
        load_proxy,
    )
    from calibdcd.targets.packaged import checkpoint_dir

    gilot = dataclasses.replace(
        VeilProbeConfig.preset("paper").perturb.attribution, proxy_bos="tokenizer"
    )
    loo = dataclasses.replace(gilot, method="loo", loo_distance="kl")
    t0 = time.perf_counter()
    proxy = load_proxy(str(checkpoint_dir(ref)), device=device)
    load_s = time.perf_counter() - t0
    per_text = []
    for text in texts:
        ids, _ = _encode(proxy, text, gilot.max_tokens)
        input_ids, mask = _variants(proxy, ids, proxy.adds_bos)
        # on a GPU every row and position: a batch's time does not grow with its size there
        gpu = next(proxy.model.parameters()).device.type == "cuda"
        rows = input_ids.shape[0] if gpu else min(beam_rows, input_ids.shape[0])
        t0 = time.perf_counter()
        dists = _beam_distributions(proxy, input_ids[:rows], mask[:rows], gilot)
        beam_row_s = (time.perf_counter() - t0) / rows
        k = rows - 1 if gpu else min(ot_positions, rows - 1)
        t0 = time.perf_counter()  # as attribute solves them: in batches on a CUDA proxy
        _ot_all(dists[0], dists[1 : k + 1], proxy, gilot)
        ot_s = (time.perf_counter() - t0) / max(k, 1)
        t0 = time.perf_counter()
        attribute(proxy, text, loo)
        loo_s = time.perf_counter() - t0
        p = len(ids)
        per_text.append({
            "tokens": p,
            "gilot_beam_s_per_row": round(beam_row_s, 3),
            "gilot_ot_s_per_position": round(ot_s, 3),
            "gilot_s": round((p + 1) * beam_row_s + p * ot_s, 1),
            "loo_kl_s": round(loo_s, 2),
        })  # fmt: skip
    return {
        "proxy": ref,
        "device": str(next(proxy.model.parameters()).device),
        "vocab": int(proxy.embeddings.shape[0]),
        "adds_bos": proxy.adds_bos,
        "load_s": round(load_s, 1),
        "threads": torch.get_num_threads(),
        "texts": per_text,
        "gilot_s_per_text": round(statistics.mean(t["gilot_s"] for t in per_text), 1),
        "loo_kl_s_per_text": round(statistics.mean(t["loo_kl_s"] for t in per_text), 2),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--texts", type=Path, required=True, help="a jsonl with a 'text' field")
    ap.add_argument("--proxies", nargs="+", required=True)
    ap.add_argument("--n-texts", type=int, default=2)
    ap.add_argument("--prompt-fraction", type=float, default=0.5)
    ap.add_argument("--beam-rows", type=int, default=12)
    ap.add_argument("--ot-positions", type=int, default=4)
    ap.add_argument(
        "--device",
        default="cpu",
        help="the proxies' device (cuda: GiLOT's OT distances of a text in float64 batches there)",
    )
    ap.add_argument("--json", type=Path, help="write the figures there")
    args = ap.parse_args()

    from calibdcd.provenance import measured_on, save_measurement

    texts, pool = _texts(args.texts, args.n_texts, args.prompt_fraction)
    proxies = [
        measure(r, texts, args.beam_rows, args.ot_positions, args.device) for r in args.proxies
    ]
    gilot_h = sum(p["gilot_s_per_text"] for p in proxies) * pool / 3600
    loo_h = sum(p["loo_kl_s_per_text"] for p in proxies) * pool / 3600
    result = {
        **measured_on(torch=True),
        "texts_file": f"{args.texts.parent.name}/{args.texts.name}",
        "pool_texts": pool,
        "prompt_fraction": args.prompt_fraction,
        "proxies": proxies,
        "pool_gilot_hours": round(gilot_h, 1),
        "pool_loo_kl_hours": round(loo_h, 2),
        "prediction": (
            f"attribution of the {pool} texts on {len(proxies)} proxies: GiLOT about "
            f"{gilot_h:.1f} h, leave-one-out (KL) about {loo_h:.2f} h on this machine"
        ),
    }
    print(json.dumps(result, indent=2))
    save_measurement(args.json, result)


if __name__ == "__main__":
    main()
