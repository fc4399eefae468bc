"""The "Circuits" tab: a prompt's attribution graph from per-layer transcoders, its nodes, and interventions.

Build: widgets (model, transcoder set, prompt, chat template, target token, feature-node budget) ->
`saes.circuits.attribute` on the Workbench's shared model (`bench.lm`) with the set's transcoders (loaded once,
checked against the model by `saes.circuits.load_transcoders`), pruned as circuit-tracer prunes (`prune`), drawn
with plotly (x: position, y: layer; embeddings below, logits above; the kept edges, blue positive, red negative)
beside a table of the kept feature nodes. Selecting a row shows its card: activation, influence, direct effect on
the target, the strongest edges in and out, the tokens its decoder row promotes. Intervene: the chosen feature
nodes scaled (0: ablated) in the real model (`real_effects`) beside the graph's prediction (`predicted_effects`).
Cancel stops the graph at its next backward pass; the progress bar counts the graph's rows.

Transcoder sets offered (`find_transcoder_sets`): each directory under ``saes/pretrained/`` (and the roots given)
with a transcoder per ``blocks.L.mlp.hook_in/``; the set's cfg.json names the model it was trained on.
"""

from __future__ import annotations

import html
import json
import threading
from pathlib import Path

import gradio as gr

from ui.common import Number, Textbox, check_prompt, finite_number, quiet_error, user_errors, whole_number

ROOT = Path(__file__).resolve().parents[1]
PRETRAINED = ROOT / "saes" / "pretrained"
MAX_FEATURE_NODES = 4096  # rows of the graph the tab computes at most (each a slot of a backward pass)
MAX_PROMPT_TOKENS = 64
MAX_EDGES_DRAWN = 400
MAX_SCALE = 100.0
DEFAULT_PROMPT = "Sort: 84 48 7"


def find_transcoder_sets(roots=None) -> list[str]:
    """Directories holding per-layer transcoders (``blocks.L.mlp.hook_in/cfg.json`` with a transcoder's
    architecture), under saes/pretrained/ and ``roots``."""
    found = []
    for root in [PRETRAINED, *(roots or [])]:
        root = Path(root)
        if not root.is_dir():
            continue
        for candidate in [root, *sorted(p for p in root.iterdir() if p.is_dir())]:
            cfg = candidate / "blocks.0.mlp.hook_in" / "cfg.json"
            if cfg.is_file() and "transcoder" in str(_cfg(cfg).get("architecture", "")):
                found.append(str(candidate))
    return list(dict.fromkeys(found))


def _cfg(path: Path) -> dict:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return {}


def set_model(directory: str) -> str | None:
    """The model a transcoder set was trained on (its layer-0 cfg.json's metadata.model_name)."""
    return (_cfg(Path(directory) / "blocks.0.mlp.hook_in" / "cfg.json").get("metadata") or {}).get("model_name")


def _embedded(name: str | None) -> bool:
    """Whether the spec says the model is an embedded one (the chat world's; its graphs take seconds)."""
    from interp.models.spec import model_spec

    try:
        return name is not None and model_spec(name).source == "embedded"
    except (ValueError, OSError):
        return False


