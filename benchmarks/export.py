"""Cost of `saes export` at the size the field publishes: 16,384 features of an LM SAE, 20 activation records each.

    python -m benchmarks.export --text ../shared/data/dolly-sample.jsonl [--model smollm2-135m-instruct]
                                [--d-sae 16384] [--top 20] [--tokens 100000] [--threads 2]
                                [--out runs/benchmarks/export.json]

Two stages, each timed: the cards (`saes features --top 20`: the corpus through the model, every feature's top
contexts and its promoted / suppressed tokens) and the export of those cards in both formats (SAEDashboard's
batches, Neuronpedia's tree: the logit histogram over the whole vocabulary per feature, the decoder tables, the
files). The SAE is a TopK SAE (k 32) at SmolLM2's layer 15 whose first 4,608 decoder directions are the shipped
SAE's and the rest random unit directions (encoder = decoder transposed): its features are not meant to mean
anything, only to fire as a trained SAE's do, so that every feature has records to write. The shipped SAE's own
export (4,608 features, its cards' 6 records) is timed too.

There is no side-by-side ratio: the alternative, SAEDashboard's NeuronpediaRunner, needs TransformerLens models and
pins transformers < 4.57 (this stack has 5.x), so it cannot run here; the issue's goal is absolute (<= 60 min).
"""

from __future__ import annotations

import argparse
import json
import platform
import subprocess
import tempfile
import time
from pathlib import Path

import torch

from interp.models.lm import load_lm
from saes.export import ExportConfig, export_sae
from saes.lm_features import LMAnalysisConfig, analyse_lm_sae
from saes.sae import SAE, SAEConfig

SHIPPED = Path("saes/pretrained/smollm2/blocks.15.hook_resid_post")


def cpu_name() -> str:
    try:
        out = subprocess.run(["lscpu"], capture_output=True, text=True).stdout
        return next(line.split(":", 1)[1].strip() for line in out.splitlines() if line.startswith("Model name"))
    except (OSError, StopIteration):
        return platform.processor()


def wide_sae(d_sae: int, seed: int = 0) -> SAE:
    shipped = SAE.load(SHIPPED)
    d_in = shipped.cfg.d_in
    generator = torch.Generator().manual_seed(seed)
    extra = torch.nn.functional.normalize(torch.randn(d_sae - shipped.cfg.d_sae, d_in, generator=generator), dim=1)
    W_dec = torch.cat([shipped.W_dec.detach().float(), extra])[:d_sae]
    cfg = SAEConfig(architecture="topk", d_in=d_in, d_sae=d_sae, k=32, dtype="float32",
                    metadata={**shipped.cfg.metadata, "trained_tokens": 0})
    sae = SAE(cfg)
    with torch.no_grad():
        sae.W_dec.copy_(W_dec)
        sae.W_enc.copy_(W_dec.T)
        sae.b_enc.zero_()
        sae.b_dec.copy_(shipped.b_dec.detach().float())
    return sae


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--text", required=True)
    parser.add_argument("--model", default="smollm2-135m-instruct")
    parser.add_argument("--d-sae", type=int, default=16_384)
    parser.add_argument("--top", type=int, default=20)
    parser.add_argument("--tokens", type=int, default=100_000)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--out", default="runs/benchmarks/export.json")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    lm = load_lm(args.model)
    result = {"cpu": cpu_name(), "threads": args.threads, "model": args.model, "d_sae": args.d_sae,
              "top": args.top, "tokens": args.tokens}
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        start = time.perf_counter()
        for fmt in ("saedashboard", "neuronpedia"):
            export_sae(SHIPPED, tmp / f"shipped-{fmt}", ExportConfig(format=fmt), lm=lm)
        result["shipped_export_both_formats_s"] = round(time.perf_counter() - start, 1)
        print(f"shipped SAE (4,608 features, 6 records): both formats in {result['shipped_export_both_formats_s']} s",
              flush=True)
        sae_dir = tmp / "wide"
        wide_sae(args.d_sae).save(sae_dir)
        sae = SAE.load(sae_dir).eval()
        start = time.perf_counter()
        payload = analyse_lm_sae(lm, sae, args.text, sae_dir,
                                 LMAnalysisConfig(tokens=args.tokens, n_top_contexts=args.top), model_name=args.model,
                                 sae_dir=sae_dir)
        result["cards_s"] = round(time.perf_counter() - start, 1)
        records = sum(len(c["top_contexts"]) for c in payload["features"])
        result["records"] = records
        result["features_with_20_records"] = sum(len(c["top_contexts"]) >= args.top for c in payload["features"])
        print(f"cards: {args.d_sae} features, {records} records in {result['cards_s']} s", flush=True)
        for fmt in ("saedashboard", "neuronpedia"):
            start = time.perf_counter()
            summary = export_sae(sae_dir, tmp / fmt, ExportConfig(format=fmt), lm=lm)
            result[f"export_{fmt}_s"] = round(time.perf_counter() - start, 1)
            result[f"export_{fmt}_mb"] = round(sum(Path(f).stat().st_size for f in summary["files"]) / 2**20, 1)
            print(f"export {fmt}: {result[f'export_{fmt}_s']} s, {result[f'export_{fmt}_mb']} MB", flush=True)
    result["total_min"] = round((result["cards_s"] + result["export_saedashboard_s"]) / 60, 1)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
