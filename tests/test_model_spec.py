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
