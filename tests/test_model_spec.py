"""`interp.models.spec`: the one place that decides whether a name or a loaded model is a language model or a
text-to-image model; every command asks it (`interp blocks|hooks|collect`, `saes eval`, the UI's feature tab)."""

from __future__ import annotations

import json

import pytest
import torch

from interp.models.spec import LM, T2I, kind_of, model_spec


@pytest.mark.parametrize("name, kind, source", [
    ("toy-chat", LM, "embedded"), ("toy-chat-safety-0.4", LM, "embedded"), ("smollm2-135m-instruct", LM, "registry"),
    ("toy", T2I, "embedded"), ("toy-v4", T2I, "embedded"), ("stabilityai/sdxl-turbo", T2I, "hub"),
])
def test_names_resolve_to_their_kind(name, kind, source):
    spec = model_spec(name)
    assert (spec.kind, spec.source, spec.is_lm) == (kind, source, kind == LM)


def test_a_directory_is_a_language_model_by_its_config_and_a_pipeline_by_its_model_index(tmp_path):
    lm, pipeline, other = tmp_path / "lm", tmp_path / "pipeline", tmp_path / "other"
    for folder in (lm, pipeline, other):
        folder.mkdir()
    (lm / "config.json").write_text(json.dumps({"model_type": "llama"}))
    (pipeline / "model_index.json").write_text(json.dumps({"_class_name": "StableDiffusionPipeline"}))
    (pipeline / "config.json").write_text("{}")  # a pipeline folder may hold one too: model_index.json decides
    assert model_spec(lm).kind == LM and model_spec(str(lm)).source == "directory"
    assert model_spec(pipeline).kind == T2I
    assert model_spec(other).kind == T2I  # load_t2i then says what is missing, in one line


def test_loaded_models_and_the_hooks_api_agree(toy_t2i):
    from interp.hooks import HookError, model_kind
    from interp.models.lm import load_lm

    chat = load_lm("toy-chat")
    assert kind_of(chat) == kind_of(chat.model) == model_kind(chat) == LM
    assert kind_of(toy_t2i) == kind_of(toy_t2i.pipe) == kind_of(toy_t2i.unet) == T2I
    with pytest.raises(HookError, match="cannot hook.*Linear"):
        model_kind(torch.nn.Linear(2, 2))
    assert model_spec("toy-chat").load().backend == "hf"


def test_saved_things_say_their_kind_in_one_vocabulary_and_old_words_are_read(tmp_path):
    """`saved_kind`: stores (manifest / plan "kind"; absent or the old "diffusion": t2i), SAE directories (the hook
    they read), sets of them, feature cards and saved models; None where nothing says."""
    from interp.models.spec import saved_kind
    from interp.store import ActivationStore, FORMAT

    def folder(name, **files):
        path = tmp_path / name
        path.mkdir()
        for file, data in files.items():
            (path / (file.rpartition("_")[0] + ".json")).write_text(json.dumps(data))
        return path

    manifest = {"format": FORMAT, "blocks": [], "shards": [], "n_images": 0}
    old_store = folder("old", manifest_json={**manifest, "kind": "diffusion"})
    assert saved_kind(old_store) == ActivationStore(old_store).kind == T2I  # the store's old word, read as t2i
    assert saved_kind(folder("image_store", manifest_json=manifest)) == T2I
    assert saved_kind(folder("lm_store", manifest_json={**manifest, "kind": "lm"})) == LM
    assert saved_kind(folder("lm_plan", plan_json={"kind": "lm"})) == LM  # a store still being written
    lm_sae = folder("lm_sae", cfg_json={"metadata": {"hook_name": "blocks.2.hook_resid_post"}})
    image_sae = folder("image_sae", cfg_json={"metadata": {"hook_name": "mid_block.attentions.0"}})
    assert (saved_kind(lm_sae), saved_kind(image_sae)) == (LM, T2I)
    assert saved_kind(folder("sae_lens", cfg_json={"hook_name": "blocks.0.hook_resid_pre"})) == LM  # top-level
    assert saved_kind(tmp_path) == LM  # a directory of SAE directories: one reads an LM hook
    assert saved_kind(folder("cards", features_json={"kind": "lm", "features": []})) == LM
    assert saved_kind(folder("image_cards", features_json={"features": []}) / "features.json") == T2I
    assert saved_kind(folder("pipeline", model_index_json={})) == T2I
    assert saved_kind(folder("hf_model", config_json={})) == LM
    assert saved_kind(folder("empty")) is None and saved_kind(tmp_path / "missing") is None


@pytest.mark.parametrize("shipped, kind", [("saes/pretrained/toy", T2I), ("saes/pretrained/toy-chat", LM),
                                           ("zoo/weights/t2i", T2I), ("zoo/weights/chat-base", LM)])
def test_the_shipped_saes_and_models_say_their_kind(shipped, kind):
    from pathlib import Path

    from interp.models.spec import saved_kind

    assert saved_kind(Path(__file__).resolve().parents[1] / shipped) == kind


