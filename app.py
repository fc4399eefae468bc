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

from interp.models import ModelError, load_t2i

DEFAULT_PROMPT = "a small red circle at the top left and a large blue striped star in the center on a white background"


class Workbench:
    """What the UI serves: loaded lazily, once, and shared read-only by every session."""

    def __init__(self, model_name: str = "toy"):
        self.model_name = model_name
        self._lock = threading.Lock()

    @functools.cached_property
    def t2i(self):
        with self._lock:
            return load_t2i(self.model_name)

    def generate(self, prompt: str, steps: float, seed: float):
        try:
            steps, seed = int(steps), int(seed)
            if seed < 0:
                raise ModelError("the seed must be 0 or more")
            image = self.t2i.generate(prompt, steps=steps, seed=seed)[0]
        except (ModelError, ValueError) as err:
            raise gr.Error(str(err)) from None
        return image, f"{self.model_name}, {steps} step(s), seed {seed}"


def build_ui(bench: Workbench) -> gr.Blocks:
    with gr.Blocks(title="Interpretability workbench") as demo:
        gr.Markdown("# Interpretability workbench\nOpen up text-to-image diffusion models and language models: "
                    "capture, train sparse autoencoders, edit by features, analyse residual geometry.")
        with gr.Tab("Generate and explore", id="generate"):
            with gr.Row():
                with gr.Column():
                    prompt = gr.Textbox(label="Prompt", value=DEFAULT_PROMPT, lines=2, max_length=2000,
                                        elem_id="prompt")
                    with gr.Row():
                        steps = gr.Number(label="Steps", value=1, precision=0, minimum=1, maximum=1000,
                                          elem_id="steps")
                        seed = gr.Number(label="Seed", value=0, precision=0, minimum=0, elem_id="seed")
                    run = gr.Button("Generate", variant="primary", elem_id="generate-button")
                with gr.Column():
                    image = gr.Image(label="Image", type="pil", image_mode="RGB", elem_id="image",
                                     format="png", interactive=False)
                    info = gr.Markdown(elem_id="generate-info")
            run.click(bench.generate, [prompt, steps, seed], [image, info], api_name="generate",
                      concurrency_limit=2)
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
    demo.launch(server_name=args.host, server_port=args.port, share=args.share, show_error=False)


if __name__ == "__main__":
    main()
