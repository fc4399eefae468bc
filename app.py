"""The workbench's browser UI. It only wires widgets to the packages; no analysis lives here.

    python app.py                      # the embedded toy model on http://127.0.0.1:7860
    python app.py --model sdxl-turbo   # the real model (needs its weights and a GPU)
"""

from __future__ import annotations

import argparse
import functools
import os
import threading

import gradio as gr
import numpy as np

from interp.models import ModelError, load_t2i

DEFAULT_PROMPT = "a small red circle at the top left and a large blue striped star in the center on a white background"
USER_ERRORS = (ValueError, KeyError, FileNotFoundError)  # ModelError, EditError, LibraryError... are ValueErrors


def user_errors(fn):
    """Show bad input as a message in the UI (never a stack trace); the app stays usable."""

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except gr.Error:
            raise
        except USER_ERRORS as err:
            raise gr.Error(str(err).strip("'\"")) from None

    return wrapper


def parse_steps(text: str, n_steps: int) -> list[int] | None:
    """'all' / '' -> None; '0,2-3' -> [0, 2, 3], each within the generation's steps."""
    text = (text or "").strip().lower()
    if text in ("", "all"):
        return None
    steps = set()
    for part in text.split(","):
        part = part.strip()
        lo, _, hi = part.partition("-")
        if not lo.isdigit() or (hi and not hi.isdigit()):
            raise ValueError(f"steps are numbers or ranges like '0,2-3' or 'all', not {part!r}")
        steps.update(range(int(lo), int(hi or lo) + 1))
    bad = [s for s in sorted(steps) if s >= n_steps]
    if bad:
        raise ValueError(f"step {bad[0]} is out of range: this generation has steps 0 to {n_steps - 1}")
    return sorted(steps)


