"""SAEBench's metric-vs-L0 plots with many points: a sweep of SmolLM2 layer-15 SAEs, each benched by `saes bench`.

    OMP_NUM_THREADS=1 python -m benchmarks.saebench_sweep_smollm2 all --threads 1 [--run runs/saebench_sweep]
        [--data-dir ../shared/data] [--max-store-tokens 163840] [--tokens 327680] [--batch-size 2048]
        [--n-tokens 6144] [--evals core] [--only topk-k8 ...]
    python -m benchmarks.saebench_sweep_smollm2 corpus|collect|saes|publish ...   (one stage)

Stages (each resumable; a finished SAE or result is not redone):
  corpus   saes/pretrained/smollm2/ship.sh's corpus, rebuilt the same way (the SmolLM2 study's Dolly train records
           and AdvBench goals with templated refusals, rendered as chats, shuffled with seed 0; the 200 held-out
           Dolly records as the held-out text), without writing the study's committed report files;
  collect  `interp collect` of blocks.15.hook_resid_post over the corpus' first --max-store-tokens tokens, 1,024-token
           whole documents (ship.sh);
  saes     for each SAE of SWEEP in turn, train then bench:
  (train)  `saes train` of every SAE of SWEEP (d_sae 4,608 like the shipped SAE; --tokens vectors each, in batches of
           --batch-size, the shipped SAE's lr 5e-4), each with its train_log.jsonl (the training curve);
  (bench)  `saes bench --evals core[,sparse_probing]` of every trained SAE on the held-out text (whole documents),
           SAEBench's JSON under <run>/saebench/<sae>/;
  publish  each SAE's results, cfg.json and train_log.jsonl (its training curve) into --publish
           (experiments/results/saebench_lm_smollm2_sweep/<sae>/, where the UI's Benchmark section reads them; the
           per-feature details rounded to 5 significant digits, to keep the files small), then SAEBench's plot
           (saes.bench.plots) over the sweep and the shipped SAE, and the training curves, into --docs.

What is committed: the results, logs and plots. The SAEs (4,608 x 576 float32, 21 MB each) are not: the command
above remakes them under --run.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import sys
import time
from pathlib import Path

MODEL = "smollm2-135m-instruct"
HOOK = "blocks.15.hook_resid_post"
CONTEXT = 1024
SHIPPED = Path("saes/pretrained/smollm2") / HOOK
# (name, architecture, k, options): TopK across k, and the other trainers at a couple of sparsities each
# in the order they are made (train, then bench, one SAE after the other: what finishes first is plotted first)
SWEEP = (("topk-k8", "topk", 8, {}), ("topk-k64", "topk", 64, {}), ("topk-k16", "topk", 16, {}),
         ("topk-k128", "topk", 128, {}), ("topk-k32", "topk", 32, {}), ("batchtopk-k32", "batchtopk", 32, {}),
         ("topk-k4", "topk", 4, {}), ("batchtopk-k64", "batchtopk", 64, {}), ("lens-topk-k32", "lens-topk", 32, {}),
         ("batchtopk-k16", "batchtopk", 16, {}))


def log(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {message}", flush=True)


def corpus(run: Path, data_dir: Path) -> None:
    """ship.sh's corpus.jsonl and heldout.jsonl (its heredoc, from the study's functions directly)."""
    if (run / "corpus.jsonl").exists() and (run / "heldout.jsonl").exists():
        return
    from benchmarks.saebench_smollm2 import chat_text
    from experiments.smollm2_study import advbench_refusals, dolly_records, split_dolly
    from interp.models.lm import load_hf_lm

    _, tokenizer = load_hf_lm(MODEL)
    train, held_out = split_dolly(dolly_records(data_dir / "dolly-sample.jsonl"))
    safety = advbench_refusals(data_dir / "advbench_harmful_behaviors.csv")
    run.mkdir(parents=True, exist_ok=True)
    for name, rows in (("corpus", train + safety), ("heldout", held_out)):
        texts = [chat_text(tokenizer, row, CONTEXT) for row in rows]
        random.Random(0).shuffle(texts)
        (run / f"{name}.jsonl").write_text("".join(json.dumps({"text": t}) + "\n" for t in texts))
        log(f"{name}: {len(texts)} documents")


def sh(command: list[str]) -> None:
    log(" ".join(command))
    subprocess.run(command, check=True)


def collect(run: Path, threads: int, max_tokens: int) -> None:
    if (run / "store" / "manifest.json").exists():
        return
    sh([sys.executable, "-m", "interp", "collect", "--model", MODEL, "--hooks", HOOK, "--text",
        str(run / "corpus.jsonl"), "--context", str(CONTEXT), "--threads", str(threads), "--max-tokens",
        str(max_tokens), "--allow-fewer", "--out", str(run / "store")])


def train(run: Path, threads: int, tokens: int, batch_size: int, name: str) -> None:
    _, architecture, k, options = next(spec for spec in SWEEP if spec[0] == name)
    out = run / "saes" / name
    if not (out / "sae_weights.safetensors").exists():
        command = [sys.executable, "-m", "saes", "train", "--store", str(run / "store"), "--block", HOOK,
                   "--out", str(out), "--architecture", architecture, "--d-sae", "4608", "--k", str(k),
                   "--tokens", str(tokens), "--batch-size", str(batch_size), "--lr", "5e-4",
                   "--threads", str(threads), "--log-every", "5", "--checkpoint-every", "50"]
        for key, value in options.items():
            command += ["--option", f"{key}={value}"]
        started = time.perf_counter()
        sh(command)
        log(f"trained {name} in {time.perf_counter() - started:.0f} s")


def bench(run: Path, threads: int, n_tokens: int, evals: str, data_dir: Path, name: str) -> None:
    sae = run / "saes" / name
    out = run / "saebench" / name
    todo = [e for e in evals.split(",") if not list((out / e).glob("*_eval_results.json"))]
    if todo:
        sh([sys.executable, "-m", "saes", "bench", "--sae", str(sae), "--model", MODEL, "--evals", ",".join(todo),
            "--out", str(out), "--text", str(run / "heldout.jsonl"), "--context", str(CONTEXT),
            "--n-tokens", str(n_tokens), "--batch-size", "4", "--threads", str(threads),
            "--dataset", f"{data_dir / 'dolly-sample.jsonl'},{data_dir / 'xstest_prompts.csv'}",
            "--max-examples", "120"])


def _rounded(value):
    if isinstance(value, float):
        return float(f"{value:.5g}")
    if isinstance(value, list):
        return [_rounded(v) for v in value]
    if isinstance(value, dict):
        return {k: _rounded(v) for k, v in value.items()}
    return value


def publish(run: Path, publish_dir: Path, docs: Path) -> None:
    """Copy each benched SAE's results (details rounded), cfg.json and train_log.jsonl; draw the plots."""
    from saes.bench.plots import collect, markdown_table, write_html, write_png

    names = []
    for name, *_ in SWEEP:
        results = sorted((run / "saebench" / name).rglob("*_eval_results.json"))
        if not results:
            continue
        names.append(name)
        out = publish_dir / name
        for path in results:
            result = json.loads(path.read_text())
            result["eval_result_details"] = _rounded(result.get("eval_result_details"))
            target = out / path.parent.name / path.name
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_text(json.dumps(result, separators=(",", ":")) + "\n")
        for extra in ("cfg.json", "train_log.jsonl", "train_summary.json"):
            if (run / "saes" / name / extra).exists():
                (out / extra).write_text((run / "saes" / name / extra).read_text())
    docs.mkdir(parents=True, exist_ok=True)
    rows = collect([publish_dir, SHIPPED / "saebench"])
    write_png(rows, docs / "metrics_vs_l0.png")
    write_html(rows, docs / "metrics_vs_l0.html", "cdn")
    training_curves([publish_dir / n for n in names], docs / "training_curves.png")
    print(markdown_table(rows), end="")
    log(f"published {len(names)} SAEs into {publish_dir}; plots in {docs}")


