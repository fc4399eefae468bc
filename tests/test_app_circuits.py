"""The Circuits tab's handlers in-process (no server), on the embedded chat model and its shipped transcoders:
a graph is built and drawn, a row's card, an ablation beside the graph's prediction, Cancel, and bad input as one
message each."""

from __future__ import annotations

import gradio as gr
import pytest

from app import Workbench
from ui.circuits import CircuitsTab, find_transcoder_sets, set_model

TOY = "saes/pretrained/toy-chat-transcoders"


class Request:
    def __init__(self, session_hash):
        self.session_hash = session_hash


class Select:
    def __init__(self, index):
        self.index = index


@pytest.fixture(scope="module")
def tab(tmp_path_factory):
    return CircuitsTab(Workbench("toy", data_dir=tmp_path_factory.mktemp("data")))


def quiet(*args, **kwargs):
    return None


def test_the_shipped_toy_chat_set_is_offered_with_its_model_and_not_as_a_residual_sae():
    from ui.lm_steer import find_lm_saes, lm_sae_roots

    sets = find_transcoder_sets()
    toy = next(s for s in sets if s.endswith("toy-chat-transcoders"))
    assert set_model(toy) == "toy-chat"
    assert not [d for d in find_lm_saes(lm_sae_roots()) if "transcoders" in d]  # LM steering's SAEs: residual only


def test_a_graph_is_built_drawn_carded_and_intervened_on(tab):
    figure, rows, status, state, nodes, card = tab.build("toy-chat", TOY, "Sort: 84 48 7", True, "", 64,
                                                         Request("a"), quiet)
    assert "'7'" in status and state["graph"].n_features <= 64 and rows
    assert {trace.name for trace in figure.data} >= {"features", "logits", "embeddings"}
    node = rows[0][0]
    assert nodes == str(node) and f"Node {node}" in card
    # the table's rows are the kept features, most influential first; a click adds the row's node
    card2, chosen = tab.select_node(state, rows, str(node), Select([1, 0]))
    assert chosen == f"{node}, {rows[1][0]}" and f"Node {rows[1][0]}" in card2
    effects, line = tab.intervene(state, str(node), 0)
    from saes.circuits import predicted_effects, real_effects

    lm = tab.bench.lm("toy-chat")
    assert effects[0][0] == state["graph"].logit_strings[0]
    assert effects[0][2] == round(float(predicted_effects(state["graph"], [node])[0]), 4)
    assert effects[0][3] == round(float(real_effects(lm, state["graph"], state["transcoders"], [node])[0]), 4)
    assert "ablated" in line


def test_cancel_stops_the_graph_between_two_backward_passes(tab):
    request = Request("b")
    calls = []

    def progress(value, desc=None, unit=None):
        calls.append(value)
        if len(calls) == 2:
            tab.bench.cancel("circuits")(request)

    out = tab.build("toy-chat", TOY, "Sort: 84 48 7", True, "", 256, request, progress)
    assert "Cancelled" in out[2] and len(calls) == 2


@pytest.fixture(scope="module")
def broken_sets(tmp_path_factory):
    """A toy-chat set without its last layer, and one whose cfg.json says it was trained on another model."""
    import json
    import shutil

    root = tmp_path_factory.mktemp("sets")
    shutil.copytree(TOY, root / "missing", ignore=shutil.ignore_patterns("blocks.3.*"))
    shutil.copytree(TOY, root / "other")
    for cfg in (root / "other").glob("*/cfg.json"):
        raw = json.loads(cfg.read_text())
        raw["metadata"]["model_name"] = "smollm2-135m-instruct"
        cfg.write_text(json.dumps(raw))
    return root


@pytest.mark.parametrize("args,message", [
    (("toy-chat", TOY, "", True, "", 64), "prompt is empty"),
    (("toy-chat", TOY, "Sort: 1 2", True, "zzzz qqqq", 64), "not one"),
    (("toy-chat", TOY, "Sort: 1 2", True, "99999", 64), "outside the vocabulary"),
    (("toy-chat", TOY, " ".join(["7"] * 200), False, "", 64), "tokens"),
    (("toy-chat", TOY, "Sort: 1 2", True, "", 0), "feature nodes"),
    (("toy-chat", "{sets}/missing", "Sort: 1 2", True, "", 64), "no transcoder for layer.s. 3"),
    (("toy-chat", "{sets}/other", "Sort: 1 2", True, "", 64), "trained on smollm2-135m-instruct, not on toy-chat"),
    (("toy-chat", "saes/pretrained/toy-chat", "Sort: 1 2", True, "", 64), "not a transcoder"),
])
def test_bad_requests_get_one_clear_message(tab, broken_sets, args, message):
    args = (args[0], args[1].format(sets=broken_sets), *args[2:])
    with pytest.raises(gr.Error, match=message):
        tab.build(*args, Request("c"), quiet)


def test_bad_interventions_get_one_clear_message(tab):
    with pytest.raises(gr.Error, match="build a graph first"):
        tab.intervene(None, "1", 0)
    _, _, _, state, _, _ = tab.build("toy-chat", TOY, "Sort: 84 48 7", True, "", 16, Request("d"), quiet)
    for nodes, scale, message in (("", 0, "give the feature nodes"), ("999999", 0, "not a feature node"),
                                  ("1", 1e9, "scale")):
        with pytest.raises(gr.Error, match=message):
            tab.intervene(state, nodes, scale)
