"""The "Paint" tab: add (or remove) one SAE feature inside a painted region while the image is generated.

Widgets (prompt, steps, seed, block, feature or a label search, strength, the steps it acts on, the painted
strokes) -> a boolean mask and `ui.common.generation_request` -> `saes.library.FeatureLibrary.paint` (original,
edited, difference) or `FeatureLibrary.feature_icon` (the feature alone on an empty prompt).
HTTP API: /paint, /paint_canvas, /feature_icon.
"""

from __future__ import annotations

import gradio as gr
import numpy as np

from ui.common import (DEFAULT_PROMPT, MAX_PROMPT_CHARS, NO_SAES_NOTE, ImageEditor, Number, Slider, Textbox, feature_id,
                       finite_number, generation_request, user_errors)


def build_paint_tab(bench) -> PaintTab:
    tab = PaintTab(bench)
    blocks = bench.library.blocks if bench.library is not None else []
    default_block = blocks[-1] if blocks else None
    with gr.Tab("Paint", id="paint") as paint_tab:
        gr.Markdown("Paint a region on the image, choose a feature and a strength (a multiple of the feature's "
                    "mean activation; negative removes it), and apply: original, edited and their difference. "
                    "Opening the tab loads the prompt's image to paint on; after changing the prompt, steps or "
                    "seed, click *Load image to paint on*. Painting nothing applies the feature everywhere."
                    + ("" if blocks else NO_SAES_NOTE.format(model=bench.model_name)))
        with gr.Row():
            with gr.Column():
                prompt = Textbox(label="Prompt", value=DEFAULT_PROMPT, lines=2, elem_id="paint-prompt",
                                    info=f"at most {MAX_PROMPT_CHARS} characters")
                with gr.Row():
                    steps = Number(label="Steps", value=bench.t2i.default_steps, minimum=1, elem_id="paint-steps")
                    seed = Number(label="Seed", value=0, minimum=0, elem_id="paint-seed")
                load = gr.Button("Load image to paint on", elem_id="paint-load")
                block = gr.Dropdown(label="Block", choices=blocks, value=default_block, elem_id="paint-block")
                with gr.Row():
                    # a feature that visibly paints (feature 0 of a block may change nothing)
                    feature = Number(label="Feature id", value=tab.default_paint_feature(default_block), minimum=0,
                                     elem_id="paint-feature")
                    search = Textbox(label="…or search labels", placeholder=f"e.g. {tab.example_label()}",
                                        elem_id="paint-search")
                with gr.Row():
                    # the browser sets a typed value outside the range to its nearest end: say so here,
                    # and the info line after Apply names the strength used
                    strength = Slider(-1, 8, value=3, step=0.5, label="Strength (x mean activation)",
                                      info="-1 to 8: a value typed outside is set to the nearest end",
                                      elem_id="paint-strength")
                    act_steps = Textbox(label="Steps it acts on", value="all", elem_id="paint-act-steps")
                with gr.Row():
                    apply = gr.Button("Apply", variant="primary", elem_id="paint-apply")
                    icon_button = gr.Button("Feature icon", elem_id="paint-icon")
                    stop = gr.Button("Cancel", elem_id="paint-cancel")
            with gr.Column():
                region = ImageEditor(label="Paint the region", type="numpy", elem_id="paint-canvas",
                                        brush=gr.Brush(default_size=24, colors=["#ff00ff"], color_mode="fixed"),
                                        height=300, sources=(), transforms=())
        with gr.Row():  # PNG: exact pixels, so original and edited compare exactly
            original = gr.Image(label="Original", interactive=False, elem_id="paint-original", format="png",
                                height=240)
            edited = gr.Image(label="Edited", interactive=False, elem_id="paint-edited", format="png", height=240)
            difference = gr.Image(label="Difference (x3)", interactive=False, elem_id="paint-difference",
                                  format="png", height=240)
            painted = gr.Image(label="Painted region", interactive=False, elem_id="paint-region", format="png",
                               image_mode="L", height=240)
            icon = gr.Image(label="Feature icon", interactive=False, elem_id="paint-icon-image", height=240)
        info = gr.Markdown(elem_id="paint-info")
        canvas = gr.State(None)  # (prompt, steps, seed) of the image loaded into the editor: its strokes belong to it
    # inputs by name: the handlers' parameters; each dict's order is the HTTP API's
    image = {"prompt": prompt, "steps": steps, "seed": seed}
    chosen = {"block": block, "feature": feature, "search": search, "strength": strength}
    # One ordered queue for both loads: a click right after opening the tab lands after the tab's own load,
    # never under it (a late load would replace the editor and drop strokes painted in between).
    loaded = load.click(tab.paint_canvas, inputs_kwargs=image, outputs=[region, info, canvas],
                        api_name="paint_canvas", concurrency_id="paint-canvas", concurrency_limit=1)
    # the first visit loads the image, so strokes always land on it
    paint_tab.select(tab.paint_canvas_if_empty, inputs_kwargs={**image, "region": region},
                     outputs=[region, info, canvas], api_name=False, concurrency_id="paint-canvas",
                     concurrency_limit=1)
    block.change(tab.default_paint_feature, inputs_kwargs={"block": block}, outputs=[feature], api_name=False,
                 queue=False)
    applied = apply.click(tab.paint, inputs_kwargs={**image, **chosen, "act_steps": act_steps, "region": region,
                                                    "canvas": canvas},
                          outputs=[original, edited, difference, painted, info], api_name="paint",
                          concurrency_limit=2)
    # a failed Apply clears the last result (another request's) and says why in the info line
    applied.failure(tab.failed, None, [original, edited, difference, painted, info], queue=False, api_name=False)
    drawn = icon_button.click(tab.feature_icon, inputs_kwargs=chosen, outputs=[icon, info], api_name="feature_icon")
    stop.click(bench.cancel("paint", "**Cancelled**"), None, [info], cancels=[loaded, applied, drawn],
               queue=False, api_name=False)
    return tab


