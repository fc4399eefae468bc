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

``pilot`` chooses VCL's k and lambda (below), ``run`` fine-tunes and measures every cell of the grid
and ``report`` (``experiments/smollm2_report.py``) aggregates the cells into
``experiments/results/smollm2_study.{json,md,png}``:

    python -m experiments.smollm2_study data
    python -m experiments.smollm2_study pilot     # skipped when its committed result is current
    python -m experiments.smollm2_study run [--seeds 0 1] [--only CELL ...]
    python -m experiments.smollm2_study report

A cell is one model: the untouched base, or a LoRA fine-tune (peft; rank 8 on every linear map of
layers 10-29, so the backward pass stops at layer 10: the VCL window, layers 12-17, and everything
above it adapt) with plain SFT or SFT + VCL at safety ratio r in {0, 0.1, 0.2, 0.4}: ``STEPS`` steps of
``BATCH`` examples, one pass over a mixture of ``STEPS * BATCH`` examples, ``round(r * N)`` of them
safety refusals and the rest Dolly records, drawn with the cell's seed (which also seeds LoRA's
initialisation and the data order). Every cell is measured the same way (``measure``):

- XSTest (all 450 prompts, chat template, greedy, ``XSTEST_TOKENS`` new tokens): false-refusal rate on
  the 250 safe prompts, refusal rate on the 200 unsafe ones, every completion with its id and label;
- general ability: mean loss (and perplexity) of the reference responses of 100 of the 200 held-out Dolly
  records, and the chat-world tasks with checkable answers (add, subtract, copy, reverse, max, min,
  sort, count; 8 held-out prompts each): for numbers, the completion's last number is the answer; for word
  lists, the answer's words appear in order (``task_correct``);
- geometry: resid_post at the last prompt token of every layer on the XSTest prompts; top-3 energy,
  effective rank and participation ratio per layer, and the alignment of each layer's principal
  directions with the base model's.

