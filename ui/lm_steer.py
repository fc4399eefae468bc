"""The "LM steering" tab: steer a language model by one SAE feature and browse the SAE's feature cards.

Steering: widgets (prompt, model, SAE: an SAE directory on a residual hook, feature, strength, mode, positions,
new tokens) -> `flowlens.steer.make_edit` (an `interp.hooks.lm_steer.LMEdit`) -> `flowlens.steer.
steer_comparison` on the Workbench's shared model (`bench.lm`): the greedy completion without and with the edit
side by side. The edit acts in the request's own context only, so concurrent users never see each other's
edits. Cards: the features.json that `python -m saes features --text` wrote beside the SAE
(`saes.lm_features.load_lm_cards`), as a table (click a row to steer that feature) and the chosen feature's card
(`card_html`: top contexts with highlighted tokens, histogram, promoted and suppressed tokens).

SAEs offered (`lm_sae_roots`, `find_lm_saes`; the Features tab finds LM SAEs with them too): every SAE on a
residual hook under ``saes/pretrained/``, under ``$WORKBENCH_LM_SAES`` (a directory of SAE directories, or one)
and under the roots given to `build_lm_steer_tab`; any other directory can be typed into the SAE box.
"""

from __future__ import annotations

import os
import threading
from pathlib import Path

import gradio as gr

from ui.common import Number, Textbox, check_prompt, finite_number, quiet_error, user_errors, whole_number

ROOT = Path(__file__).resolve().parents[1]
PRETRAINED = ROOT / "saes" / "pretrained"
MODES = ("add", "scale", "set", "ablate")
POSITIONS = ("all", "prompt", "generated")
MAX_NEW_TOKENS = 256
TABLE_ROWS = 200
DEFAULT_PROMPT = "What colour is the sky?"


def lm_sae_roots(extra=None) -> list:
    """Where LM SAEs are looked for: saes/pretrained/, $WORKBENCH_LM_SAES, then ``extra``."""
    env = os.environ.get("WORKBENCH_LM_SAES")
    return [PRETRAINED, *([env] if env else []), *(extra or [])]


def find_lm_saes(roots) -> list[str]:
    """SAE directories on a language-model residual hook, under (or at) each root, depth two at most."""
    from interp.models.spec import LM, saved_kind

    found = []
    for root in roots:
        root = Path(root)
        if not root.is_dir():
            continue
        for cfg in [root / "cfg.json", *root.glob("*/cfg.json"), *root.glob("*/*/cfg.json")]:
            if cfg.is_file() and saved_kind(cfg.parent) == LM and "transcoder" not in _architecture(cfg):
                found.append(str(cfg.parent))  # (a transcoder reads an MLP's input: the Circuits tab's)
    return sorted(dict.fromkeys(found))


def _architecture(cfg: Path) -> str:
    import json

    try:
        return str(json.loads(cfg.read_text()).get("architecture", ""))
    except (OSError, ValueError):
        return ""


def sae_model(directory) -> str | None:
    """The language model an SAE directory says it was trained on (cfg.json's metadata.model_name)."""
    import json

    try:
        raw = json.loads((Path(directory) / "cfg.json").read_text())
    except (OSError, ValueError):
        return None
    return (raw.get("metadata") or {}).get("model_name") or raw.get("model_name")


