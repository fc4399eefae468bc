"""SAEBench's core and sparse probing on SmolLM2's shipped layer-15 SAE, on this CPU, with wall times.

    python -m benchmarks.saebench_smollm2 [--data-dir ../shared/data] [--threads 1] [--n-tokens 20000]
                                          [--max-examples 120] [--evals core,sparse_probing]
                                          [--out saes/pretrained/smollm2/blocks.15.hook_resid_post/saebench]

Held-out text for the core eval: the SmolLM2 study's 200 held-out Dolly records (experiments.smollm2_study's
split of dolly-sample.jsonl, which the SAE was not trained on), each rendered as a chat by the model's template,
as saes/pretrained/smollm2/ship.sh renders them for `saes eval`; whole documents (--context 1024), so that no
sequence starts mid-document (SmolLM2's attention sink, ship.sh's note). Sparse probing: Dolly's 8 categories
(dolly-sample.jsonl) and XSTest's safe / unsafe label (xstest_prompts.csv), at most --max-examples texts a class,
128 tokens a text. Writes SAEBench's JSON (one per eval) into --out and prints each eval's wall and CPU time and
the CPU (lscpu's model name). The two evals can run as two processes (--evals core / --evals sparse_probing).
"""

from __future__ import annotations

import argparse
import json
import platform
import subprocess
import sys
import time
from pathlib import Path

SAE_DIR = Path("saes/pretrained/smollm2/blocks.15.hook_resid_post")
MODEL = "smollm2-135m-instruct"


def cpu_name() -> str:
    try:
        out = subprocess.run(["lscpu"], capture_output=True, text=True, timeout=10).stdout
        for line in out.splitlines():
            if line.startswith("Model name:"):
                return line.split(":", 1)[1].strip()
    except (OSError, subprocess.SubprocessError):
        pass
    return platform.processor() or "unknown"


def chat_text(tokenizer, row: dict, context: int = 1024) -> str:
    """A prompt / completion record as ship.sh renders it: the model's chat template without its start token (the
    collector adds one), cut to context - 8 tokens when it would fill the context."""
    chat = [{"role": "user", "content": row["prompt"]}, {"role": "assistant", "content": row["completion"]}]
    text = tokenizer.apply_chat_template(chat, tokenize=False)
    if tokenizer.bos_token and text.startswith(tokenizer.bos_token):
        text = text[len(tokenizer.bos_token):]
    ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    return tokenizer.decode(ids[:context - 8]) if len(ids) >= context else text


def held_out_file(data_dir: Path, out: Path) -> Path:
    from experiments.smollm2_study import dolly_records, split_dolly
    from interp.models.lm import load_hf_lm

    _, tokenizer = load_hf_lm(MODEL)
    _, held_out = split_dolly(dolly_records(data_dir / "dolly-sample.jsonl"))
    texts = [chat_text(tokenizer, row) for row in held_out]
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text("".join(json.dumps({"text": t}) + "\n" for t in texts))
    return out


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--data-dir", default="../shared/data")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--n-tokens", type=int, default=20000)
    parser.add_argument("--max-examples", type=int, default=120)
    parser.add_argument("--out", default=str(SAE_DIR / "saebench"))
    parser.add_argument("--evals", default="core,sparse_probing")
    args = parser.parse_args(argv)
    data = Path(args.data_dir)
    text = held_out_file(data, Path("runs/saebench/smollm2/heldout.jsonl"))
    datasets = f"{data / 'dolly-sample.jsonl'},{data / 'xstest_prompts.csv'}"
    from saes.__main__ import main as saes_main

    command = ["bench", "--sae", str(SAE_DIR), "--model", MODEL, "--evals", args.evals, "--out", args.out,
               "--text", str(text), "--context", "1024", "--n-tokens", str(args.n_tokens), "--batch-size", "4",
               "--dataset", datasets, "--max-examples", str(args.max_examples), "--threads", str(args.threads),
               "--overwrite"]
    print("python -m saes " + " ".join(command), flush=True)
    start = time.perf_counter()
    code = saes_main(command)
    total = time.perf_counter() - start
    print(f"total {total:.0f} s on {cpu_name()} ({args.threads} thread(s); the machine is shared with other jobs)")
    for path in sorted(Path(args.out).rglob("*.json")):
        result = json.loads(path.read_text())
        u = result["eval_result_unstructured"]
        print(f"{result['eval_type_id']}: {u['wall_seconds']:.0f} s wall, {u.get('cpu_seconds', 0):.0f} s CPU "
              f"({path})")
    return code


if __name__ == "__main__":
    sys.exit(main())
