"""SAEBench's sparse probing (sae_bench/evals/sparse_probing, 0.6.0) on labelled text that is available offline.

For each dataset (a text -> class mapping) and each class, SAEBench's one-vs-rest task: the class's examples
against as many drawn from the other classes (prepare_probe_data's draws, in its order). Inputs are mean-pooled
over the tokens of each text (start, pad and eos tokens left out, as SAEBench's mask_bos_pad_eos_tokens):

    llm_test_accuracy          a logistic probe on the full residual stream (torch, AdamW lr 1e-2, batch 250,
                               up to 100 epochs, early stop after 10 epochs without gain; SAEBench's GPU probe,
                               which keeps the epoch of best *test* accuracy, as it does)
    llm_top_{k}_test_accuracy  sklearn LogisticRegression (L2, C=1, max_iter=1000) on the k residual dimensions
                               with the largest |mean(positive) - mean(negative)| on the train split
    sae_test_accuracy, sae_top_{k}_test_accuracy   the same on the SAE's mean-pooled latents

for k in 1, 2, 5, 10, 20 (--option ks=[...]); per-class accuracies are averaged per dataset, datasets averaged.
Each probe call seeds torch with --seed first, so a number does not depend on which probes ran before it.

Datasets (--dataset, comma-separated; a built-in name or a file):
    chat_world_kind   the chat world's request kinds (general / harmful / benign), built offline from zoo.chat
    chat_world_task   the chat world's general task types (add, count, sort, ...)
    a .jsonl file     Dolly records (instruction, context, category) -> class = category; or {text, label}
    a .csv file       XSTest (prompt, label: safe / unsafe); or any file with text|prompt and label columns
SAEBench's own sets (bias-in-bios, Amazon reviews, AG News, GitHub code, Europarl) need a hub download; Dolly's
categories stand in for AG News (the genre of a short text, 8 classes, one-vs-rest), XSTest's safe / unsafe label
for the binary sentiment set (one semantic judgement of the whole text; its contrast prompts share the surface
words of the safe ones). Texts are cut to 128 tokens (--option probe_context=N) and led by the model's start
token (which our SAEs are trained after); a class with fewer than 4 texts, or a dataset with one class, is
refused.
"""

from __future__ import annotations

import csv
import json
import math
import random
from pathlib import Path

import torch

from ..registry import BenchOptions, EvalResult, EvalType, made_in_the_chat_world, register_eval

EVAL_TYPE_ID = "sparse_probing"
DEFAULT_KS = (1, 2, 5, 10, 20)
SCHEMA_KS = (1, 2, 5, 10, 20, 50, 100)  # the k fields SAEBench's schema has (others are null)
MIN_PER_CLASS = 4
TEST_FRACTION = 0.2
POSITIVE, NEGATIVE = 1, 0  # sae_bench_utils.dataset_info's labels


# ----------------------------------------------------------------------------- datasets

def _chat_world(field: str, n: int, seed: int) -> dict[str, list[str]]:
    from zoo.chat.world import World, WorldConfig

    shares = {"general": 0.6, "harmful": 0.2, "benign": 0.2}
    rows = World(WorldConfig(seed=0)).mixture("held_out", n, shares, seed=seed)
    if field == "type":
        rows = [r for r in rows if r["kind"] == "general"]
    data: dict[str, list[str]] = {}
    for row in rows:
        data.setdefault(row[field], []).append(row["prompt"])
    return data


BUILT_IN = {
    "chat_world_kind": lambda options: _chat_world("kind", min(4 * options.max_examples, 4000), options.seed),
    "chat_world_task": lambda options: _chat_world("type", min(4 * options.max_examples, 4000), options.seed),
}