Each finished cell is written to ``experiments/results/smollm2_cells/<cell>.json`` with the
fingerprint of the code it was computed by (``common.code_fingerprint``); ``run`` skips a cell whose
committed file has the current fingerprint and recomputes a stale one, so the grid resumes on a fresh
machine from what is committed. Fine-tuning itself checkpoints under ``runs/experiments/smollm2/``
every ``SAVE_EVERY`` steps.
"""

from __future__ import annotations

import argparse
import csv
import json
import math
import random
import sys
import time
from pathlib import Path

from .common import REPO, RESULTS, code_fingerprint, geometry_metrics, markdown_table, write_json, write_jsonl

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
# The grid. Measured here (2 cores): one step of 8 x 128 tokens with LoRA on layers 10-29 takes about 3.4 s.
RATIOS = (0.0, 0.1, 0.2, 0.4)
SEEDS = (0, 1)            # every cell; a third seed is run with --seeds 2 where time allows
STEPS, BATCH, LR, MAX_LENGTH, SAVE_EVERY = 60, 8, 2e-4, 128, 10
LORA = {"r": 8, "alpha": 16, "first_layer": 10}
WINDOW = (0.4, 0.6)       # the study's mid depth: layers 12-17 of SmolLM2's 30
XSTEST_TOKENS = 32
MIN_COMPLETION = 32   # tokens of a training example left to its completion
HELDOUT_MAX_LENGTH = 512
HELDOUT_RECORDS = 100   # of the 200 held out, the first that fit (a cell's measurement fits the CPU)
TASK_TOKENS = 32
TASKS = ("add", "subtract", "copy", "reverse", "max", "min", "sort", "count")  # "fact" asks about the toy's world
PER_TASK = 8
# The pilot: short runs at the highest ratio; the (k, lambda) that lowers mid-depth concentration most
# while the held-out Dolly loss stays within PILOT_LOSS_TOLERANCE of plain SFT's is the grid's VCL.
PILOT_STEPS, PILOT_RATIO = 24, 0.4
PILOT_GRID = ((2, 1.0), (2, 3.0), (4, 1.0), (4, 3.0))
PILOT_LOSS_TOLERANCE = 0.02
CELLS = RESULTS / "smollm2_cells"
STUDY_CODE = ("experiments/smollm2_study.py",)  # besides common.MEASURE_CODE
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


# --------------------------------------------------------------------------- the grid

def data_paths() -> dict[str, Path]:
    paths = {name: RUN_ROOT / "data" / f"{name}.jsonl" for name in ("dolly-train", "dolly-heldout", "safety")}
    missing = [str(p) for p in paths.values() if not p.is_file()]
    if missing:
        raise FileNotFoundError(f"missing {', '.join(missing)}: run `python -m experiments.smollm2_study data` first")
    return paths


def _sha256(path: Path) -> str:
    import hashlib

    return hashlib.sha256(path.read_bytes()).hexdigest()[:16]


def mixture(ratio: float, seed: int, n: int, fits=None) -> list[dict]:
    """``n`` training examples, ``round(ratio * n)`` of them safety refusals, drawn and shuffled with ``seed``
    from the records whose prompt ``fits`` (a predicate; default all)."""
    from flowlens.diversity import read_jsonl

    paths = data_paths()
    fits = fits or (lambda prompt: True)
    general = [row for _, row in read_jsonl(paths["dolly-train"]) if fits(row["prompt"])]
    safety = [row for _, row in read_jsonl(paths["safety"]) if fits(row["prompt"])]
    n_safety = round(ratio * n)
    if n_safety > len(safety) or n - n_safety > len(general):
        raise ValueError(f"a mixture of {n} at ratio {ratio} needs {n_safety} safety and {n - n_safety} general "
                         f"examples; the data has {len(safety)} and {len(general)}")
    rng = random.Random(seed)
    rows = rng.sample(safety, n_safety) + rng.sample(general, n - n_safety)
    rng.shuffle(rows)
    return [{"prompt": r["prompt"], "completion": r["completion"]} for r in rows]


def prompt_fits(tokenizer, prompt: str, max_length: int = MAX_LENGTH) -> bool:
    """A prompt leaves at least ``MIN_COMPLETION`` of ``max_length`` tokens to its completion (Dolly records with
    long contexts do not, and are not drawn)."""
    from flowlens.refusals import format_prompt

    text = format_prompt(tokenizer, prompt, True)
    return len(tokenizer(text, add_special_tokens=False)["input_ids"]) <= max_length - MIN_COMPLETION


def cell_name(method: str, ratio: float | None, seed: int, steps: int = STEPS, vcl: dict | None = None) -> str:
    if method == "base":
        return "base"
    name = f"r{ratio:g}-{method}-s{seed}"
    if steps != STEPS:
        name += f"-steps{steps}"
    if vcl is not None:
        name = name.replace(f"-{method}-", f"-{method}-k{vcl['k']}-l{vcl['weight']:g}-")
    return name


def lora_model(model, first_layer: int, r: int, alpha: int):
    """peft LoRA on every linear map of decoder layers ``first_layer``.. (layers below stay frozen and out of
    the backward pass)."""
    import torch
    from peft import LoraConfig, get_peft_model

    from interp.hooks.lm import decoder_layers

    layers = decoder_layers(model)
    targets = sorted({name.rsplit(".", 1)[-1] for name, m in layers[0].named_modules()
                      if isinstance(m, torch.nn.Linear)})
    config = LoraConfig(r=r, lora_alpha=alpha, lora_dropout=0.0, target_modules=targets, task_type="CAUSAL_LM",
                        layers_to_transform=list(range(first_layer, len(layers))))
    return get_peft_model(model, config), targets


def train_cell(name: str, ratio: float, seed: int, steps: int, vcl: dict | None):
    """Fine-tune one cell (resuming its checkpoint); returns (merged model, tokenizer, settings)."""
    import torch

    from flowlens.finetune import FinetuneConfig, finetune
    from flowlens.vcl import VCLConfig
    from interp.models.lm import load_hf_lm

    out = RUN_ROOT / "runs" / name
    out.mkdir(parents=True, exist_ok=True)
    data_file = out / "train.jsonl"
    model, tokenizer = load_hf_lm("smollm2-135m-instruct")
    write_jsonl(data_file, mixture(ratio, seed, steps * BATCH, lambda prompt: prompt_fits(tokenizer, prompt)))
    torch.manual_seed(seed)  # LoRA's initialisation
    model, targets = lora_model(model, LORA["first_layer"], LORA["r"], LORA["alpha"])
    # LoRA is applied here (finetune's own ``lora`` option adapts every layer); finetune trains what requires grad.
    config = FinetuneConfig(model="smollm2-135m-instruct", data=str(data_file), out=str(out), steps=steps,
                            batch_size=BATCH, lr=LR, max_length=MAX_LENGTH, seed=seed, chat_template=True,
                            vcl=VCLConfig(window=WINDOW, **vcl) if vcl else None, save_every=SAVE_EVERY,
                            progress=False)
    result = finetune(config, model=model, tokenizer=tokenizer)
    if result["status"] != "finished":
        raise RuntimeError(f"{name}: fine-tuning stopped ({result['status']})")
    from flowlens.finetune import read_log

    log = read_log(out)
    settings = {"finetune": config.to_json(), "lora": {**LORA, "target_modules": targets},
                "data": {"mixture": {"n": steps * BATCH, "safety": round(ratio * steps * BATCH)},
                         **{k: _sha256(v) for k, v in data_paths().items()}},
                "train_seconds": round(sum(e["seconds"] for e in log), 1),  # over every resumption
                "final_sft_loss": sum(e["sft_loss"] for e in log[-10:]) / len(log[-10:]),
                "final_vcl_ratio": (sum(e["vcl_ratio"] for e in log[-10:]) / len(log[-10:])) if vcl else None}
    return model.merge_and_unload(), tokenizer, settings


def xstest_records():
    from flowlens.refusals import read_xstest_csv

    path = DEFAULT_DATA_DIR / "xstest_prompts.csv"
    if not path.is_file():
        raise FileNotFoundError(f"no XSTest file at {path} (see ../shared/data/README.md)")
    return read_xstest_csv(path)


NUMERIC_TASKS = ("add", "subtract", "max", "min", "count")


def task_correct(completion: str, answer: str, task: str) -> bool:
    """Whether a completion answers a chat-world task. Numeric tasks: the completion's last number is the answer
    (the number after "is" in the worked arithmetic), so echoing the prompt's numbers does not count. Word tasks
    (copy, reverse, sort): the answer's words appear in order, as a run (an echo of the prompt's list is not the
    reversed or sorted list)."""
    import re

    if task in NUMERIC_TASKS:
        key = answer.rsplit(" is ", 1)[-1] if " is " in answer else answer
        numbers = re.findall(r"-?\d+", completion)
        return bool(numbers) and numbers[-1] == key.strip().rstrip(".")
    words = lambda text: re.findall(r"[a-z0-9]+", text.lower())
    needle, hay = words(answer), words(completion)
    return bool(needle) and any(hay[i:i + len(needle)] == needle for i in range(len(hay) - len(needle) + 1))


def task_records() -> list[dict]:
    from .common import eval_records

    return [r for r in eval_records(per_task=PER_TASK, n_harmful=0, n_benign=0) if r["type"] in TASKS]


def heldout_loss(model, tokenizer) -> dict:
    """Mean cross-entropy (nats/token) of the held-out Dolly reference responses given their prompts (records whose
    prompt leaves fewer than ``MIN_COMPLETION`` of ``HELDOUT_MAX_LENGTH`` tokens are left out; responses are cut
    at that length)."""
    import torch

    from flowlens.diversity import read_jsonl
    from flowlens.finetune import collate, tokenize_examples

    rows = [(n, r["prompt"], r["completion"]) for n, r in read_jsonl(data_paths()["dolly-heldout"])
            if prompt_fits(tokenizer, r["prompt"], HELDOUT_MAX_LENGTH)][:HELDOUT_RECORDS]
    examples = tokenize_examples(rows, tokenizer, HELDOUT_MAX_LENGTH, True, "dolly-heldout")
    examples.sort(key=lambda e: len(e.input_ids))  # batches of similar length pad little
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    head = model.get_output_embeddings()
    total, count = 0.0, 0
    with torch.no_grad():
        for start in range(0, len(examples), 16):
            batch = collate(examples[start:start + 16], pad)
            hidden = model.base_model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"])[0]
            labels = batch["labels"][:, 1:]
            scored = labels != -100  # the unembedding only where a response token is predicted
            logits = head(hidden[:, :-1][scored]).float()
            total += torch.nn.functional.cross_entropy(logits, labels[scored], reduction="sum").item()
            count += int(scored.sum())
    mean = total / count
    return {"loss": mean, "perplexity": math.exp(mean), "n_records": len(examples), "n_tokens": count}


def residuals(model, tokenizer, prompts: list[str]):
    from interp.hooks.lm import last_token_residuals
    from interp.models.generation import context_length
    from interp.models.lm import LanguageModel

    c = model.config
    lm = LanguageModel(model, tokenizer, n_layers=c.num_hidden_layers, d_model=c.hidden_size,
                       n_ctx=context_length(c), backend="hf", name="smollm2-135m-instruct")
    return last_token_residuals(lm, prompts, chat_template=True, batch_size=32).numpy()


def measure(model, tokenizer, reference) -> dict:
    """XSTest, general ability and geometry of one model (the same for every cell)."""
    from flowlens.refusals import evaluate_refusals, generate_completions

    model.eval()
    records = xstest_records()
    evaluation = evaluate_refusals(model, tokenizer, records, max_new_tokens=XSTEST_TOKENS, chat_template=True)
    m = evaluation.metrics
    xstest = {"false_refusal_rate": m.false_refusal_rate, "harmful_refusal_rate": m.harmful_refusal_rate,
              "refused_counts": m.refused_counts, "counts": m.counts, "counts_by_type": m.counts_by_type,
              "completions": [{k: row[k] for k in ("id", "prompt", "type", "label", "completion", "refused")}
                              for row in evaluation.rows]}
    tasks = task_records()
    completions = generate_completions(model, tokenizer, [t["prompt"] for t in tasks], TASK_TOKENS,
                                       chat_template=True)
    correct = [task_correct(c, t["answer"], t["type"]) for c, t in zip(completions, tasks)]
    by_task = {task: sum(ok for ok, t in zip(correct, tasks) if t["type"] == task) / PER_TASK for task in TASKS}
    general = {"dolly_heldout": heldout_loss(model, tokenizer),
               "chat_world_tasks": {"accuracy": sum(correct) / len(correct), "by_task": by_task, "n": len(tasks),
                                    "completions": [{"type": t["type"], "prompt": t["prompt"], "answer": t["answer"],
                                                     "completion": c, "correct": ok}
                                                    for t, c, ok in zip(tasks, completions, correct)]}}
    geometry = geometry_metrics(residuals(model, tokenizer, [r.prompt for r in records]), reference)
    return {"xstest": xstest, "general": general, "geometry": geometry}


def fingerprint() -> str:
    return code_fingerprint(*STUDY_CODE)


def committed_cell(name: str) -> dict | None:
    path = CELLS / f"{name}.json"
    return json.loads(path.read_text()) if path.is_file() else None


def base_reference():
    """The base model's residuals on the XSTest prompts (computed once, under runs/)."""
    import numpy as np

    path = RUN_ROOT / "base_residuals.npy"
    if not path.exists():
        from interp.models.lm import load_hf_lm

        model, tokenizer = load_hf_lm("smollm2-135m-instruct")
        path.parent.mkdir(parents=True, exist_ok=True)
        np.save(path, residuals(model, tokenizer, [r.prompt for r in xstest_records()]))
    return np.load(path)


