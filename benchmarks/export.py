"""Cost of `saes features` + `saes export` at the size the field publishes: 16,384 features of a trained LM SAE,
20 activation records each.

    python -m benchmarks.export --sae DIR --text ../shared/data/dolly-sample.jsonl [--model smollm2-135m-instruct]
                                [--tokens 300000] [--max-length 128] [--top 20] [--threads 2] [--compare]
                                [--out runs/benchmarks/export.json]

The SAE is one trained on the model (docs/performance.md, "Export", says which and how). Stages, each timed: the
cards (`analyse_lm_sae`: the corpus through the model to the SAE's hook and its sparse encoding; every feature's
logit effects on the vocabulary, its promoted / suppressed tokens and logit histogram; every feature's top
contexts; the files) and the export of those cards in both formats. Reported beside the times: how many features
have `--top` records, how many fire in fewer sequences than that (a card keeps one context per sequence, so those
cannot have them on this corpus) and how many never fire.

``--compare`` also times, side by side on the same activations and cards, what these stages replaced: the
feature-by-feature top-context search (`per_feature_top_contexts`, which tests/test_lm_features.py also holds the
new search equal to) and an export that computes the logit histograms through the model again (cards made before
they kept them).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

import numpy as np
import torch


def cpu_name() -> str:
    try:
        out = subprocess.run(["lscpu"], capture_output=True, text=True).stdout
        return next(line.split(":", 1)[1].strip() for line in out.splitlines() if line.startswith("Model name"))
    except (OSError, StopIteration):
        return platform.processor()


def per_feature_top_contexts(acts, tokenizer, config) -> list[list[dict]]:
    """The cards' top contexts searched feature by feature (`np.unique` of its sequences per feature, every window
    decoded token by token): what `saes.lm_features.feature_cards` did before it searched all features at once."""
    from saes.lm_features import _r, sequence_pieces

    document_of = np.searchsorted(acts.starts, acts.rows, side="right") - 1
    order = np.lexsort((-acts.values, acts.features))
    counts = np.bincount(acts.features, minlength=acts.d_sae)
    group_starts = np.concatenate([[0], np.cumsum(counts)])
    windows: dict[tuple[int, int, int], list[str]] = {}
    out = []
    for f in range(acts.d_sae):
        group = order[group_starts[f]:group_starts[f + 1]]
        contexts = []
        if len(group):
            _, first_of_doc = np.unique(document_of[group], return_index=True)
            best = group[np.sort(first_of_doc)][:config.n_top_contexts]
            best = best[np.argsort(-acts.values[best], kind="stable")]
            rows_f, values_f = acts.rows[group], acts.values[group]
            for entry in best:
                doc = int(document_of[entry])
                start = int(acts.starts[doc])
                position = int(acts.rows[entry]) - start
                lo = max(0, position - config.window_before)
                hi = min(len(acts.sequences[doc]), position + config.window_after + 1)
                inside = (rows_f >= start + lo) & (rows_f < start + hi)
                window = np.zeros(hi - lo)
                window[rows_f[inside] - start - lo] = values_f[inside]
                if (doc, lo, hi) not in windows:
                    windows[doc, lo, hi] = sequence_pieces(tokenizer, acts.sequences[doc][lo:hi])
                contexts.append({"sequence": doc, "position": position, "activation": _r(acts.values[entry]),
                                 "start": lo, "tokens": windows[doc, lo, hi],
                                 "activations": [_r(v) for v in window], "highlight": position - lo})
        out.append(contexts)
    return out


def sequences_per_feature(acts) -> np.ndarray:
    """How many distinct sequences each feature fires in (a card keeps at most one context per sequence)."""
    document_of = np.searchsorted(acts.starts, acts.rows, side="right") - 1
    pairs = np.unique(acts.features.astype(np.int64) * len(acts.starts) + document_of)
    return np.bincount(pairs // len(acts.starts), minlength=acts.d_sae)


def main() -> int:
    from interp.cli import parse_dtype
    from interp.models.lm import load_lm
    from saes.export import ExportConfig, export_sae
    from saes.lm_features import LMAnalysisConfig, all_top_contexts, analyse_lm_sae
    from saes.sae import SAE

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sae", required=True, help="a trained LM SAE directory (its cards are made in a copy)")
    parser.add_argument("--text", required=True)
    parser.add_argument("--model", default="smollm2-135m-instruct")
    parser.add_argument("--top", type=int, default=20)
    parser.add_argument("--tokens", type=int, default=300_000)
    parser.add_argument("--max-length", type=int, default=128, help="tokens per sequence (the cards' max_length)")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--dtype", default="float32", help="the model's dtype (bfloat16: AMX/AVX512-BF16 CPUs)")
    parser.add_argument("--compare", action="store_true", help="also time the stages this replaced, side by side")
    parser.add_argument("--out", default="runs/benchmarks/export.json")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    lm = load_lm(args.model, dtype=parse_dtype(args.dtype))
    result = {"cpu": cpu_name(), "threads": args.threads, "load_average_at_start": list(os.getloadavg()),
              "model": args.model, "dtype": args.dtype, "sae": str(args.sae), "top": args.top,
              "max_length": args.max_length}
    out_path = Path(args.out)
    out_path.parent.mkdir(parents=True, exist_ok=True)

    def timed(key: str, run):
        """run(), its wall and CPU seconds into result[key + '_s' / '_cpu_s'], the result so far written out."""
        wall, cpu = time.perf_counter(), time.process_time()
        value = run()
        result[f"{key}_s"] = round(time.perf_counter() - wall, 1)
        result[f"{key}_cpu_s"] = round(time.process_time() - cpu, 1)
        result["load_average_now"] = list(os.getloadavg())
        out_path.write_text(json.dumps(result, indent=2) + "\n")
        return value

    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        sae_dir = tmp / Path(args.sae).name
        shutil.copytree(args.sae, sae_dir, ignore=shutil.ignore_patterns("features.*", "checkpoint*", "*.pt"))
        sae = SAE.load(sae_dir).eval()
        result["d_sae"], result["k"] = sae.cfg.d_sae, sae.cfg.k
        config = LMAnalysisConfig(tokens=args.tokens, n_top_contexts=args.top, max_length=args.max_length)
        stages, keep = {}, {}
        result["cards_stages"] = stages
        payload = timed("cards", lambda: analyse_lm_sae(lm, sae, args.text, sae_dir, config, model_name=args.model,
                                                        sae_dir=sae_dir, timings=stages, keep=keep))
        cards = payload["features"]
        acts = keep["acts"]
        spread = sequences_per_feature(acts)
        result["corpus"] = payload["corpus"]
        result["records"] = sum(len(c["top_contexts"]) for c in cards)
        result["features_with_top_records"] = sum(len(c["top_contexts"]) >= args.top for c in cards)
        result["features_dead"] = sum(c["n_firing"] == 0 for c in cards)
        result["features_in_fewer_sequences_than_top"] = int(((spread > 0) & (spread < args.top)).sum())
        print(f"cards: {sae.cfg.d_sae} features, {result['records']} records, "
              f"{result['features_with_top_records']} with {args.top}, {result['features_dead']} dead, in "
              f"{result['cards_s']} s {stages}", flush=True)
        for fmt in ("saedashboard", "neuronpedia"):
            summary = timed(f"export_{fmt}", lambda: export_sae(sae_dir, tmp / fmt, ExportConfig(format=fmt)))
            result[f"export_{fmt}_mb"] = round(sum(Path(f).stat().st_size for f in summary["files"]) / 2**20, 1)
            print(f"export {fmt}: {result[f'export_{fmt}_s']} s, {result[f'export_{fmt}_mb']} MB", flush=True)
        result["total_min"] = round((result["cards_s"] + result["export_saedashboard_s"]) / 60, 1)
        if args.compare:
            timed("compare_top_contexts_at_once", lambda: all_top_contexts(acts, lm.tokenizer, config))
            old = timed("compare_top_contexts_feature_by_feature",
                        lambda: per_feature_top_contexts(acts, lm.tokenizer, config))
            assert old == [c["top_contexts"] for c in cards], "the two searches disagree"
            print(f"top contexts: {result['compare_top_contexts_at_once_s']} s at once, "
                  f"{result['compare_top_contexts_feature_by_feature_s']} s feature by feature", flush=True)
            stale = json.loads((sae_dir / "features.json").read_text())
            for card in stale["features"]:
                del card["logit_histogram"]
            (sae_dir / "features.json").write_text(json.dumps(stale))
            timed("compare_export_saedashboard_through_the_model",
                  lambda: export_sae(sae_dir, tmp / "through-model", ExportConfig(format="saedashboard"), lm=lm))
            print(f"export through the model: {result['compare_export_saedashboard_through_the_model_s']} s",
                  flush=True)
    result["load_average_at_end"] = list(os.getloadavg())
    out_path.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
