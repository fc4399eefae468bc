"""The workbench's browser UI. It only wires widgets to the packages; no analysis lives here.

    python app.py                      # the embedded toy model on http://127.0.0.1:7860
    python app.py --model sdxl-turbo   # the real model (needs its weights and a GPU)
    python app.py --lm DIR             # also a language model's directory in the LM tabs

The entry: arguments, checked before anything heavy is imported (a wrong one is said in a second or two, not after
the imports and loads), then the model cache all sessions share (ui.workbench.Workbench) and the page built from one
module per tab in ui/ over ui/common.py (errors, fields, sessions, Cancel, streaming).
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path

import zoo  # noqa: F401 - registers the embedded models and worlds with the core (interp.embedded); light
from interp.cli import DTYPES, add_dtype_argument

# the names tests and benchmarks import from app, served from the modules that hold them (imported on first use,
# so that `python app.py --bad-argument` answers before gradio, torch and the models are imported)
_FROM = {"Workbench": "ui.workbench", "build_ui": "ui.workbench", "CSS": "ui.workbench",
         "DEFAULT_PROMPT": "ui.common", "USER_ERRORS": "ui.common", "Number": "ui.common", "Slider": "ui.common",
         "session_key": "ui.common", "user_errors": "ui.common", "whole_number": "ui.common",
         "parse_steps": "ui.paint"}
__all__ = ["check_arguments", "main", *_FROM]


def __getattr__(name: str):
    if name in _FROM:
        import importlib

        return getattr(importlib.import_module(_FROM[name]), name)
    raise AttributeError(f"module 'app' has no attribute {name!r}")


def _saes(root: Path) -> list[Path]:
    """Each SAE directory (a cfg.json) at or one level under ``root``."""
    return [cfg.parent for cfg in [root / "cfg.json", *sorted(root.glob("*/cfg.json"))] if cfg.is_file()]


def check_arguments(args) -> None:
    """What can be checked by looking at files alone, before gradio, torch or a model is loaded: a ValueError
    with one line for the user (an LM where the image model goes, language-model SAEs for the image model, a
    missing directory, a bad dtype or port)."""
    from interp.models.spec import LM, model_spec, saved_hook_name, saved_kind

    for value, what in ((args.dtype, "--dtype / WORKBENCH_DTYPE"), (args.lm_dtype, "--lm-dtype / WORKBENCH_LM_DTYPE")):
        if value is not None and value not in DTYPES:  # by name: interp.cli.parse_dtype imports torch
            raise ValueError(f"{what}: unknown dtype {value!r}; use one of {', '.join(DTYPES)}")
    if not 0 <= args.port <= 65535:
        raise ValueError(f"--port {args.port} is not a port: use 1 to 65535 (0: any free port)")
    if os.path.isabs(args.model) or args.model.startswith((".", "~")):
        if not Path(args.model).expanduser().is_dir():
            raise ValueError(f"--model {args.model}: no such directory")
    for directory in args.lm or []:
        lm = model_spec(directory)
        if not Path(directory).expanduser().is_dir():
            raise ValueError(f"--lm {directory}: no such directory (--lm takes a language model's directory; the "
                             "embedded and fetched ones are listed already)")
        if not lm.is_lm:
            raise ValueError(f"--lm {directory} is not a language model's directory (it needs a config.json and no "
                             "model_index.json)" + ("; a text-to-image pipeline goes to --model"
                                                    if (Path(directory).expanduser() / "model_index.json").is_file()
                                                    else ""))
    if args.saes:
        root = Path(args.saes).expanduser()
        if not root.is_dir():
            raise ValueError(f"--saes {args.saes}: no such directory")
        saes = _saes(root)
        if not saes:
            raise ValueError(f"--saes {args.saes}: no SAE here (a directory with one SAE directory per block, each "
                             "with cfg.json and sae_weights.safetensors)")
        on_lm = [directory for directory in saes if saved_kind(directory) == LM]  # the hook each reads says
        if on_lm:
            directory, hook = on_lm[0], saved_hook_name(on_lm[0])
            raise ValueError(f"--saes {args.saes}: these are a language model's SAEs ({directory.name} reads {hook}); "
                             "--saes takes SAEs on the text-to-image model's blocks. The LM steering and Features "
                             "tabs find LM SAEs under saes/pretrained/ and $WORKBENCH_LM_SAES")
    # the model last: a name that is not a directory needs the pipelines' table (torch, diffusers)
    spec = model_spec(args.model)
    if spec.is_lm:
        found = ": config.json and no model_index.json" if spec.source == "directory" else ""
        where = f"pass it with --lm {args.model}" if spec.source == "directory" else "they list it already"
        raise ValueError(f"--model {args.model} is a language model ({spec.source}{found}); --model takes the "
                         "text-to-image pipeline. Language models go to the LM tabs (FlowLens, VCL fine-tuning, LM "
                         f"steering): {where}, and leave --model at toy or a pipeline")
    if spec.source == "directory" and not (Path(args.model).expanduser() / "model_index.json").is_file():
        raise ValueError(f"--model {args.model}: the directory has no model_index.json, so it is not a pipeline "
                         "saved with save_pretrained (nor a language model: no config.json)")
    if not spec.is_lm and spec.source == "hub":  # a name: one of the known pipelines or a hub id (owner/name)
        spec.locate()  # the one resolution: an unknown name is one line


def check_saes_fit(bench) -> None:
    """After the loads: every SAE of the library is on a block of the model (else each Generate failed with
    "unknown block")."""
    library = bench.library
    if library is None:
        return
    sites = set(bench.t2i.blocks) | set(getattr(bench.t2i, "text_sites", None) or ())
    foreign = [block for block in library.blocks if block not in sites]
    if foreign:
        raise ValueError(f"--saes: SAEs on {', '.join(foreign)}, which {bench.model_name} does not have (its blocks: "
                         f"{', '.join(sorted(sites))}); give the SAEs trained on this model")


def parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default=os.environ.get("WORKBENCH_MODEL", "toy"),
                        help="the text-to-image model: toy (embedded, default), sdxl-turbo, sdxl-base, a hub id or a "
                             "pipeline's directory")
    parser.add_argument("--lm", action="append", default=None, metavar="DIR",
                        help="a language model's directory (config.json) to offer in the LM tabs beside the embedded "
                             "and fetched ones; repeat for several")
    parser.add_argument("--host", default=os.environ.get("GRADIO_SERVER_NAME", "127.0.0.1"),
                        help="address to bind (default: this machine only; a Space sets GRADIO_SERVER_NAME)")
    parser.add_argument("--port", type=int, default=int(os.environ.get("GRADIO_SERVER_PORT", 7860)))
    parser.add_argument("--share", action="store_true", help="open a public Gradio link (off by default)")
    parser.add_argument("--data-dir", default=os.environ.get("WORKBENCH_DATA_DIR"),
                        help="where sessions write their runs (default: <temp>/interp-workbench)")
    parser.add_argument("--saes", default=None,
                        help="a directory with one SAE directory per block (sae-lens format) to use instead of "
                             "the SAEs shipped for the model (saes/pretrained/<model>/)")
    add_dtype_argument(parser, default=os.environ.get("WORKBENCH_DTYPE"), what="the text-to-image model")
    parser.add_argument("--lm-dtype", choices=DTYPES, default=os.environ.get("WORKBENCH_LM_DTYPE", "float32"),
                        help="dtype the language models run in (default float32; bfloat16: about 2x faster "
                             "generation on a CPU with AMX, docs/dtype.md)")
    return parser


def main(argv: list[str] | None = None) -> None:
    args = parser().parse_args(argv)
    try:
        check_arguments(args)  # before the heavy imports: a wrong argument is said at once
    except ValueError as err:
        raise SystemExit(f"error: {err}") from None
    from interp.models import ModelError
    from ui.workbench import CSS, Workbench, build_ui

    bench = Workbench(args.model, args.data_dir, args.saes, dtype=args.dtype, lm_dtype=args.lm_dtype,
                      lm_dirs=args.lm or ())
    try:
        bench.t2i  # load before serving: a missing model is reported here, not on the first click
        bench.library  # a bad --saes directory is reported here too
        check_saes_fit(bench)
    except (ModelError, ValueError) as err:
        raise SystemExit(f"error: {err}") from None
    demo = build_ui(bench)
    demo.queue(default_concurrency_limit=2, max_size=64)
    # the sessions' images are served from the data folder: a --data-dir outside the temp folder and the working
    # directory must be allowed, or every image failed with a blank error
    demo.launch(server_name=args.host, server_port=args.port, share=args.share, show_error=False,
                max_file_size="5mb", css=CSS, allowed_paths=[str(bench.data_dir)])


if __name__ == "__main__":
    main()
