"""`saes bench`: SAEBench's evals on a CPU, one SAEBench JSON per SAE and eval type.

    python -m saes bench --sae saes/pretrained/toy-chat/blocks.1.hook_resid_post --model toy-chat \\
        --evals core,sparse_probing --out runs/saebench --n-tokens 20000

Order of work, so that bad input writes nothing: the eval names, the SAEs, each eval type's kinds against each
SAE's and the model's, the model, the SAE's hook and width in it, each eval type's own `check`; then every eval
runs; then every result is wrapped in SAEBench's envelope and validated; only then is anything written.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

from .registry import LIMITS, BenchOptions, check_kinds, parse_evals
from .schema import envelope, result_path, validate, schemas, write_result


def _load_model(name: str, kind: str, options: BenchOptions):
    from interp.cli import LM_DTYPE, parse_dtype
    from interp.models.spec import model_spec

    if kind == "lm":
        from interp.models.lm import load_lm

        return load_lm(name, backend="hf", device=options.device, dtype=parse_dtype(options.dtype, default=LM_DTYPE))
    return model_spec(name).load()


def check_lm_hook(sae, lm, hook: str) -> None:
    """The model has the SAE's hook and the SAE reads the model's width there: one clear line otherwise."""
    from interp.hooks.lm import check_hooks

    from ..lm_eval import check_sae_for_model

    check_hooks(lm, [hook])
    check_sae_for_model(sae, lm, hook)


def prepare(sae_dirs, model_name: str, eval_names: str, options_for, progress: bool = False):
    """Everything checked before any eval runs: [(name, dir, sae, options)], the eval types, the model."""
    from interp.models.spec import model_spec, saved_kind

    from ..sae import SAE

    evals = parse_evals(eval_names)
    claimed = {key for e in evals for key in e.options}
    loaded = []
    for sae_dir in sae_dirs:
        sae = SAE.load(sae_dir)
        name = Path(sae_dir).resolve().name
        hook = sae.cfg.metadata.get("hook_name")
        if not hook:
            raise ValueError(f"the SAE at {sae_dir} does not name its hook (metadata.hook_name in cfg.json)")
        options = options_for(hook)
        unknown = sorted(set(options.extra) - claimed)
        if unknown:
            raise ValueError(f"--option {', '.join(unknown)} is read by none of the evals asked for "
                             f"({', '.join(e.name for e in evals)}); they read: {', '.join(sorted(claimed)) or 'none'}")
        loaded.append((name, Path(sae_dir), sae, options))
    model_kind = model_spec(model_name).kind
    for eval_type in evals:
        for name, sae_dir, sae, _ in loaded:
            check_kinds(eval_type, saved_kind(sae_dir), model_kind, f"the SAE at {sae_dir}", model_name)
    if model_kind == "lm":  # the hook and the width from the model's config, before its weights load
        described = model_spec(model_name).describe()
        for name, sae_dir, sae, options in loaded:
            if options.hook not in described["sites"]:
                raise ValueError(f"{model_name} has no hook {options.hook!r} (the SAE at {sae_dir} reads it); its "
                                 f"residual hooks are {described['sites'][0]} .. {described['sites'][-1]}")
            if sae.cfg.d_in != described["d_model"]:
                raise ValueError(f"the SAE at {sae_dir} reads d_in={sae.cfg.d_in} but {model_name} has "
                                 f"d_model={described['d_model']} at {options.hook}: it was trained on another model")
    model = _load_model(model_name, model_kind, loaded[0][3])
    for name, sae_dir, sae, options in loaded:
        if model_kind == "lm":
            check_lm_hook(sae, model, options.hook)
        recorded = sae.cfg.metadata.get("model_name")
        if recorded and recorded != model_name:
            print(f"note: the SAE at {sae_dir} was trained on {recorded}; measuring it on {model_name}",
                  file=sys.stderr)
        for eval_type in evals:
            if eval_type.check is not None:
                eval_type.check(sae, model, options)
    return loaded, evals, model


def run_bench(sae_dirs, model_name: str, eval_names: str, out_dir, options_for, overwrite: bool = False,
              progress: bool = False) -> list[tuple[Path, dict]]:
    """Run, validate, then write; returns [(path, result)]. `options_for(hook)` -> BenchOptions."""
    loaded, evals, model = prepare(sae_dirs, model_name, eval_names, options_for, progress)
    if not overwrite:
        from interp.shipped import refuse_shipped

        refuse_shipped([result_path(out_dir, name, e.name) for name, *_ in loaded for e in evals], "saes bench")
    try:
        schemas()
        have_schemas = True
    except ImportError as err:
        print(f"note: {err}", file=sys.stderr)
        have_schemas = False
    results = []
    for name, sae_dir, sae, options in loaded:
        for eval_type in evals:
            start, cpu_start = time.perf_counter(), time.process_time()
            outcome = eval_type.run(sae, model, options)
            seconds, cpu_seconds = time.perf_counter() - start, time.process_time() - cpu_start
            unstructured = outcome.unstructured if outcome.unstructured is not None else {}
            if isinstance(unstructured, dict):
                unstructured = {**unstructured, "wall_seconds": round(seconds, 3),
                                "cpu_seconds": round(cpu_seconds, 3), "sae_path": str(sae_dir),
                                "model": model_name, "hook": options.hook}
            result = envelope(eval_type.eval_type_id, outcome.config, outcome.metrics, outcome.details,
                              unstructured, sae=sae, sae_name=name, hook=options.hook, model_name=model_name)
            if have_schemas:
                validate(result)
            results.append((result_path(out_dir, name, eval_type.name), result))
            print(f"{eval_type.name} on {name}: {seconds:.1f} s wall, {cpu_seconds:.1f} s CPU", file=sys.stderr)
    written = []
    for path, result in results:
        written.append((write_result(path, result, overwrite=overwrite), result))
    return written


def add_bench_arguments(parser) -> None:
    from interp.cli import add_dtype_argument, add_out_argument, at_least

    parser.add_argument("--sae", required=True, nargs="+", help="SAE directories (sae-lens format, cfg.json inside)")
    parser.add_argument("--model", required=True, help="the model the SAEs read (e.g. toy-chat, smollm2-135m-instruct)")
    parser.add_argument("--evals", default="core,sparse_probing",
                        help="comma-separated eval types (default: core,sparse_probing)")
    add_out_argument(parser, default="runs/saebench",
                        help="output folder: <out>/<eval>/interp-workbench_<sae>_eval_results.json")
    parser.add_argument("--n-tokens", type=at_least(*LIMITS["n_tokens"]), default=20_000,
                        help="tokens of held-out text the core eval scores (default 20000)")
    parser.add_argument("--context", type=at_least(*LIMITS["context_size"]), default=128,
                        help="sequence length in tokens (default 128, SAEBench's)")
    parser.add_argument("--batch-size", type=at_least(*LIMITS["batch_size"]), default=8,
                        help="sequences per forward pass (default 8)")
    parser.add_argument("--text", default=None,
                        help="held-out text for the core eval (JSONL or lines); default: the eval's own")
    parser.add_argument("--dataset", default=None, help="labelled data for the probing evals (see docs/saebench.md)")
    parser.add_argument("--max-examples", type=at_least(*LIMITS["max_examples"]), default=2000,
                        help="at most this many labelled examples per dataset (default 2000)")
    parser.add_argument("--seed", type=at_least(*LIMITS["seed"]), default=42)
    parser.add_argument("--option", action="append", default=[], metavar="KEY=VALUE",
                        help="an eval type's own option (JSON value), e.g. --option ks=[1,2,5]")
    parser.add_argument("--threads", type=at_least(1, 256), default=2)
    add_dtype_argument(parser)


def bench_command(args) -> int:
    import torch

    from interp.cli import parse_options as _parse_options

    torch.set_num_threads(args.threads)
    extra = _parse_options(args.option)

    def options_for(hook: str) -> BenchOptions:
        return BenchOptions(hook=hook, model_name=args.model, n_tokens=args.n_tokens, context_size=args.context,
                            batch_size=args.batch_size, seed=args.seed, dataset=args.dataset, text=args.text,
                            max_examples=args.max_examples, dtype=args.dtype or "float32", extra=extra,
                            progress=True)

    written = run_bench(args.sae, args.model, args.evals, args.out, options_for, overwrite=args.overwrite,
                        progress=True)
    for path, result in written:
        headline = ", ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}"
                             for category in result["eval_result_metrics"].values()
                             for k, v in list(category.items())[:3] if isinstance(v, (int, float)))
        print(f"wrote {path}  ({result['eval_type_id']}: {headline})")
    return 0


__all__ = ["add_bench_arguments", "bench_command", "check_lm_hook", "prepare", "run_bench"]
