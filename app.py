"""The workbench's browser UI. It only wires widgets to the packages; no analysis lives here.

    python app.py                      # the embedded toy model on http://127.0.0.1:7860
    python app.py --model sdxl-turbo   # the real model (needs its weights and a GPU)

The entry: arguments, the model cache all sessions share (Workbench), and the page built from one module per
tab in ui/ over ui/common.py (errors, fields, sessions, Cancel, streaming).
"""

from __future__ import annotations

import argparse
import functools
import os
import threading
from pathlib import Path

import gradio as gr

import zoo  # noqa: F401 - registers the embedded models and worlds with the core (interp.embedded)
from interp.cli import DTYPES, add_dtype_argument, dtype_name, lm_dtype, t2i_dtype
from interp.models import ModelError, load_t2i
from ui.common import DEFAULT_PROMPT, USER_ERRORS, Number, Sessions, Slider, session_key, user_errors, whole_number
from ui.features import build_features_tab
from ui.flowlens import build_flowlens_tab
from ui.generate import build_generate_tab
from ui.lm_steer import build_lm_steer_tab
from ui.paint import build_paint_tab, parse_steps
from ui.riebench import build_riebench_tab
from ui.vcl import build_vcl_tab

# also the names tests and benchmarks import from app (the helpers live in ui/common.py and ui/paint.py)
__all__ = ["CSS", "Workbench", "build_ui", "main", "DEFAULT_PROMPT", "USER_ERRORS", "Number", "Slider",
           "parse_steps", "session_key", "user_errors", "whole_number"]
# Small generated images are shown scaled up with sharp pixels (the files served keep their exact size).
CSS = """
#image img, #heatmap img, #paint-original img, #paint-edited img, #paint-difference img, #paint-region img,
#paint-icon-image img, #riebench-gallery img { image-rendering: pixelated; }
#image img, #heatmap img { width: 100%; height: 100%; object-fit: contain; }
#paint-original img, #paint-edited img, #paint-difference img, #paint-region img, #paint-icon-image img {
  width: 100%; height: 100%; object-fit: contain; }
/* RIEBench's gallery: each caption under its square thumbnail, in at most two lines (Gradio lays captions
   over the bottom of the image, which hid what an edit did there) */
#riebench-gallery .thumbnail-item { aspect-ratio: auto; height: auto; display: flex; flex-direction: column; }
#riebench-gallery .thumbnail-item > img { aspect-ratio: 1 / 1; height: auto; flex: none; }
#riebench-gallery .caption-label { position: static; max-width: 100%; white-space: normal; overflow-wrap: anywhere;
  border: none; border-radius: 0; display: -webkit-box; -webkit-line-clamp: 2; -webkit-box-orient: vertical;
  padding-bottom: 0; margin-bottom: 4px; }
#riebench-gallery .grid-wrap { padding-top: 30px; }  /* the first row below the gallery's own label */
"""


