"""The "Features" tab: the feature cards of one block's SAE as a table, and one card with its top images.

Model: the app's text-to-image model, or a language model with SAE feature cards (an SAE directory on a residual
hook with the features.json that `python -m saes features --text` wrote beside it, found where the LM steering
tab finds SAEs: `ui.lm_steer.lm_sae_roots`). Widgets (model, block, sort, search, feature id) ->
- the image model: `saes.library.FeatureLibrary` (cards, search, card) and the analysis image pool the cards
  were made on (`load_analysis_images`) with `heatmap_overlay`;
- a language model: `saes.lm_features.load_lm_cards` and `card_html` (top contexts with the tokens shaded by
  activation, histogram, promoted and suppressed tokens); the block is the SAE's hook.
Only what applies to the model picked is shown: for a language model the image-only widgets are hidden (the
Top images gallery; the AUROC sort, as an LM card has no label) and the search is over tokens, not labels
(`model_widgets`). `open_feature` shows a feature chosen in another tab (the Generate tab's top features): this tab
selected, the image model with its widgets, the feature's block, table and card. HTTP API: /features (block,
sort_by, search, model), /feature_card (block, feature, model).
"""

from __future__ import annotations

import gradio as gr

from pathlib import Path

from ui.common import NO_SAES_NOTE, Number, Textbox, feature_id, parse_feature_choice, percent, user_errors

IMAGE_HEADERS = ["id", "label", "AUROC", "frequency", "mean activation"]
LM_HEADERS = ["id", "promotes", "max activation", "frequency", "mean activation"]
LM_TABLE_ROWS = 500  # rows of an LM SAE's table (the most frequent first when sorted by frequency)
SORT_KEYS = {"AUROC": lambda c: -(c.get("auroc") or 0), "frequency": lambda c: -(c.get("frequency") or 0),
             "mean activation": lambda c: -(c.get("mean_activation") or 0), "id": lambda c: c["id"]}
IMAGE_SORTS = list(SORT_KEYS)
LM_SORTS = [k for k in SORT_KEYS if k != "AUROC"]  # an LM card has no label, so no AUROC
SEARCH_LABELS = {"image": "Search labels", "lm": "Search tokens (promoted, or in the top contexts)"}