def build_circuits_tab(bench, roots=None) -> "CircuitsTab":
    tab = CircuitsTab(bench, roots)
    sets = tab.set_choices()
    models = bench.chat_models()
    # the embedded chat model's set first: the example prompt is its task, and its graph takes seconds
    default_set = next((d for d in sets if _embedded(set_model(d))), sets[0] if sets else None)
    default_model = set_model(default_set) if default_set else (models[0] if models else None)
    with gr.Tab("Circuits", id="circuits"):
        gr.Markdown("The attribution graph of a prompt's next token (circuit-tracer's method: every MLP replaced by "
                    "its transcoder plus an error node, attention and norms frozen), pruned to the nodes and edges "
                    "that carry most of the influence on the target. Select a feature in the table for its card; "
                    "ablate or scale features to see the real model's logits change beside the graph's "
                    "prediction. CLI: `python -m saes graph` (circuit-tracer's JSON).")
        with gr.Row():
            with gr.Column():
                prompt = Textbox(label="Prompt", value=DEFAULT_PROMPT, lines=2, elem_id="circuits-prompt")
                with gr.Row():
                    model = gr.Dropdown(label="Model", choices=models, value=default_model, elem_id="circuits-model")
                    transcoders = gr.Dropdown(label="Transcoders (or type a directory)", choices=sets,
                                              value=default_set, allow_custom_value=True,
                                              elem_id="circuits-transcoders")
                with gr.Row():
                    chat = gr.Checkbox(label="Chat template", value=True, elem_id="circuits-chat")
                    target = Textbox(label="Target token (empty: the likeliest)", value="", elem_id="circuits-target")
                    budget = Number(label=f"Feature nodes (1 to {MAX_FEATURE_NODES})", value=512,
                                    elem_id="circuits-budget")
                with gr.Row():
                    run = gr.Button("Build the graph", variant="primary", elem_id="circuits-run")
                    stop = gr.Button("Cancel", elem_id="circuits-cancel")
                status = gr.Markdown(elem_id="circuits-status")
            with gr.Column():
                plot = gr.Plot(label="Graph", elem_id="circuits-plot")
        with gr.Row():
            with gr.Column(scale=3):
                table = gr.Dataframe(headers=["node", "layer", "position", "token", "feature", "activation",
                                              "influence", "effect on target"],
                                     datatype=["number", "number", "number", "str", "number", "number", "number",
                                               "number"], interactive=False, max_height=360,
                                     elem_id="circuits-table")
            with gr.Column(scale=2):
                card = gr.HTML(elem_id="circuits-card")
        with gr.Row():
            nodes = Textbox(label="Feature nodes to change (the table's node numbers, comma separated)", value="",
                            elem_id="circuits-nodes")
            scale = Number(label="Scale (0: ablate; 2: double)", value=0.0, elem_id="circuits-scale")
            apply = gr.Button("Intervene", elem_id="circuits-intervene")
        effects = gr.Dataframe(headers=["target", "logit (demeaned)", "graph's prediction", "real change"],
                               datatype=["str", "number", "number", "number"], interactive=False,
                               elem_id="circuits-effects")
        effects_status = gr.Markdown(elem_id="circuits-effects-status")
        graph_state = gr.State(None)
    built = run.click(tab.build, inputs_kwargs={"model": model, "transcoders_dir": transcoders, "prompt": prompt,
                                                "chat": chat, "target": target, "max_feature_nodes": budget},
                      outputs=[plot, table, status, graph_state, nodes, card], concurrency_limit=1)
    stop.click(bench.cancel("circuits", "**Cancelled**: the graph was not finished."), None, [status],
               cancels=[built], queue=False, api_name=False)
    transcoders.input(tab.model_for_set, inputs_kwargs={"transcoders_dir": transcoders, "model": model},
                      outputs=[model], api_name=False)
    table.select(tab.select_node, inputs_kwargs={"state": graph_state, "rows": table, "chosen": nodes},
                 outputs=[card, nodes], api_name=False)
    apply.click(tab.intervene, inputs_kwargs={"state": graph_state, "nodes": nodes, "scale": scale},
                outputs=[effects, effects_status], api_name=False)
    return tab


