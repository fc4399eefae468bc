"""The "LM steering" tab: steer a language model by one SAE feature and browse the SAE's feature cards.

Steering: prompt, model, SAE (an SAE directory on a residual hook), feature, strength, mode and
positions; the greedy completion without and with the edit side by side (`flowlens.steer.
steer_comparison`, whose edit acts in the request's own context only, so concurrent users never see
each other's edits). Cards: the features.json that `python -m saes features --text` wrote beside
the SAE, as a table (click a row to steer that feature) and the chosen feature's card (top contexts
with highlighted tokens, histogram, promoted and suppressed tokens).

SAEs offered: every SAE on a residual hook under ``saes/pretrained/``, under ``$WORKBENCH_LM_SAES``
(a directory of SAE directories, or one) and under the roots given to `build_lm_steer_tab`; any other
directory can be typed into the SAE box.
"""

from __future__ import annotations

import os
import threading
from pathlib import Path

import gradio as gr

from .common import MAX_PROMPT_CHARS, quiet_error, user_errors  # the app's one error map and message rules

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
    from saes.lm_features import sae_hook_name

    from interp.hooks.lm_steer import is_residual_hook

    found = []
    for root in roots:
        root = Path(root)
        if not root.is_dir():
            continue
        for cfg in [root / "cfg.json", *root.glob("*/cfg.json"), *root.glob("*/*/cfg.json")]:
            if cfg.is_file() and is_residual_hook(sae_hook_name(cfg.parent)):
                found.append(str(cfg.parent))
    return sorted(dict.fromkeys(found))


def sae_model(directory) -> str | None:
    """The language model an SAE directory says it was trained on (cfg.json's metadata.model_name)."""
    import json

    try:
        raw = json.loads((Path(directory) / "cfg.json").read_text())
    except (OSError, ValueError):
        return None
    return (raw.get("metadata") or {}).get("model_name") or raw.get("model_name")


def _whole(value, name: str, low: int, high: int) -> int:
    if value is None or value == "" or not float(value).is_integer() or not low <= float(value) <= high:
        raise ValueError(f"{name} must be a whole number from {low} to {high}")
    return int(float(value))


def _finite(value, name: str) -> float:
    import math

    if value is None or value == "" or not math.isfinite(float(value)):
        raise ValueError(f"{name} must be a finite number")
    return float(value)


class LMSteerPanel:
    """The tab's actions, apart from the widgets (so they can be called and tested without a browser)."""

    def __init__(self, bench=None, sae_roots=None):
        self.bench = bench
        self.roots = lm_sae_roots(sae_roots)
        self._lock = threading.Lock()
        self._lms: dict = {}
        self._saes: dict = {}

    # ----- what there is ------------------------------------------------------------------------
    def models(self) -> list[str]:
        from interp.models.lm import available_lms

        return available_lms()

    def sae_choices(self) -> list[str]:
        return find_lm_saes(self.roots)

    def sae_for(self, model: str | None, choices: list[str] | None = None) -> str | None:
        """The first SAE trained on ``model`` (else the first SAE): what the SAE box shows for that model."""
        choices = self.sae_choices() if choices is None else choices
        return next((d for d in choices if sae_model(d) == model), choices[0] if choices else None)

    @user_errors
    def model_changed(self, model: str, sort_by: str):
        """Another model chosen: its own SAE in the SAE box (an SAE of another model cannot steer it) and its cards."""
        choices = self.sae_choices()
        directory = self.sae_for(model, choices)
        if directory is None:
            return gr.update(), [], "No SAE on a residual hook is available."
        rows, summary = self.feature_table(directory, sort_by)
        return gr.update(choices=choices, value=directory), rows, summary

    def lm(self, name: str):
        if self.bench is not None and hasattr(self.bench, "lm"):
            return self.bench.lm(name)  # the app's shared cache (and its check of the name)
        from interp.models.lm import load_lm

        if name not in self.models():
            raise ValueError(f"unknown model {name!r}; the language models here are: {', '.join(self.models())}")
        with self._lock:
            if name not in self._lms:
                self._lms[name] = load_lm(name)
        return self._lms[name]

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
              max_new_tokens):
        """(completion without the edit, with it, a status line)."""
        from flowlens.steer import check_feature, make_edit, steer_comparison

        if not isinstance(prompt, str) or not prompt.strip():
            raise ValueError("the prompt is empty: give some text to continue")
        if len(prompt) > MAX_PROMPT_CHARS:
            raise ValueError(f"the prompt has {len(prompt)} characters; at most {MAX_PROMPT_CHARS}")
        if mode not in MODES or positions not in POSITIONS:
            raise ValueError(f"mode must be one of {', '.join(MODES)} and positions one of {', '.join(POSITIONS)}")
        if not model:
            raise ValueError("choose a model")
        sae, hook = self.sae(sae_dir)
        feature = check_feature(sae, _whole(feature, "feature", 0, sae.cfg.d_sae - 1))
        strength = _finite(strength, "strength")
        tokens = _whole(max_new_tokens, "new tokens", 1, MAX_NEW_TOKENS)
        lm = self.lm(model)
        edit = make_edit(hook, feature, strength, mode, positions)
        # the edit is context-scoped: it never reaches another request's forward pass on the shared model
        result = steer_comparison(lm, sae, hook, prompt, edit, tokens)
        what = f"{mode} feature #{feature}" + ("" if mode == "ablate" else f", strength {strength:g}")
        same = " The edit does not change the completion." if result["without"] == result["with"] else ""
        status = f"**{what}** at `{hook}` on {positions} positions; greedy, up to {tokens} new tokens.{same}"
        return result["without"], result["with"], status

    # ----- cards --------------------------------------------------------------------------------
    def _cards(self, sae_dir: str) -> dict | None:
        from saes.lm_features import load_lm_cards

        self.sae(sae_dir)  # a clear error for what is not an LM SAE
        return load_lm_cards(Path(str(sae_dir).strip()).expanduser())

    @user_errors
    def feature_table(self, sae_dir: str, sort_by: str):
        """(rows: id, frequency %, mean activation, promotes; a summary line)."""
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

    @user_errors
    def feature_card(self, sae_dir: str, feature):
        from saes.lm_features import CSS, card_html

        sae, _ = self.sae(sae_dir)
        feature = _whole(feature, "feature", 0, sae.cfg.d_sae - 1)
        payload = self._cards(sae_dir)
        if payload is None:
            return "<p>No feature cards beside this SAE yet.</p>"
        card = next((c for c in payload["features"] if c["id"] == feature), None)
        if card is None:
            return f"<p>No card for feature #{feature}.</p>"
        return f"<style>{CSS.replace('body{', '.lm-cards{')}</style><div class='lm-cards'>{card_html(card)}</div>"

    @user_errors
    def select_row(self, sae_dir: str, rows, evt: gr.SelectData):
        """The clicked row's feature: into the feature box, and its card."""
        row = evt.index[0] if isinstance(evt.index, (list, tuple)) else evt.index
        try:
            feature = int(rows.iloc[row, 0]) if hasattr(rows, "iloc") else int(rows[row][0])
        except (IndexError, ValueError, TypeError, KeyError):
            raise quiet_error("no feature in that row", "select_row") from None
        return feature, self.feature_card(sae_dir, feature)