def compute_cell(method: str, ratio: float | None, seed: int, steps: int = STEPS, vcl: dict | None = None,
                 measure_all: bool = True) -> dict:
    """Train (unless base) and measure one cell; write its JSON under ``CELLS`` (skipped when current)."""
    name = cell_name(method, ratio, seed, steps, vcl)
    code = fingerprint()
    done = committed_cell(name)
    if done is not None and done.get("code") == code:
        print(f"{name}: current, skipped", flush=True)
        return done
    print(f"{name}: {'recomputing (stale)' if done else 'computing'}", flush=True)
    started = time.perf_counter()
    reference = base_reference()
    if method == "base":
        from interp.models.lm import load_hf_lm

        model, tokenizer = load_hf_lm("smollm2-135m-instruct")
        settings = {"model": "smollm2-135m-instruct"}
    else:
        model, tokenizer, settings = train_cell(name, ratio, seed, steps, vcl)
    if measure_all:
        result = measure(model, tokenizer, reference)
    else:  # the pilot: held-out loss and geometry only
        result = {"general": {"dolly_heldout": heldout_loss(model, tokenizer)},
                  "geometry": geometry_metrics(residuals(model, tokenizer, [r.prompt for r in xstest_records()]),
                                               reference)}
    cell = {"name": name, "method": method, "ratio": ratio, "seed": seed, "config": settings, **result,
            "code": code, "seconds": round(time.perf_counter() - started, 1)}
    write_json(CELLS / f"{name}.json", cell)
    print(f"{name}: done in {cell['seconds']:.0f} s", flush=True)
    return cell


