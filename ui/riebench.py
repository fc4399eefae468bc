"""The "RIEBench" tab: edit shapes-world images by representations and score the edits against the exact target.

Widgets (category, tasks, method, k_trans, m, variant, blocks) -> `riebench.methods.MethodConfig` and
`riebench.runner.RunConfig` -> `Runner.run` in a thread (`Sessions.stream_action`), whose results stream (at
most every `STREAM_INTERVAL_S`) into `riebench.report.category_table` / `tradeoff_figure` and a gallery per task.
Cancel sets the session's flag; the runner stops before its next edit and the stream says where it stopped.
HTTP API: /riebench (category, task_ids, method, k_trans, multiplier, blocks, variant).
"""

from __future__ import annotations

import functools
import tempfile
from pathlib import Path

import gradio as gr
import numpy as np

from ui.common import Number, finite_number, status_on_failure, user_errors, whole_number

MAX_RIEBENCH_TASKS = 8           # tasks in one interactive run
RIEBENCH_TASKS_SHOWN = 8         # tasks of a category offered for choice
TABLE_COLUMNS = ["method", "k_trans", "m", "category", "n", "success", "preservation", "outside_pixel_distance",
                 "target_distance"]
# The table fits its width: headers that can wrap, widths per column (the method's label is the long one), and
# cells that wrap (a column past the edge was cut off).
TABLE_HEADERS = [c.replace("_", " ") for c in TABLE_COLUMNS]
TABLE_WIDTHS = ["22%", "7%", "5%", "13%", "5%", "9%", "13%", "13%", "13%"]


def build_riebench_tab(bench) -> RIEBenchTab:
    from riebench.methods import METHODS, VARIANTS

    tab = RIEBenchTab(bench)
    blocks = list(bench.t2i.blocks)
    categories = tab.categories()
    first = categories[0] if categories else None
    tasks = tab.task_choices(first) if first else []
    methods = list(METHODS)
    default_method = "sae" if bench.library is not None and "sae" in methods else \
        next((m for m in ("activation-diff", "neurons", "prompt-swap") if m in methods), methods[0])
    with gr.Tab("RIEBench", id="riebench"):
        gr.Markdown("Edit images by representations: a method finds the units (SAE features, neurons, the update "
                    "itself) that separate the original from the edited prompt and transports them while the "
                    "original is generated again. Scored against the exact target the shapes world renders.")
        with gr.Row():
            with gr.Column():
                category = gr.Dropdown(categories, value=first, label="Category", elem_id="riebench-category")
                # a multiselect that takes any task id (the API reaches every category's tasks; the runner checks)
                task_ids = gr.Dropdown(tasks, value=[t[1] for t in tasks[:2]], multiselect=True,
                                       allow_custom_value=True, label=f"Tasks (up to {MAX_RIEBENCH_TASKS})",
                                       elem_id="riebench-tasks")
            with gr.Column():
                method = gr.Dropdown(methods, value=default_method, label="Method", elem_id="riebench-method")
                with gr.Row():
                    # the sweep's best SAE configuration over all categories (docs/experiments/riebench.md): k_trans 8, m 1
                    k_trans = Number(value=8, minimum=1, label="k_trans (units moved)", elem_id="riebench-k")
                    multiplier = Number(value=1.0, label="m (multiplier, 0 to 10)", elem_id="riebench-m")
                variant = gr.Radio(list(VARIANTS), value="static", label="Variant (sae)", elem_id="riebench-variant")
                # the model's analysed blocks (the shipped SAEs') by default; every hookable block can be chosen
                default_blocks = [b for b in bench.t2i.default_blocks if b in blocks] or blocks[:1]
                run_blocks = gr.CheckboxGroup(blocks, value=default_blocks, label="Blocks", elem_id="riebench-blocks")
                with gr.Row():
                    run = gr.Button("Run", variant="primary", elem_id="riebench-run")
                    cancel = gr.Button("Cancel", variant="stop", elem_id="riebench-cancel")
        status = gr.Markdown(elem_id="riebench-status")
        table = gr.Dataframe(label="Results (mean per category)", headers=TABLE_HEADERS, column_widths=TABLE_WIDTHS,
                             wrap=True, interactive=False, elem_id="riebench-table")
        with gr.Row():
            plot = gr.Plot(label="Success against preservation", elem_id="riebench-plot")
            # one task per row: original, edited, target; each caption under its image (app.py's CSS)
            gallery = gr.Gallery(label="Original / edited / target, per task", columns=3, height=560,
                                 object_fit="contain", elem_id="riebench-gallery")
    category.change(tab.tasks_for, inputs_kwargs={"category": category}, outputs=[task_ids], queue=False,
                    api_name=False)
    # inputs by name: the handler's parameters; the dict's order is the HTTP API's
    run.click(tab.run, inputs_kwargs={"category": category, "task_ids": task_ids, "method": method,
                                      "k_trans": k_trans, "multiplier": multiplier, "blocks": run_blocks,
                                      "variant": variant},
              outputs=[status, table, plot, gallery], api_name="riebench", concurrency_limit=1)
    # The run's own stream says "Cancelling…" at once and "Cancelled" (or "Finished", when the last edit was
    # already under way) when it has stopped: the button only sets the session's Event, and a click when no
    # run is going changes nothing.
    cancel.click(bench.cancel("riebench"), None, None, queue=False, api_name=False)
    return tab


