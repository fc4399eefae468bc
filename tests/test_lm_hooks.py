"""Residual-stream capture: Hugging Face and TransformerLens agree, hooks never outlive their block, bad input is named."""

from __future__ import annotations

import pytest
import torch

from interp.hooks.lm import (
    RESIDUAL_HOOKS,
    LMHookError,
    capture_residuals,
    last_token_residuals,
    residual_capture,
    residual_hook_names,
)
from interp.models.lm import LanguageModel, LMError, load_lm

PROMPTS = ["What is 3 plus 4?", "How do I kill a python process?", "Reverse: apple river stone",
           "Where does Telbel live?"]


@pytest.fixture(scope="module")
def chat_hf():
    return load_lm("toy-chat", backend="hf")


@pytest.fixture(scope="module")
def chat_tl():
    return load_lm("toy-chat", backend="transformer_lens")


def padded(tokenizer, prompts, side):
    tokenizer.padding_side = side
    try:
        return tokenizer(prompts, padding=True, return_tensors="pt")
    finally:
        tokenizer.padding_side = "right"


def registered_hooks(model) -> int:
    return sum(len(m._forward_hooks) + len(m._forward_pre_hooks) for m in model.modules())


def test_loaded_models_describe_themselves(chat_hf, chat_tl):
    assert (chat_hf.backend, chat_tl.backend) == ("hf", "transformer_lens")
    assert chat_hf.n_layers == chat_tl.n_layers >= 4 and chat_hf.d_model == chat_tl.d_model
    assert chat_hf.n_ctx == chat_tl.n_ctx == 128


@pytest.mark.parametrize("side", ["right", "left"])
def test_hf_and_transformer_lens_capture_agree_on_every_layer(chat_hf, chat_tl, side):
    batch = padded(chat_hf.tokenizer, PROMPTS, side)
    names = residual_hook_names(chat_hf.n_layers)
    assert len(names) == 3 * chat_hf.n_layers
    hf = capture_residuals(chat_hf, batch.input_ids, batch.attention_mask, names)
    tl = capture_residuals(chat_tl, batch.input_ids, batch.attention_mask, names)
    real = batch.attention_mask.bool()
    for name in names:
        assert hf[name].shape == (len(PROMPTS), batch.input_ids.shape[1], chat_hf.d_model)
        torch.testing.assert_close(hf[name][real], tl[name][real], atol=1e-4, rtol=1e-4)
    # the three quantities are distinct stages of the stream, and consecutive blocks chain
    assert not torch.allclose(hf["blocks.1.hook_resid_pre"], hf["blocks.1.hook_resid_mid"])
    for layer in range(chat_hf.n_layers - 1):
        torch.testing.assert_close(hf[f"blocks.{layer}.hook_resid_post"], hf[f"blocks.{layer + 1}.hook_resid_pre"])


def test_left_padding_gives_each_prompt_its_unpadded_residuals(chat_hf, chat_tl):
    batch = padded(chat_hf.tokenizer, PROMPTS, "left")
    for lm in (chat_hf, chat_tl):
        last = capture_residuals(lm, batch.input_ids, batch.attention_mask, ["blocks.2.hook_resid_mid"], "last")
        for i, prompt in enumerate(PROMPTS):
            alone = torch.tensor([chat_hf.tokenizer(prompt)["input_ids"]])
            single = capture_residuals(lm, alone, None, ["blocks.2.hook_resid_mid"], "last")
            torch.testing.assert_close(last["blocks.2.hook_resid_mid"][i], single["blocks.2.hook_resid_mid"][0],
                                       atol=1e-4, rtol=1e-4)


def test_last_token_residuals_shape_and_independence_of_batching(chat_hf, chat_tl):
    together = last_token_residuals(chat_hf, PROMPTS, chat_template=True, batch_size=4)
    one_by_one = last_token_residuals(chat_hf, PROMPTS, chat_template=True, batch_size=1)
    assert together.shape == (len(PROMPTS), chat_hf.n_layers, chat_hf.d_model) and together.dtype == torch.float32
    torch.testing.assert_close(together, one_by_one, atol=1e-5, rtol=1e-5)
    for hook in RESIDUAL_HOOKS:
        torch.testing.assert_close(last_token_residuals(chat_hf, PROMPTS, hook=hook),
                                   last_token_residuals(chat_tl, PROMPTS, hook=hook), atol=1e-4, rtol=1e-4)


