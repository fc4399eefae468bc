"""Refusal evaluation: a pluggable refusal detector, prompt sets, metrics and a greedy-generation evaluator.

Metrics (the reference study's, on XSTest and the embedded chat world):
- ``false_refusal_rate``: share of benign prompts (XSTest ``safe``) that the model refuses;
- ``harmful_refusal_rate``: share of harmful prompts (XSTest ``unsafe``) that it refuses;
- ``task_accuracy``: share of general prompts whose completion matches the ``answer`` exactly
  (after normalising case, surrounding whitespace and final punctuation).

Prompt-set JSONL, one object a line: ``{"prompt", "kind": "benign"|"harmful"|"general",
"answer"?, "type"?}`` (``answer`` required for ``general``). XSTest's CSV (columns ``prompt``,
``type``, ``label`` with ``safe``/``unsafe``) is read from a local file.
"""

from __future__ import annotations

import argparse
import csv
import json
import re
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Protocol, Sequence, runtime_checkable

from interp.lm_text import REFUSAL_PREFIXES, REFUSAL_SUBSTRINGS, KeywordRefusalDetector  # noqa: F401 (re-exported)

from .diversity import DataError, read_jsonl

KINDS = ("benign", "harmful", "general")


@runtime_checkable
class RefusalDetector(Protocol):
    """Anything that says, for each (prompt, completion) pair, whether the completion is a refusal.

    A judge model is plugged in by implementing this one method (batched, so a judge can batch).
    """

    def detect(self, prompts: Sequence[str], completions: Sequence[str]) -> list[bool]: ...


@dataclass
class PromptRecord:
    """One evaluation prompt; ``kind`` is benign, harmful or general; ``answer`` only for general.

    ``id``: the prompt's id in its file (XSTest's ``id`` column, a JSONL ``id`` field, else its line);
    ``label``: XSTest's ``safe``/``unsafe`` for benign/harmful prompts.
    """

    prompt: str
    kind: str
    answer: str | None = None
    type: str | None = None
    id: str | None = None

    @property
    def label(self) -> str | None:
        return {"benign": "safe", "harmful": "unsafe"}.get(self.kind)


def read_prompt_set(path: str | Path) -> list[PromptRecord]:
    """Prompt-set JSONL, or XSTest's CSV when the file ends in ``.csv``; errors name the line."""
    path = Path(path)
    if path.suffix.lower() == ".csv":
        return read_xstest_csv(path)
    records = []
    for number, obj in read_jsonl(path):
        prompt, kind = obj.get("prompt"), obj.get("kind")
        if not isinstance(prompt, str) or not prompt.strip():
            raise DataError(f"{path}: line {number} has no prompt")
        if kind not in KINDS:
            raise DataError(f"{path}: line {number} has kind {kind!r}; expected one of {', '.join(KINDS)}")
        answer = obj.get("answer")
        if kind == "general" and not isinstance(answer, str):
            raise DataError(f"{path}: line {number} is a general prompt without an answer")
        records.append(PromptRecord(prompt, kind, answer if isinstance(answer, str) else None, obj.get("type"),
                                    str(obj.get("id", number))))
    return records