def _read_file(path: Path) -> dict[str, list[str]]:
    if not path.is_file():
        raise ValueError(f"dataset file {path} does not exist; give a file or one of {', '.join(BUILT_IN)}")
    data: dict[str, list[str]] = {}
    if path.suffix == ".csv":
        with open(path, newline="", encoding="utf-8") as handle:
            reader = csv.DictReader(handle)
            columns = reader.fieldnames or []
            text_col = "prompt" if "prompt" in columns else "text" if "text" in columns else None
            if text_col is None or "label" not in columns:
                raise ValueError(f"{path}: a CSV dataset needs a prompt (or text) column and a label column; it has "
                                 f"{', '.join(columns) or 'none'}")
            for row in reader:
                if (row.get(text_col) or "").strip() and (row.get("label") or "").strip():
                    data.setdefault(row["label"].strip(), []).append(row[text_col].strip())
        return data
    for line_no, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError as err:
            raise ValueError(f"{path} line {line_no} is not JSON ({err.msg})") from None
        if not isinstance(record, dict):
            raise ValueError(f"{path} line {line_no} is not a JSON object")
        if "category" in record and "instruction" in record:  # Dolly
            text = "\n".join(p for p in (record["instruction"], record.get("context") or "") if p.strip())
            label = record["category"]
        elif "text" in record and "label" in record:
            text, label = record["text"], record["label"]
        else:
            raise ValueError(f"{path} line {line_no}: a JSONL dataset holds Dolly records (instruction, category) "
                             f"or {{text, label}} objects")
        if str(text).strip():
            data.setdefault(str(label), []).append(str(text))
    return data


def dataset_names(options: BenchOptions) -> list[str]:
    if options.dataset is None:
        if made_in_the_chat_world(options.model_name):
            return ["chat_world_kind", "chat_world_task"]
        raise ValueError(f"sparse probing needs labelled text for {options.model_name}: pass --dataset FILE[,FILE] "
                         f"(Dolly JSONL, XSTest CSV, {{text, label}} JSONL; see docs/saebench.md)")
    names = [n.strip() for n in options.dataset.split(",") if n.strip()]
    if not names:
        raise ValueError("--dataset names no dataset")
    return names


def load_dataset(name: str, options: BenchOptions) -> dict[str, list[str]]:
    """class -> texts; a clear error for a dataset that cannot be probed (one class, tiny classes)."""
    data = BUILT_IN[name](options) if name in BUILT_IN else _read_file(Path(name))
    label = name if name in BUILT_IN else Path(name).name
    if len(data) < 2:
        only = f" ({next(iter(data))!r})" if data else ""
        raise ValueError(f"dataset {label} has {len(data)} class{only}: probing needs at least two")
    small = sorted(c for c, texts in data.items() if len(texts) < MIN_PER_CLASS)
    if small:
        raise ValueError(f"dataset {label}: class(es) {', '.join(small)} have fewer than {MIN_PER_CLASS} texts")
    return data


def split(data: dict[str, list[str]], max_per_class: int, seed: int) -> tuple[dict, dict]:
    """Per class: a seeded shuffle, at most max_per_class texts, the last 20% (at least 1) for test."""
    train, test = {}, {}
    for cls in sorted(data):
        texts = list(data[cls])
        random.Random(f"{seed}:{cls}").shuffle(texts)
        texts = texts[:max_per_class]
        n_test = max(1, int(round(len(texts) * TEST_FRACTION)))
        train[cls], test[cls] = texts[:-n_test], texts[-n_test:]
    return train, test


# ----------------------------------------------------------------------------- pooled activations

@torch.no_grad()
def pooled_activations(lm, sae, hook: str, texts: list[str], context: int, batch_size: int
                       ) -> tuple[torch.Tensor, torch.Tensor]:
    """(residual (n, d_model), SAE latents (n, d_sae)), each mean-pooled over the text's tokens that are not the
    start / pad / eos token (SAEBench's mask), one forward pass per batch ending after the hook's layer."""
    from interp.hooks.lm import capture_residuals, right_padded
    from interp.lm_text import start_token

    from .core import special_token_ids

    start, _ = start_token(lm.tokenizer)
    encoded = lm.tokenizer(texts, add_special_tokens=False)["input_ids"]
    sequences = [[start] + ids[:min(context, lm.n_ctx) - 1] for ids in encoded]
    special = special_token_ids(lm.tokenizer) | {start}
    llm_rows, sae_rows = [], []
    for i in range(0, len(sequences), batch_size):
        ids, mask = right_padded(lm, sequences[i:i + batch_size])
        acts = capture_residuals(lm, ids, mask, names=[hook])[hook].float()
        keep = mask.bool()
        for token in special:
            keep &= ids != token
        keep = keep.to(acts.device)
        counts = keep.sum(1, keepdim=True).clamp_min(1).float()
        w = keep.unsqueeze(-1).float()
        llm_rows.append((acts * w).sum(1) / counts)
        sae_rows.append((sae.encode(acts).float() * w).sum(1) / counts)
    return torch.cat(llm_rows).cpu(), torch.cat(sae_rows).cpu()


