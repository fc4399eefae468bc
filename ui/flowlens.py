"""The "FlowLens" tab: residual geometry of language models, and the lexical diversity of a data set.

Analysis: widgets (models, reference, prompt set or upload, number of prompts, components, PC1 stability) ->
prompts (the chat world's held-out split, or `flowlens.analyze.read_prompts` of an upload) ->
`interp.hooks.lm.last_token_residuals` per model, in chunks (Cancel stops within one) ->
`flowlens.analyze.analyse` and `geometry_figures`. Diversity: an upload and a text selection ->
`flowlens.diversity.read_texts` and `lexical_diversity`.
HTTP API: /flowlens (models, reference, source, upload, n_prompts, components, stability), /diversity (upload,
selection).
"""

from __future__ import annotations

import gradio as gr
import numpy as np
import torch

from ui.common import (UPLOADED, Number, fetch_hint, status_on_failure, user_errors,
                       whole_number, world_records)

MAX_PROMPTS = 2000               # prompts read from one uploaded file
RESIDUAL_CHUNK = 16              # prompts per forward pass between checks for Cancel
WORLD_PROMPT_SETS = {            # prompt sets from the chat world: name -> kinds (held-out split)
    "built-in mixture (chat world, held out)": ("general", "benign", "harmful"),
    "chat world: benign only": ("benign",),
    "chat world: harmful only": ("harmful",),
    "chat world: general only": ("general",),
}


def build_flowlens_tab(bench) -> FlowLensTab:
    tab = FlowLensTab(bench)
    models = bench.chat_models()
    with gr.Tab("FlowLens", id="flowlens"):
        gr.Markdown("Residual geometry of language models: residuals at the last prompt token of every layer, PCA "
                    "across layers, how variance concentrates along a few directions layer by layer, and how well "
                    "the principal directions align with a reference model's. Chat models see each prompt as a "
                    "user turn of their chat template. For XSTest, upload its `xstest_prompts.csv`." +
                    ("" if models else "\n\n**No embedded chat model is present**: train them with "
                     "`python -m zoo train chat`.") + fetch_hint(models))
        with gr.Row():
            with gr.Column():
                chosen = gr.Dropdown(models, value=models[:1], multiselect=True, label="Models",
                                     elem_id="flowlens-models")
                reference = gr.Dropdown(["none"] + models, value="none", label="Reference (alignment score)",
                                        elem_id="flowlens-reference")
                source = gr.Radio(list(WORLD_PROMPT_SETS) + [UPLOADED], value=next(iter(WORLD_PROMPT_SETS)),
                                  label="Prompt set", elem_id="flowlens-source")
                upload = gr.File(label="Prompt file (JSONL with a prompt field, or XSTest CSV; 2 MB at most)",
                                 file_types=[".jsonl", ".csv"], type="filepath", elem_id="flowlens-upload")
                with gr.Row():
                    n_prompts = Number(value=48, minimum=3, maximum=MAX_PROMPTS, label="Prompts (chat world)",
                                       elem_id="flowlens-n")
                    components = Number(value=3, minimum=1, maximum=64, label="Principal components",
                                        elem_id="flowlens-k")
                stability = gr.Checkbox(False, label="PC1 stability without trailing punctuation")
                with gr.Row():
                    run = gr.Button("Analyse", variant="primary", elem_id="flowlens-run")
                    cancel = gr.Button("Cancel", variant="stop", elem_id="flowlens-cancel")
            with gr.Column(scale=2):
                summary = gr.Markdown(elem_id="flowlens-summary")
                concentration = gr.Plot(label="Concentration per layer", elem_id="flowlens-concentration")
        with gr.Row():
            projections = gr.Plot(label="Projections along depth", elem_id="flowlens-projections")
            alignment = gr.Plot(label="Alignment with the reference", elem_id="flowlens-alignment")
        gr.Markdown("### Lexical diversity of a data set")
        with gr.Row():
            data = gr.File(label="Instruction data (JSONL: prompt/query/instruction and completion/response/output; "
                                 "2 MB at most)", file_types=[".jsonl"], type="filepath", elem_id="diversity-upload")
            with gr.Column():
                selection = gr.Radio(["queries", "completions", "both"], value="completions", label="Texts",
                                     elem_id="diversity-selection")
                measure = gr.Button("Measure", elem_id="diversity-run")
                diversity_info = gr.Markdown(elem_id="diversity-info")
            diversity_table = gr.Dataframe(headers=["measure", "value"], interactive=False, elem_id="diversity-table")
    # inputs by name: the handlers' parameters; each dict's order is the HTTP API's
    event = run.click(tab.run, inputs_kwargs={"models": chosen, "reference": reference, "source": source,
                                              "upload": upload, "n_prompts": n_prompts, "components": components,
                                              "stability": stability},
                      outputs=[summary, concentration, projections, alignment], api_name="flowlens",
                      concurrency_limit=2)
    # the run's own stream reports the stop (or its results, when the click lands as it ends): the button only
    # sets the session's flag, so no progress line of a closed stream is left over empty plots
    cancel.click(bench.cancel("flowlens"), None, None, queue=False, api_name=False)
    measure.click(tab.diversity, inputs_kwargs={"upload": data, "selection": selection},
                  outputs=[diversity_table, diversity_info], api_name="diversity")
    return tab


