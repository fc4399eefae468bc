"""SAEBench (sae-bench 0.6.0) evals on a CPU, in SAEBench's own JSON (docs/saebench.md).

    registry.py   EvalType / register_eval / eval_types: eval modules under saes/bench/evals register themselves
    schema.py     the output envelope, validation against the sae-bench wheel's JSON schemas, the writer
    run.py        `saes bench`: checks everything, runs, validates, then writes one JSON per SAE and eval
    evals/        one module per eval type (core, sparse_probing, ...)
"""

from .registry import BenchOptions, EvalResult, EvalType, eval_types, register_eval

__all__ = ["BenchOptions", "EvalResult", "EvalType", "eval_types", "register_eval"]
