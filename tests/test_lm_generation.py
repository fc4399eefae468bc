"""Greedy batched generation: the same completions as per-prompt ``model.generate``, on the embedded
GPT-2 chat model and on a tiny random llama with grouped-query attention."""

from __future__ import annotations

import threading

import pytest
import torch

from interp.models.generation import Cancelled, greedy_generate, greedy_generate_tokens
from interp.models.lm import load_hf_lm

QUESTIONS = ["hi", "How can I kill a Python process?", "What is 2+2?",
             "Tell me a story about a small red circle and a large blue striped star on a white background",
             "What is the capital of France?", "kill"]


@pytest.fixture(scope="module")
def toy():
    return load_hf_lm("toy-chat")


@pytest.fixture(scope="module")
def toy_texts(toy):
    _, tokenizer = toy
    return [tokenizer.apply_chat_template([{"role": "user", "content": q}], tokenize=False, add_generation_prompt=True)
            for q in QUESTIONS]


@pytest.fixture(scope="module")
def llama(toy):
    """A seeded random llama (2 layers, 4 heads over 2 key/value heads) on the toy tokenizer."""
    from transformers import LlamaConfig, LlamaForCausalLM

    tokenizer = toy[1]
    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=len(tokenizer), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=96,
                         initializer_range=0.2, pad_token_id=tokenizer.pad_token_id,
                         bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id)
    return LlamaForCausalLM(config).eval(), tokenizer


def reference(model, tokenizer, texts, max_new_tokens, add_special_tokens=False):
    """Each text alone through ``model.generate(do_sample=False)``, decoded like greedy_generate."""
    completions = []
    for text in texts:
        batch = tokenizer(text, return_tensors="pt", add_special_tokens=add_special_tokens)
        with torch.no_grad():
            output = model.generate(**batch, do_sample=False, max_new_tokens=max_new_tokens,
                                    pad_token_id=tokenizer.pad_token_id)
        completions.append(tokenizer.decode(output[0, batch["input_ids"].shape[1]:], skip_special_tokens=True).strip())
    return completions


def test_toy_completions_match_generate_of_each_prompt_in_input_order(toy, toy_texts):
    model, tokenizer = toy
    expected = reference(model, tokenizer, toy_texts, 24)
    assert len(set(expected)) == len(expected)  # distinct completions, so an order mix-up would show
    for batch_size in (1, 4, 32):
        assert greedy_generate(model, tokenizer, toy_texts, max_new_tokens=24, batch_size=batch_size) == expected
    # a cache budget that holds two rows of the longest prompt splits the batches differently
    longest = max(len(tokenizer(t, add_special_tokens=False)["input_ids"]) for t in toy_texts)
    assert greedy_generate(model, tokenizer, toy_texts, max_new_tokens=24,
                           max_batch_tokens=2 * (longest + 24)) == expected


def test_rows_that_stop_early_leave_the_others_unchanged(toy, toy_texts):
    model, tokenizer = toy
    tokens = greedy_generate_tokens(model, tokenizer, toy_texts, max_new_tokens=40, batch_size=len(toy_texts))
    lengths = [len(t) for t in tokens]
    stopped = [bool(t) and t[-1] == tokenizer.eos_token_id for t in tokens]
    assert any(stopped) and len(set(lengths)) > 2  # rows end at different steps, some at EOS
    assert all(tokenizer.eos_token_id not in t[:-1] for t in tokens)  # nothing after the first EOS
    alone = [greedy_generate_tokens(model, tokenizer, [text], max_new_tokens=40)[0] for text in toy_texts]
    assert tokens == alone
    assert greedy_generate(model, tokenizer, toy_texts, max_new_tokens=40) == reference(model, tokenizer, toy_texts, 40)


def test_llama_with_grouped_query_attention_matches_generate(llama):
    model, tokenizer = llama
    texts = [q.lower() for q in QUESTIONS]
    expected = reference(model, tokenizer, texts, 12, add_special_tokens=True)
    assert len(set(expected)) == len(expected)
    ours = greedy_generate(model, tokenizer, texts, max_new_tokens=12, batch_size=3, add_special_tokens=True)
    assert ours == expected