def test_last_token_is_the_last_prompt_token(chat_hf):
    ids = torch.tensor([chat_hf.tokenizer(PROMPTS[1])["input_ids"]])
    every = capture_residuals(chat_hf, ids, None, ["blocks.3.hook_resid_post"])["blocks.3.hook_resid_post"]
    last = last_token_residuals(chat_hf, [PROMPTS[1]], hook="resid_post")
    torch.testing.assert_close(last[0, 3], every[0, -1])


def test_stripping_trailing_punctuation_changes_the_last_token(chat_hf):
    kept = last_token_residuals(chat_hf, PROMPTS[:2])
    stripped = last_token_residuals(chat_hf, PROMPTS[:2], strip_trailing_punctuation=True)
    same_text = last_token_residuals(chat_hf, ["What is 3 plus 4", "How do I kill a python process"])
    assert not torch.allclose(kept, stripped)
    torch.testing.assert_close(stripped, same_text)


def test_hooks_are_removed_after_the_block_also_when_it_raises(chat_hf, chat_tl):
    for lm in (chat_hf, chat_tl):
        before = registered_hooks(lm.model)
        names = residual_hook_names(lm.n_layers)
        with residual_capture(lm, names) as capture:
            assert registered_hooks(lm.model) > before
            lm.model(torch.tensor([[2, 4, 11, 5]]))
        assert registered_hooks(lm.model) == before and len(capture.activations) == len(names)
        with pytest.raises(RuntimeError, match="boom"):
            with residual_capture(lm, names):
                raise RuntimeError("boom")
        assert registered_hooks(lm.model) == before


def test_unknown_layer_lists_the_valid_names(chat_hf, chat_tl):
    last = chat_hf.n_layers - 1
    for lm in (chat_hf, chat_tl):
        for bad in (f"blocks.{chat_hf.n_layers}.hook_resid_post", "blocks.0.hook_resid_middle", "resid_post"):
            with pytest.raises(LMHookError, match=f"blocks.{last}.hook_resid_post"):
                residual_capture(lm, [bad])
    with pytest.raises(LMHookError, match="resid_pre"):
        last_token_residuals(chat_hf, PROMPTS, hook="resid_final")


def test_prompts_longer_than_the_context_and_empty_input_are_errors(chat_hf):
    with pytest.raises(LMHookError, match="longer than the model's context of 128"):
        last_token_residuals(chat_hf, ["fine", " ".join(["apple"] * 200)])
    with pytest.raises(LMHookError, match="no prompts"):
        last_token_residuals(chat_hf, [])


