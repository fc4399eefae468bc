"""interp.hooks.capture / intervene: one pair for both model kinds (issue 20), on the embedded toy models."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from interp.edits import Edit
from interp.hooks import (BlockCapture, HookError, ResidualCapture, ScopedHooks, capture, capture_updates, generate,
                          intervene, model_kind)
from interp.hooks.lm import capture_residuals
from interp.hooks.lm_steer import LMEdit, LMSteerSession

MID = "mid_block.attentions.0"
HOOK = "blocks.1.hook_resid_post"


@pytest.fixture(scope="module")
def chat():
    from interp.models.lm import load_lm

    return load_lm("toy-chat")


def test_model_kinds_are_told_apart(toy_t2i, chat):
    assert model_kind(toy_t2i) == "t2i" and model_kind(toy_t2i.pipe) == "t2i" and model_kind(toy_t2i.unet) == "t2i"
    assert model_kind(chat) == "lm" and model_kind(chat.model) == "lm"
    with pytest.raises(HookError, match="cannot hook"):
        model_kind(object())


def test_capture_on_the_image_model_is_capture_updates(toy_t2i):
    with capture(toy_t2i, [MID]) as cap:
        image = generate(toy_t2i, "a red circle", steps=2, seed=3, output_type="np")
    assert isinstance(cap, BlockCapture) and isinstance(cap, ScopedHooks)
    with capture_updates(toy_t2i, [MID]) as reference:
        again = generate(toy_t2i, "a red circle", steps=2, seed=3, output_type="np")
    assert np.array_equal(image, again)
    torch.testing.assert_close(cap.updates(MID), reference.updates(MID), rtol=0, atol=0)
    assert cap.updates(MID).shape[0] == 2


def test_capture_on_the_language_model_is_the_residual_capture(chat):
    ids = torch.tensor([chat.tokenizer("What is 3 plus 4?")["input_ids"]])
    with capture(chat, [HOOK]) as cap, torch.no_grad():
        chat.model(ids)
    assert isinstance(cap, ResidualCapture) and isinstance(cap, ScopedHooks)
    torch.testing.assert_close(cap.activations[HOOK], capture_residuals(chat, ids, None, [HOOK])[HOOK], rtol=0, atol=0)
    with capture(chat.model, [HOOK], keep_graph=True) as graph:  # a bare Hugging Face model too
        chat.model(ids)
    assert graph.activations[HOOK].requires_grad


def test_intervene_on_the_image_model_is_apply_edits(toy_t2i):
    edits = [Edit(MID, "ablate")]
    plain = generate(toy_t2i, "a red circle", steps=2, seed=3, output_type="np")
    with intervene(toy_t2i, edits):
        edited = generate(toy_t2i, "a red circle", steps=2, seed=3, output_type="np")
    with intervene(toy_t2i, [e.to_dict() for e in edits]):  # edits as their JSON dicts
        again = generate(toy_t2i, "a red circle", steps=2, seed=3, output_type="np")
    assert not np.array_equal(plain, edited) and np.array_equal(edited, again)


def test_intervene_on_the_language_model_is_apply_lm_edits(chat):
    ids = torch.tensor([chat.tokenizer("What is 3 plus 4?")["input_ids"]])
    edit = LMEdit(HOOK, "add", direction=[3.0] * chat.d_model)
    with torch.no_grad():
        plain = chat.model(ids).logits
        with intervene(chat, [edit]) as session:
            edited = chat.model(ids).logits
        with intervene(chat.model, [edit.to_dict()]):
            again = chat.model(ids).logits
    assert isinstance(session, LMSteerSession)
    assert not torch.allclose(plain, edited)
    torch.testing.assert_close(edited, again, rtol=0, atol=0)
    assert not any(m._forward_hooks or m._forward_pre_hooks for m in chat.model.modules())