class Workbench:
    """What the UI serves: models loaded lazily, once, and shared read-only by every session.
    Per-session results live in gr.State, never here."""

    def __init__(self, model_name: str = "toy"):
        self.model_name = model_name
        self._lock = threading.Lock()

    @functools.cached_property
    def t2i(self):
        with self._lock:
            return load_t2i(self.model_name)

    @functools.cached_property
    def library(self):
        from saes.library import FeatureLibrary

        return FeatureLibrary.for_model(self.model_name)

    @functools.cached_property
    def analysis_images(self):
        from saes.library import PRETRAINED_DIR, load_analysis_images

        return load_analysis_images(PRETRAINED_DIR / self.model_name)

    def require_library(self):
        if self.library is None:
            raise gr.Error(f"no SAEs are available for {self.model_name}: train them with `python -m saes train`")
        return self.library

    # ----- generate and explore -------------------------------------------------------------
    @staticmethod
    def _check_seed(seed) -> int:
        if seed is None or float(seed) < 0 or not float(seed).is_integer():
            raise ValueError("the seed must be a whole number, 0 or more")
        return int(seed)

    @user_errors
    def generate(self, prompt: str, steps: float, seed: float):
        steps, seed = int(steps or 0), self._check_seed(seed)
        image = self.t2i.generate(prompt, steps=steps, seed=seed)[0]
        return image, f"{self.model_name}, {steps} step(s), seed {seed}"

    @user_errors
    def explore(self, prompt: str, steps: float, seed: float):
        """Generate, then name the top SAE features of each block with their heatmaps."""
        steps, seed = int(steps or 0), self._check_seed(seed)
        info = f"{self.model_name}, {steps} step(s), seed {seed}"
        if self.library is None:
            image = self.t2i.generate(prompt, steps=steps, seed=seed)[0]
            return image, info, {}, gr.update(choices=[], value=None), None, ""
        image, tops = self.library.explain(self.t2i, prompt, seed=seed, steps=steps)
        state = {"image": np.asarray(image), "features": tops}
        choices = [self._feature_choice(b, f) for b, feats in tops.items() for f in feats]
        first = choices[0] if choices else None
        overlay, card = self.show_heatmap(state, first)
        return image, info, state, gr.update(choices=choices, value=first), overlay, card

    @staticmethod
    def _feature_choice(block: str, feature: dict) -> str:
        label = f" ({feature['label']})" if feature.get("label") else ""
        return f"{block} #{feature['id']}{label}"

    @staticmethod
    def _parse_choice(choice: str) -> tuple[str, int]:
        block, _, rest = choice.partition(" #")
        return block, int(rest.split(" ")[0])

    def show_heatmap(self, state: dict, choice: str | None):
        """Switch the heatmap shown: no model work, from the session's state."""
        from saes.library import heatmap_overlay

        if not state or not choice:
            return None, ""
        block, feature_id = self._parse_choice(choice)
        feature = next(f for f in state["features"][block] if f["id"] == feature_id)
        card = self.library.card(block, feature_id)
        text = (f"**{block} feature {feature_id}**: {card.get('label') or 'unlabelled'}"
                + (f" (AUROC {card['auroc']:.2f})" if card.get("auroc") else "")
                + f"; activation here: max {feature['max']:.2f}, total {feature['total']:.1f}"
                + (f"; fires on {100 * card['frequency']:.2f}% of positions" if card.get("frequency") is not None else "")
                + ". Open it in the Features tab for its top images.")
        return heatmap_overlay(state["image"], feature["heatmap"]), text

    # ----- paint --------------------------------------------------------------------------------
    def feature_from(self, block: str, feature, search: str) -> int:
        library = self.require_library()
        if search and search.strip():
            hits = library.search(block, search)
            if not hits:
                raise ValueError(f"no feature of {block} has a label matching {search.strip()!r}")
            return hits[0]
        if feature is None or feature == "":
            raise ValueError("choose a feature by its id or search for a label")
        return library.check_feature(block, float(feature))

    @user_errors
    def paint(self, prompt: str, steps: float, seed: float, block: str, feature, search: str, strength: float,
              act_steps: str, region):
        steps, seed = int(steps or 0), self._check_seed(seed)
        self.t2i.check_request(steps)
        feature = self.feature_from(block, feature, search)
        mask = self._painted_mask(region)
        result = self.require_library().paint(self.t2i, prompt, seed, block, feature, float(strength), mask=mask,
                                              steps=steps, act_steps=parse_steps(act_steps, steps))
        where = "inside the painted region" if mask is not None else "everywhere"
        return (result.original, result.edited, result.difference,
                f"{block} feature {feature} at {strength:+g} x its mean activation, {where}, "
                f"steps {act_steps or 'all'}")

    def paint_benchmark_request(self) -> list:
        """A paint request for benchmarks/app.py (the first block, feature 0, everywhere)."""
        return [DEFAULT_PROMPT, 1, 0, self.require_library().blocks[0], 0, "", 2.0, "all", None]

    @staticmethod
    def _painted_mask(region) -> np.ndarray | None:
        """The painted strokes of an ImageEditor value as a boolean (H, W) mask; None if nothing is painted."""
        if region is None:
            return None
        layers = region.get("layers") if isinstance(region, dict) else None
        if not layers:
            return None
        painted = None
        for layer in layers:
            if layer is None:
                continue
            array = np.asarray(layer)
            alpha = array[..., 3] > 0 if array.ndim == 3 and array.shape[-1] == 4 else array.max(axis=-1) > 0
            painted = alpha if painted is None else painted | alpha
        return painted if painted is not None and painted.any() else None

    @user_errors
    def paint_canvas(self, prompt: str, steps: float, seed: float):
        """The image to paint on: the prompt's generation."""
        steps, seed = int(steps or 0), self._check_seed(seed)
        image = self.t2i.generate(prompt, steps=steps, seed=seed)[0]
        big = image.resize((image.width * 4, image.height * 4), 0)
        return {"background": big, "layers": [], "composite": big}

    @user_errors
    def feature_icon(self, block: str, feature, search: str, strength: float):
        feature = self.feature_from(block, feature, search)
        icon = self.require_library().feature_icon(self.t2i, block, feature, strength=max(1.0, abs(strength)))
        return icon, f"{block} feature {feature} alone, on an empty prompt"

    # ----- features -----------------------------------------------------------------------------
    @user_errors
    def feature_table(self, block: str, sort_by: str, search: str):
        library = self.require_library()
        cards = library.cards(block)
        if not cards:
            return [], f"{block} has no feature cards yet (`python -m saes features`)"
        if search and search.strip():
            ids = set(library.search(block, search))
            cards = [c for c in cards if c["id"] in ids]
        key = {"frequency": lambda c: -(c.get("frequency") or 0), "AUROC": lambda c: -(c.get("auroc") or 0),
               "mean activation": lambda c: -(c.get("mean_activation") or 0), "id": lambda c: c["id"]}[sort_by]
        rows = [[c["id"], c.get("label") or "", round(c.get("auroc") or 0, 3), round(c.get("frequency") or 0, 5),
                 round(c.get("mean_activation") or 0, 3)] for c in sorted(cards, key=key)]
        return rows, f"{len(rows)} feature(s) of {block}"

    @user_errors
    def feature_card(self, block: str, feature):
        from saes.library import heatmap_overlay

        library = self.require_library()
        feature = library.check_feature(block, float(feature) if feature not in (None, "") else None)
        card = library.card(block, feature)
        pool = self.analysis_images
        gallery = []
        for top in card.get("top_images", []):
            if pool is None:
                break
            images, prompts = pool
            gallery.append((heatmap_overlay(images[top["index"]], top["heatmap"]),
                            f"{prompts[top['index']]} (max {top['activation']:.2f})"))
        text = (f"### {block} feature {feature}\n**Label:** {card.get('label') or 'unlabelled'}"
                + (f" (AUROC {card['auroc']:.3f})" if card.get("auroc") else "")
                + (f"\n\n**Fires on** {100 * card['frequency']:.3f}% of positions; **mean activation when firing** "
                   f"{card['mean_activation']:.3f}" if card.get("frequency") is not None else ""))
        return text, gallery

    def select_row(self, block: str, evt: gr.SelectData):
        row = evt.row_value if hasattr(evt, "row_value") and evt.row_value else None
        feature = row[0] if row else evt.value
        return (feature, *self.feature_card(block, feature))


