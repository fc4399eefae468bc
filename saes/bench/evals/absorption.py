"""`absorption`: SAEBench's feature absorption eval (absorption_first_letter); the method is saes/bench/absorption.py.

Options (--option key=value): max_words (vocabulary words used; default 3000 on a CPU, `null`: all, as SAEBench),
max_k_value, f1_jump_threshold, k_sparse_probe_num_epochs, min_GT_probe_f1, min_feats_for_eval, llm_batch_size."""

from __future__ import annotations

from ..absorption import EVAL_TYPE_ID, AbsorptionConfig, AbsorptionRun, check_inputs, run_absorption
from ..registry import BenchOptions, EvalResult, EvalType, register_eval

DEFAULT_MAX_WORDS = 3000
OPTIONS = ("max_words", "max_k_value", "f1_jump_threshold", "k_sparse_probe_num_epochs", "min_GT_probe_f1",
           "min_feats_for_eval", "llm_batch_size")


def config_of(options: BenchOptions) -> AbsorptionConfig:
    max_words = options.get("max_words", DEFAULT_MAX_WORDS)
    if max_words is not None:
        max_words = options.get_int("max_words", DEFAULT_MAX_WORDS, 10, 200_000)
    config = AbsorptionConfig(
        model_name=options.model_name, random_seed=options.seed, llm_dtype=options.dtype, max_words=max_words,
        max_k_value=options.get_int("max_k_value", 10, 1, 64),
        f1_jump_threshold=options.get_float("f1_jump_threshold", 0.03, 0.0, 1.0),
        k_sparse_probe_num_epochs=options.get_int("k_sparse_probe_num_epochs", 50, 1, 10_000),
        min_GT_probe_f1=options.get_float("min_GT_probe_f1", 0.6, 0.0, 1.0),
        min_feats_for_eval=options.get_int("min_feats_for_eval", 20, 1, 26),
        llm_batch_size=options.get_int("llm_batch_size", 10, 1, 4096))
    config.check()
    return config


def check(sae, model, options: BenchOptions) -> None:
    config_of(options)
    check_inputs(sae, model, options.hook)


def run(sae, model, options: BenchOptions) -> EvalResult:
    import sys

    config = config_of(options)
    record = AbsorptionRun()
    say = (lambda message: print(f"absorption: {message}", file=sys.stderr)) if options.progress else None
    metrics, details = run_absorption(sae, model, options.hook, config, progress=say, run=record)
    unstructured = {"words_train": record.words_train, "words_test": record.words_test,
                    "probe_f1": record.probe_f1, "split_feats": record.split_feats}
    return EvalResult(config=config.as_dict(), metrics=metrics, details=details, unstructured=unstructured)


register_eval(EvalType(name="absorption", eval_type_id=EVAL_TYPE_ID, run=run, check=check, options=OPTIONS,
                       description="feature absorption on the first-letter task (SAEBench's absorption_first_letter)"))