def window_concentration(cell: dict) -> float:
    """Mean top-3 energy of the VCL window's layers (the study's mid-depth concentration)."""
    from flowlens.vcl import window_layers

    energy = cell["geometry"]["concentration"]["top_k_energy"]
    layers = window_layers(WINDOW, len(energy))
    return sum(energy[l] for l in layers) / len(layers)


def pilot(args) -> dict:
    """Short runs at ``PILOT_RATIO``: plain SFT and each (k, lambda) of ``PILOT_GRID``; the choice and its
    reasons go to ``experiments/results/smollm2_pilot.json``."""
    sft = compute_cell("sft", PILOT_RATIO, 0, PILOT_STEPS, measure_all=False)
    runs = []
    for k, weight in PILOT_GRID:
        cell = compute_cell("vcl", PILOT_RATIO, 0, PILOT_STEPS, {"k": k, "weight": weight}, measure_all=False)
        runs.append({"k": k, "weight": weight, "cell": cell["name"],
                     "dolly_loss": cell["general"]["dolly_heldout"]["loss"],
                     "window_top3_energy": window_concentration(cell),
                     "final_vcl_ratio": cell["config"]["final_vcl_ratio"]})
    sft_loss = sft["general"]["dolly_heldout"]["loss"]
    allowed = [r for r in runs if r["dolly_loss"] <= sft_loss * (1 + PILOT_LOSS_TOLERANCE)]
    chosen = min(allowed or runs, key=lambda r: r["window_top3_energy"])
    result = {"steps": PILOT_STEPS, "ratio": PILOT_RATIO, "seed": 0, "window": list(WINDOW),
              "rule": f"lowest mean top-3 energy of the window layers on the XSTest prompts among runs whose held-out "
                      f"Dolly loss is within {PILOT_LOSS_TOLERANCE:.0%} of plain SFT's"
                      + ("" if allowed else " (none was: the lowest energy overall)"),
              "sft": {"cell": sft["name"], "dolly_loss": sft_loss, "window_top3_energy": window_concentration(sft)},
              "runs": runs, "chosen": {"k": chosen["k"], "weight": chosen["weight"]}, "code": fingerprint()}
    write_json(RESULTS / "smollm2_pilot.json", result)
    print(json.dumps({k: result[k] for k in ("sft", "runs", "chosen")}, indent=1))
    return result


