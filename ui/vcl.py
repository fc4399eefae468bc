"""The "VCL fine-tuning" tab: SFT plus lambda x the Variance Concentration Loss on a copy of a chat model.

Widgets (model, training data, loss settings, run settings) -> `flowlens.vcl.VCLConfig` inside
`flowlens.finetune.FinetuneConfig` -> `flowlens.finetune.finetune` in a thread (`Sessions.stream_action`) on a
private copy of the model (`interp.models.lm.load_hf_lm`); its log streams into the status line (at most every
`STREAM_INTERVAL_S`) and `loss_curves_figure` (at most every `FIGURE_INTERVAL_S`, through at most `LIVE_PLOT_POINTS`
steps), and the refusal evaluation before and after training into a table. Cancel sets the session's flag; finetune
stops after its current step with a checkpoint, and the stream says so.
HTTP API: /vcl (model_name, source, upload, n_examples, weight, k, window_start, window_end, sign, pooling,
steps, lr, batch_size, eval_per_kind).
"""

from __future__ import annotations

import shutil
import tempfile
import time
from pathlib import Path

import gradio as gr
import torch

from ui.common import (STREAM_INTERVAL_S, UPLOADED, Number, Slider, fetch_hint, finite_number, status_on_failure, user_errors,
                       whole_number, world_records)


# While a run streams, its loss curves are re-sent at most every FIGURE_INTERVAL_S, through at most LIVE_PLOT_POINTS
# steps (the finished run's figure has every step): re-sending all 2,000 steps' markers every STREAM_INTERVAL_S
# froze the page, and Cancel took 39 to over 120 s to land.
FIGURE_INTERVAL_S = max(2.0, 5 * STREAM_INTERVAL_S)
LIVE_PLOT_POINTS = 200


def build_vcl_tab(bench) -> VCLTab:
    from flowlens.vcl import POOLINGS, SIGNS

    tab = VCLTab(bench)
    models = bench.chat_models()
    with gr.Tab("VCL fine-tuning", id="vcl"):
        gr.Markdown("Fine-tune a copy of a chat model with SFT plus lambda x the Variance Concentration Loss on the "
                    "residuals of a window of layers; watch both terms, then compare refusals and task accuracy "
                    "before and after." + ("" if models else "\n\n**No embedded chat model is present.**")
                    + fetch_hint(models))
        with gr.Row():
            with gr.Column():
                model = gr.Dropdown(models, value=models[0] if models else None, label="Model", elem_id="vcl-model")
                source = gr.Radio(["chat world mixture", UPLOADED], value="chat world mixture", label="Training data",
                                  elem_id="vcl-source")
                upload = gr.File(label="SFT data (JSONL: prompt, completion; 2 MB at most)", file_types=[".jsonl"],
                                 type="filepath", elem_id="vcl-upload")
                n_examples = Number(value=256, minimum=1, label="Examples (chat world)", elem_id="vcl-examples")
            with gr.Column():
                gr.Markdown("**Loss**")
                with gr.Row():
                    weight = Number(value=1.0, label="lambda", elem_id="vcl-lambda")
                    k = Number(value=2, minimum=1, label="k", elem_id="vcl-k")
                with gr.Row():
                    window_start = Slider(0, 1, value=0.3, step=0.05, label="window a", elem_id="vcl-window-a")
                    window_end = Slider(0, 1, value=0.7, step=0.05, label="window b", elem_id="vcl-window-b")
                with gr.Row():
                    sign = gr.Radio(list(SIGNS), value="penalize", label="sign", elem_id="vcl-sign")
                    pooling = gr.Radio(list(POOLINGS), value="mean", label="pooling", elem_id="vcl-pooling")
            with gr.Column():
                gr.Markdown("**Run**")
                with gr.Row():
                    steps = Number(value=30, minimum=1, maximum=2000, label="steps", elem_id="vcl-steps")
                    lr = Number(value=1e-4, label="lr", elem_id="vcl-lr")
                with gr.Row():
                    batch_size = Number(value=8, minimum=1, maximum=64, label="batch", elem_id="vcl-batch")
                    eval_per_kind = Number(value=8, minimum=0, maximum=100, label="eval prompts per kind (0: none)",
                                           elem_id="vcl-eval")
                with gr.Row():
                    run = gr.Button("Fine-tune", variant="primary", elem_id="vcl-run")
                    cancel = gr.Button("Cancel", variant="stop", elem_id="vcl-cancel")
        status = gr.Markdown(elem_id="vcl-status")
        with gr.Row():
            curves = gr.Plot(label="Loss curves", elem_id="vcl-curves")
            table = gr.Dataframe(headers=["metric", "before", "after"], interactive=False, label="Before / after",
                                 elem_id="vcl-table")
    # inputs by name: the handler's parameters; the dict's order is the HTTP API's
    run.click(tab.run, inputs_kwargs={"model_name": model, "source": source, "upload": upload,
                                      "n_examples": n_examples, "weight": weight, "k": k,
                                      "window_start": window_start, "window_end": window_end, "sign": sign,
                                      "pooling": pooling, "steps": steps, "lr": lr, "batch_size": batch_size,
                                      "eval_per_kind": eval_per_kind},
              outputs=[status, curves, table], api_name="vcl", concurrency_limit=1)
    # The run's own generator reports the clean stop (status, curves up to the last step), so the
    # button sets the session's Event and leaves the stream open until finetune returns.
    cancel.click(bench.cancel("fine-tuning"), None, None, queue=False, api_name=False)
    return tab