def training_curves(folders, path: Path) -> None:
    """Each SAE's training explained variance (per batch, train_log.jsonl) against training tokens: whether the run
    had converged. (Its dead-latent count is left out: saes train counts a latent dead after --dead-after-tokens,
    10M by default, which a short run never reaches.)"""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    for folder in folders:
        lines = [json.loads(line) for line in (folder / "train_log.jsonl").read_text().splitlines() if line.strip()]
        ax.plot([line["tokens"] for line in lines], [line["explained_variance"] for line in lines], lw=1.2,
                label=folder.name)
    ax.set_xlabel("training tokens")
    ax.set_title("training explained variance (per batch)", fontsize=10)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("stage", choices=("all", "corpus", "collect", "saes", "publish"))
    parser.add_argument("--publish", default="experiments/results/saebench_lm_smollm2_sweep")
    parser.add_argument("--docs", default="docs/saebench/sweep")
    parser.add_argument("--run", default="runs/saebench_sweep")
    parser.add_argument("--data-dir", default="../shared/data")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--max-store-tokens", type=int, default=163_840, help="tokens the store collects")
    parser.add_argument("--tokens", type=int, default=327_680, help="training vectors per SAE (2 epochs)")
    parser.add_argument("--batch-size", type=int, default=2048)
    parser.add_argument("--n-tokens", type=int, default=6_144, help="core eval tokens per SAE")
    parser.add_argument("--evals", default="core")
    parser.add_argument("--only", nargs="*", default=None, help="SWEEP names (default: all)")
    args = parser.parse_args(argv)
    for name, value, low, high in (("--threads", args.threads, 1, 64), ("--tokens", args.tokens, 4096, 10**9),
                                   ("--batch-size", args.batch_size, 1, 65536),
                                   ("--max-store-tokens", args.max_store_tokens, 4096, 10**8),
                                   ("--n-tokens", args.n_tokens, 16, 5_000_000)):
        if not low <= value <= high:
            parser.error(f"{name} must be in {low}..{high}, got {value}")
    unknown = set(args.only or ()) - {name for name, *_ in SWEEP}
    if unknown:
        parser.error(f"unknown SAE(s) {', '.join(sorted(unknown))}; the sweep has {', '.join(n for n, *_ in SWEEP)}")
    os.environ.setdefault("OMP_NUM_THREADS", str(args.threads))
    run, data = Path(args.run), Path(args.data_dir)
    if args.stage in ("all", "corpus"):
        corpus(run, data)
    if args.stage in ("all", "collect"):
        collect(run, args.threads, args.max_store_tokens)
    if args.stage in ("all", "saes"):
        for name, *_ in SWEEP:
            if not args.only or name in args.only:
                try:  # one SAE that fails (a diverged run) leaves the others to be made
                    train(run, args.threads, args.tokens, args.batch_size, name)
                    bench(run, args.threads, args.n_tokens, args.evals, data, name)
                except subprocess.CalledProcessError as err:
                    log(f"{name} failed: {err}")
    if args.stage in ("all", "publish"):
        publish(run, Path(args.publish), Path(args.docs))
    return 0


if __name__ == "__main__":
    sys.exit(main())