class CircuitsTab:
    """The tab's handlers and the transcoder sets it has loaded (language models: ``bench.lm``'s shared cache)."""

    def __init__(self, bench, roots=None):
        self.bench = bench
        self.roots = roots
        self._lock = threading.Lock()
        self._sets: dict = {}

    def set_choices(self) -> list[str]:
        return find_transcoder_sets(self.roots)

    def transcoders(self, directory: str, model: str, lm):
        from saes.circuits import load_transcoders

        if not directory or not str(directory).strip():
            raise ValueError("choose a transcoder set (a directory with blocks.L.mlp.hook_in/ for every layer)")
        path = Path(str(directory).strip()).expanduser()
        if not path.is_dir():
            raise ValueError(f"{path.name or directory} is not a directory of transcoders")
        key = (str(path.resolve()), model)
        with self._lock:
            if key not in self._sets:
                self._sets[key] = load_transcoders(path, lm, model_name=model)
        return self._sets[key]

    @user_errors
    def model_for_set(self, transcoders_dir: str, model: str):
        """A transcoder set chosen: the model it was trained on, when the app has it."""
        trained_on = set_model(transcoders_dir) if transcoders_dir else None
        return trained_on if trained_on in self.bench.chat_models() else gr.update()

    @user_errors
    def build(self, model: str, transcoders_dir: str, prompt: str, chat: bool, target: str, max_feature_nodes,
              request: gr.Request = None, progress=gr.Progress()):
        """(figure, kept feature nodes, status, the graph for the other handlers, the nodes box, the card)."""
        from interp.models.generation import Cancelled
        from saes.circuits import GraphError, attribute, graph_scores, prune, tokenize_prompt

        prompt = check_prompt(prompt)
        if not prompt.strip():
            raise ValueError("the prompt is empty: give the text whose next token the graph explains")
        budget = whole_number(max_feature_nodes, "feature nodes", 1, MAX_FEATURE_NODES)
        if not model:
            raise ValueError("choose a model")
        target = (target or "").strip() if isinstance(target, str) else target
        lm = self.bench.lm(model)
        transcoders = self.transcoders(transcoders_dir, model, lm)
        ids = tokenize_prompt(lm, prompt, bool(chat))
        if len(ids) > MAX_PROMPT_TOKENS:
            raise GraphError(f"the prompt is {len(ids)} tokens; this tab draws graphs of at most {MAX_PROMPT_TOKENS} "
                             "(python -m saes graph takes longer ones)")
        cancel = self.bench.start_action(request, "circuits")

        def step(done: int, total: int) -> None:
            if cancel.is_set():
                raise Cancelled("cancelled")
            progress((done, total), desc="graph rows", unit="row")

        try:
            graph = attribute(lm, transcoders, ids, [target] if target else None, model_name=model,
                              max_feature_nodes=budget, batch_size=32, progress=step)
        except Cancelled:
            return gr.update(), gr.update(), "**Cancelled**: the graph was not finished.", gr.update(), \
                gr.update(), gr.update()
        finally:
            self.bench.end_action(request, "circuits", cancel)
        pruned = prune(graph)
        scores = graph_scores(graph)
        rows = self._rows(graph, pruned)
        kept = int(pruned.node_mask[:graph.n_features].sum())
        status = (f"**{graph.logit_strings[0]!r}** (p = {float(graph.logit_probabilities[0]):.3f}) after "
                  f"{len(ids)} tokens: {graph.info['n_active_features']} active features, "
                  f"{graph.n_features} with rows (budget {budget}); {kept} features and "
                  f"{int(pruned.edge_mask.sum())} edges kept. Replacement score {scores['replacement_score']:.3f}, "
                  f"completeness {scores['completeness_score']:.3f}.")
        first = rows[0][0] if rows else ""
        return self._figure(graph, pruned), rows, status, {"graph": graph, "pruned": pruned, "model": model,
                                                          "transcoders": transcoders}, \
            str(first), self._card(graph, pruned, lm, int(first), transcoders) if rows else ""

    @staticmethod
    def _rows(graph, pruned) -> list[list]:
        kept = pruned.node_mask[:graph.n_features].nonzero().flatten().tolist()
        kept.sort(key=lambda i: -float(pruned.node_influence[i]))
        rows = []
        for i in kept:
            layer, pos, feat = graph.features[i].tolist()
            rows.append([i, layer, pos, graph.token_strings[pos], feat, round(float(graph.activations[i]), 3),
                         round(float(pruned.node_influence[i]), 4),
                         round(float(graph.adjacency[graph.logit_start, i]), 4)])
        return rows

    @staticmethod
    def _figure(graph, pruned):
        import plotly.graph_objects as go

        n_layers, n_pos = graph.n_layers, graph.n_pos
        kept = pruned.node_mask.nonzero().flatten().tolist()
        place, label, kind = {}, {}, {}
        per_cell: dict = {}
        for i in kept:
            if i < graph.n_features:
                layer, pos, feat = graph.features[i].tolist()
                y, text, k = layer, f"L{layer} #{feat} @{pos} {graph.token_strings[pos]!r}<br>act " \
                    f"{float(graph.activations[i]):.2f}", "feature"
            elif i < graph.token_start:
                layer, pos = divmod(i - graph.error_start, n_pos)
                y, text, k = layer + 0.5, f"error L{layer} @{pos}", "error"
            elif i < graph.logit_start:
                pos = i - graph.token_start
                y, text, k = -1, f"embedding {graph.token_strings[pos]!r} @{pos}", "embedding"
            else:
                j = i - graph.logit_start
                pos, y = n_pos - 1, n_layers
                text, k = f"logit {graph.logit_strings[j]!r} p={float(graph.logit_probabilities[j]):.3f}", "logit"
            if k != "logit":
                pos = int(graph.features[i, 1]) if i < graph.n_features else pos
            slot = per_cell.setdefault((pos, y), [])
            slot.append(i)
            place[i] = (pos, y)
            label[i], kind[i] = text, k
        for (pos, y), members in per_cell.items():  # spread a cell's nodes across its column
            for r, i in enumerate(members):
                place[i] = (pos + (r - (len(members) - 1) / 2) * min(0.8 / max(len(members), 1), 0.3), y)
        fig = go.Figure()
        targets, sources = pruned.edge_mask.nonzero(as_tuple=True)
        weights = graph.adjacency[targets, sources]
        order = weights.abs().argsort(descending=True)[:MAX_EDGES_DRAWN]
        for sign, colour in ((1, "rgba(31,119,180,0.35)"), (-1, "rgba(214,39,40,0.35)")):
            xs, ys = [], []
            for e in order.tolist():
                t, s, w = int(targets[e]), int(sources[e]), float(weights[e])
                if (w > 0) != (sign > 0) or s not in place or t not in place:
                    continue
                xs += [place[s][0], place[t][0], None]
                ys += [place[s][1], place[t][1], None]
            fig.add_trace(go.Scatter(x=xs, y=ys, mode="lines", line={"color": colour, "width": 1}, hoverinfo="skip",
                                     name="positive edges" if sign > 0 else "negative edges"))
        for k, colour in (("embedding", "#7f7f7f"), ("feature", "#2ca02c"), ("error", "#bcbd22"),
                          ("logit", "#9467bd")):
            members = [i for i in kept if kind.get(i) == k]
            fig.add_trace(go.Scatter(x=[place[i][0] for i in members], y=[place[i][1] for i in members],
                                     mode="markers", marker={"size": 9, "color": colour}, name=k + "s",
                                     text=[f"node {i}: {label[i]}" for i in members], hoverinfo="text"))
        fig.update_layout(height=520, margin={"l": 40, "r": 10, "t": 30, "b": 80},
                          xaxis={"tickmode": "array", "tickvals": list(range(n_pos)),
                                 "ticktext": [t.replace("\n", "\\n") for t in graph.token_strings],
                                 "tickangle": -45, "title": "position"},
                          yaxis={"title": "layer (embeddings -1, logits top)"}, legend={"orientation": "h"})
        return fig

    @staticmethod
    def _card(graph, pruned, lm, node: int, transcoders) -> str:
        from saes.circuits import predicted_effects

        layer, pos, feat = graph.features[node].tolist()
        tc = transcoders.get(layer)
        A = graph.adjacency

        def name(i: int) -> str:
            if i < graph.n_features:
                l, p, f = graph.features[i].tolist()
                return f"L{l} #{f} @{p}"
            if i < graph.token_start:
                l, p = divmod(i - graph.error_start, graph.n_pos)
                return f"error L{l} @{p}"
            if i < graph.logit_start:
                return f"embedding {graph.token_strings[i - graph.token_start]!r}"
            return f"logit {graph.logit_strings[i - graph.logit_start]!r}"

        incoming = A[node].abs().argsort(descending=True)[:6].tolist()
        outgoing = A[:, node].abs().argsort(descending=True)[:6].tolist()
        rows_in = "".join(f"<tr><td>{html.escape(name(i))}</td><td>{float(A[node, i]):+.3f}</td></tr>"
                          for i in incoming if float(A[node, i]) != 0)
        rows_out = "".join(f"<tr><td>{html.escape(name(i))}</td><td>{float(A[i, node]):+.3f}</td></tr>"
                           for i in outgoing if float(A[i, node]) != 0)
        promoted = ""
        if tc is not None and lm.tokenizer is not None:
            from saes.circuits import _unembedding

            unembed, _ = _unembedding(lm)
            scores = unembed.float() @ tc.W_dec[feat].float()
            promoted = ", ".join(html.escape(repr(lm.tokenizer.decode([t]))) for t in scores.topk(8).indices.tolist())
        predicted = float(predicted_effects(graph, [node])[0])
        return (f"<div id='circuits-feature-card'><h4>Node {node}: layer {layer}, feature {feat}, position {pos} "
                f"({html.escape(repr(graph.token_strings[pos]))})</h4>"
                f"<p>activation {float(graph.activations[node]):.3f}; influence "
                f"{float(pruned.node_influence[node]):.4f}; direct effect on {html.escape(repr(graph.logit_strings[0]))}"
                f" {float(A[graph.logit_start, node]):+.3f}; the graph predicts ablating it changes that logit by "
                f"{predicted:+.3f}.</p>"
                + (f"<p>its decoder row promotes: {promoted}</p>" if promoted else "")
                + f"<table><tr><th>strongest inputs</th><th>effect</th></tr>{rows_in}</table>"
                f"<table><tr><th>strongest outputs</th><th>effect</th></tr>{rows_out}</table></div>")

    @user_errors
    def select_node(self, state, rows, chosen: str, evt: gr.SelectData):
        """A clicked row: its feature's card, and the node added to the intervention box."""
        if not state:
            raise quiet_error("build a graph first", "select_node")
        row = evt.index[0] if isinstance(evt.index, (list, tuple)) else evt.index
        try:
            node = int(rows.iloc[row, 0]) if hasattr(rows, "iloc") else int(rows[row][0])
        except (IndexError, ValueError, TypeError, KeyError):
            raise quiet_error("no feature node in that row", "select_node") from None
        card = self._card(state["graph"], state["pruned"], self.bench.lm(state["model"]), node, state["transcoders"])
        present = [p.strip() for p in (chosen or "").split(",") if p.strip()]
        if str(node) not in present:
            present.append(str(node))
        return card, ", ".join(present)

    @user_errors
    def intervene(self, state, nodes: str, scale):
        """(per target: demeaned logit, predicted change, real change; a status line)."""
        from saes.circuits import predicted_effects, real_effects

        if not state:
            raise ValueError("build a graph first")
        graph = state["graph"]
        factor = finite_number(scale, "scale", MAX_SCALE)
        parts = [p.strip() for p in (nodes or "").split(",") if p.strip()]
        if not parts:
            raise ValueError("give the feature nodes to change: the table's node numbers, comma separated")
        if len(parts) > 64:
            raise ValueError(f"at most 64 nodes at once, got {len(parts)}")
        chosen = []
        for p in parts:
            if not p.isdigit() or int(p) >= graph.n_features:
                raise ValueError(f"node {p!r} is not a feature node of this graph (0..{graph.n_features - 1})")
            chosen.append(int(p))
        chosen = list(dict.fromkeys(chosen))
        predicted = predicted_effects(graph, chosen, scale=factor)
        real = real_effects(self.bench.lm(state["model"]), graph, state["transcoders"], chosen, scale=factor)
        rows = [[graph.logit_strings[k], round(float(graph.values[graph.logit_start + k]), 4),
                 round(float(predicted[k]), 4), round(float(real[k]), 4)] for k in range(len(graph.logit_tokens))]
        what = "ablated" if factor == 0 else f"scaled by {factor:g}"
        agree = sum((float(p) > 0) == (float(r) > 0) for p, r in zip(predicted, real))
        return rows, (f"{len(chosen)} feature node(s) {what} at their layer and position, in the real model "
                      f"(attention, norms and later MLPs live) beside the graph's linear prediction; the signs "
                      f"agree on {agree} of {len(rows)} targets.")


__all__ = ["CircuitsTab", "build_circuits_tab", "find_transcoder_sets", "set_model"]