class VCLTab:
    def __init__(self, bench):
        self.bench = bench

    @user_errors
    @status_on_failure(3)
    def run(self, model_name: str, source: str, upload, n_examples, weight, k, window_start, window_end,
            sign: str, pooling: str, steps, lr, batch_size, eval_per_kind, request: gr.Request = None,
            progress=gr.Progress()):
        """Fine-tune a fresh copy of the model with SFT + lambda x VCL; streams the loss curves."""
        from flowlens.finetune import FinetuneConfig, finetune
        from flowlens.training_log import loss_curves_figure, read_log
        from flowlens.vcl import VCLConfig
        from flowlens.refusals import context_length
        from interp.models.lm import load_hf_lm

        bench = self.bench
        bench.known_lm(model_name)
        # VCLConfig and FinetuneConfig refuse what cannot run (an empty window, an unknown sign, a k above the
        # batch, ...); whole_number / finite_number only turn the fields' floats into the numbers they take
        vcl = VCLConfig(k=whole_number(k, "k", 1), weight=weight,
                        window=(finite_number(window_start, "window start"), finite_number(window_end, "window end")),
                        sign=sign, pooling=pooling)
        steps = whole_number(steps, "steps", 1, 2000)
        batch = whole_number(batch_size, "batch size", 1, 64)
        eval_per_kind = whole_number(eval_per_kind, "evaluation prompts per kind", 0, 100)
        run_dir = Path(tempfile.mkdtemp(prefix="vcl-", dir=bench.session_dir(request, "vcl")))
        data, evaluation = self.data(run_dir, source, upload, whole_number(n_examples, "examples", 1, 20000),
                                         eval_per_kind)
        model, tokenizer = load_hf_lm(model_name)  # a private copy: training never touches the shared models
        config = FinetuneConfig(model=model_name, data=str(data), out=str(run_dir / "run"), steps=steps,
                                batch_size=batch, lr=finite_number(lr, "lr"), vcl=vcl, save_every=steps,
                                max_length=min(256, context_length(model) or 256),
                                chat_template=None,
                                eval_prompts=str(evaluation) if evaluation else None, eval_max_new_tokens=24,
                                progress=False)
        title = f"{model_name}: SFT + {vcl.weight:g} x VCL (k={vcl.k}, window {vcl.window[0]:g}-{vcl.window[1]:g}, " \
                f"{vcl.sign}, {vcl.pooling})"
        # finetune's log as last read, how many steps the status shows, and when the figure was last sent
        log = {"entries": [], "drawn": 0, "figure_at": 0.0}

        def phase(n: int) -> str:
            if not n:
                return "evaluating before training…" if evaluation else "starting…"
            if n < steps:
                return f"step {n} of {steps}…"
            return f"step {steps} of {steps}; saving" + (" and evaluating after training…" if evaluation else "…")

        def update():  # a few times a second: the status, when the log has new steps; the curves more rarely
            log["entries"] = read_log(config.out)
            if len(log["entries"]) == log["drawn"]:
                return None
            log["drawn"] = len(log["entries"])
            progress((log["drawn"], steps), desc="fine-tuning", unit="step")
            curves = gr.update()
            if time.monotonic() - log["figure_at"] >= FIGURE_INTERVAL_S:  # bounded in size and in rate at any length
                log["figure_at"] = time.monotonic()
                curves = loss_curves_figure(log["entries"], title, max_points=LIVE_PLOT_POINTS)
            return f"Fine-tuning: {phase(log['drawn'])}", curves, []

        def cancelling():
            log["entries"] = read_log(config.out)
            when = "after the current step" if log["entries"] else \
                "after the evaluation before training and the first step"
            return (f"**Cancelling** at step {len(log['entries'])} of {steps}: the run stops {when}…", gr.update(),
                    gr.update())

        progress((0, steps), desc="fine-tuning", unit="step")
        yield f"Fine-tuning: {phase(0)}", loss_curves_figure([], title), []
        # the session's Cancel flag stops finetune after its current step, with a checkpoint (so does a closed stream)
        result = yield from bench.stream_action(
            request, "fine-tuning", lambda emit, cancel: finetune(config, model=model, tokenizer=tokenizer,
                                                                 cancel=cancel),
            update=update, cancelling=cancelling,
            on_error=lambda err: self.failure(err, read_log(config.out), steps, config.lr))
        entries = read_log(config.out)
        if result["status"] == "cancelled":
            status = (f"**Cancelled** cleanly at step {result['step']} of {steps}: the checkpoint is saved in the "
                      "session's folder; the after-training evaluation was not run.")
        else:
            last = entries[-1] if entries else {}
            status = (f"**Finished** {steps} steps: SFT {last.get('sft_loss', float('nan')):.3f}, "
                      f"VCL {last.get('vcl_loss', float('nan')):.3f}"
                      + (f", top-{vcl.k} energy ratio {last['vcl_ratio']:.3f}" if "vcl_ratio" in last else "") + ".")
        yield status, loss_curves_figure(entries, title), self.table(result)

    # ----- the run's data and what it shows -------------------------------------------------------
    def data(self, directory: Path, source: str, upload, n_examples: int, eval_per_kind: int):
        """The training JSONL and the evaluation prompt set of a run, written into the session's folder."""
        from zoo.chat.world import World, write_jsonl

        data = directory / "train.jsonl"
        if source == UPLOADED:
            upload = self.bench.checked_upload(upload, (".jsonl",))
            data = directory / "upload" / upload.name  # its own name: the messages about it name it so
            data.parent.mkdir()
            shutil.copyfile(upload, data)
        else:
            write_jsonl(data, World().mixture("train", n_examples, {"general": 0.5, "benign": 0.25, "harmful": 0.25}))
        if eval_per_kind == 0:
            return data, None
        evaluation = directory / "eval.jsonl"
        write_jsonl(evaluation, world_records(("general", "benign", "harmful"), 3 * eval_per_kind, seed=1))
        return data, evaluation

    @staticmethod
    def table(result: dict | None) -> list[list]:
        if not result or not result.get("eval_before"):
            return []
        before, after = result["eval_before"], result.get("eval_after") or {}
        names = {"task_accuracy": "task accuracy (general)", "false_refusal_rate": "false refusal rate (benign)",
                 "harmful_refusal_rate": "refusal rate (harmful)"}

        def show(value):
            return "n/a" if value is None else round(value, 3)

        return [[label, show(before.get(key)), show(after.get(key)) if after else "(not run)"]
                for key, label in names.items()]

    @staticmethod
    def failure(err: BaseException, entries: list[dict], steps: int, lr: float) -> BaseException:
        """A run that diverged (a non-finite loss, or residuals too large for the VCL's eigendecomposition:
        torch's LinAlgError) as a message saying so and what to lower; anything else as it is."""
        if isinstance(err, (FloatingPointError, torch.linalg.LinAlgError)):
            cause = "the loss became non-finite" if isinstance(err, FloatingPointError) else \
                "the residuals became too large for the VCL's eigendecomposition"
            step = len(entries) if isinstance(err, FloatingPointError) else len(entries) + 1  # logged or not
            return ValueError(f"training diverged at step {step} of {steps} ({cause}); lower the lr "
                              f"(now {lr:g}) or lambda")
        return err
