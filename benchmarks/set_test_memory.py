"""Peak memory and time of ``calibdcd score``'s set-level test, and of the scoring path after
the target, at 1k, 10k and 100k suspect texts (issue 44, item 6):

    python benchmarks/set_test_memory.py [--sizes 1000 10000 100000] [--null 500] \
        [--old-max-gb 3] [--no-path] [--out benchmarks/results/set_test_memory.json]

Each measurement runs in a fresh process and reports that process's peak RSS (``ru_maxrss``:
the interpreter, numpy/scipy/scikit-learn and the inputs included) and, separately, its RSS
just before the measured step (``base_rss_mb``: libraries imported, inputs built, for ``path``
the fit done), so the step's own share is the difference.

* ``set``: :func:`calibdcd.fitted.audit.set_level_test` alone, 9,999 permutations, on
  overlap-like scores (a 1/32 grid: many ties) for K suspect and ``--null`` null scores.
  ``old`` is the one-matrix formula it replaced (copied below from commit 7030fb5: an
  (n_perm, K + n) float64 matrix); ``new`` draws the permutations in chunks. Both give the same
  p-value (checked here); ``old`` is skipped where its matrix alone exceeds ``--old-max-gb``.
* ``path``: :meth:`calibdcd.fitted.FittedDetector.score` on the real overlap detector
  (:class:`~calibdcd.detectors.overlap.ContinuationOverlap`, its features and logistic
  classifier), fitted inductively on 150 + 150 supervised texts and ``--null`` held-out
  non-members, then scoring K suspect texts, and the summary plus one JSON line per text
  written as ``calibdcd score`` writes them. No model: the target is a stub that returns the
  true continuation for memorised texts (the fit's members and 2 % of the suspect texts) and
  seeded Zipf words otherwise, so the generation cache, the HTTP client and a model's memory
  are not in the figures; everything after the completions is (features of K texts, scores,
  p-values, de-duplication, the set test, the distribution check on the texts, the output).
  ``old`` swaps in the one-matrix set test and the distribution check before this change (all
  suspect texts, every bootstrap resample at once); skipped where it would exceed
  ``--old-max-gb``. Both use the overlap detector as it is now: its ``extract`` held every
  text's continuation words at once before this change (measured apart at 100,000 texts: its
  peak 521 MB from 109 MB with the texts loaded, 227 MB after). ``stages_s`` are timed
  between score's own status messages: "features: texts to score" covers the features,
  scores, p-values and the set test; "distribution check" the check; "write" the JSON lines.

Texts: 32-128 words drawn from a Zipf(1.15) law over 50,000 pseudo-words of 2-9 letters.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
SRC = HERE.parent / "src"
N_PERM = 9999


def _rss_mb() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def _peak_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


# -- the implementations before this change (commit 7030fb5), for the "old" rows ----------------
def old_set_level_test(scores, null, *, alpha=0.05, n_perm=N_PERM, seed=0):
    import numpy as np
    from scipy.stats import rankdata

    from calibdcd.fitted.audit import SetTest

    s = np.asarray(scores, dtype=np.float64)
    s = s[np.isfinite(s)]
    nul = np.asarray(null, dtype=np.float64)
    k, n = s.size, nul.size
    ranks = rankdata(np.r_[s, nul])  # midranks
    u = float(ranks[:k].sum() - k * (k + 1) / 2)
    rng = np.random.default_rng([seed, 0x5E7])
    perm = rng.permuted(np.broadcast_to(ranks, (n_perm, k + n)), axis=1)
    u_star = perm[:, :k].sum(axis=1) - k * (k + 1) / 2
    p = float((1 + np.sum(u_star >= u - 1e-9)) / (n_perm + 1))
    return SetTest(int(k), int(n), u, u / (k * n), p, alpha, bool(p <= alpha))


def old_distribution_check(suspect, nonmembers, *, folds=5, n_boot=1000, level=0.95, seed=0):
    import numpy as np
    from sklearn.model_selection import StratifiedKFold

    from calibdcd.blind import blind_scores
    from calibdcd.fitted.audit import DistributionCheck
    from calibdcd.metrics import auc, bootstrap_ci

    texts = list(suspect) + list(nonmembers)
    y = np.r_[np.ones(len(suspect), dtype=int), np.zeros(len(nonmembers), dtype=int)]
    k = max(2, min(folds, len(suspect), len(nonmembers)))
    oof = np.zeros(len(texts))
    for tr, te in StratifiedKFold(k, shuffle=True, random_state=seed).split(texts, y):
        oof[te] = blind_scores([texts[i] for i in tr], y[tr], [texts[i] for i in te], seed=seed)
    iv = bootstrap_ci(y, oof, auc, n_boot=n_boot, level=level, seed=seed)
    return DistributionCheck(
        float(iv.estimate), float(iv.low), float(iv.high), level, k, bool(iv.low > 0.5), 0.0,
        None, len(suspect), len(suspect),
    )  # fmt: skip


# -- inputs ------------------------------------------------------------------------------------
def _vocab(rng) -> list[str]:
    letters = list("abcdefghijklmnopqrstuvwxyz")
    return ["".join(rng.choice(letters, int(rng.integers(2, 10)))) for _ in range(50_000)]


def _texts(rng, vocab, m: int, tag: str) -> list[str]:
    import numpy as np

    out = []
    for i in range(m):
        ranks = np.minimum(rng.zipf(1.15, int(rng.integers(32, 129))), len(vocab)) - 1
        out.append(" ".join(vocab[r] for r in ranks) + f" {tag}{i}")  # distinct texts
    return out


class StubTarget:
    """No model: the true continuation for memorised prompts, seeded Zipf words otherwise."""

    name = "stub"
    family = None

    def __init__(self, memorised: dict[str, str], vocab: list[str]) -> None:
        self.memorised = memorised
        self.vocab = vocab

    def generation_record(self, params):
        return {"requested": params.as_dict(), "used": None, "note": "benchmark stub"}

    def generate(self, prompts, params):
        import zlib

        import numpy as np

        out = []
        for p in prompts:
            if p in self.memorised:
                out.append([self.memorised[p]])
                continue
            r = np.random.default_rng(zlib.crc32(p.encode()))
            ranks = np.minimum(r.zipf(1.15, params.max_new_tokens), len(self.vocab)) - 1
            out.append([" ".join(self.vocab[i] for i in ranks)])
        return out


# -- children ----------------------------------------------------------------------------------
def child_set(method: str, k: int, n: int) -> dict:
    import numpy as np
    import scipy.stats  # noqa: F401  (in the base, as in score)

    from calibdcd.fitted.audit import set_level_test

    rng = np.random.default_rng(k)
    scores = np.floor(rng.random(k) * 32) / 32  # overlap-like: a grid, many ties
    null = np.floor(rng.random(n) * 32) / 32
    fn = old_set_level_test if method == "old" else set_level_test
    base = _rss_mb()
    t0 = time.perf_counter()
    res = fn(scores, null, n_perm=N_PERM)
    return {
        "seconds": round(time.perf_counter() - t0, 2),
        "base_rss_mb": round(base, 1),
        "peak_rss_mb": round(_peak_mb(), 1),
        "p_value": res.p_value,
        "statistic": res.statistic,
    }


def child_path(method: str, k: int, n: int, out: str) -> dict:
    import warnings

    import numpy as np
    import scipy.stats  # noqa: F401  (the libraries in the base)
    import sklearn.feature_extraction.text
    import sklearn.linear_model
    import sklearn.model_selection  # noqa: F401

    import calibdcd.fitted.detector as fd
    from calibdcd.atomic import atomic_write_text
    from calibdcd.detectors.overlap import ContinuationOverlap, _split
    from calibdcd.fitted import FitTexts, fit_detector

    if method == "old":
        fd.set_level_test = old_set_level_test
        fd.distribution_check = old_distribution_check
    rng = np.random.default_rng(0)
    vocab = _vocab(rng)
    det = ContinuationOverlap()
    members = _texts(rng, vocab, 150, "m")
    nonmembers = _texts(rng, vocab, 150 + n, "n")
    suspect = _texts(rng, vocab, k, "s")
    memorised_texts = members + suspect[: max(1, k // 50)]
    memorised = {}
    for t in memorised_texts:
        prompt, _ = _split(t, det.config)
        memorised[prompt] = " ".join(t.split()[: det.config.max_words][len(prompt.split()) :])
    target = StubTarget(memorised, vocab)
    texts = FitTexts(
        supervised=tuple(members + nonmembers[:150]),
        labels=(1,) * 150 + (0,) * 150,
        heldout=tuple(nonmembers[150:]),
    )
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        fitted = fit_detector(det, target, texts, mode="inductive")
    base = _rss_mb()
    stages = {}
    t0 = time.perf_counter()
    stage = {"t": t0}

    def status(s: str) -> None:  # per-stage seconds, as score's progress bar names them
        now = time.perf_counter()
        stages[stage.get("name", "start")] = round(now - stage["t"], 2)
        stage.update(name=s, t=now)

    res = fitted.score(suspect, target, det, status=status)
    status("write")
    summary = {
        "kind": "summary",
        "n_texts": len(suspect),
        "set_test": res.set_test,
        "distribution_check": res.distribution,
        "warnings": res.warnings,
    }
    lines = [json.dumps(summary, default=float)]
    for i, (s, p, dec) in enumerate(zip(res.scores, res.p_values, res.decisions, strict=True)):
        rec = {"kind": "text", "index": i, "id": str(i), "score": float(s), "p_value": float(p),
               "member": bool(dec), "in_fit": res.in_fit[i] if res.in_fit else None}  # fmt: skip
        lines.append(json.dumps(rec))
    atomic_write_text(Path(out), "\n".join(lines) + "\n")
    status("done")
    dist = res.distribution or {}
    return {
        "seconds": round(time.perf_counter() - t0, 2),
        "stages_s": stages,
        "base_rss_mb": round(base, 1),
        "peak_rss_mb": round(_peak_mb(), 1),
        "p_value": (res.set_test or {}).get("p_value"),
        "auc": (res.set_test or {}).get("auc"),
        "distribution_auc": dist.get("auc"),
        "distribution_texts": dist.get("n_suspect_used", k),
    }


# -- parent ------------------------------------------------------------------------------------
def _old_bytes(what: str, k: int, n: int) -> float:
    """The one matrix of the old code (set: n_perm × texts float64; path: the larger of it and
    the old bootstrap's ~10 arrays of 1,000 × texts)."""
    m = N_PERM * (k + n) * 8
    return m if what == "set" else max(m, 10 * 1000 * (k + n) * 8)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sizes", type=int, nargs="+", default=[1000, 10_000, 100_000])
    ap.add_argument("--null", type=int, default=500)
    ap.add_argument("--old-max-gb", type=float, default=3.0)
    ap.add_argument("--no-path", action="store_true", help="the set test only")
    ap.add_argument("--out", type=Path, default=None)
    ap.add_argument(
        "--child", nargs=4, metavar=("WHAT", "METHOD", "K", "N"), help=argparse.SUPPRESS
    )
    args = ap.parse_args()
    if args.child:
        what, method, k, n = args.child
        import tempfile

        with tempfile.TemporaryDirectory() as tmp:
            row = (
                child_set(method, int(k), int(n))
                if what == "set"
                else child_path(method, int(k), int(n), str(Path(tmp) / "scores.jsonl"))
            )
        print(json.dumps(row))
        return
    env = {**os.environ, "PYTHONPATH": str(SRC), "HF_HUB_OFFLINE": "1"}
    from calibdcd.provenance import measured_on

    machine = measured_on()
    print(f"{machine['cpu']}, {machine['cores']} cores, kernel {machine['kernel']}", flush=True)
    rows = []
    for what in ("set",) if args.no_path else ("set", "path"):
        for k in args.sizes:
            for method in ("old", "new"):
                row = {"what": what, "method": method, "texts": k, "null": args.null}
                need = _old_bytes(what, k, args.null) / 2**30
                if method == "old" and need > args.old_max_gb:
                    row["skipped"] = f"the old code needs ~{need:.1f} GB (> --old-max-gb)"
                else:
                    res = subprocess.run(
                        [sys.executable, __file__, "--child", what, method, str(k), str(args.null)],
                        capture_output=True, text=True, env=env,
                    )  # fmt: skip
                    if res.returncode:
                        row["error"] = res.stderr.strip().splitlines()[-1:]
                    else:
                        row.update(json.loads(res.stdout.strip().splitlines()[-1]))
                rows.append(row)
                print(json.dumps(row), flush=True)
    for what in ("set", "path"):  # the same p-value where both ran
        for k in args.sizes:
            pair = [r for r in rows if (r["what"], r["texts"]) == (what, k) and "p_value" in r]
            if len(pair) == 2:
                same = pair[0]["p_value"] == pair[1]["p_value"]
                for r in pair:
                    r["same_p_as_other_method"] = same
    print()
    print(f"{'what':5} {'texts':>7} {'method':6} {'peak MB':>8} {'base MB':>8} {'s':>7}  p")
    for r in rows:
        if "peak_rss_mb" in r:
            print(
                f"{r['what']:5} {r['texts']:>7} {r['method']:6} {r['peak_rss_mb']:>8.0f} "
                f"{r['base_rss_mb']:>8.0f} {r['seconds']:>7.1f}  {r['p_value']:.4g}"
            )
        else:
            print(
                f"{r['what']:5} {r['texts']:>7} {r['method']:6} {r.get('skipped', r.get('error'))}"
            )
    record = {
        "machine": machine,
        "n_perm": N_PERM,
        "null": args.null,
        "measures": {
            "set": "set_level_test alone on 1/32-grid scores; old = the one-matrix formula",
            "path": "FittedDetector.score with the overlap detector and a stub target (no "
            "model, no generation cache) + the JSON lines written; old = the one-matrix set "
            "test and the unsampled, unchunked distribution check",
            "peak_rss_mb": "ru_maxrss of the child process (imports and inputs included)",
            "base_rss_mb": "VmRSS just before the measured step",
        },
        "rows": rows,
    }
    from calibdcd.provenance import save_measurement

    save_measurement(args.out, record)


if __name__ == "__main__":
    main()