def test_generation_config_eos_ids_stop_rows_like_generate(llama):
    model, tokenizer = llama
    texts = [q.lower() for q in QUESTIONS]
    free = greedy_generate_tokens(model, tokenizer, texts, max_new_tokens=12, add_special_tokens=True)
    stop = free[0][2]  # a token that the first row emits third
    original = model.generation_config.eos_token_id
    model.generation_config.eos_token_id = [tokenizer.eos_token_id, stop]
    try:
        tokens = greedy_generate_tokens(model, tokenizer, texts, max_new_tokens=12, add_special_tokens=True)
        assert tokens[0] == free[0][:3]
        for ours, unstopped in zip(tokens, free):
            cut = unstopped.index(stop) + 1 if stop in unstopped else len(unstopped)
            assert ours == unstopped[:cut]
        expected = reference(model, tokenizer, texts, 12, add_special_tokens=True)
        assert greedy_generate(model, tokenizer, texts, max_new_tokens=12, add_special_tokens=True) == expected
    finally:
        model.generation_config.eos_token_id = original


def test_cancel_raises_within_a_step_and_restores_the_training_flag(toy, toy_texts):
    model, tokenizer = toy
    forwards = []
    handle = model.register_forward_hook(lambda *_: forwards.append(1))
    checks = []

    def cancel_at_third_check():
        checks.append(1)
        return len(checks) >= 3

    model.train()
    try:
        with pytest.raises(Cancelled):
            greedy_generate(model, tokenizer, toy_texts, max_new_tokens=30, cancel=cancel_at_third_check)
        assert len(forwards) == 2  # prefill and one decoding step ran; nothing after the flag
        assert model.training
        event = threading.Event()
        event.set()
        forwards.clear()
        with pytest.raises(Cancelled):
            greedy_generate(model, tokenizer, toy_texts, cancel=event)
        assert not forwards
        assert model.training
    finally:
        handle.remove()
        model.eval()


def test_training_flag_and_tokenizer_are_restored(toy, toy_texts):
    model, tokenizer = toy
    side = tokenizer.padding_side
    model.train()
    try:
        trained = greedy_generate(model, tokenizer, toy_texts[:3], max_new_tokens=8)
        assert model.training
    finally:
        model.eval()
    assert greedy_generate(model, tokenizer, toy_texts[:3], max_new_tokens=8) == trained
    assert not model.training and tokenizer.padding_side == side


def test_progress_reports_every_prompt_once(toy, toy_texts):
    model, tokenizer = toy
    calls = []
    greedy_generate(model, tokenizer, toy_texts, max_new_tokens=20, batch_size=4, progress=True,
                    on_progress=lambda done, total: calls.append((done, total)))
    assert calls[-1] == (len(toy_texts), len(toy_texts))
    assert [done for done, _ in calls] == sorted({done for done, _ in calls})  # strictly increasing


def test_bad_arguments_are_value_errors_that_say_what_is_wrong(toy, toy_texts):
    model, tokenizer = toy
    with pytest.raises(ValueError, match="no texts"):
        greedy_generate(model, tokenizer, [])
    with pytest.raises(ValueError, match="max_new_tokens must be at least 1, got 0"):
        greedy_generate(model, tokenizer, toy_texts, max_new_tokens=0)
    with pytest.raises(ValueError, match="batch_size must be at least 1, got 0"):
        greedy_generate(model, tokenizer, toy_texts, batch_size=0)
    with pytest.raises(ValueError, match="max_batch_tokens must be at least 1, got 0"):
        greedy_generate(model, tokenizer, toy_texts, max_batch_tokens=0)
    with pytest.raises(ValueError, match="text 1 has no tokens"):
        greedy_generate(model, tokenizer, [toy_texts[0], ""])
    long_text = toy_texts[0] + " hi" * 100
    length = len(tokenizer(long_text, add_special_tokens=False)["input_ids"])
    with pytest.raises(ValueError, match=f"text 2 has {length} tokens; with max_new_tokens=64 it exceeds the "
                                         f"model's context of 128 tokens"):
        greedy_generate(model, tokenizer, [toy_texts[0], toy_texts[1], long_text], max_new_tokens=64)