def build_lm_steer_tab(bench, sae_roots=None) -> LMSteerTab:
    """The "LM steering" tab, inside the caller's gr.Blocks. ``sae_roots``: more places to look for SAEs."""
    tab = LMSteerTab(bench, sae_roots)
    models = bench.chat_models()
    saes = tab.sae_choices()
    default_model = models[0] if models else None
    default_sae = tab.sae_for(default_model, saes)
    rows, summary = [], ""
    if default_sae:
        try:
            rows, summary = tab.feature_table(default_sae, "frequency")
        except gr.Error as err:  # a broken SAE directory: said when the tab opens, the rest still works
            summary = f"{default_sae}: {err.message}"
    with gr.Tab("LM steering", id="lm-steer"):
        gr.Markdown("Steer a language model by one feature of a sparse autoencoder on its residual stream: the "
                    "greedy completion without and with the edit, side by side. The edit acts at the hook the "
                    "SAE was trained on; *generated* positions are the new tokens as they are fed back in (so the "
                    "first new token is unchanged). CLI: `python -m flowlens steer`.")
        with gr.Row():
            with gr.Column():
                prompt = Textbox(label="Prompt", value=DEFAULT_PROMPT, lines=2,  # longer: refused, not cut
                                    elem_id="lm-steer-prompt")
                with gr.Row():
                    model = gr.Dropdown(label="Model", choices=models, value=default_model,
                                        elem_id="lm-steer-model")
                    sae = gr.Dropdown(label="SAE (or type a directory)", choices=saes,
                                      value=default_sae, allow_custom_value=True, elem_id="lm-steer-sae")
                with gr.Row():  # ui.common.Number: never precision=0 (it rounds silently); the handlers check
                    feature = Number(label="Feature", value=0, elem_id="lm-steer-feature")
                    strength = Number(label="Strength", value=40.0, elem_id="lm-steer-strength")
                    tokens = Number(label=f"New tokens (1 to {MAX_NEW_TOKENS})", value=32, elem_id="lm-steer-tokens")
                with gr.Row():
                    mode = gr.Radio(label="Mode", choices=list(MODES), value="add", elem_id="lm-steer-mode")
                    positions = gr.Radio(label="Positions", choices=list(POSITIONS), value="all",
                                         elem_id="lm-steer-positions")
                with gr.Row():
                    run = gr.Button("Generate without and with the edit", variant="primary", elem_id="lm-steer-run")
                    stop = gr.Button("Cancel", elem_id="lm-steer-cancel")
            with gr.Column():
                with gr.Row():
                    without = gr.Textbox(label="Without the edit", lines=6, interactive=False,
                                         elem_id="lm-steer-without")
                    edited = gr.Textbox(label="With the edit", lines=6, interactive=False, elem_id="lm-steer-with")
                status = gr.Markdown(elem_id="lm-steer-status")
        gr.Markdown("### Feature cards")
        with gr.Row():
            sort_by = gr.Dropdown(label="Sort by", choices=["frequency", "mean activation", "id"], value="frequency",
                                  elem_id="lm-cards-sort")
            show = gr.Button("Show the SAE's cards", elem_id="lm-cards-show")
        cards_summary = gr.Markdown(summary, elem_id="lm-cards-summary")
        with gr.Row():
            with gr.Column(scale=2):
                table = gr.Dataframe(value=rows or None, headers=["feature", "fires on %", "mean act.", "promotes"],
                                     datatype=["number", "number", "number", "str"], interactive=False,
                                     max_height=420, elem_id="lm-cards-table")
            with gr.Column(scale=3):
                card = gr.HTML(elem_id="lm-card")
    # inputs by name: the handlers' parameters; each dict's order is the HTTP API's. Queued, all of them: an
    # unqueued event's error reaches the browser without its message.
    steered = run.click(tab.steer, inputs_kwargs={"model": model, "sae_dir": sae, "feature": feature,
                                                  "strength": strength, "mode": mode, "positions": positions,
                                                  "prompt": prompt, "max_new_tokens": tokens},
                        outputs=[without, edited, status], concurrency_limit=2)
    # the session's flag stops the generation at its next token (the closed event frees the button at once)
    stop.click(bench.cancel("lm-steer", "**Cancelled**: nothing more is generated."), None, [status],
               cancels=[steered], queue=False, api_name=False)
    listing = {"sae_dir": sae, "sort_by": sort_by}
    show.click(tab.feature_table, inputs_kwargs=listing, outputs=[table, cards_summary])
    # the same listing on other triggers: one endpoint (/feature_table) is enough for the API
    sort_by.change(tab.feature_table, inputs_kwargs=listing, outputs=[table, cards_summary], api_name=False)
    sae.change(tab.feature_table, inputs_kwargs=listing, outputs=[table, cards_summary], api_name=False)
    model.input(tab.model_changed, inputs_kwargs={"model": model, "sort_by": sort_by},
                outputs=[sae, table, cards_summary], api_name=False)
    # a table click carries its row in gr.SelectData, which an API call cannot send (it failed blank): not an endpoint
    table.select(tab.select_row, inputs_kwargs={"sae_dir": sae, "rows": table}, outputs=[feature, card],
                 api_name=False)
    feature.submit(tab.feature_card, inputs_kwargs={"sae_dir": sae, "feature": feature}, outputs=[card])
    return tab