def build_ui(bench: Workbench) -> gr.Blocks:
    blocks = list(bench.t2i.blocks)
    library_blocks = bench.library.blocks if bench.library is not None else []
    default_block = library_blocks[-1] if library_blocks else None
    with gr.Blocks(title="Interpretability workbench") as demo:
        gr.Markdown("# Interpretability workbench\nOpen up text-to-image diffusion models and language models: "
                    "capture, train sparse autoencoders, edit by features, analyse residual geometry. "
                    f"Model: **{bench.model_name}** ({len(blocks)} hookable blocks; SAEs on "
                    f"{', '.join(library_blocks) or 'none'}).")
        with gr.Tab("Generate and explore", id="generate"):
            explore_state = gr.State({})
            with gr.Row():
                with gr.Column():
                    prompt = gr.Textbox(label="Prompt", value=DEFAULT_PROMPT, lines=2, max_length=2000,
                                        elem_id="prompt")
                    with gr.Row():
                        steps = gr.Number(label="Steps", value=bench.t2i.default_steps, precision=0, minimum=1,
                                          maximum=1000, elem_id="steps")
                        seed = gr.Number(label="Seed", value=0, precision=0, minimum=0, elem_id="seed")
                    run = gr.Button("Generate", variant="primary", elem_id="generate-button")
                    info = gr.Markdown(elem_id="generate-info")
                with gr.Column():
                    image = gr.Image(label="Image", type="pil", image_mode="RGB", elem_id="image", format="png",
                                     interactive=False, height=320)
                with gr.Column():
                    feature_choice = gr.Dropdown(label="Top features of this image (block #id)", choices=[],
                                                 elem_id="feature-choice")
                    heatmap = gr.Image(label="Heatmap", interactive=False, elem_id="heatmap", height=320)
                    feature_text = gr.Markdown(elem_id="feature-text")
            run.click(bench.explore, [prompt, steps, seed], [image, info, explore_state, feature_choice, heatmap,
                                                             feature_text], api_name="explore", concurrency_limit=2)
            feature_choice.change(bench.show_heatmap, [explore_state, feature_choice], [heatmap, feature_text],
                                  api_name=False, queue=False)
            gen_api = gr.Button(visible=False)
            gen_api.click(bench.generate, [prompt, steps, seed], [image, info], api_name="generate")

        with gr.Tab("Paint", id="paint"):
            gr.Markdown("Paint a region on the image, choose a feature and a strength (a multiple of the feature's "
                        "mean activation; negative removes it), and apply: original, edited and their difference.")
            with gr.Row():
                with gr.Column():
                    p_prompt = gr.Textbox(label="Prompt", value=DEFAULT_PROMPT, lines=2, max_length=2000,
                                          elem_id="paint-prompt")
                    with gr.Row():
                        p_steps = gr.Number(label="Steps", value=bench.t2i.default_steps, precision=0, minimum=1,
                                            elem_id="paint-steps")
                        p_seed = gr.Number(label="Seed", value=0, precision=0, minimum=0, elem_id="paint-seed")
                    load = gr.Button("Load image to paint on", elem_id="paint-load")
                    p_block = gr.Dropdown(label="Block", choices=library_blocks, value=default_block,
                                          elem_id="paint-block")
                    with gr.Row():
                        p_feature = gr.Number(label="Feature id", value=0, precision=0, minimum=0,
                                              elem_id="paint-feature")
                        p_search = gr.Textbox(label="…or search labels", placeholder="e.g. colour=red",
                                              elem_id="paint-search")
                    with gr.Row():
                        p_strength = gr.Slider(-1, 8, value=3, step=0.5, label="Strength (x mean activation)",
                                               elem_id="paint-strength")
                        p_act = gr.Textbox(label="Steps it acts on", value="all", elem_id="paint-act-steps")
                    with gr.Row():
                        apply = gr.Button("Apply", variant="primary", elem_id="paint-apply")
                        icon_btn = gr.Button("Feature icon", elem_id="paint-icon")
                with gr.Column():
                    region = gr.ImageEditor(label="Paint the region", type="numpy", elem_id="paint-canvas",
                                            brush=gr.Brush(default_size=24, colors=["#ff00ff"],
                                                           color_mode="fixed"),
                                            height=300, sources=(), transforms=())
            with gr.Row():
                original = gr.Image(label="Original", interactive=False, elem_id="paint-original")
                edited = gr.Image(label="Edited", interactive=False, elem_id="paint-edited")
                difference = gr.Image(label="Difference (x3)", interactive=False, elem_id="paint-difference")
                icon = gr.Image(label="Feature icon", interactive=False, elem_id="paint-icon-image")
            p_info = gr.Markdown(elem_id="paint-info")
            load.click(bench.paint_canvas, [p_prompt, p_steps, p_seed], [region], api_name="paint_canvas")
            apply.click(bench.paint, [p_prompt, p_steps, p_seed, p_block, p_feature, p_search, p_strength, p_act,
                                      region], [original, edited, difference, p_info], api_name="paint",
                        concurrency_limit=2)
            icon_btn.click(bench.feature_icon, [p_block, p_feature, p_search, p_strength], [icon, p_info],
                           api_name="feature_icon")

        with gr.Tab("Features", id="features"):
            with gr.Row():
                f_block = gr.Dropdown(label="Block", choices=library_blocks, value=default_block,
                                      elem_id="features-block")
                f_sort = gr.Radio(["AUROC", "frequency", "mean activation", "id"], value="AUROC", label="Sort by",
                                  elem_id="features-sort")
                f_search = gr.Textbox(label="Search labels", elem_id="features-search")
                f_show = gr.Button("Show", elem_id="features-show")
            f_summary = gr.Markdown(elem_id="features-summary")
            with gr.Row():
                table = gr.Dataframe(headers=["id", "label", "AUROC", "frequency", "mean activation"],
                                     interactive=False, elem_id="features-table", max_height=420)
                with gr.Column():
                    f_id = gr.Number(label="Feature id", precision=0, minimum=0, elem_id="features-id")
                    f_open = gr.Button("Open card", elem_id="features-open")
                    card_text = gr.Markdown(elem_id="feature-card")
                    gallery = gr.Gallery(label="Top images (heatmap in red)", columns=3, height=300,
                                         elem_id="feature-gallery")
            f_show.click(bench.feature_table, [f_block, f_sort, f_search], [table, f_summary], api_name="features",
                         queue=False)
            f_open.click(bench.feature_card, [f_block, f_id], [card_text, gallery], api_name="feature_card",
                         queue=False)
            table.select(bench.select_row, [f_block], [f_id, card_text, gallery], queue=False)
            demo.load(bench.feature_table, [f_block, f_sort, f_search], [table, f_summary], queue=False) \
                if default_block else None
    return demo


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default=os.environ.get("WORKBENCH_MODEL", "toy"),
                        help="toy (embedded, default), sdxl-turbo, sdxl-base, a hub id or a directory")
    parser.add_argument("--host", default=os.environ.get("GRADIO_SERVER_NAME", "127.0.0.1"),
                        help="address to bind (default: this machine only; a Space sets GRADIO_SERVER_NAME)")
    parser.add_argument("--port", type=int, default=int(os.environ.get("GRADIO_SERVER_PORT", 7860)))
    parser.add_argument("--share", action="store_true", help="open a public Gradio link (off by default)")
    args = parser.parse_args(argv)
    bench = Workbench(args.model)
    try:
        bench.t2i  # load before serving: a missing model is reported here, not on the first click
    except ModelError as err:
        raise SystemExit(f"error: {err}") from None
    demo = build_ui(bench)
    demo.queue(default_concurrency_limit=2, max_size=64)
    demo.launch(server_name=args.host, server_port=args.port, share=args.share, show_error=False,
                max_file_size="5mb")


if __name__ == "__main__":
    main()