def test_the_core_alone_names_what_to_import_for_an_embedded_model(monkeypatch):
    """Registration: the core registers nothing of its own (a fresh interpreter that imports only the core has no
    weights directory and no world), and asking it for an embedded model before `zoo` registered one is one line
    saying to import `zoo`, for either kind; a hub name is still a hub name."""
    import subprocess
    import sys
    from pathlib import Path

    from interp import embedded
    from interp.models.lm import load_lm
    from interp.models.t2i import load_t2i

    code = ("from interp.embedded import registered_weights_dir\n"
            "from interp.ground_truth import WORLDS\n"
            "print(registered_weights_dir(), WORLDS)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         cwd=Path(__file__).resolve().parents[1]).stdout
    assert out.strip() == "None {}"
    monkeypatch.setattr(embedded, "_WEIGHTS", [])
    for load, name in ((load_t2i, "toy"), (load_lm, "toy-chat")):
        with pytest.raises(embedded.NotRegistered, match=r"^no embedded models are registered: import zoo first"):
            load(name)
    assert model_spec("stabilityai/sdxl-turbo").source == "hub"


def test_the_spec_carries_the_registry_entry_its_defaults_and_where_the_model_loads_from(tmp_path):
    """A name is resolved once: the spec's entry and defaults are the registry's, `locate` is what both loaders and
    their old resolvers (`resolve_lm`, `t2i.resolve`) read, and a hub id's kind is the caller's word."""
    from interp.embedded import weights_dir
    from interp.models import fetch
    from interp.models.lm import LMError, resolve_lm
    from interp.models.t2i import KNOWN_MODELS, ModelError, resolve

    base = model_spec("toy-base")
    assert (base.entry, base.default_steps, base.default_guidance, base.world) == (KNOWN_MODELS["toy-base"], 30, 5.0,
                                                                                   "shapes")
    assert base.locate() == (str(weights_dir() / "t2i-base"), True) and resolve("toy-base") == (
        str(weights_dir() / "t2i-base"), KNOWN_MODELS["toy-base"])
    chat = model_spec("toy-chat")
    assert (chat.world, chat.default_steps, chat.entry) == ("chat", None, None)
    assert chat.locate() == resolve_lm("toy-chat") == (str(weights_dir() / "chat-base"), True)
    assert chat.context_length() == json.loads((weights_dir() / "chat-base" / "config.json").read_text())["n_positions"]
    smol = model_spec("smollm2-135m-instruct")
    assert smol.entry is fetch.REGISTRY_MODELS["smollm2-135m-instruct"] and smol.source == "registry"
    hub = "someone/some-model"
    assert model_spec(hub).kind == T2I and model_spec(hub, kind=LM).kind == LM  # the caller says what a hub id is
    assert model_spec(hub, kind=LM).locate() == resolve_lm(hub) == (hub, False)
    assert model_spec("toy-chat", kind=T2I).kind == LM  # a name that says its kind keeps it
    assert model_spec(chat) is chat
    with pytest.raises(ModelError, match="unknown model 'nope'"):
        model_spec("nope").locate()
    with pytest.raises(ModelError, match="toy-chat is a language model"):
        resolve("toy-chat")
    with pytest.raises(LMError, match="did you mean toy-chat"):
        resolve_lm("toy-chatt")
    with pytest.raises(ValueError, match="kind is one of"):
        model_spec("toy", kind="diffusion")


def test_both_loaded_kinds_implement_one_protocol_whose_sessions_are_the_hooks(toy_t2i):
    """`LoadedModel`: kind, sites, describe, and capture / intervene that run `interp.hooks`' sessions."""
    from interp.hooks import capture
    from interp.models.lm import load_lm
    from interp.models.protocol import LoadedModel

    chat = load_lm("toy-chat")
    for model, kind in ((chat, LM), (toy_t2i, T2I)):
        assert isinstance(model, LoadedModel) and model.kind == kind == kind_of(model)
    assert chat.sites == model_spec("toy-chat").describe()["sites"] == chat.describe()["sites"]
    assert list(toy_t2i.sites) == [*toy_t2i.blocks, *toy_t2i.text_sites]
    ids = chat.tokenizer("the cat", return_tensors="pt").input_ids
    hook = chat.sites[-1]
    with chat.capture([hook]) as ours, torch.no_grad():
        chat.model(ids)
    with capture(chat, [hook]) as theirs, torch.no_grad():
        chat.model(ids)
    assert torch.equal(ours.activations[hook], theirs.activations[hook])
    from interp.hooks.lm_steer import LMEdit

    direction = torch.ones(chat.d_model)
    with chat.intervene([LMEdit(hook, "add", direction=direction, strength=2.0)]), chat.capture([hook]) as edited, \
            torch.no_grad():
        chat.model(ids)
    assert torch.allclose(edited.activations[hook], ours.activations[hook] + 2.0 * direction, atol=1e-4)