def build_features_tab(bench, demo: gr.Blocks) -> FeaturesTab:
    tab = FeaturesTab(bench)
    blocks = bench.library.blocks if bench.library is not None else []
    default_block = blocks[-1] if blocks else None
    with gr.Tab("Features", id="features"):
        if not blocks:
            gr.Markdown(NO_SAES_NOTE.format(model=bench.model_name).strip(), elem_id="features-note")
        with gr.Row():
            model = gr.Dropdown(label="Model", choices=tab.models(), value=bench.model_name,
                                elem_id="features-model")
            block = gr.Dropdown(label="Block (an LM's: the SAE's hook)", choices=blocks, value=default_block,
                                elem_id="features-block")
            sort_by = gr.Radio(IMAGE_SORTS, value="AUROC", label="Sort by", elem_id="features-sort")
            search = Textbox(label=SEARCH_LABELS["image"], elem_id="features-search")
            show = gr.Button("Show", elem_id="features-show")
        summary = gr.Markdown(elem_id="features-summary")
        with gr.Row():
            table = gr.Dataframe(headers=["id", "label", "AUROC", "frequency", "mean activation"],
                                 interactive=False, elem_id="features-table", max_height=420)
            with gr.Column():
                feature = Number(label="Feature id", minimum=0, elem_id="features-id")
                open_card = gr.Button("Open card", elem_id="features-open")
                card = gr.Markdown(elem_id="feature-card")
                gallery = gr.Gallery(label="Top images (heatmap in red)", columns=3, height=300,
                                     elem_id="feature-gallery")
                lm_card = gr.HTML(elem_id="feature-lm-card")
        # SAEBench's results of the chosen model's SAEs, as written by `saes bench` / experiments.image_saebench
        with gr.Accordion("Benchmark (SAEBench)", open=False, elem_id="features-benchmark"):
            bench_note = gr.Markdown(elem_id="features-benchmark-note")
            bench_table = gr.Dataframe(interactive=False, elem_id="features-benchmark-table", max_height=360)
            bench_plot = gr.Plot(elem_id="features-benchmark-plot")
    # inputs by name: the handlers' parameters; each dict's order is the HTTP API's.
    # Queued: an error of an unqueued event reaches the browser as a bare "Error", without its message.
    listing = {"block": block, "sort_by": sort_by, "search": search, "model": model}
    shown = [card, gallery, lm_card]
    show.click(tab.table, inputs_kwargs=listing, outputs=[table, summary], api_name="features")
    open_card.click(tab.card, inputs_kwargs={"block": block, "feature": feature, "model": model}, outputs=shown,
                    api_name="feature_card")
    # a table click carries its row in gr.SelectData, which an API call cannot send: not an endpoint
    table.select(tab.select, inputs_kwargs={"block": block, "model": model}, outputs=[feature, *shown],
                 api_name=False)
    # another block chosen: its own table, and the old block's card cleared (a row or id is per block). On the
    # user's input only: open_feature sets the block together with its table and the card it opens.
    block.input(tab.block_changed, inputs_kwargs=listing, outputs=[table, summary, feature, *shown], api_name=False)
    # another model: its blocks and table, and only the widgets that apply to it (model_widgets)
    model.input(tab.model_changed, inputs_kwargs={"model": model, "sort_by": sort_by, "search": search},
                outputs=[block, sort_by, search, table, summary, feature, *shown], api_name=False)
    # on the user's input only: model_changed and open_feature set the sort together with the table it gives
    sort_by.input(tab.table, inputs_kwargs=listing, outputs=[table, summary], api_name=False)
    search.submit(tab.table, inputs_kwargs=listing, outputs=[table, summary], api_name=False)
    if default_block:
        demo.load(tab.table, inputs_kwargs=listing, outputs=[table, summary])
    # the benchmark follows the model however it is set (the user, or open_feature from another tab)
    benchmark = [bench_note, bench_table, bench_plot]
    model.change(tab.benchmark, inputs_kwargs={"model": model}, outputs=benchmark, api_name=False)
    demo.load(tab.benchmark, inputs_kwargs={"model": model}, outputs=benchmark, api_name="features_benchmark")
    # for a link from another tab (app.py): open_feature's inputs after the choice, and its outputs after the tabs
    tab.open_inputs = {"sort_by": sort_by, "search": search}
    tab.open_outputs = [model, block, sort_by, search, table, summary, feature, *shown]
    return tab


def lm_card_sets(roots) -> dict[str, dict[str, str]]:
    """Language model -> {hook: SAE directory} for every SAE on a residual hook under ``roots`` that has LM feature
    cards beside it (the model: cfg.json's metadata.model_name)."""
    import json

    from saes.lm_features import FEATURES_FILENAME, sae_hook_name

    from ui.lm_steer import find_lm_saes

    sets: dict[str, dict[str, str]] = {}
    for directory in find_lm_saes(roots):
        path = Path(directory)
        if not (path / FEATURES_FILENAME).is_file():
            continue
        try:
            raw = json.loads((path / "cfg.json").read_text())
        except (OSError, ValueError):
            continue
        model = (raw.get("metadata") or {}).get("model_name") or raw.get("model_name")
        if model:
            sets.setdefault(str(model), {}).setdefault(sae_hook_name(path), directory)
    return {m: dict(sorted(hooks.items())) for m, hooks in sorted(sets.items())}


def _lm_matches(card: dict, query: str) -> bool:
    """A search of an LM card: the query in its promoted tokens or its top contexts (case-insensitive)."""
    query = query.lower()
    text = " ".join([*(t["token"] for t in card["promoted"]),
                     *("".join(c["tokens"]) for c in card["top_contexts"])]).lower()
    return query in text