class Workbench(Sessions):
    """What the UI serves: models loaded lazily, once, and shared read-only by every session (the sessions'
    folders and Cancel flags come from ui.common.Sessions). Each tab module's handlers take it as `bench`."""

    def __init__(self, model_name: str = "toy", data_dir: str | os.PathLike | None = None,
                 saes_dir: str | os.PathLike | None = None, dtype: str | None = None, lm_dtype: str = "float32"):
        super().__init__(data_dir)
        from interp.cli import parse_dtype

        self.model_name = model_name
        # dtypes of the shared models (app --dtype / --lm-dtype): the pipeline's (None: load_t2i's default for the
        # device) and every language model's; checked here, shown in the page's header
        self.dtype = dtype and dtype_name(parse_dtype(dtype))
        self.lm_dtype = dtype_name(parse_dtype(lm_dtype))
        self.saes_dir = Path(saes_dir) if saes_dir else None  # None: the SAEs shipped for the model
        self._lock = threading.Lock()
        self._lms: dict[str, object] = {}

    @functools.cached_property
    def t2i(self):
        with self._lock:
            return load_t2i(self.model_name, dtype=t2i_dtype(self.dtype))

    @functools.cached_property
    def library(self):
        from saes.library import FeatureLibrary

        if self.saes_dir is not None:
            return FeatureLibrary(self.saes_dir)
        return FeatureLibrary.for_model(self.model_name)

    @functools.cached_property
    def analysis_images(self):
        from saes.library import PRETRAINED_DIR
        from saes.pool import load_analysis_images

        return load_analysis_images(self.saes_dir or PRETRAINED_DIR / self.model_name)

    def require_library(self):
        if self.library is None:
            raise gr.Error(f"no SAEs are available for {self.model_name}: train them with `python -m saes train`")
        return self.library

    @staticmethod
    def chat_models() -> list[str]:
        """The embedded chat models and every fetched registry model (SmolLM2 once fetched)."""
        from interp.models.lm import available_lms

        return available_lms()

    def known_lm(self, name: str) -> str:
        if name not in self.chat_models():
            from interp.models.fetch import REGISTRY_MODELS, fetch_command_for
            from interp.models.spec import model_spec

            if model_spec(name).source == "registry":  # a model the app knows, not fetched here: how to fetch it
                raise ValueError(f"{name} is not fetched on this machine: run `{fetch_command_for(name)}` (once, "
                                 f"{REGISTRY_MODELS[name].download_mb} MB from PyPI) and restart the app to use it")
            raise ValueError(f"unknown model {name!r}; the language models here are: "
                             f"{', '.join(self.chat_models()) or 'none'}")
        return name

    def lm(self, name: str):
        """A language model for analysis, loaded once and shared read-only (never trained in place)."""
        from interp.models.lm import load_lm

        self.known_lm(name)
        with self._lock:
            if name not in self._lms:
                self._lms[name] = load_lm(name, dtype=lm_dtype(self.lm_dtype))
        return self._lms[name]


def build_ui(bench: Workbench) -> gr.Blocks:
    blocks = list(bench.t2i.blocks)
    library_blocks = bench.library.blocks if bench.library is not None else []
    with gr.Blocks(title="Interpretability workbench") as demo:
        gr.Markdown("# Interpretability workbench\nOpen up text-to-image diffusion models and language models: "
                    "capture, train sparse autoencoders, edit by features, analyse residual geometry. "
                    f"Model: **{bench.model_name}** ({len(blocks)} hookable blocks; SAEs on "
                    f"{', '.join(library_blocks) or 'none'}), in {dtype_name(bench.t2i.denoiser.dtype)}; "
                    f"language models in {bench.lm_dtype}.")
        with gr.Tabs() as tabs:
            generate = build_generate_tab(bench)
            build_paint_tab(bench)
            features = build_features_tab(bench, demo)
            build_riebench_tab(bench)
            build_flowlens_tab(bench)
            build_vcl_tab(bench)
            build_lm_steer_tab(bench)
        # the one link between tabs: a feature of the generated image opens its card in the Features tab
        generate.open_button.click(features.open_feature,
                                   inputs_kwargs={"choice": generate.feature_choice, **features.open_inputs},
                                   outputs=[tabs, *features.open_outputs], api_name=False)
        demo.unload(bench.end_session)
    return demo


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default=os.environ.get("WORKBENCH_MODEL", "toy"),
                        help="toy (embedded, default), sdxl-turbo, sdxl-base, a hub id or a directory")
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
    args = parser.parse_args(argv)
    try:
        bench = Workbench(args.model, args.data_dir, args.saes, dtype=args.dtype, lm_dtype=args.lm_dtype)
    except ValueError as err:  # WORKBENCH_DTYPE / WORKBENCH_LM_DTYPE are not checked by argparse's choices
        raise SystemExit(f"error: {err}") from None
    try:
        bench.t2i  # load before serving: a missing model is reported here, not on the first click
    except ModelError as err:
        raise SystemExit(f"error: {err}") from None
    try:
        bench.library  # a bad --saes directory is reported here too
    except ValueError as err:
        raise SystemExit(f"error: {err}") from None
    demo = build_ui(bench)
    demo.queue(default_concurrency_limit=2, max_size=64)
    demo.launch(server_name=args.host, server_port=args.port, share=args.share, show_error=False,
                max_file_size="5mb", css=CSS)


if __name__ == "__main__":
    main()