class RIEBenchTab:
    def __init__(self, bench):
        self.bench = bench

    @user_errors
    @status_on_failure(4)
    def run(self, category: str, task_ids: list[str], method: str, k_trans, multiplier, blocks: list[str],
            variant: str, request: gr.Request = None, progress=gr.Progress()):
        """Run a method on the chosen tasks; streams the table, the trade-off plot and the gallery per task."""
        from zoo import shapes
        from riebench.methods import METHODS, MethodConfig
        from riebench.runner import RunConfig, Runner

        bench = self.bench
        if not task_ids:
            raise ValueError("choose at least one task")
        if len(task_ids) > MAX_RIEBENCH_TASKS:
            raise ValueError(f"choose at most {MAX_RIEBENCH_TASKS} tasks for an interactive run "
                             "(run the whole suite with `python -m riebench run`)")
        if not blocks:
            raise ValueError("choose at least one block")
        # MethodConfig refuses an unknown method, k_trans < 1, a non-finite m and an unknown variant
        config = MethodConfig(method, whole_number(k_trans, "k_trans", 1), finite_number(multiplier, "m"),
                              list(blocks), variant or "static")
        saes = self.saes(blocks)
        if METHODS[method].needs_saes and saes is None:
            raise ValueError(f"the {method} method needs SAEs, and none are shipped for {bench.model_name} yet; "
                             "choose activation-diff, neurons or prompt-swap")
        suite = self.suite.select(ids=list(task_ids))
        elsewhere = [t.id for t in suite.tasks if t.category != category]
        if elsewhere:
            raise ValueError(f"task {elsewhere[0]} is not in the category {category!r}")
        out = Path(tempfile.mkdtemp(prefix="run-", dir=bench.session_dir(request, "riebench")))
        runner = Runner(RunConfig(model=bench.model_name, configs=[config]), out, model=bench.t2i, saes=saes,
                        suite=suite, progress=False)
        results, gallery, failures = [], [], []
        state = {"done": 0, "total": len(suite.tasks), "changed": False}

        def add(item):  # one (task, configuration) done: its result, and its images in the gallery
            task, result = item["task"], item["result"]
            state.update(done=item["done"], total=item["total"], changed=True)
            if "error" in result:
                failures.append(f"{task.id}: {result['error']}")
                return
            results.append(result)
            target = shapes.render(task.scenes()[1]) if task.target_scene is not None else None
            gallery.extend([(self.run_image(out, item["original_image"], f"{task.id}-original"),
                             f"{task.id} original: {task.original}"),
                            (self.run_image(out, item["edited_image"], f"{task.id}-edited"),
                             f"{task.id} edited ({config.label})"),
                            *([(self.run_image(out, target, f"{task.id}-target"),
                                f"{task.id} target: {task.edited}")] if target is not None else [])])

        def update():  # a few times a second, when something was added
            if not state["changed"]:
                return None
            state["changed"] = False
            progress((state["done"], state["total"]), desc="riebench", unit="task")
            return self.outputs(results, gallery, f"{state['done']} of {state['total']} task(s) done…")

        def cancelling():
            unchanged = gr.update()
            return (f"**Cancelling**: {state['done']} of {state['total']} task(s) done; the run stops after the "
                    "current edit…", unchanged, unchanged, unchanged)

        total = state["total"]
        progress((0, total), desc="riebench", unit="task")
        yield self.outputs(results, gallery, f"Running {config.label} on {total} task(s)…")
        # the session's Cancel flag stops the runner before its next edit (and so does a closed stream)
        counts = yield from bench.stream_action(
            request, "riebench", lambda emit, cancel: runner.run(on_result=emit, cancel=cancel),
            on_event=add, update=update, cancelling=cancelling)
        settings = f"with `{config.label}` (k_trans={config.k_trans}, m={config.multiplier:g})"
        if counts.get("cancelled"):
            status = (f"**Cancelled** after {counts['done'] + counts['failed']} of {state['total']} task(s): "
                      f"{counts['done']} edited {settings}, {counts['failed']} failed; the tasks after them "
                      "were not run.")
        else:
            status = f"**Finished**: {counts['done']} task(s) edited {settings}, {counts['failed']} failed."
        yield self.outputs(results, gallery, status + "".join(f"\n- {f}" for f in failures))

    # ----- the suite, the SAEs and what a run shows ----------------------------------------------
    @functools.cached_property
    def suite(self):
        from riebench.tasks import ShapesSuiteConfig, shapes_suite

        return shapes_suite(ShapesSuiteConfig(seed=0))

    def categories(self) -> list[str]:
        return self.suite.categories()

    def task_choices(self, category: str) -> list[tuple[str, str]]:
        """(label shown, task id) of the first tasks of a category."""
        tasks = [t for t in self.suite.tasks if t.category == category][:RIEBENCH_TASKS_SHOWN]
        return [(f"{t.id}: {t.editing_instruction or t.edited}", t.id) for t in tasks]

    def tasks_for(self, category: str):
        choices = self.task_choices(category) if category else []
        return gr.update(choices=choices, value=[c[1] for c in choices[:2]])

    def saes(self, blocks: list[str]) -> dict | None:
        """The library's SAEs of the chosen blocks (shared, read-only); the sae method names any missing."""
        library = self.bench.library
        if library is None:
            return None
        return {b: library.sae(b) for b in blocks if b in library.blocks} or None

    @staticmethod
    def outputs(results: list[dict], gallery: list, status: str):
        from riebench.report import category_table, tradeoff_curves, tradeoff_figure

        rows = category_table(results)
        table = [[round(r[c], 3) if isinstance(r.get(c), float) else r.get(c) for c in TABLE_COLUMNS] for r in rows]
        figure = tradeoff_figure(tradeoff_curves(rows)) if rows else None
        return status, gr.update(value=table, headers=TABLE_HEADERS), figure, gallery

    @staticmethod
    def run_image(out: Path, image, name: str) -> str:
        """A gallery image as a PNG file of the run (a file is sent as it is each time the gallery is
        streamed again; an array would be encoded again for every update)."""
        from PIL import Image

        directory = out / "gallery"
        directory.mkdir(exist_ok=True)
        path = directory / f"{name}.png"
        Image.fromarray(np.asarray(image)).save(path, format="PNG")
        return str(path)