class LMSteerTab:
    """The tab's state (the SAEs it has loaded) and handlers; language models come from the Workbench's shared
    cache (``bench.lm``, which also refuses an unknown name)."""

    def __init__(self, bench, sae_roots=None):
        self.bench = bench
        self.roots = lm_sae_roots(sae_roots)
        self._lock = threading.Lock()
        self._saes: dict = {}

    # ----- what there is ------------------------------------------------------------------------
    def sae_choices(self) -> list[str]:
        return find_lm_saes(self.roots)

    def sae_for(self, model: str | None, choices: list[str] | None = None) -> str | None:
        """The first SAE trained on ``model`` (else the first SAE): what the SAE box shows for that model."""
        choices = self.sae_choices() if choices is None else choices
        return next((d for d in choices if sae_model(d) == model), choices[0] if choices else None)

    def sae(self, directory: str):
        """(SAE, hook) of a directory, loaded once per version of its weights file."""
        from flowlens.steer import load_lm_sae

        if not directory or not str(directory).strip():
            raise ValueError("choose an SAE (a directory with cfg.json and sae_weights.safetensors)")
        path = Path(str(directory).strip()).expanduser()
        if not (path / "cfg.json").is_file():
            raise ValueError(f"{path} is not an SAE directory (no cfg.json)")
        key = (str(path.resolve()), (path / "sae_weights.safetensors").stat().st_mtime_ns
               if (path / "sae_weights.safetensors").exists() else 0)
        with self._lock:
            if key not in self._saes:
                self._saes[key] = load_lm_sae(path)
        return self._saes[key]

    # ----- steering -----------------------------------------------------------------------------
    @user_errors
    def steer(self, model: str, sae_dir: str, feature, strength, mode: str, positions: str, prompt: str,
              max_new_tokens, request: gr.Request = None, progress=gr.Progress()):
        """(completion without the edit, with it, a status line). Cancel stops it at the next token; progress
        counts the tokens of both completions."""
        from flowlens.steer import check_feature, make_edit, steer_comparison
        from interp.hooks.lm_steer import MAX_LM_STRENGTH

        prompt = check_prompt(prompt)  # refused above the limit, never cut
        if not prompt.strip():
            raise ValueError("the prompt is empty: give some text to continue")
        if mode not in MODES or positions not in POSITIONS:
            raise ValueError(f"mode must be one of {', '.join(MODES)} and positions one of {', '.join(POSITIONS)}")
        if not model:
            raise ValueError("choose a model")
        sae, hook = self.sae(sae_dir)
        feature = check_feature(sae, whole_number(feature, "feature", 0, sae.cfg.d_sae - 1))
        strength = finite_number(strength, "strength", MAX_LM_STRENGTH)
        tokens = whole_number(max_new_tokens, "new tokens", 1, MAX_NEW_TOKENS)
        lm = self.bench.lm(model)  # the app's shared cache (and its check of the name)
        edit = make_edit(hook, feature, strength, mode, positions)
        cancel = self.bench.start_action(request, "lm-steer")
        steps = {"done": 0}

        def stopped() -> bool:  # asked before each token of both completions: progress, and the Cancel flag
            steps["done"] += 1
            progress((min(steps["done"], 2 * tokens), 2 * tokens), desc="generating", unit="token")
            return cancel.is_set()

        try:
            # the edit is context-scoped: it never reaches another request's forward pass on the shared model
            result = steer_comparison(lm, sae, hook, prompt, edit, tokens, cancel=stopped)
        finally:
            self.bench.end_action(request, "lm-steer", cancel)
        what = f"{mode} feature #{feature}" + ("" if mode == "ablate" else f", strength {strength:g}")
        notes = []
        if not result["with"].strip():  # said, not shown as an empty box under a normal status line
            notes.append("**The edited completion is empty**: with the edit the model ends at once" +
                         ("" if mode == "ablate" else f" (strength {strength:g} may be far above the feature's "
                                                      "scale: try a smaller one)") + ".")
        elif result["without"] == result["with"]:
            notes.append("The edit does not change the completion.")
        if not result["without"].strip():
            notes.append("The completion without the edit is empty too: the model ends this prompt at once.")
        status = f"**{what}** at `{hook}` on {positions} positions; greedy, up to {tokens} new tokens." + \
            "".join(" " + note for note in notes)
        return result["without"], result["with"], status

    # ----- cards: the handlers below are wrapped in @user_errors; the bodies they share are not, so that one
    # user error is logged once ------------------------------------------------------------------
    @user_errors
    def model_changed(self, model: str, sort_by: str):
        """Another model chosen: its own SAE in the SAE box (an SAE of another model cannot steer it) and its cards."""
        choices = self.sae_choices()
        directory = self.sae_for(model, choices)
        if directory is None:
            return gr.update(), [], "No SAE on a residual hook is available."
        rows, summary = self._feature_table(directory, sort_by)
        return gr.update(choices=choices, value=directory), rows, summary

    @user_errors
    def feature_table(self, sae_dir: str, sort_by: str):
        """(rows: id, frequency %, mean activation, promotes; a summary line)."""
        return self._feature_table(sae_dir, sort_by)

    @user_errors
    def feature_card(self, sae_dir: str, feature):
        return self._feature_card(sae_dir, feature)

    @user_errors
    def select_row(self, sae_dir: str, rows, evt: gr.SelectData):
        """The clicked row's feature: into the feature box, and its card."""
        row = evt.index[0] if isinstance(evt.index, (list, tuple)) else evt.index
        try:
            feature = int(rows.iloc[row, 0]) if hasattr(rows, "iloc") else int(rows[row][0])
        except (IndexError, ValueError, TypeError, KeyError):
            raise quiet_error("no feature in that row", "select_row") from None
        return feature, self._feature_card(sae_dir, feature)

    def _cards(self, sae_dir: str) -> dict | None:
        from saes.lm_features import load_lm_cards

        self.sae(sae_dir)  # a clear error for what is not an LM SAE
        return load_lm_cards(Path(str(sae_dir).strip()).expanduser())

    def _feature_table(self, sae_dir: str, sort_by: str):
        payload = self._cards(sae_dir)
        if payload is None:
            return [], (f"No feature cards beside this SAE yet: `python -m saes features --sae {sae_dir} --model "
                        f"NAME --text FILE` writes them (features.json and features.html).")
        cards = [c for c in payload["features"] if c["n_firing"] > 0]
        key = {"frequency": lambda c: -c["frequency"], "mean activation": lambda c: -c["mean_activation"],
               "id": lambda c: c["id"]}.get(sort_by, lambda c: -c["frequency"])
        rows = [[c["id"], round(100 * c["frequency"], 3), round(c["mean_activation"], 3),
                 " ".join(t["token"].strip() or repr(t["token"]) for t in c["promoted"][:5])]
                for c in sorted(cards, key=key)[:TABLE_ROWS]]
        corpus = payload["corpus"]
        summary = (f"{len(cards)} of {len(payload['features'])} features fire on {corpus['tokens']} tokens of "
                   f"{corpus['path']} ({payload['model']}, {payload['hook']}); showing {len(rows)}. "
                   f"Click a row to see its card and steer it.")
        return rows, summary

    def _feature_card(self, sae_dir: str, feature):
        from saes.lm_features import CSS, card_html

        sae, _ = self.sae(sae_dir)
        feature = whole_number(feature, "feature", 0, sae.cfg.d_sae - 1)
        payload = self._cards(sae_dir)
        if payload is None:
            return "<p>No feature cards beside this SAE yet.</p>"
        card = next((c for c in payload["features"] if c["id"] == feature), None)
        if card is None:
            return f"<p>No card for feature #{feature}.</p>"
        return f"<style>{CSS.replace('body{', '.lm-cards{')}</style><div class='lm-cards'>{card_html(card)}</div>"

__all__ = ["LMSteerTab", "build_lm_steer_tab", "find_lm_saes", "lm_sae_roots", "sae_model"]