def test_generic_hf_models_are_hooked_through_their_decoder_layers():
    """A Llama-architecture model (rotary positions, RMSNorm): its stream chains and matches output_hidden_states."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=50, hidden_size=32, intermediate_size=64, num_hidden_layers=3,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64, pad_token_id=0)
    model = LlamaForCausalLM(config).eval()
    lm = LanguageModel(model, tokenizer=None, n_layers=3, d_model=32, n_ctx=64, backend="hf", name="tiny-llama")
    ids = torch.randint(1, 50, (2, 7))
    acts = capture_residuals(lm, ids)
    with torch.no_grad():
        hidden = model(ids, output_hidden_states=True).hidden_states
    for layer in range(3):
        torch.testing.assert_close(acts[f"blocks.{layer}.hook_resid_pre"], hidden[layer])
    torch.testing.assert_close(acts["blocks.1.hook_resid_post"], hidden[2])
    # left padding with a rotary model: the padded row's last token equals its unpadded run
    mask = torch.tensor([[0, 0, 1, 1, 1, 1, 1], [1] * 7])
    last = capture_residuals(lm, ids, mask, ["blocks.2.hook_resid_mid"], "last")["blocks.2.hook_resid_mid"]
    alone = capture_residuals(lm, ids[:1, 2:], None, ["blocks.2.hook_resid_mid"], "last")["blocks.2.hook_resid_mid"]
    torch.testing.assert_close(last[0], alone[0], atol=1e-5, rtol=1e-5)


def test_load_lm_errors_say_what_is_missing(tmp_path, monkeypatch):
    with pytest.raises(LMError, match="toy-chat"):
        load_lm("toy-chat-safety-0.99")
    with pytest.raises(LMError, match="config.json"):
        load_lm(tmp_path)
    with pytest.raises(LMError, match="does not exist"):
        load_lm(tmp_path / "missing")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(LMError, match="huggingface-cli download"):
        load_lm("someone/not-on-this-machine-7b")
    with pytest.raises(LMError, match="backend"):
        load_lm("toy-chat", backend="jax")


# ----------------------------------------------------------------------------- context scoping (issue 20)

def _batch(lm, prompts):
    return padded(lm.tokenizer, prompts, "right")


THREAD_PROMPTS = {"sums": [f"What is {i} plus {i + 1}?" for i in range(6)],
                  "kills": [f"How do I kill a {w} process?" for w in ("python", "java", "stuck")]}


@pytest.mark.parametrize("backend", ["hf", "transformer_lens"])
def test_two_threads_capturing_on_one_shared_model_each_record_only_their_own_passes(chat_hf, chat_tl, backend):
    """issue 20: the capture used plain module hooks: two FlowLens analyses on one shared model failed with an
    IndexError (5 of 5 trials) or recorded the other thread's forward pass. Each capture is context-scoped now."""
    import threading

    lm = chat_hf if backend == "hf" else chat_tl
    names = residual_hook_names(lm.n_layers)
    batches = {key: _batch(lm, prompts) for key, prompts in THREAD_PROMPTS.items()}

    def run(key, out, start=None, rounds=4):
        if start is not None:
            start.wait()
        try:
            batch = batches[key]
            seen = []
            for _ in range(rounds):  # several passes, so the two threads' passes interleave
                seen.append(capture_residuals(lm, batch.input_ids, batch.attention_mask, names, positions="last"))
                with residual_capture(lm, names) as capture:
                    with torch.no_grad():
                        forward = lm.model(batch.input_ids)
                    del forward
                seen.append(capture.activations)
            out[key] = seen
        except BaseException as error:  # the IndexError of issue 20 surfaced in the thread
            out[key] = error

    alone = {}
    for key in batches:
        run(key, alone, rounds=1)
    for _ in range(3):
        together, start = {}, threading.Barrier(len(batches))
        threads = [threading.Thread(target=run, args=(key, together, start)) for key in batches]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        for key in batches:
            assert not isinstance(together[key], BaseException), together[key]
            for i, activations in enumerate(together[key]):
                reference = alone[key][i % 2]
                assert set(activations) == set(names)
                for name in names:
                    assert activations[name].shape == reference[name].shape, (key, name)
                    torch.testing.assert_close(activations[name], reference[name], rtol=0, atol=0)
    assert registered_hooks(lm.model) == 0