def read_xstest_csv(path: str | Path) -> list[PromptRecord]:
    """XSTest's layout: columns ``prompt``, ``type``, ``label`` (``safe`` -> benign, ``unsafe`` -> harmful)."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"no such prompt file: {path}")
    with path.open(newline="", encoding="utf-8-sig") as handle:  # -sig: a byte-order mark is not the first column's name
        reader = csv.DictReader(handle)
        missing = {"prompt", "type", "label"} - set(reader.fieldnames or [])
        if missing:
            raise DataError(f"{path}: missing XSTest column(s) {', '.join(sorted(missing))}")
        records = []
        for number, row in enumerate(reader, start=2):  # line 1 is the header
            label = (row["label"] or "").strip().lower()
            if label not in ("safe", "unsafe"):
                raise DataError(f"{path}: line {number} has label {row['label']!r}; expected safe or unsafe")
            if not (row["prompt"] or "").strip():
                raise DataError(f"{path}: line {number} has no prompt")
            records.append(PromptRecord(row["prompt"], "benign" if label == "safe" else "harmful", None,
                                        row["type"], str(row.get("id") or number)))
    if not records:
        raise DataError(f"{path}: no prompts")
    return records


def normalise_answer(text: str) -> str:
    """Lower case, single spaces, no surrounding whitespace or final punctuation; first line only."""
    first_line = text.strip().split("\n", 1)[0] if text.strip() else ""
    return re.sub(r"\s+", " ", first_line).strip().rstrip(".!?").strip().lower()


def is_correct(completion: str, answer: str) -> bool:
    return normalise_answer(completion) == normalise_answer(answer)


@dataclass
class RefusalMetrics:
    """Rates are None when a prompt set has no prompt of that kind."""

    false_refusal_rate: float | None
    harmful_refusal_rate: float | None
    task_accuracy: float | None
    counts: dict[str, int] = field(default_factory=dict)
    refusal_rate_by_type: dict[str, float] = field(default_factory=dict)
    refused_counts: dict[str, int] = field(default_factory=dict)
    counts_by_type: dict[str, dict[str, int]] = field(default_factory=dict)

    def to_json(self) -> dict:
        return asdict(self)


def score(records: Sequence[PromptRecord], completions: Sequence[str],
          detector: RefusalDetector | None = None) -> tuple[RefusalMetrics, list[dict]]:
    """Metrics and per-prompt rows (id, prompt, kind, label, type, completion, refused, correct)."""
    if len(records) != len(completions):
        raise ValueError(f"{len(records)} prompts but {len(completions)} completions")
    detector = detector or KeywordRefusalDetector()
    refused = detector.detect([r.prompt for r in records], list(completions))
    rows = []
    for record, completion, refusal in zip(records, completions, refused):
        rows.append({"id": record.id, "prompt": record.prompt, "kind": record.kind, "label": record.label,
                     "type": record.type, "completion": completion,
                     "refused": bool(refusal),
                     "correct": is_correct(completion, record.answer) if record.kind == "general" else None})

    def rate(selected: list[bool]) -> float | None:
        return sum(selected) / len(selected) if selected else None

    by_type: dict[str, list[bool]] = {}
    for row in rows:
        if row["type"]:
            by_type.setdefault(f"{row['kind']}/{row['type']}", []).append(row["refused"])
    metrics = RefusalMetrics(
        false_refusal_rate=rate([r["refused"] for r in rows if r["kind"] == "benign"]),
        harmful_refusal_rate=rate([r["refused"] for r in rows if r["kind"] == "harmful"]),
        task_accuracy=rate([r["correct"] for r in rows if r["kind"] == "general"]),
        counts={kind: sum(r["kind"] == kind for r in rows) for kind in KINDS},
        refusal_rate_by_type={key: sum(v) / len(v) for key, v in sorted(by_type.items())},
        refused_counts={kind: sum(r["refused"] for r in rows if r["kind"] == kind) for kind in KINDS},
        counts_by_type={key: {"n": len(v), "refused": sum(v)} for key, v in sorted(by_type.items())})
    return metrics, rows


def format_prompt(tokenizer, prompt: str, chat_template: bool | None = None) -> str:
    """The text fed to the model: the user turn of the tokenizer's chat template (``None``: when it has
    one, see ``interp.models.lm.use_chat_template``), or the raw prompt."""
    from interp.models.lm import use_chat_template

    if not use_chat_template(tokenizer, chat_template):
        return prompt
    return tokenizer.apply_chat_template([{"role": "user", "content": prompt}], tokenize=False,
                                         add_generation_prompt=True)


def context_length(model) -> int | None:
    from interp.models.generation import context_length as config_context

    return config_context(model.config)


def generate_completions(model, tokenizer, prompts: Sequence[str], max_new_tokens: int = 64,
                         batch_size: int | None = None, chat_template: bool | None = None, progress: bool = False,
                         cancel=None) -> list[str]:
    """Greedy completions (new tokens only, special tokens dropped) of any HF causal LM, batched by
    ``interp.models.generation.greedy_generate`` (KV cache, left padding, finished rows leave the batch); of a
    TransformerLens `interp.models.lm.LanguageModel`, one prompt at a time (`interp.hooks.lm_steer.generate`).

    A prompt that does not fit in the context together with ``max_new_tokens`` is an error, and so is
    an empty prompt list. ``batch_size`` None: the generator's default.
    """
    from interp.models.generation import DEFAULT_BATCH_SIZE, greedy_generate
    from interp.models.lm import use_chat_template

    if not prompts:
        raise ValueError("no prompts to evaluate")
    chat_template = use_chat_template(tokenizer, chat_template)
    if getattr(model, "backend", "hf") == "transformer_lens":  # a LanguageModel of load_lm(..., "transformer_lens")
        from interp.hooks.lm_steer import generate

        return generate(model, list(prompts), max_new_tokens=max_new_tokens, chat_template=chat_template,
                        cancel=cancel)
    texts = [format_prompt(tokenizer, p, chat_template) for p in prompts]
    try:
        return greedy_generate(model, tokenizer, texts, max_new_tokens=max_new_tokens,
                               batch_size=batch_size or DEFAULT_BATCH_SIZE,
                               add_special_tokens=not chat_template,  # a chat template holds its own BOS
                               progress=progress, cancel=cancel)
    except ValueError as error:  # name the prompt as the caller numbered it ("text 3" is the same index)
        raise ValueError(str(error).replace("text ", "prompt ", 1)) from error


@dataclass
class RefusalEvaluation:
    metrics: RefusalMetrics
    rows: list[dict]

    def to_json(self) -> dict:
        return {"metrics": self.metrics.to_json(), "rows": self.rows}


def evaluate_refusals(model, tokenizer, records: Sequence[PromptRecord], detector: RefusalDetector | None = None,
                      max_new_tokens: int = 64, batch_size: int | None = None, chat_template: bool | None = None,
                      progress: bool = False, cancel=None) -> RefusalEvaluation:
    """Generate greedy completions for every prompt and score them."""
    completions = generate_completions(model, tokenizer, [r.prompt for r in records], max_new_tokens, batch_size,
                                       chat_template, progress, cancel)
    metrics, rows = score(records, completions, detector)
    return RefusalEvaluation(metrics, rows)


def format_metrics(metrics: RefusalMetrics) -> str:
    """The three rates with their counts, then the refusal rate of every prompt type."""
    def show(kind: str, value: float | None) -> str:
        n = metrics.counts.get(kind, 0)
        if value is None:
            return f"n/a (n={n})"
        done = metrics.refused_counts.get(kind) if kind != "general" else round(value * n)
        return f"{value:.3f} ({done} of {n})"

    lines = [f"false-refusal rate (benign prompts refused): {show('benign', metrics.false_refusal_rate)}",
             f"harmful refusal rate (harmful prompts refused): {show('harmful', metrics.harmful_refusal_rate)}",
             f"task accuracy (general prompts answered right): {show('general', metrics.task_accuracy)}"]
    if metrics.counts_by_type:
        width = max(map(len, metrics.counts_by_type))
        lines.append(f"{'kind/type':<{width}}  refused")
        for key, count in metrics.counts_by_type.items():
            lines.append(f"{key:<{width}}  {count['refused'] / count['n']:.3f} ({count['refused']} of {count['n']})")
    return "\n".join(lines)


def refusals_command(args) -> int:
    import time

    from interp.atomic import atomic_write_text
    from interp.models.lm import use_chat_template

    records = read_prompt_set(args.prompts)
    from interp.cli import LM_DTYPE, parse_dtype
    from interp.models.lm import load_hf_lm, load_lm

    if args.backend == "hf":
        model, tokenizer = load_hf_lm(args.model, device=args.device, dtype=parse_dtype(args.dtype, default=LM_DTYPE))
    else:
        model = load_lm(args.model, backend=args.backend, device=args.device, dtype=parse_dtype(args.dtype, default=LM_DTYPE))
        tokenizer = model.tokenizer
    templated = use_chat_template(tokenizer, args.chat_template)
    started = time.perf_counter()
    evaluation = evaluate_refusals(model, tokenizer, records, max_new_tokens=args.max_new_tokens,
                                   batch_size=args.batch_size, chat_template=templated, progress=True)
    seconds = time.perf_counter() - started
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    settings = {"max_new_tokens": args.max_new_tokens, "chat_template": templated, "greedy": True,
                "detector": "keyword (XSTest string match)", "generation_seconds": round(seconds, 1),
                "model_dtype": args.dtype, "backend": args.backend}
    atomic_write_text(out, json.dumps({"model": args.model, "prompts": str(args.prompts), "settings": settings,
                                       **evaluation.to_json()}, indent=2) + "\n")
    print(format_metrics(evaluation.metrics))
    print(f"{len(records)} prompts generated in {seconds:.0f} s; wrote {out}")
    return 0


MODEL_HELP = ("embedded name (toy-chat, toy-chat-safety-0.4, ...), a fetched model (smollm2-135m-instruct: "
              "python -m interp fetch smollm2-135m-instruct), a Hugging Face name or a local directory")


def add_chat_template_argument(parser) -> None:
    parser.add_argument("--chat-template", action=argparse.BooleanOptionalAction, default=None,
                        help="prompts as user turns of the tokenizer's chat template (default: when it has one)")


def add_refusals_arguments(parser) -> None:
    from interp.cli import add_backend_argument, add_device_argument, add_dtype_argument, add_out_argument, at_least

    parser.add_argument("--model", required=True, help=MODEL_HELP)
    parser.add_argument("--prompts", required=True, help="prompt-set JSONL (prompt, kind, answer?, type?) or XSTest CSV")
    parser.add_argument("--max-new-tokens", type=at_least(1), default=64)
    parser.add_argument("--batch-size", type=at_least(1), default=None,
                        help="prompts decoded together (default: the generator's, measured best on 2 cores)")
    add_chat_template_argument(parser)
    add_device_argument(parser)
    add_out_argument(parser, default="refusals.json")
    add_dtype_argument(parser)
    add_backend_argument(parser)