MAX_STEPS_TEXT = 1000  # characters of the "Steps it acts on" field


def parse_steps(text: str, n_steps: int) -> list[int] | None:
    """The "Steps it acts on" field: 'all' / '' -> None; '0,2-3' -> [0, 2, 3], each within the generation's steps."""
    if text is not None and not isinstance(text, str):
        raise ValueError(f"steps it acts on: a text like '0,2-3' or 'all', not {type(text).__name__}")
    if len(text or "") > MAX_STEPS_TEXT:
        raise ValueError(f"steps it acts on: {len(text)} characters; the limit is {MAX_STEPS_TEXT}")
    text = (text or "").strip().lower()
    if text in ("", "all"):
        return None
    steps = set()
    for part in text.split(","):
        part = part.strip()
        lo, _, hi = part.partition("-")
        # ASCII digits only: str.isdigit() also takes '٣' (an Arabic-Indic 3) and '²', which int() reads or rejects
        if not (lo.isascii() and lo.isdigit()) or (hi and not (hi.isascii() and hi.isdigit())):
            raise ValueError(f"steps are numbers or ranges like '0,2-3' or 'all', not {part!r}")
        if hi and int(hi) < int(lo):
            raise ValueError(f"the step range {part!r} runs backwards: write it low to high ('{hi}-{lo}')")
        # bounded before the range is built: '0-99999999' once built a set of 10^8 steps (42 s, 6 GB)
        top = int(hi or lo)
        if top >= n_steps:
            raise ValueError(f"step {top} is out of range: this generation has steps 0 to {n_steps - 1}")
        steps.update(range(int(lo), top + 1))
    return sorted(steps)


