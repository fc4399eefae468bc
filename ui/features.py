"""The "Features" tab: the feature cards of one block's SAE as a table, and one card with its top images.

Widgets (block, sort, label search, feature id) -> `saes.library.FeatureLibrary` (cards, search, card) and the
analysis image pool the cards were made on (`load_analysis_images`) with `heatmap_overlay`.
`open_feature` shows a feature chosen in another tab (the Generate tab's top features): this tab selected, its
block, table and card. HTTP API: /features (block, sort_by, search), /feature_card (block, feature).
"""

from __future__ import annotations

import gradio as gr

from ui.common import NO_SAES_NOTE, Number, feature_id, parse_feature_choice, percent, user_errors

SORT_KEYS = {"AUROC": lambda c: -(c.get("auroc") or 0), "frequency": lambda c: -(c.get("frequency") or 0),
             "mean activation": lambda c: -(c.get("mean_activation") or 0), "id": lambda c: c["id"]}


def build_features_tab(bench, demo: gr.Blocks) -> FeaturesTab:
    tab = FeaturesTab(bench)
    blocks = bench.library.blocks if bench.library is not None else []
    default_block = blocks[-1] if blocks else None
    with gr.Tab("Features", id="features"):
        if not blocks:
            gr.Markdown(NO_SAES_NOTE.format(model=bench.model_name).strip(), elem_id="features-note")
        with gr.Row():
            block = gr.Dropdown(label="Block", choices=blocks, value=default_block, elem_id="features-block")
            sort_by = gr.Radio(list(SORT_KEYS), value="AUROC", label="Sort by", elem_id="features-sort")
            search = gr.Textbox(label="Search labels", elem_id="features-search")
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
    # inputs by name: the handlers' parameters; each dict's order is the HTTP API's.
    # Queued: an error of an unqueued event reaches the browser as a bare "Error", without its message.
    listing = {"block": block, "sort_by": sort_by, "search": search}
    show.click(tab.feature_table, inputs_kwargs=listing, outputs=[table, summary], api_name="features")
    open_card.click(tab.feature_card, inputs_kwargs={"block": block, "feature": feature}, outputs=[card, gallery],
                    api_name="feature_card")
    table.select(tab.select_row, inputs_kwargs={"block": block}, outputs=[feature, card, gallery])
    # another block chosen: its own table, and the old block's card cleared (a row or id is per block). On the
    # user's input only: open_feature sets the block together with its table and the card it opens.
    block.input(tab.feature_block, inputs_kwargs=listing, outputs=[table, summary, feature, card, gallery],
                 api_name=False)
    sort_by.change(tab.feature_table, inputs_kwargs=listing, outputs=[table, summary], api_name=False)
    search.submit(tab.feature_table, inputs_kwargs=listing, outputs=[table, summary], api_name=False)
    if default_block:
        demo.load(tab.feature_table, inputs_kwargs=listing, outputs=[table, summary])
    # for a link from another tab (app.py): open_feature's inputs after the choice, and its outputs after the tabs
    tab.open_inputs = {"sort_by": sort_by, "search": search}
    tab.open_outputs = [block, table, summary, feature, card, gallery]
    return tab


class FeaturesTab:
    def __init__(self, bench):
        self.bench = bench
        self.open_inputs, self.open_outputs = {}, []  # set by build_features_tab

    @user_errors
    def feature_table(self, block: str, sort_by: str, search: str):
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

    @user_errors
    def feature_card(self, block: str, feature):
        from saes.library import heatmap_overlay

        library = self.bench.require_library()
        feature = feature_id(library, block, feature)
        card = library.card(block, feature)
        pool = self.bench.analysis_images
        gallery = []
        for top in card.get("top_images", []):
            if pool is None:
                break
            images, prompts = pool
            gallery.append((heatmap_overlay(images[top["index"]], top["heatmap"]),
                            f"{prompts[top['index']]} (max {top['activation']:.2f})"))
        text = (f"### {block} feature {feature}\n**Label:** {card.get('label') or 'unlabelled'}"
                + (f" (AUROC {card['auroc']:.3f})" if card.get("auroc") else "")
                + (f"\n\n**Fires on** {percent(card['frequency'])} of positions; **mean activation when firing** "
                   f"{card['mean_activation']:.3f}" if card.get("frequency") is not None else ""))
        if card.get("firing_by_value"):
            shares = sorted(card["firing_by_value"].items(), key=lambda kv: -kv[1])
            text += (f"\n\n**Firing rate by {card['attribute']}** (share of objects, or background positions): "
                     + ", ".join(f"{value} {100 * share:.0f}%" for value, share in shares))
        return text, gallery

    @user_errors
    def select_row(self, block: str, evt: gr.SelectData):
        row = evt.row_value if hasattr(evt, "row_value") and evt.row_value else None
        feature = row[0] if row else evt.value
        return (feature, *self.feature_card(block, feature))

    @user_errors
    def open_feature(self, choice: str, sort_by: str, search: str):
        """A feature chosen elsewhere ("block #id (label)"): this tab selected (its id is "features"), the
        feature's block with its table, the id and the card."""
        block, feature = parse_feature_choice(choice)
        rows, summary = self.feature_table(block, sort_by, search)
        return (gr.Tabs(selected="features"), gr.update(value=block), rows, summary, feature,
                *self.feature_card(block, feature))

    @user_errors
    def feature_block(self, block: str, sort_by: str, search: str):
        """A new block chosen: its table, and the card of the other block cleared (its id means nothing here)."""
        rows, summary = self.feature_table(block, sort_by, search)
        return rows, summary, None, "", []
