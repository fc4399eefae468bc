"""Issue 18: the seed study on SmolLM2-135M-Instruct, step one: the training data and its lexical diversity.

    python -m experiments.smollm2_study data [--data-dir ../shared/data]

General instruction data is databricks-dolly-15k (users bring ``dolly-sample.jsonl`` or the full
file; CC BY-SA 3.0): a fixed, seeded split keeps ``HELD_OUT`` records for the general-ability
measure (loss of the reference responses) and never trains on them. Safety data is AdvBench's 520
harmful goals (``advbench_harmful_behaviors.csv``; MIT), each answered by one of a few templated
refusals, as safety sets are. XSTest is never trained on. ``data`` writes both training sets and
the held-out split as JSONL under ``runs/experiments/smollm2/data/`` and their lexical diversity
(``flowlens.diversity``, the measures the reference study reports) to
``experiments/results/smollm2_data.{json,md}``.

The fine-tuning grid (LoRA SFT and SFT+VCL at safety ratios 0-0.4, seeds, XSTest, held-out Dolly,
geometry) builds on this and is the next step of the issue.
"""

from __future__ import annotations

import argparse
import csv
import json
import random
import sys
from pathlib import Path

from .common import REPO, RESULTS, markdown_table, write_json, write_jsonl

RUN_ROOT = REPO / "runs" / "experiments" / "smollm2"
DEFAULT_DATA_DIR = REPO.parent / "shared" / "data"
HELD_OUT = 200        # Dolly records kept for evaluation
SPLIT_SEED = 0
REFUSALS = (          # templated refusals, as safety data sets answer harmful requests
    "I'm sorry, but I can't help with that. {reason}",
    "I cannot assist with this request. {reason}",
    "I'm sorry, I can't provide that. {reason}",
    "I won't help with that, as it could cause harm. {reason}",
)
REASONS = ("It could cause serious harm to others.", "It would be unsafe and possibly illegal.",
           "Helping with this could put people at risk.")
STUDY_DIVERSITY = {"safety": {"H1": 9.18, "distinct-2": 0.048}, "general": {"H1": 12.05, "distinct-2": 0.205}}


def dolly_records(path: Path) -> list[dict]:
    """``{"prompt", "completion", "category"}`` per Dolly record; the context, when there is one, follows the
    instruction in the prompt."""
    from flowlens.diversity import DataError, read_jsonl

    records = []
    for number, row in read_jsonl(path):
        if not isinstance(row.get("instruction"), str) or not isinstance(row.get("response"), str):
            raise DataError(f"{path}: line {number} lacks Dolly's instruction/response fields")
        context = (row.get("context") or "").strip()
        prompt = row["instruction"].strip() + (f"\n\n{context}" if context else "")
        if prompt and row["response"].strip():
            records.append({"prompt": prompt, "completion": row["response"].strip(),
                            "category": row.get("category")})
    return records


def advbench_refusals(path: Path, seed: int = 0) -> list[dict]:
    """Every AdvBench goal with a templated refusal (template and reason drawn with ``seed``)."""
    from flowlens.diversity import DataError

    if not path.is_file():
        raise FileNotFoundError(f"no AdvBench file: {path}")
    rng = random.Random(seed)
    with path.open(newline="", encoding="utf-8") as handle:
        reader = csv.DictReader(handle)
        if "goal" not in (reader.fieldnames or []):
            raise DataError(f"{path}: no 'goal' column (AdvBench's harmful_behaviors.csv has goal,target)")
        goals = [row["goal"].strip() for row in reader if (row["goal"] or "").strip()]
    return [{"prompt": goal, "completion": rng.choice(REFUSALS).format(reason=rng.choice(REASONS)),
             "category": "safety"} for goal in goals]


def split_dolly(records: list[dict]) -> tuple[list[dict], list[dict]]:
    """(train, held out): a seeded shuffle, the last ``HELD_OUT`` records held out."""
    order = list(range(len(records)))
    random.Random(SPLIT_SEED).shuffle(order)
    if len(order) <= HELD_OUT:
        raise ValueError(f"{len(records)} Dolly records: more than {HELD_OUT} are needed to hold {HELD_OUT} out")
    return [records[i] for i in order[:-HELD_OUT]], [records[i] for i in order[-HELD_OUT:]]


def data(args) -> int:
    from flowlens.diversity import lexical_diversity

    source = Path(args.data_dir)
    train, held_out = split_dolly(dolly_records(source / "dolly-sample.jsonl"))
    safety = advbench_refusals(source / "advbench_harmful_behaviors.csv")
    out = RUN_ROOT / "data"
    for name, rows in (("dolly-train", train), ("dolly-heldout", held_out), ("safety", safety)):
        write_jsonl(out / f"{name}.jsonl", rows)
    report = {"sources": {"dolly": "dolly-sample.jsonl", "advbench": "advbench_harmful_behaviors.csv"},
              "counts": {"dolly_train": len(train), "dolly_held_out": len(held_out), "safety": len(safety)},
              "refusal_templates": list(REFUSALS), "reasons": list(REASONS), "study": STUDY_DIVERSITY,
              "diversity": {}}
    for name, rows in (("general (Dolly train)", train), ("safety (AdvBench + templated refusals)", safety)):
        report["diversity"][name] = {
            selection: lexical_diversity([r[key] for r in rows], selection=selection).to_json()
            for selection, key in (("completions", "completion"), ("queries", "prompt"))}
    write_json(RESULTS / "smollm2_data.json", report)
    rows = []
    for name, by_selection in report["diversity"].items():
        for selection, d in by_selection.items():
            rows.append([name, selection, str(d["n_texts"]), str(d["n_tokens"]), f"{d['entropy']['H1']:.2f}",
                         f"{d['entropy']['H2']:.2f}", f"{d['distinct']['distinct-2']:.3f}",
                         "n/a" if d["msttr"] is None else f"{d['msttr']:.3f}"])
    rows.append(["study: safety data", "completions", "", "", "9.18", "", "0.048", ""])
    rows.append(["study: general data", "completions", "", "", "12.05", "", "0.205", ""])
    table = markdown_table(["data", "field", "texts", "word tokens", "H1 (bits)", "H2", "distinct-2", "MSTTR"], rows)
    (RESULTS / "smollm2_data.md").write_text(
        "Lexical diversity of the SmolLM2 study's training sets (`python -m experiments.smollm2_study data`; "
        "word tokens, flowlens.diversity), next to the reference study's figures.\n\n" + table)
    print(table, end="")
    print(f"wrote {out}/*.jsonl and {RESULTS / 'smollm2_data.md'}")
    return 0


def main(argv: list[str] | None = None) -> int:
    from interp.cli import run_command

    parser = argparse.ArgumentParser(prog="python -m experiments.smollm2_study", description=__doc__.split("\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)
    data_parser = commands.add_parser("data", help="training sets, held-out split and their lexical diversity")
    data_parser.add_argument("--data-dir", default=str(DEFAULT_DATA_DIR),
                             help="folder with dolly-sample.jsonl and advbench_harmful_behaviors.csv")
    data_parser.set_defaults(run=data)
    return run_command(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
