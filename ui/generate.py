"""The "Generate and explore" tab: a prompt's image and the SAE features that fire on it, with heatmaps.

Widgets (prompt, steps, seed) -> `ui.common.generation_request` -> `T2IModel.generate`, or
`saes.library.FeatureLibrary.explain` (the image and each block's top features) when the model has SAEs, shown
labelled and local features first (`FeatureLibrary.by_relevance`). "Open in the Features tab" (`open_feature`,
wired by app.py's build_ui to `FeaturesTab.open_feature`) shows the chosen feature's card there.
HTTP API: /explore and /generate (prompt, steps, seed).
"""

from __future__ import annotations

import gradio as gr
import numpy as np

from ui.common import DEFAULT_PROMPT, MAX_PROMPT_CHARS, Number, Textbox, feature_choice, generation_request, \
    parse_feature_choice, percent, user_errors


def build_generate_tab(bench) -> GenerateTab:
    tab = GenerateTab(bench)
    with gr.Tab("Generate and explore", id="generate"):
        explore_state = gr.State({})
        with gr.Row():
            with gr.Column():
                prompt = Textbox(label="Prompt", value=DEFAULT_PROMPT, lines=2, elem_id="prompt",
                                    info=f"at most {MAX_PROMPT_CHARS} characters")
                with gr.Row():
                    steps = Number(label="Steps", value=bench.t2i.default_steps, minimum=1, maximum=1000,
                                   elem_id="steps")
                    seed = Number(label="Seed", value=0, minimum=0, elem_id="seed")
                with gr.Row():
                    run = gr.Button("Generate", variant="primary", elem_id="generate-button")
                    stop = gr.Button("Cancel", elem_id="generate-cancel")
                info = gr.Markdown(elem_id="generate-info")
            with gr.Column():
                image = gr.Image(label="Image", type="pil", image_mode="RGB", elem_id="image", format="png",
                                 interactive=False, height=320)
            with gr.Column():
                chosen = gr.Dropdown(label="Top features of this image (block #id), labelled ones first",
                                     choices=[], elem_id="feature-choice")
                heatmap = gr.Image(label="Heatmap", interactive=False, elem_id="heatmap", height=320)
                feature_text = gr.Markdown(elem_id="feature-text")
                # its click is wired in app.py's build_ui: it changes another tab (FeaturesTab.open_feature)
                tab.open_button = gr.Button("Open in the Features tab", size="sm", elem_id="generate-open-feature")
                tab.feature_choice = chosen
        # inputs by name: the handler's parameters; the dict's order is the HTTP API's
        request = {"prompt": prompt, "steps": steps, "seed": seed}
        shown = [image, info, explore_state, chosen, heatmap, feature_text]
        explored = run.click(tab.explore, inputs_kwargs=request, outputs=shown, api_name="explore",
                             concurrency_limit=2)
        # a failed run clears the last image and says why where it was (the toast goes after 10 s)
        explored.failure(tab.failed, None, shown, queue=False, api_name=False)
        stop.click(bench.cancel("generate", "**Cancelled**"), None, [info], cancels=[explored], queue=False,
                   api_name=False)
        chosen.change(tab.show_heatmap, inputs_kwargs={"state": explore_state, "choice": chosen},
                              outputs=[heatmap, feature_text], api_name=False, queue=False)
        gen_api = gr.Button(visible=False)
        gen_api.click(tab.generate, inputs_kwargs=request, outputs=[image, info], api_name="generate")
    return tab


class GenerateTab:
    def __init__(self, bench):
        self.bench = bench
        self.open_button = self.feature_choice = None  # the widgets app.py links to the Features tab

    @user_errors
    def generate(self, prompt: str, steps: float, seed: float, request: gr.Request = None,
                 progress=gr.Progress()):
        prompt, steps, seed = generation_request(prompt, steps, seed)
        bench = self.bench
        with bench.interruptible(request, "generate", progress):
            image = bench.t2i.generate(prompt, steps=steps, seed=seed)[0]
        return bench.image_file(request, image, "image"), f"{bench.model_name}, {steps} step(s), seed {seed}"

    def failed(self, request: gr.Request = None):
        """After a failed or cancelled Generate: no image (the last one is another prompt's), and the reason."""
        return None, self.bench.failure_status(request, "generate"), {}, gr.update(choices=[], value=None), None, ""

    @user_errors
    def explore(self, prompt: str, steps: float, seed: float, request: gr.Request = None,
                progress=gr.Progress()):
        """Generate, then name the top SAE features of each block with their heatmaps."""
        try:
            return self._explore(prompt, steps, seed, request, progress)
        except BaseException as err:
            self.bench.record_failure(request, "generate", err)
            raise

    def _explore(self, prompt, steps, seed, request, progress):
        prompt, steps, seed = generation_request(prompt, steps, seed)
        bench = self.bench
        info = f"{bench.model_name}, {steps} step(s), seed {seed}"
        with bench.interruptible(request, "generate", progress):
            if bench.library is None:
                image = bench.t2i.generate(prompt, steps=steps, seed=seed)[0]
                return bench.image_file(request, image, "image"), info, {}, gr.update(choices=[], value=None), None, ""
            image, tops = bench.library.explain(bench.t2i, prompt, seed=seed, steps=steps)
        state = {"image": np.asarray(image), "features": tops}
        choices = [feature_choice(b, f) for b, f in bench.library.by_relevance(tops)]
        first = choices[0] if choices else None
        overlay, card = self.show_heatmap(state, first, request)
        return (bench.image_file(request, image, "image"), info, state, gr.update(choices=choices, value=first),
                overlay, card)

    def show_heatmap(self, state: dict, choice: str | None, request: gr.Request = None):
        """Switch the heatmap shown: no model work, from the session's state."""
        from saes.render import heatmap_overlay

        if not state or not choice:
            return None, ""
        block, feature_id = parse_feature_choice(choice)
        feature = next(f for f in state["features"][block] if f["id"] == feature_id)
        card = self.bench.library.card(block, feature_id)
        text = (f"**{block} feature {feature_id}**: {card.get('label') or 'unlabelled'}"
                + (f" (AUROC {card['auroc']:.2f})" if card.get("auroc") else "")
                + f"; activation here: max {feature['max']:.2f}, total {feature['total']:.1f}"
                + (f"; fires on {percent(card['frequency'])} of positions" if card.get("frequency") is not None else "")
                + ". *Open in the Features tab* shows its card with its top images.")
        return self.bench.image_file(request, heatmap_overlay(state["image"], feature["heatmap"]), "heatmap"), text