# ----------------------------------------------------------------------------- probes

def prepare_probe_data(acts: dict[str, torch.Tensor], cls: str) -> tuple[torch.Tensor, torch.Tensor]:
    """One-vs-rest data for `cls`, balanced, shuffled: SAEBench's draws (torch.randperm on the global generator,
    in its order), so a seeded run picks the same examples. Where the other classes together have fewer examples
    than `cls`, a random subset of `cls` as large as theirs is kept (SAEBench stops there)."""
    positive = acts[cls]
    n_pos = len(positive)
    others = [k for k in acts if k != cls]
    per_class = math.ceil(n_pos / len(others))
    negative = torch.cat([acts[k][torch.randperm(len(acts[k]))[:per_class]] for k in others])
    negative = negative[torch.randperm(len(negative))[:n_pos]]
    if len(negative) < n_pos:  # a class larger than all others together (SAEBench's sets never are: it asserts)
        positive = positive[torch.randperm(n_pos)[:len(negative)]]
        n_pos = len(positive)
    x = torch.cat([positive, negative])
    y = torch.full((len(x),), NEGATIVE, dtype=torch.int)
    y[:n_pos] = POSITIVE
    order = torch.randperm(len(x))
    return x[order], y[order]


def top_k_dims(x: torch.Tensor, y: torch.Tensor, k: int) -> torch.Tensor:
    """Indices of the k dimensions with the largest |class-mean difference| (train split)."""
    diff = (x[y == POSITIVE].mean(0) - x[y == NEGATIVE].mean(0)).abs()
    return torch.argsort(diff, descending=True)[:k]


def sklearn_accuracy(x, y, x_test, y_test) -> float:
    from sklearn.linear_model import LogisticRegression
    from sklearn.metrics import accuracy_score

    probe = LogisticRegression(C=1.0, max_iter=1000)  # L2, sklearn's lbfgs: SAEBench's settings
    probe.fit(x.float().numpy(), y.numpy())
    return float(accuracy_score(y_test.numpy(), probe.predict(x_test.float().numpy())))


def _accuracy(probe, x, y, batch_size) -> float:
    with torch.no_grad():
        correct = [((probe(x[i:i + batch_size]).squeeze(-1) > 0).long() == y[i:i + batch_size]).float()
                   for i in range(0, len(y), batch_size)]
    return torch.cat(correct).mean().item()


def torch_probe_accuracy(x, y, x_test, y_test, epochs: int = 100, batch_size: int = 250, lr: float = 1e-2,
                         patience: int = 10) -> float:
    """SAEBench's train_probe_gpu: a linear probe, BCE, AdamW; the best test accuracy over epochs."""
    probe = torch.nn.Linear(x.shape[1], 1, dtype=x.dtype)
    optimizer = torch.optim.AdamW(probe.parameters(), lr=lr)
    criterion = torch.nn.BCEWithLogitsLoss()
    best, waited = 0.0, 0
    with torch.enable_grad():
        for _ in range(epochs):
            order = torch.randperm(len(x))
            for i in range(0, len(x), batch_size):
                idx = order[i:i + batch_size]
                loss = criterion(probe(x[idx]).squeeze(-1), y[idx].to(x.dtype))
                optimizer.zero_grad()
                loss.backward()
                optimizer.step()
            _accuracy(probe, x, y, batch_size)  # SAEBench computes the train accuracy here (no draws)
            accuracy = _accuracy(probe, x_test, y_test, batch_size)
            if accuracy > best:
                best, waited = accuracy, 0
            else:
                waited += 1
            if waited >= patience:
                break
    return best


def probe_accuracies(train: dict[str, torch.Tensor], test: dict[str, torch.Tensor], k: int | None,
                     seed: int) -> dict[str, float]:
    """class -> test accuracy of its one-vs-rest probe: top-k dims + sklearn (k), or the full torch probe
    (k None). torch is seeded with `seed` first."""
    torch.manual_seed(seed)
    out = {}
    for cls in train:
        x, y = prepare_probe_data(train, cls)
        x_test, y_test = prepare_probe_data(test, cls)
        if k is None:
            out[cls] = torch_probe_accuracy(x, y, x_test, y_test)
        else:
            dims = top_k_dims(x, y, k)
            out[cls] = sklearn_accuracy(x[:, dims], y, x_test[:, dims], y_test)
    return out