class FeaturesTab:
    def __init__(self, bench, lm_roots=None):
        from ui.lm_steer import lm_sae_roots

        self.bench = bench
        self.open_inputs, self.open_outputs = {}, []  # set by build_features_tab
        self.lm_roots = lm_sae_roots(lm_roots)
        self.lm_sets = lm_card_sets(self.lm_roots)
        self.image_results_dir = None  # where experiments.image_saebench's runs are (None: experiments/results)
        self._lm_cards: dict = {}

    # ----- which model: the image model's library, or a language model's SAE cards --------------------
    def models(self) -> list[str]:
        return [self.bench.model_name, *(m for m in self.lm_sets if m != self.bench.model_name)]

    def kind(self, model) -> str:
        """The kind of the model picked (`interp.names`): the workbench's image model (no choice yet is that model;
        the app's --model is a text-to-image model: `app.check_arguments` asks its spec) or a language model whose
        card set is listed (its SAEs read an LM hook: `lm_card_sets`); anything else is one line."""
        from interp.names import LM, T2I

        if not model or model == self.bench.model_name:
            return T2I
        if model in self.lm_sets:
            return LM
        raise ValueError(f"choose a model: one of {', '.join(self.models())}")

    def is_lm(self, model) -> bool:
        from interp.names import LM

        return self.kind(model) == LM

    def lm_payload(self, model: str, block: str) -> dict:
        """The feature cards of the model's SAE at this hook (read once per version of the file)."""
        from saes.lm_features import FEATURES_FILENAME, load_lm_cards

        hooks = self.lm_sets.get(model)
        if hooks is None:
            raise ValueError(f"choose a model: one of {', '.join(self.models())}")
        if block not in hooks:
            raise ValueError(f"{model} has feature cards at {', '.join(hooks)}; choose one of those")
        directory = Path(hooks[block])
        key = (str(directory), (directory / FEATURES_FILENAME).stat().st_mtime_ns)
        if key not in self._lm_cards:
            self._lm_cards[key] = load_lm_cards(directory)
        return self._lm_cards[key]

    def model_widgets(self, model, sort_by: str, gallery=()):
        """The updates that show only what applies to the model: (the sort with the model's keys and a value among
        them, the search's label, the gallery with these images: hidden for an LM, whose cards have none)."""
        lm = self.is_lm(model)
        sorts = LM_SORTS if lm else IMAGE_SORTS
        value = sort_by if sort_by in sorts else sorts[0]
        return (gr.update(choices=sorts, value=value), gr.update(label=SEARCH_LABELS["lm" if lm else "image"]),
                gr.update(value=list(gallery), visible=not lm))

    @user_errors
    def model_changed(self, model: str, sort_by: str, search: str):
        """Another model chosen: its blocks (an LM's: the hooks with cards), its widgets (model_widgets), the first
        block's table, the card cleared."""
        if self.is_lm(model):
            blocks = list(self.lm_sets.get(model) or {})
        else:
            blocks = self.bench.library.blocks if self.bench.library is not None else []
        if not blocks:
            raise ValueError(f"{model} has no SAE feature cards here")
        block = blocks[0] if self.is_lm(model) else blocks[-1]
        sort, search_box, gallery = self.model_widgets(model, sort_by)
        rows, summary = self._table(block, sort["value"], search, model)
        return gr.update(choices=blocks, value=block), sort, search_box, rows, summary, None, "", gallery, ""

    # ----- the wired handlers: each dispatches on the model -------------------------------------------
    def _table(self, block: str, sort_by: str, search: str, model: str | None = None):
        """(the table as a DataFrame with its headers, a summary line)."""
        import pandas as pd

        if self.is_lm(model):
            rows, summary = self.lm_table(model, block, sort_by, search)
            return pd.DataFrame(rows, columns=LM_HEADERS), summary
        rows, summary = self._feature_table(block, sort_by, search)
        return pd.DataFrame(rows, columns=IMAGE_HEADERS), summary

    def _card(self, block: str, feature, model: str | None = None):
        """(the card's text, its top images, the LM card's HTML): the image model's or an LM's."""
        if self.is_lm(model):
            return self.lm_card(model, block, feature)
        return (*self._feature_card(block, feature), "")

    @user_errors
    def select(self, block: str, evt: gr.SelectData, model: str | None = None):
        row = evt.row_value if hasattr(evt, "row_value") and evt.row_value else None
        feature = row[0] if row else evt.value
        return (feature, *self._card(block, feature, model))

    @user_errors
    def block_changed(self, block: str, sort_by: str, search: str, model: str | None = None):
        """A new block chosen: its table, and the card of the other block cleared (its id means nothing here)."""
        rows, summary = self._table(block, sort_by, search, model)
        return rows, summary, None, "", [], ""

    # ----- the public handlers: each logs a user error once (they call only the undecorated bodies) -----
    @user_errors
    def table(self, block: str, sort_by: str, search: str, model: str | None = None):
        """(the table as a DataFrame with its headers, a summary line): the image model's or an LM's."""
        return self._table(block, sort_by, search, model)

    @user_errors
    def card(self, block: str, feature, model: str | None = None):
        """(the card's text, its top images, the LM card's HTML): the image model's or an LM's."""
        return self._card(block, feature, model)

    @user_errors
    def feature_table(self, block: str, sort_by: str, search: str):
        return self._feature_table(block, sort_by, search)

    @user_errors
    def feature_card(self, block: str, feature):
        return self._feature_card(block, feature)

    # ----- SAEBench's results of the model's SAEs ---------------------------------------------------------
    @user_errors
    def benchmark(self, model: str):
        """(a note, the table of key metrics per SAE, SAEBench's metric-vs-L0 plot) of the bench results of the
        model's SAEs, read as written (`saes.bench.results`); a model without any: the note says what makes them."""
        import pandas as pd

        from saes.bench.plots import figure
        from saes.bench.results import ROOT, image_results, lm_results

        from ui.lm_steer import find_lm_saes

        if model not in self.models():
            raise ValueError(f"choose a model: one of {', '.join(self.models())}")
        if self.is_lm(model):
            results = lm_results(model, find_lm_saes(self.lm_roots))
        else:
            results = image_results(model, *([self.image_results_dir] if self.image_results_dir else []))
        if not results.rows:
            return (f"No SAEBench results for {model}'s SAEs here: `{results.command}` makes them.",
                    pd.DataFrame(columns=["SAE"]), None)
        headers, rows = results.table()

        def shown(path: str) -> str:
            path = Path(path).resolve()
            return str(path.relative_to(ROOT)) if path.is_relative_to(ROOT) else str(path)

        note = (f"SAEBench results of {len(rows)} SAE(s) of {model}, read from "
                f"{', '.join(f'`{shown(s)}`' for s in dict.fromkeys(results.sources))} (as written, not recomputed; "
                f"{'docs/saebench.md' if self.is_lm(model) else 'docs/image-saebench.md'} reads them). "
                f"More: `{results.command}`.")
        fig = figure(results.rows, results.panels, title=f"SAEBench metrics against L0: {model}", width=None)
        # the page's width for the panels: the legend under them, the panels' titles small enough not to overlap
        fig.update_layout(legend={"orientation": "h", "yanchor": "top", "y": -0.22, "font": {"size": 10}},
                          height=440 + 11 * len(rows), margin={"t": 70, "b": 20})
        fig.update_annotations(font_size=11)
        return note, pd.DataFrame(rows, columns=headers), fig

    # ----- a language model's cards -------------------------------------------------------------------
    def lm_table(self, model: str, block: str, sort_by: str, search: str):
        payload = self.lm_payload(model, block)
        cards = [c for c in payload["features"] if c["n_firing"] > 0]
        if search and search.strip():
            cards = [c for c in cards if _lm_matches(c, search.strip())]
        key = {"AUROC": SORT_KEYS["frequency"]}.get(sort_by, SORT_KEYS.get(sort_by, SORT_KEYS["frequency"]))
        chosen = sorted(cards, key=key)
        rows = [[c["id"], " ".join(t["token"].strip() or repr(t["token"]) for t in c["promoted"][:5]),
                 round(c["max_activation"], 3), percent(c["frequency"]), round(c["mean_activation"], 3)]
                for c in chosen[:LM_TABLE_ROWS]]
        corpus = payload["corpus"]
        note = " (an LM SAE has no labels: sorted by frequency)" if sort_by == "AUROC" else ""
        shown = f"; showing {len(rows)}" if len(rows) < len(chosen) else ""
        return rows, (f"{len(chosen)} feature(s) of {block} of {model} that fire on {corpus['tokens']} tokens of "
                      f"{corpus['path']}{shown}{note}")

    def lm_card(self, model: str, block: str, feature):
        from saes.lm_features import CSS, card_html

        payload = self.lm_payload(model, block)
        n = len(payload["features"])
        if (feature is None or feature == "" or not float(feature).is_integer()
                or not 0 <= float(feature) < n):
            raise ValueError(f"feature must be a whole number from 0 to {n - 1} ({block} of {model} has {n})")
        card = payload["features"][int(float(feature))]
        html = f"<style>{CSS.replace('body{', '.lm-cards{')}</style><div class='lm-cards'>{card_html(card)}</div>"
        return f"### {block} feature {card['id']} ({model})", [], html

    def _feature_table(self, block: str, sort_by: str, search: str):
        library = self.bench.require_library()
        cards = library.cards(block)
        if not cards:
            return [], f"{block} has no feature cards yet (`python -m saes features`)"
        if search and search.strip():
            ids = set(library.search(block, search))
            cards = [c for c in cards if c["id"] in ids]
        rows = [[c["id"], c.get("label") or "", round(c.get("auroc") or 0, 3), percent(c.get("frequency") or 0),
                 round(c.get("mean_activation") or 0, 3)] for c in sorted(cards, key=SORT_KEYS[sort_by])]
        return rows, f"{len(rows)} feature(s) of {block}"

    def _feature_card(self, block: str, feature):
        from saes.causal import STRENGTH
        from saes.library import label_scores
        from saes.render import heatmap_overlay

        library = self.bench.require_library()
        feature = feature_id(library, block, feature)
        card = library.card(block, feature)
        causal_strength = library.causal_config(block).get("strength", STRENGTH)
        pool = self.bench.analysis_images
        gallery = []
        for top in card.get("top_images", []):
            if pool is None:
                break
            images, prompts = pool
            gallery.append((heatmap_overlay(images[top["index"]], top["heatmap"]),
                            f"{prompts[top['index']]} (max {top['activation']:.2f})"))
        scores = label_scores(card)
        text = (f"### {block} feature {feature}\n**Label:** {card.get('label') or 'unlabelled'}"
                + (f" ({scores})" if scores else "")
                + (f"\n\n**Causal label:** painted at {causal_strength:g} x its mean activation into "
                   f"{card['causal_label_n']} held-out scenes that do not show {card['label']} where it is painted, "
                   f"it makes the probe read {card['label']} in {100 * card['causal_label']:.0f}% of them "
                   f"({100 * card['causal_label_before']:.0f}% before the edit); the label search ranks by this"
                   if card.get("causal_label") is not None else "")
                + (f"\n\n**Fires on** {percent(card['frequency'])} of positions; **mean activation when firing** "
                   f"{card['mean_activation']:.3f}" if card.get("frequency") is not None else ""))
        if card.get("firing_by_value"):
            shares = sorted(card["firing_by_value"].items(), key=lambda kv: -kv[1])
            text += (f"\n\n**Firing rate by {card['attribute']}** (share of objects, or background positions): "
                     + ", ".join(f"{value} {100 * share:.0f}%" for value, share in shares))
        return text, gallery

    @user_errors
    def open_feature(self, choice: str, sort_by: str, search: str):
        """A feature chosen elsewhere ("block #id (label)"): this tab selected (its id is "features"), the image
        model with its widgets (an LM may have been picked), the feature's block with its table, the id and the
        card."""
        block, feature = parse_feature_choice(choice)
        model = self.bench.model_name
        sort, search_box, _ = self.model_widgets(model, sort_by)
        rows, summary = self._table(block, sort["value"], search, model)
        text, images, html = self._card(block, feature, model)
        gallery = self.model_widgets(model, sort_by, images)[2]
        blocks = self.bench.library.blocks if self.bench.library is not None else []
        return (gr.Tabs(selected="features"), gr.update(value=model), gr.update(choices=blocks, value=block), sort,
                search_box, rows, summary, feature, text, gallery, html)