class PaintTab:
    def __init__(self, bench):
        self.bench = bench

    @user_errors
    def paint(self, prompt: str, steps: float, seed: float, block: str, feature, search: str, strength: float,
              act_steps: str, region, request: gr.Request = None, progress=gr.Progress(), canvas=None):
        """Original, edited, difference and painted region; ``canvas``: (prompt, steps, seed) of the image the
        strokes were painted on (the page's state; None through the API, whose client sends its own region)."""
        try:
            return self._paint(prompt, steps, seed, block, feature, search, strength, act_steps, region, request,
                               progress, canvas)
        except BaseException as err:
            self.bench.record_failure(request, "paint", err)
            raise

    def failed(self, request: gr.Request = None):
        """After a failed or cancelled Apply: no images of an earlier request, and the reason."""
        return None, None, None, None, self.bench.failure_status(request, "paint")

    def _paint(self, prompt, steps, seed, block, feature, search, strength, act_steps, region, request, progress,
               canvas):
        bench = self.bench
        prompt, steps, seed = generation_request(prompt, steps, seed)
        bench.t2i.check_request(steps)
        feature = self.feature_from(block, feature, search)
        strength = finite_number(strength, "strength")
        if self._strokes_without_image(region):
            raise ValueError("click \"Load image to paint on\" first: the strokes need the image under them "
                             "(or paint nothing to apply the feature everywhere)")
        mask = self._painted_mask(region)
        if mask is not None and canvas is not None and tuple(canvas) != (prompt, steps, seed):
            loaded_prompt, loaded_steps, loaded_seed = canvas
            what = [f"the prompt ({self._short(loaded_prompt)!r})" if loaded_prompt != prompt else "",
                    f"{loaded_steps} steps" if loaded_steps != steps else "",
                    f"seed {loaded_seed}" if loaded_seed != seed else ""]
            raise ValueError("the strokes were painted on the image of another request (loaded with "
                             f"{', '.join(w for w in what if w)}): click \"Load image to paint on\" for this one "
                             "and paint the region again, so that it lies where you meant on this image")
        act = parse_steps(act_steps, steps)  # bounded and checked before the generation
        with bench.interruptible(request, "paint", progress):
            result = bench.require_library().paint(bench.t2i, prompt, seed, block, feature, float(strength),
                                                   mask=mask, steps=steps, act_steps=act)
        where = "inside the painted region" if mask is not None else "everywhere"
        images = {"original": result.original, "edited": result.edited, "difference": result.difference,
                  "region": self._region_image(mask, result.original)}
        return (*[bench.image_file(request, image, f"paint-{slot}") for slot, image in images.items()],
                f"{self._feature_name(block, feature)} at {strength:+g} x its mean activation, {where}, "
                f"steps {act_steps or 'all'}")

    def benchmark_request(self) -> list:
        """A paint request for benchmarks/app.py (the first block, feature 0, everywhere)."""
        return [DEFAULT_PROMPT, 1, 0, self.bench.require_library().blocks[0], 0, "", 2.0, "all", None]

    @user_errors
    def paint_canvas(self, prompt: str, steps: float, seed: float, request: gr.Request = None,
                     progress=gr.Progress()):
        """The image to paint on (the prompt's generation) and a line saying which it is."""
        prompt, steps, seed = generation_request(prompt, steps, seed)
        with self.bench.interruptible(request, "paint", progress):
            image = self.bench.t2i.generate(prompt, steps=steps, seed=seed)[0]
        big = image.resize((image.width * 4, image.height * 4), 0)
        return ({"background": big, "layers": [], "composite": big},
                f"Loaded {self._short(prompt)!r} ({steps} step{'s' * (steps != 1)}, seed {seed}): paint the region, "
                "then Apply.", (prompt, steps, seed))

    @staticmethod
    def _short(prompt: str) -> str:
        return prompt if len(prompt) <= 80 else prompt[:77] + "..."

    @user_errors
    def paint_canvas_if_empty(self, prompt: str, steps: float, seed: float, region, request: gr.Request = None,
                              progress=gr.Progress()):
        """The Paint tab opened: the image to paint on, unless one is loaded already (strokes kept)."""
        if isinstance(region, dict) and region.get("background") is not None:
            return gr.update(), gr.update(), gr.update()
        return self.paint_canvas(prompt, steps, seed, request, progress)

    @user_errors
    def feature_icon(self, block: str, feature, search: str, strength: float, request: gr.Request = None,
                     progress=gr.Progress()):
        bench = self.bench
        feature = self.feature_from(block, feature, search)
        strength = finite_number(strength, "strength")
        used = max(1.0, abs(strength))  # an icon draws the feature added, at least at its mean activation
        with bench.interruptible(request, "paint", progress):
            icon = bench.require_library().feature_icon(bench.t2i, block, feature, strength=used)
        note = "" if used == strength else f" (an icon adds the feature: strength {strength:g} is drawn as {used:g})"
        return (bench.image_file(request, icon, "paint-icon"),
                f"{self._feature_name(block, feature)} alone at {used:g} x its mean activation, on an empty "
                f"prompt{note}")

    # ----- the feature ----------------------------------------------------------------------------
    def feature_from(self, block: str, feature, search: str) -> int:
        library = self.bench.require_library()
        if search and search.strip():
            hits = library.search(block, search)
            if not hits:
                raise ValueError(f"no feature of {block} has a label matching {search.strip()!r}")
            return hits[0]
        if feature is None or feature == "":
            raise ValueError("choose a feature by its id or search for a label")
        return feature_id(library, block, feature)

    def labels_world(self):
        """The world the cards' labels are values of (a `GroundTruth`): the one whose captions the analysed image
        pool's prompts are (`interp.ground_truth.ground_truth_of`, as the labels were made), or None."""
        from interp.ground_truth import ground_truth_of

        pool = self.bench.analysis_images
        return ground_truth_of(pool[1]) if pool is not None else None

    def example_label(self) -> str:
        """A label to search for, as the search box's hint: one of the labels' world (`colour=red`)."""
        from interp.ground_truth import example_label

        truth = self.labels_world()
        return example_label(truth) if truth is not None else "attribute=value"

    def default_paint_feature(self, block: str | None) -> int:
        """The feature the Paint tab starts with: the block's best feature labelled with a value of its world's
        first key attribute (the shapes world's colour: it visibly changes what it is painted on), else its best
        labelled one, else the one firing most; 0 without cards."""
        from saes.library import label_rank

        library = self.bench.library
        cards = library.cards(block) if library is not None and block in library.blocks else []
        truth = self.labels_world() if cards else None
        key = f"{truth.key_attributes[0]}=" if truth is not None else None
        for keep in (lambda c: key is not None and (c.get("label") or "").startswith(key),
                     lambda c: bool(c.get("label"))):
            chosen = [c for c in cards if keep(c)]
            if chosen:  # best as the label search ranks: by causal label score where measured, else AUROC
                return min(chosen, key=label_rank)["id"]
        return max(cards, key=lambda c: c.get("frequency") or 0)["id"] if cards else 0

    def _feature_name(self, block: str, feature: int) -> str:
        """"<block> feature <id> (<label>)", and for a labelled feature its label's scores: AUROC (what its
        activation predicts) and, where measured, the causal label score (what painting it draws)."""
        from saes.library import label_scores

        library = self.bench.library
        card = (library.card(block, feature) or {}) if library is not None else {}
        scores = label_scores(card)
        return f"{block} feature {feature} ({card.get('label') or 'unlabelled'})" + (f" [{scores}]" if scores else "")

    # ----- the painted region ---------------------------------------------------------------------
    @staticmethod
    def _region_image(mask: np.ndarray | None, image: np.ndarray) -> np.ndarray:
        """The painted region at the image's size, as grey levels (255 = fully painted)."""
        from PIL import Image

        height, width = np.asarray(image).shape[:2]
        if mask is None:
            return np.full((height, width), 255, np.uint8)
        painted = Image.fromarray(np.asarray(mask, np.uint8) * 255)
        return np.asarray(painted.resize((width, height), Image.BOX))

    @staticmethod
    def _strokes_without_image(region) -> bool:
        """Strokes painted on the editor before an image was loaded into it (they would be read at the
        empty canvas's size, not the image's)."""
        return isinstance(region, dict) and region.get("background") is None and \
            PaintTab._painted_mask(region) is not None

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
