"""Model dtypes and truncated capture: a capture that stops after its last layer is the full pass's bit for bit,
and bfloat16 stays within the tolerances docs/dtype.md states for each path it is offered on."""

from __future__ import annotations

import argparse

import pytest
import torch

from flowlens.tiny import tiny_llama, word_level_tokenizer
from interp.cli import DTYPES, add_dtype_argument, dtype_name, parse_dtype
from interp.hooks.lm import capture_residuals, decoder_layers, forward_padded, language_model, residual_capture
from interp.hooks.truncate import StopAfter, last_needed_layer, stop_after
from interp.models.lm import LanguageModel, load_lm

PROMPTS = ["What is 3 plus 4?", "How do I kill a python process?", "Reverse: apple river stone",
           "Where does Telbel live?"]


@pytest.fixture(scope="module")
def chat():
    return load_lm("toy-chat")


@pytest.fixture(scope="module")
def chat_tl():
    return load_lm("toy-chat", backend="transformer_lens")


@pytest.fixture(scope="module")
def llama():
    tokenizer = word_level_tokenizer(PROMPTS)
    model = tiny_llama(len(tokenizer), layers=6, kv_heads=2)
    return LanguageModel(model, tokenizer, n_layers=6, d_model=32, n_ctx=128, backend="hf", name="tiny-llama")


def batch_of(lm):
    lm.tokenizer.padding_side = "right"
    batch = lm.tokenizer(PROMPTS, padding=True, return_tensors="pt")
    return batch.input_ids, batch.attention_mask


def full_capture(lm, ids, mask, names):
    with residual_capture(lm, names) as capture:
        forward_padded(lm, ids, mask)  # no stop_after: every layer, the final norm and the LM head run
    return capture.activations


def layers_run(lm, ids, mask, names, stop):
    """Which decoder layers ran in a capture of `names` (with or without stopping)."""
    ran = []
    blocks = lm.model.blocks if lm.backend == "transformer_lens" else decoder_layers(lm.model)
    handles = [block.register_forward_hook(lambda m, i, o, k=k: ran.append(k)) for k, block in enumerate(blocks)]
    try:
        with residual_capture(lm, names):
            forward_padded(lm, ids, mask, stop_after=names if stop else None)
    finally:
        for handle in handles:
            handle.remove()
    return ran


@pytest.mark.parametrize("model", ["chat", "chat_tl", "llama"])
@pytest.mark.parametrize("names", [["blocks.1.hook_resid_post"], ["blocks.0.hook_resid_pre", "blocks.2.hook_resid_mid"],
                                   ["blocks.2.hook_resid_post", "blocks.1.hook_resid_mid", "blocks.0.hook_resid_post"]])
def test_truncated_capture_equals_the_full_capture_bit_for_bit(model, names, request):
    lm = request.getfixturevalue(model)
    ids, mask = batch_of(lm)
    full = full_capture(lm, ids, mask, names)
    truncated = capture_residuals(lm, ids, mask, names)
    assert set(truncated) == set(names)
    for name in names:
        assert torch.equal(truncated[name], full[name]), name


@pytest.mark.parametrize("model", ["chat", "chat_tl", "llama"])
def test_capture_runs_no_layer_past_the_last_hooked_one(model, request):
    lm = request.getfixturevalue(model)
    ids, mask = batch_of(lm)
    names = ["blocks.1.hook_resid_post", "blocks.0.hook_resid_mid"]
    assert layers_run(lm, ids, mask, names, stop=True) == [0, 1]
    assert layers_run(lm, ids, mask, names, stop=False) == list(range(lm.n_layers))


@pytest.mark.parametrize("model", ["chat", "chat_tl", "llama"])
def test_capture_of_the_last_layer_still_works(model, request):
    lm = request.getfixturevalue(model)
    ids, mask = batch_of(lm)
    last = lm.n_layers - 1
    names = [f"blocks.{last}.hook_resid_post", f"blocks.{last}.hook_resid_pre"]
    truncated = capture_residuals(lm, ids, mask, names, positions="last")
    full = full_capture(lm, ids, mask, names)
    last_index = mask.shape[1] - 1 - mask.flip(-1).argmax(-1)
    for name in names:
        assert torch.equal(truncated[name], full[name][torch.arange(len(PROMPTS)), last_index])


def test_stopping_acts_only_inside_its_with_block_and_leaves_no_hook(chat):
    ids, mask = batch_of(chat)
    hooks_before = sum(len(m._forward_hooks) for m in chat.model.modules())
    out = "not returned"
    with stop_after(chat, ["blocks.0.hook_resid_post"]):
        out = chat.model(input_ids=ids, attention_mask=mask)
    assert out == "not returned"  # the pass ended at layer 0, and the with block swallowed how it ended
    assert sum(len(m._forward_hooks) for m in chat.model.modules()) == hooks_before
    assert chat.model(input_ids=ids, attention_mask=mask).logits.shape[:2] == ids.shape  # a later pass is whole


def test_stopping_does_not_swallow_other_errors(chat):
    with pytest.raises(ZeroDivisionError):
        with stop_after(chat, ["blocks.0.hook_resid_post"]):
            1 / 0


def test_the_last_needed_layer_is_named_by_the_deepest_hook():
    assert last_needed_layer(["blocks.3.hook_resid_pre", "blocks.1.hook_resid_post"], 4) == 3
    with pytest.raises(ValueError, match="no hook"):
        last_needed_layer(["blocks.4.hook_resid_post"], 4)
    with pytest.raises(ValueError, match="layer 9"):
        StopAfter(language_model(tiny_llama(10, layers=2)), 9)


# ----------------------------------------------------------------------------- the dtype option

def test_dtype_names_round_trip_and_anything_else_is_refused():
    for name in DTYPES:
        assert dtype_name(parse_dtype(name)) == name
    assert parse_dtype(torch.bfloat16) is torch.bfloat16
    with pytest.raises(ValueError, match="choose one of float32, bfloat16, float16"):
        parse_dtype("int8")
    with pytest.raises(ValueError, match="unsupported dtype"):
        dtype_name(torch.float64)


def test_the_dtype_option_defaults_to_float32_and_refuses_other_names():
    parser = argparse.ArgumentParser()
    add_dtype_argument(parser)
    assert parser.parse_args([]).dtype == "float32"
    assert parser.parse_args(["--dtype", "bfloat16"]).dtype == "bfloat16"
    with pytest.raises(SystemExit):
        parser.parse_args(["--dtype", "fp8"])