def build_lm_steer_tab(bench=None, sae_roots=None, number_field=gr.Number) -> LMSteerPanel:
    """The "LM steering" tab, inside the caller's gr.Blocks. ``number_field``: the class of its number fields
    (app.py passes its app.Number: named, quiet range checks; never precision=0, which rounds silently)."""
    panel = LMSteerPanel(bench, sae_roots)
    models = panel.models()
    saes = panel.sae_choices()
    default_model = models[0] if models else None
    default_sae = panel.sae_for(default_model, saes)
    rows, summary = [], ""
    if default_sae:
        try:
            rows, summary = panel.feature_table(default_sae, "frequency")
        except gr.Error as err:  # a broken SAE directory: said when the tab opens, the rest still works
            summary = f"{default_sae}: {err.message}"
    with gr.Tab("LM steering", id="lm-steer"):
        gr.Markdown("Steer a language model by one feature of a sparse autoencoder on its residual stream: the "
                    "greedy completion without and with the edit, side by side. The edit acts at the hook the "
                    "SAE was trained on; *generated* positions are the new tokens as they are fed back in (so the "
                    "first new token is unchanged). CLI: `python -m flowlens steer`.")
        with gr.Row():
            with gr.Column():
                prompt = gr.Textbox(label="Prompt", value=DEFAULT_PROMPT, lines=2,  # longer: refused, not cut
                                    elem_id="lm-steer-prompt")
                with gr.Row():
                    model = gr.Dropdown(label="Model", choices=models, value=default_model,
                                        elem_id="lm-steer-model")
                    sae = gr.Dropdown(label="SAE (or type a directory)", choices=saes,
                                      value=default_sae, allow_custom_value=True, elem_id="lm-steer-sae")
                with gr.Row():
                    feature = number_field(label="Feature", value=0, elem_id="lm-steer-feature")
                    strength = number_field(label="Strength", value=40.0, elem_id="lm-steer-strength")
                    tokens = number_field(label=f"New tokens (1 to {MAX_NEW_TOKENS})", value=32, elem_id="lm-steer-tokens")
                with gr.Row():
                    mode = gr.Radio(label="Mode", choices=list(MODES), value="add", elem_id="lm-steer-mode")
                    positions = gr.Radio(label="Positions", choices=list(POSITIONS), value="all",
                                         elem_id="lm-steer-positions")
                run = gr.Button("Generate without and with the edit", variant="primary", elem_id="lm-steer-run")
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
        # inputs by name: the handlers' parameters. Queued, all of them: an unqueued event's error reaches the
        # browser without its message.
        run.click(panel.steer, inputs_kwargs={"model": model, "sae_dir": sae, "feature": feature, "strength": strength,
                                              "mode": mode, "positions": positions, "prompt": prompt,
                                              "max_new_tokens": tokens},
                  outputs=[without, edited, status], concurrency_limit=2)
        listing = {"sae_dir": sae, "sort_by": sort_by}
        show.click(panel.feature_table, inputs_kwargs=listing, outputs=[table, cards_summary])
        sort_by.change(panel.feature_table, inputs_kwargs=listing, outputs=[table, cards_summary])
        sae.change(panel.feature_table, inputs_kwargs=listing, outputs=[table, cards_summary])
        model.input(panel.model_changed, inputs_kwargs={"model": model, "sort_by": sort_by},
                    outputs=[sae, table, cards_summary])
        table.select(panel.select_row, inputs_kwargs={"sae_dir": sae, "rows": table}, outputs=[feature, card])
        feature.submit(panel.feature_card, inputs_kwargs={"sae_dir": sae, "feature": feature}, outputs=[card])
    return panel


__all__ = ["LMSteerPanel", "build_lm_steer_tab", "find_lm_saes", "lm_sae_roots", "sae_model"]