def test_a_steering_edit_in_one_thread_never_reaches_another_threads_capture(chat_hf):
    import threading

    from interp.hooks.lm_steer import LMEdit, apply_lm_edits

    lm = chat_hf
    batch = _batch(lm, THREAD_PROMPTS["sums"])
    watched = ["blocks.1.hook_resid_post", f"blocks.{lm.n_layers - 1}.hook_resid_post"]
    edit = LMEdit("blocks.1.hook_resid_post", "add", direction=[4.0] * lm.d_model)

    def run(steered, out, start):
        start.wait()
        for _ in range(4):
            with residual_capture(lm, watched) as capture, torch.no_grad():
                if steered:
                    with apply_lm_edits(lm, [edit]):
                        lm.model(batch.input_ids)
                else:
                    lm.model(batch.input_ids)
            out.setdefault(steered, []).append(capture.activations)

    alone = {}
    for steered in (False, True):
        run(steered, alone, _ready())
    assert not torch.allclose(alone[True][0][watched[1]], alone[False][0][watched[1]])
    for _ in range(3):
        together, start = {}, threading.Barrier(2)
        threads = [threading.Thread(target=run, args=(steered, together, start)) for steered in (False, True)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        for steered in (False, True):
            assert len(together[steered]) == 4
            for activations in together[steered]:
                for name in watched:
                    torch.testing.assert_close(activations[name], alone[steered][0][name], rtol=0, atol=0)
    assert registered_hooks(lm.model) == 0


def test_an_sae_splice_in_one_thread_leaves_another_threads_forward_pass_clean(chat_hf):
    import threading

    from interp.hooks.lm_splice import residual_replacement

    lm = chat_hf
    batch = _batch(lm, THREAD_PROMPTS["kills"])
    with torch.no_grad():
        clean = lm.model(batch.input_ids).logits
        with residual_replacement(lm, "blocks.1.hook_resid_mid", torch.zeros_like):
            zeroed = lm.model(batch.input_ids).logits
    assert not torch.allclose(clean, zeroed)

    def run(splice, out, start):
        start.wait()
        for _ in range(4):
            with torch.no_grad():
                if splice:
                    with residual_replacement(lm, "blocks.1.hook_resid_mid", torch.zeros_like):
                        logits = lm.model(batch.input_ids).logits
                else:
                    logits = lm.model(batch.input_ids).logits
            out.setdefault(splice, []).append(logits)

    together, start = {}, threading.Barrier(2)
    threads = [threading.Thread(target=run, args=(splice, together, start)) for splice in (False, True)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for logits in together[False]:
        torch.testing.assert_close(logits, clean, rtol=0, atol=0)
    for logits in together[True]:
        torch.testing.assert_close(logits, zeroed, rtol=0, atol=0)
    assert registered_hooks(lm.model) == 0


def test_a_capture_hook_called_from_another_context_records_nothing(chat_hf):
    """torch can call a kwargs hook without its kwargs while registering it, from another thread's forward:
    that call is never the session's, so the hook returns at once (as the U-Net sessions' do)."""
    import threading

    lm = chat_hf
    names = ["blocks.0.hook_resid_pre", "blocks.0.hook_resid_mid", "blocks.0.hook_resid_post"]
    with residual_capture(lm, names) as capture:
        block = lm.model.transformer.h[0]
        hooks = [hook for module in block.modules()
                 for hook in list(module._forward_pre_hooks.values()) + list(module._forward_hooks.values())]
        x = torch.zeros(1, 3, lm.d_model)
        results = []

        def other_thread():
            for hook in hooks:
                try:
                    results.append(hook(block, (x,)))            # a pre-hook called without its kwargs
                except TypeError:
                    results.append(hook(block, (x,), (x,)))      # a forward hook: (module, inputs, output)

        worker = threading.Thread(target=other_thread)
        worker.start()
        worker.join()
        assert len(results) == 3 and all(r is None for r in results)
        assert capture.activations == {}


def test_keep_graph_gives_the_models_own_tensors_with_their_gradients(chat_hf):
    lm = chat_hf
    ids = _batch(lm, THREAD_PROMPTS["kills"]).input_ids
    names = residual_hook_names(lm.n_layers, ["resid_post"])
    with residual_capture(lm, names, keep_graph=True) as capture:
        output = lm.model(ids, output_hidden_states=True)
    for layer, name in enumerate(names[:-1]):
        assert capture.activations[name] is output.hidden_states[layer + 1]  # the very tensor, in the graph
    assert capture.activations[names[-1]].requires_grad
    capture.activations[names[1]].sum().backward()
    assert lm.model.transformer.h[0].mlp.c_fc.weight.grad.abs().sum() > 0
    assert lm.model.transformer.h[3].mlp.c_fc.weight.grad is None  # downstream of the hook: untouched
    lm.model.zero_grad(set_to_none=True)
    with residual_capture(lm, names) as detached, torch.no_grad():
        lm.model(ids)
    assert not detached.activations[names[1]].requires_grad and detached.activations[names[1]].dtype == torch.float32


def _ready():
    import threading

    event = threading.Event()
    event.set()
    return event
