"""The supervised fine-tuning data of `flowlens.finetune`: JSONL rows of prompt and completion, tokenised apart (so
the boundary is exact), right-padded batches with the completion as the only labels, and the seeded order of
micro-batches (a function of (seed, step): a resumed run takes the same batches)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch

from .diversity import DataError, read_jsonl
from .refusals import format_prompt


@dataclass
class Example:
    """One tokenised example: ``input_ids`` = prompt ids + completion ids (+ EOS)."""

    input_ids: list[int]
    prompt_length: int


def read_sft_data(path: str | Path) -> list[tuple[int, str, str]]:
    """(line, prompt, completion) of a JSONL file; a missing field is named by its line."""
    rows = []
    for number, record in read_jsonl(path):
        for name in ("prompt", "completion"):
            if not isinstance(record.get(name), str):
                raise DataError(f"{path}: line {number} has no {name!r} field (a string)")
        if not record["completion"].strip():
            raise DataError(f"{path}: line {number} has an empty completion")
        rows.append((number, record["prompt"], record["completion"]))
    return rows


def tokenize_examples(rows, tokenizer, max_length: int, chat_template: bool, path: str = "data") -> list[Example]:
    """Prompt and completion tokenised apart (so the prompt/completion boundary is exact)."""
    examples = []
    for number, prompt, completion in rows:
        text = format_prompt(tokenizer, prompt, chat_template)
        prompt_ids = list(tokenizer(text, add_special_tokens=not chat_template)["input_ids"])
        completion_ids = list(tokenizer(completion, add_special_tokens=False)["input_ids"])
        if tokenizer.eos_token_id is not None:
            completion_ids.append(tokenizer.eos_token_id)
        if not prompt_ids:
            raise DataError(f"{path}: line {number}: the prompt gives no tokens")
        if len(prompt_ids) >= max_length:
            raise DataError(f"{path}: line {number}: the prompt has {len(prompt_ids)} tokens, leaving no room for "
                            f"the completion within max_length={max_length}")
        examples.append(Example((prompt_ids + completion_ids)[:max_length], len(prompt_ids)))
    return examples


def collate(examples: list[Example], pad_id: int) -> dict[str, torch.Tensor]:
    """Right-padded batch: input_ids, attention_mask, labels (-100 off the completion), prompt/response masks."""
    width = max(len(e.input_ids) for e in examples)
    batch = {name: torch.zeros(len(examples), width, dtype=torch.long) for name in ("input_ids", "attention_mask")}
    batch["labels"] = torch.full((len(examples), width), -100, dtype=torch.long)
    batch["prompt_mask"] = torch.zeros(len(examples), width, dtype=torch.bool)
    batch["response_mask"] = torch.zeros(len(examples), width, dtype=torch.bool)
    batch["input_ids"].fill_(pad_id)
    for row, example in enumerate(examples):
        n, p = len(example.input_ids), example.prompt_length
        batch["input_ids"][row, :n] = torch.tensor(example.input_ids)
        batch["attention_mask"][row, :n] = 1
        batch["labels"][row, p:n] = batch["input_ids"][row, p:n]
        batch["prompt_mask"][row, :p] = True
        batch["response_mask"][row, p:n] = True
    return batch


def micro_batch_indices(n_examples: int, batch_size: int, seed: int, micro_batch: int) -> list[int]:
    """Indices of the ``micro_batch``-th micro-batch: a fresh seeded permutation each epoch, no partial batch."""
    per_epoch = n_examples // batch_size
    epoch, position = divmod(micro_batch, per_epoch)
    order = torch.randperm(n_examples, generator=torch.Generator().manual_seed(seed * 100_003 + epoch))
    return order[position * batch_size:(position + 1) * batch_size].tolist()