class FlowLensTab:
    def __init__(self, bench):
        self.bench = bench

    def prompts(self, source: str, upload, n_prompts) -> list[str]:
        from flowlens.analyze import read_prompts

        if source == UPLOADED:
            prompts = read_prompts(self.bench.checked_upload(upload, (".jsonl", ".csv")))
            if len(prompts) > MAX_PROMPTS:
                raise ValueError(f"the file has {len(prompts)} prompts; the UI reads at most {MAX_PROMPTS}")
        elif source in WORLD_PROMPT_SETS:
            n = whole_number(n_prompts, "prompts", 3, MAX_PROMPTS)
            prompts = [r["prompt"] for r in world_records(WORLD_PROMPT_SETS[source], n)]
        else:
            raise ValueError(f"unknown prompt set {source!r}")
        from flowlens.analyze import check_prompt_set

        return check_prompt_set(prompts, "the uploaded file" if source == UPLOADED else source)

    def _residuals(self, names, prompts, stability, emit, cancel) -> dict | None:
        """{model: (residuals, residuals without trailing punctuation or None)}, in chunks of RESIDUAL_CHUNK
        prompts; None when Cancel was clicked (checked between two chunks). ``emit((model, i, done))`` after each."""
        from interp.hooks.lm import last_token_residuals

        found = {}
        for i, name in enumerate(names):
            lm = self.bench.lm(name)
            parts, stripped_parts = [], []
            for start in range(0, len(prompts), RESIDUAL_CHUNK):
                if cancel.is_set():
                    return None
                emit((name, i, start))
                chunk = prompts[start:start + RESIDUAL_CHUNK]
                # the capture is context-scoped: another request's forward pass on the shared model never reaches it
                parts.append(last_token_residuals(lm, chunk, chat_template=None))
                if stability:
                    stripped_parts.append(last_token_residuals(lm, chunk, chat_template=None,
                                                               strip_trailing_punctuation=True))
            found[name] = (torch.cat(parts).numpy(), torch.cat(stripped_parts).numpy() if stability else None)
        return found

    @user_errors
    @status_on_failure(4)
    def run(self, models: list[str], reference: str, source: str, upload, n_prompts, components,
            stability: bool, request: gr.Request = None, progress=gr.Progress()):
        """Residual geometry of each chosen model (aligned with the reference when one is chosen). Streams its
        progress; Cancel (the session's flag) stops it between two chunks of prompts, and the run's own last
        output says how it ended: results, or "Cancelled" with empty plots (never a stale progress line)."""
        from flowlens.analyze import analyse, geometry_figures

        models = [models] if isinstance(models, str) else list(models or [])
        if not models:
            raise ValueError("choose at least one model")
        reference = None if reference in (None, "", "none") else reference
        k = whole_number(components, "components", 1, 64)
        prompts = self.prompts(source, upload, n_prompts)
        from flowlens.analyze import checked_components

        checked_components(k, len(prompts))  # before any residual is computed
        names = list(dict.fromkeys(models + ([reference] if reference else [])))
        for name in names:  # an unknown or unfetched model is refused before any residual is computed
            self.bench.known_lm(name)
        where = {"at": (names[0], 0, 0), "shown": None}
        unchanged = [gr.update()] * 3

        def update():
            if where["at"] == where["shown"]:
                return None
            where["shown"] = name, i, start = where["at"]
            progress((i * len(prompts) + start, len(names) * len(prompts)), desc=f"residuals of {name}",
                     unit="prompt")
            return (f"Residuals of {name} ({i + 1} of {len(names)}): {start} of {len(prompts)} prompts…",
                    *unchanged)

        def cancelling():
            name, i, start = where["at"]
            return (f"**Cancelling** at {start} of {len(prompts)} prompts of {name}: the analysis stops after the "
                    "current chunk…", *unchanged)

        found = yield from self.bench.stream_action(
            request, "flowlens", lambda emit, cancel: self._residuals(names, prompts, stability, emit, cancel),
            update=update, cancelling=cancelling, on_event=lambda at: where.update(at=at))
        if found is None:
            name, i, start = where["at"]
            yield (f"**Cancelled** at {start} of {len(prompts)} prompts of {name} ({i + 1} of {len(names)} "
                   "model(s)): nothing was analysed.", None, None, None)
            return
        residuals = {name: pair[0] for name, pair in found.items()}
        stripped = {name: pair[1] for name, pair in found.items() if pair[1] is not None}
        progress((len(names), len(names)), desc="PCA")
        # every chosen model is aligned with the reference (itself included: a check that reads 1);
        # the reference, when not chosen, is shown beside them unaligned
        results = {name: analyse(residuals[name], residuals[reference] if reference and name in models else None,
                                 stripped.get(name), k) for name in names}
        figures = geometry_figures(results)
        lines = [f"**{len(prompts)} prompts** ({source}); {k} principal component(s)."]
        for name, r in results.items():
            ratio = ", ".join(f"{v:.2f}" for v in r["stacked"]["explained_variance_ratio"])
            line = f"- **{name}**: {r['n_layers']} layers, width {r['width']}; stacked PCA explains {ratio}"
            if "alignment" in r:
                pc1 = np.mean([score[0] for score in r["alignment"]["score"]])
                line += f"; mean alignment of PC1 with {reference}: {pc1:.3f}"
            if "pc1_stability" in r:
                line += f"; PC1 stability without trailing punctuation: {r['pc1_stability']['overall']:.3f}"
            lines.append(line)
        if not reference:
            lines.append("\nChoose a reference model to see the alignment score.")
        yield "\n".join(lines), figures["concentration"], figures["projections"], figures.get("alignment")

    @user_errors
    def diversity(self, upload, selection: str):
        from flowlens.diversity import lexical_diversity, read_texts

        path = self.bench.checked_upload(upload, (".jsonl",))
        report = lexical_diversity(read_texts(path, selection), selection=selection).to_json()
        row = {"texts": report["n_texts"], "tokens": report["n_tokens"], **report["entropy"], **report["distinct"],
               **report["unique"], f"MSTTR({report['msttr_window']})": report["msttr"]}
        table = [[k, round(v, 4) if isinstance(v, float) else ("n/a" if v is None else v)] for k, v in row.items()]
        return table, f"Lexical diversity of the {selection} of {path.name} (word tokens)."