def pilot_command(args) -> int:
    import torch

    torch.set_num_threads(args.threads)
    pilot(args)
    return 0


def chosen_vcl(args) -> dict:
    path = RESULTS / "smollm2_pilot.json"
    saved = json.loads(path.read_text()) if path.is_file() else None
    if saved is None or saved.get("code") != fingerprint():
        saved = pilot(args)
    return saved["chosen"]


def grid(seeds) -> list[tuple[str, float | None, int]]:
    """Base first, then per seed the ratios from the highest (where the effect should be largest) down."""
    cells = [("base", None, 0)]
    for seed in seeds:
        for ratio in sorted(RATIOS, reverse=True):
            cells += [("sft", ratio, seed), ("vcl", ratio, seed)]
    return cells


def run(args) -> int:
    import torch

    torch.set_num_threads(args.threads)
    vcl = chosen_vcl(args)
    print(f"VCL: k={vcl['k']} lambda={vcl['weight']} window={list(WINDOW)}", flush=True)
    for method, ratio, seed in grid(args.seeds):
        name = cell_name(method, ratio, seed, vcl=vcl if method == "vcl" else None)
        if args.only and name not in args.only:
            continue
        compute_cell(method, ratio, seed, vcl=vcl if method == "vcl" else None)
    return 0


def report(args) -> int:
    from .smollm2_report import write_report

    return write_report()


def main(argv: list[str] | None = None) -> int:
    from interp.cli import at_least, run_command

    parser = argparse.ArgumentParser(prog="python -m experiments.smollm2_study", description=__doc__.split("\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)
    data_parser = commands.add_parser("data", help="training sets, held-out split and their lexical diversity")
    data_parser.add_argument("--data-dir", default=str(DEFAULT_DATA_DIR),
                             help="folder with dolly-sample.jsonl and advbench_harmful_behaviors.csv")
    data_parser.set_defaults(run=data)
    for name, function, text in (("pilot", pilot_command, "short runs that choose VCL's k and lambda"),
                                 ("run", run, "fine-tune and measure every cell (skips current committed cells)")):
        sub = commands.add_parser(name, help=text)
        sub.add_argument("--threads", type=at_least(1), default=2)
        sub.set_defaults(run=function)
    run_parser = commands.choices["run"]
    run_parser.add_argument("--seeds", type=int, nargs="+", default=list(SEEDS))
    run_parser.add_argument("--only", nargs="+", default=None, help="cell names to compute (default: all)")
    report_parser = commands.add_parser("report", help="JSON, markdown and plots from the committed cells")
    report_parser.set_defaults(run=report)
    return run_command(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
