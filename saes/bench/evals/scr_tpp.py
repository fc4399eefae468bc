"""`scr` and `tpp`: SAEBench's spurious correlation removal and targeted probe perturbation evals; the method and
the offline dataset are saes/bench/scr_tpp.py's.

--dataset FILE: JSONL of Dolly records (instruction, category) or {"text", "label"} records; or `chat_world_task`:
the chat world's general task types (zoo.chat.world, 200 prompts of each, built offline; the toy chat model's data).
Options (--option key=value): train_set_size, test_set_size, n_values (JSON list), probe_epochs,
scr_pairs (JSON list of [class A, class B]), tpp_classes (JSON list), llm_batch_size."""

from __future__ import annotations

from pathlib import Path

from ..registry import BenchOptions, EvalResult, EvalType, register_eval
from ..scr_tpp import (EVAL_TYPE_ID_SCR, EVAL_TYPE_ID_TPP, ScrTppConfig, ScrTppError, check_inputs, read_labelled,
                       run_scr, run_tpp)

OPTIONS = ("train_set_size", "test_set_size", "n_values", "probe_epochs", "scr_pairs", "tpp_classes",
           "llm_batch_size")


CHAT_WORLD = "chat_world_task"
CHAT_TASKS = ("add", "copy", "reverse", "max", "fact")
CHAT_DEFAULTS = {"scr_pairs": [["add", "copy"], ["max", "reverse"]], "tpp_classes": list(CHAT_TASKS)}


def chat_world_records(per_task: int = 200, seed: int = 0) -> list[tuple[str, str]]:
    """(prompt, task type) of the chat world's general tasks, the held-out split's wordings excluded."""
    import random

    from zoo.chat.world import general_example, knowledge_base

    rng, kb = random.Random(seed), knowledge_base()
    return [(general_example(rng, "train", kb, task)["prompt"], task) for task in CHAT_TASKS for _ in range(per_task)]


def records_of(options: BenchOptions) -> list[tuple[str, str]]:
    return chat_world_records() if options.dataset == CHAT_WORLD else read_labelled(options.dataset)


def _names(value, key: str, pairs: bool = False) -> list:
    if pairs:
        ok = isinstance(value, list) and value and all(
            isinstance(p, list) and len(p) == 2 and all(isinstance(c, str) and c for c in p) for p in value)
        if not ok:
            raise ScrTppError(f"option {key} must be a JSON list of [class A, class B] pairs, got {value!r}")
        return [list(p) for p in value][:16]
    if not (isinstance(value, list) and 2 <= len(value) <= 64 and all(isinstance(c, str) and c for c in value)):
        raise ScrTppError(f"option {key} must be a JSON list of 2 to 64 class names, got {value!r}")
    return list(value)


def config_of(options: BenchOptions) -> tuple[ScrTppConfig, str]:
    if not options.dataset:
        raise ScrTppError("scr and tpp need --dataset FILE: labelled JSONL (Dolly records or {text, label}), "
                          "e.g. ../shared/data/dolly-sample.jsonl")
    name = Path(options.dataset).stem
    defaults = ScrTppConfig()
    chat = options.dataset == CHAT_WORLD
    pairs = _names(options.get("scr_pairs", CHAT_DEFAULTS["scr_pairs"] if chat else
                               defaults.column1_vals_lookup["dolly-sample"]), "scr_pairs", pairs=True)
    config = ScrTppConfig(
        random_seed=options.seed, dataset_names=[name], model_name=options.model_name, llm_dtype=options.dtype,
        train_set_size=options.get_int("train_set_size", defaults.train_set_size, 8, 100_000),
        test_set_size=options.get_int("test_set_size", defaults.test_set_size, 4, 100_000),
        probe_epochs=options.get_int("probe_epochs", defaults.probe_epochs, 1, 10_000),
        llm_batch_size=options.get_int("llm_batch_size", defaults.llm_batch_size, 1, 4096),
        n_values=list(options.get_ints("n_values", tuple(defaults.n_values), 1, 1 << 20)),
        column1_vals_lookup={name: pairs},
        tpp_classes=_names(options.get("tpp_classes", CHAT_DEFAULTS["tpp_classes"] if chat else defaults.tpp_classes),
                           "tpp_classes"))
    config.check()
    return config, name


def check(sae, model, options: BenchOptions) -> None:
    config, _ = config_of(options)
    check_inputs(sae, model, options.hook, config)
    records_of(options)


def _runner(fn, label):
    def run(sae, model, options: BenchOptions) -> EvalResult:
        import sys

        config, name = config_of(options)
        say = (lambda message: print(f"{label}: {message}", file=sys.stderr)) if options.progress else None
        metrics, details = fn(sae, model, options.hook, records_of(options), config, progress=say,
                              dataset_name=name)
        return EvalResult(config=config.as_dict(), metrics=metrics, details=details,
                          unstructured={"dataset": str(options.dataset)})
    return run


register_eval(EvalType(name="scr", eval_type_id=EVAL_TYPE_ID_SCR, run=_runner(run_scr, "scr"), check=check,
                       options=OPTIONS, description="spurious correlation removal (SAEBench's scr) on a planted "
                       "surface feature"))
register_eval(EvalType(name="tpp", eval_type_id=EVAL_TYPE_ID_TPP, run=_runner(run_tpp, "tpp"), check=check,
                       options=OPTIONS, description="targeted probe perturbation (SAEBench's tpp)"))