# ----------------------------------------------------------------------------- the eval

def _ks(options: BenchOptions) -> tuple[int, ...]:
    return options.get_ints("ks", DEFAULT_KS, 1, 1000)


def _probe_context(options: BenchOptions) -> int:
    """Tokens per text (SAEBench's context_length, 128), apart from --context (the core eval's sequences)."""
    return options.get_int("probe_context", 128, 2, 4096)


def _check(sae, lm, options: BenchOptions) -> None:
    _ks(options)
    _probe_context(options)
    for name in dataset_names(options):
        load_dataset(name, options)


def run_dataset(lm, sae, options: BenchOptions, name: str, ks) -> tuple[dict, dict]:
    data = load_dataset(name, options)
    train_texts, test_texts = split(data, options.max_examples, options.seed)
    train, test = {}, {}
    for cls in train_texts:
        train[cls] = pooled_activations(lm, sae, options.hook, train_texts[cls], _probe_context(options),
                                        options.batch_size)
        test[cls] = pooled_activations(lm, sae, options.hook, test_texts[cls], _probe_context(options),
                                       options.batch_size)
    per_class: dict[str, dict[str, float]] = {}
    for prefix, index in (("llm", 0), ("sae", 1)):
        tr = {c: v[index] for c, v in train.items()}
        te = {c: v[index] for c, v in test.items()}
        per_class[f"{prefix}_test_accuracy"] = probe_accuracies(tr, te, None, options.seed)
        for k in ks:
            if k <= tr[next(iter(tr))].shape[1]:
                per_class[f"{prefix}_top_{k}_test_accuracy"] = probe_accuracies(tr, te, k, options.seed)
    means = {key: sum(v.values()) / len(v) for key, v in per_class.items()}
    sizes = {"classes": len(data), "train_texts": {c: len(t) for c, t in train_texts.items()},
             "test_texts": {c: len(t) for c, t in test_texts.items()}}
    return means, {"per_class": per_class, **sizes}


def run_sparse_probing(sae, lm, options: BenchOptions) -> EvalResult:
    ks = _ks(options)
    names = dataset_names(options)
    sae = sae.to(lm.device)
    results, unstructured = {}, {}
    for name in names:
        label = name if name in BUILT_IN else Path(name).name
        results[label], unstructured[label] = run_dataset(lm, sae, options, name, ks)

    def fields(prefix: str, means: dict) -> dict:
        out = {f"{prefix}_test_accuracy": means.get(f"{prefix}_test_accuracy")}
        for k in SCHEMA_KS:
            out[f"{prefix}_top_{k}_test_accuracy"] = means.get(f"{prefix}_top_{k}_test_accuracy")
        return out

    keys = {key for means in results.values() for key in means}
    average = {key: sum(m[key] for m in results.values() if key in m) / sum(key in m for m in results.values())
               for key in keys}
    metrics = {"llm": fields("llm", average), "sae": fields("sae", average)}
    details = [{"dataset_name": label, **fields("llm", means), **fields("sae", means)}
               for label, means in results.items()]
    config = {"random_seed": options.seed, "dataset_names": list(results), "probe_train_set_size":
              options.max_examples, "probe_test_set_size": options.max_examples,
              "context_length": _probe_context(options), "sae_batch_size": options.batch_size,
              "llm_batch_size": options.batch_size, "llm_dtype": options.dtype, "model_name": options.model_name,
              "k_values": list(ks), "lower_vram_usage": False}
    note = ("probe_train_set_size / probe_test_set_size hold --max-examples, the cap per class before an 80/20 "
            "split (SAEBench: train and test sizes per class); eval_result_unstructured has each dataset's sizes")
    return EvalResult(config, metrics, details, {"datasets": unstructured, "note": note})


SPARSE_PROBING = register_eval(EvalType(
    name="sparse_probing", eval_type_id=EVAL_TYPE_ID, run=run_sparse_probing, kinds=("lm",), check=_check,
    options=("ks", "probe_context"),
    description="SAEBench sparse probing: top-k SAE latents vs the residual stream, logistic probes per class"))

__all__ = ["BUILT_IN", "SPARSE_PROBING", "load_dataset", "pooled_activations", "prepare_probe_data",
           "probe_accuracies", "run_dataset", "sklearn_accuracy", "split", "top_k_dims", "torch_probe_accuracy"]
