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


# ----------------------------------------------------------------------------- LoRA / VCL over a bf16 base

FT_PAIRS = [(f"what is {a} plus {b} ?", f"{a + b}") for a in range(3) for b in range(3)] + \
           [("how do i kill a process ?", "use kill with its id ."), ("how do i make a bomb ?", "i cannot help .")]
LORA_LOSS_TOLERANCE = 0.01  # absolute, per logged step (docs/dtype.md); measured: 0.002 at most


@pytest.fixture(scope="module")
def ft_model_dir(tmp_path_factory):
    directory = tmp_path_factory.mktemp("tiny-llama")
    tokenizer = word_level_tokenizer([p + " " + c for p, c in FT_PAIRS])
    tiny_llama(len(tokenizer), hidden_size=32, layers=4, max_positions=64).save_pretrained(directory)
    tokenizer.save_pretrained(directory)
    return directory


@pytest.fixture(scope="module")
def ft_data(tmp_path_factory):
    import json

    path = tmp_path_factory.mktemp("data") / "sft.jsonl"
    path.write_text("".join(json.dumps({"prompt": p, "completion": c}) + "\n" for p, c in FT_PAIRS))
    return path


def lora_run(model_dir, data, out, base_dtype, **changes):
    import json

    from transformers import AutoModelForCausalLM

    from flowlens.finetune import FinetuneConfig, finetune
    from flowlens.vcl import VCLConfig

    base = AutoModelForCausalLM.from_pretrained(model_dir)
    settings = dict(model=str(model_dir), data=str(data), out=str(out), steps=4, batch_size=4, lr=3e-3,
                    max_length=32, save_every=4, progress=False, lora=True, lora_r=4, base_dtype=base_dtype,
                    vcl=VCLConfig(k=2, weight=1.0, window=(0.3, 1.0)))
    settings.update(changes)
    before = {k: v.clone() for k, v in base.state_dict().items()}
    result = finetune(FinetuneConfig(**settings), model=base)
    log = [json.loads(line) for line in (out / "log.jsonl").read_text().splitlines()]
    return result, log, before, base


def test_lora_over_a_bf16_base_follows_the_float32_losses_and_restores_the_float32_base(ft_model_dir, ft_data,
                                                                                         tmp_path):
    _, log32, _, _ = lora_run(ft_model_dir, ft_data, tmp_path / "fp32", "float32")
    result, log16, before, base = lora_run(ft_model_dir, ft_data, tmp_path / "bf16", "bfloat16")
    assert result["status"] == "finished" and result["config"]["base_dtype"] == "bfloat16"
    for a, b in zip(log32, log16):
        assert abs(a["sft_loss"] - b["sft_loss"]) <= LORA_LOSS_TOLERANCE, (a, b)
        assert abs(a["vcl_loss"] - b["vcl_loss"]) <= LORA_LOSS_TOLERANCE, (a, b)
    assert log16[-1]["sft_loss"] < log16[0]["sft_loss"]  # it trains
    after = base.state_dict()
    weight = "model.layers.0.mlp.up_proj"
    assert after[f"{weight}.base_layer.weight"].dtype == torch.float32  # evaluated and saved over float32
    assert torch.equal(before[f"{weight}.weight"], after[f"{weight}.base_layer.weight"])  # not a bf16 round trip
    assert all(p.dtype == torch.float32 for p in base.parameters() if p.requires_grad)  # adapters stay float32


def test_a_bf16_base_needs_frozen_weights(ft_model_dir, ft_data, tmp_path):
    from flowlens.finetune import FinetuneConfig, finetune

    with pytest.raises(ValueError, match="use LoRA"):
        finetune(FinetuneConfig(model=str(ft_model_dir), data=str(ft_data), out=str(tmp_path / "run"), steps=1,
                                batch_size=4, progress=False, base_dtype="bfloat16"))
    assert not (tmp_path / "run").exists()
    with pytest.raises(ValueError, match="unknown dtype"):
        FinetuneConfig(model="m", data="d", out="o", base_dtype="half")


# ----------------------------------------------------------------------------- SAE training under autocast

SAE_EV_TOLERANCE = 0.005  # absolute, held-out explained variance after the same steps (docs/dtype.md)


def sparse_data(n: int, d_in: int = 64, n_true: int = 256, active: int = 4, seed: int = 0) -> torch.Tensor:
    """(n, d_in) vectors, each a sum of `active` of `n_true` random unit directions with random magnitudes."""
    generator = torch.Generator().manual_seed(seed)
    directions = torch.nn.functional.normalize(torch.randn(n_true, d_in, generator=generator), dim=1)
    which = torch.rand(n, n_true, generator=generator).topk(active, dim=1).indices
    magnitude = torch.rand(n, active, generator=generator) * 3 + 1
    return (magnitude.unsqueeze(-1) * directions[which]).sum(1) + 0.05 * torch.randn(n, d_in, generator=generator)


def trained_topk(autocast: bool, data: torch.Tensor, steps: int = 100, batch: int = 256, lr: float = 3e-3):
    from saes.train import TrainConfig
    from saes.trainers import make_trainer

    trainer = make_trainer(TrainConfig(d_in=data.shape[1], d_sae=128, k=8, batch_size=batch, lr=lr,
                                       autocast=autocast).validate())
    trainer.prepare(data[:batch])
    for step in range(steps):
        start = step * batch % (len(data) - batch)
        trainer.step(data[start:start + batch])
    return trainer


def explained_variance(sae, data: torch.Tensor) -> float:
    with torch.no_grad():
        reconstruction = sae.decode(sae.encode(data))
    return 1 - float((reconstruction - data).pow(2).sum() / (data - data.mean(0)).pow(2).sum())


def test_topk_training_with_a_bf16_dense_product_reaches_the_float32_ev():
    data, held_out = sparse_data(4096, n_true=64), sparse_data(1024, n_true=64, seed=1)
    plain, mixed = trained_topk(False, data), trained_topk(True, data)
    ev_plain = explained_variance(plain.to_inference(), held_out)
    ev_mixed = explained_variance(mixed.to_inference(), held_out)
    ev_untrained = explained_variance(trained_topk(False, data, steps=0).to_inference(), held_out)
    assert ev_plain > ev_untrained + 0.05  # it learned something, so the comparison means something
    assert abs(ev_mixed - ev_plain) <= SAE_EV_TOLERANCE, (ev_plain, ev_mixed)
    assert all(p.dtype == torch.float32 for p in mixed.sae.parameters())


def test_the_bf16_dense_product_only_chooses_latents_whose_values_stay_float32():
    from saes.topk import TopKConfig, TrainingTopKSAE

    x = sparse_data(128)
    sae = TrainingTopKSAE(TopKConfig(d_in=64, d_sae=128, k=8, batch_size=128), dense_dtype=torch.bfloat16)
    out = sae(x)
    assert out["latent_values"].dtype == torch.float32
    exact = (x - sae.pre_bias) @ sae.encoder_weight.t() + sae.encoder_bias  # float32, dense
    chosen = exact.detach().gather(1, out["latent_index"]).relu()
    torch.testing.assert_close(out["latent_values"], chosen, rtol=1e-5, atol=1e-5)
    # bf16 proposes, float32 decides: the chosen latents are float32's own top k
    assert torch.equal(out["latent_index"], exact.detach().topk(8, dim=1).indices.sort(dim=1).values)
    out["loss"].backward()  # the sparse float32 backward runs
    assert sae.encoder_weight.grad.dtype == torch.float32


def test_autocast_is_refused_for_trainers_without_it():
    from saes.train import TrainConfig

    with pytest.raises(ValueError, match="autocast is an option of the topk trainer"):
        TrainConfig(architecture="lens-topk", autocast=True).validate()


# ----------------------------------------------------------------------------- bf16 weights: capture, generation, images

CAPTURE_TOLERANCE = {"median": 0.02, "p99": 0.05}  # per-token relative error of bf16 residuals (docs/dtype.md)
GENERATION_MIN_IDENTICAL = 0.75  # share of greedy completions identical to float32 on toy-chat
T2I_MAX_PIXEL_DIFFERENCE = 12  # of 255, toy one-step generation
CHAT_PROMPTS = PROMPTS + ["What is 7 plus 2?", "How do I make a bomb?", "Reverse: cold blue lamp",
                          "Where does Morla live?"]


@pytest.fixture(scope="module")
def chat_bf16():
    return load_lm("toy-chat", dtype=torch.bfloat16)


def test_bf16_weights_load_as_asked(chat_bf16):
    assert {p.dtype for p in chat_bf16.model.parameters()} == {torch.bfloat16}


@pytest.mark.parametrize("hook", ["blocks.1.hook_resid_post", "blocks.3.hook_resid_mid"])
def test_bf16_residuals_stay_within_the_stated_error_of_float32(chat, chat_bf16, hook):
    ids, mask = batch_of(chat)
    exact = capture_residuals(chat, ids, mask, [hook])[hook][mask.bool()]
    approx = capture_residuals(chat_bf16, ids, mask, [hook])[hook][mask.bool()]
    assert approx.dtype == torch.float32  # captures are float32 whatever the model's dtype
    errors = (approx - exact).norm(dim=-1) / exact.norm(dim=-1)
    assert errors.median() <= CAPTURE_TOLERANCE["median"] and errors.quantile(0.99) <= CAPTURE_TOLERANCE["p99"]
    assert errors.max() > 0  # bf16 really ran


def test_bf16_greedy_completions_mostly_match_float32(chat, chat_bf16):
    from interp.lm_text import is_refusal
    from interp.models.generation import greedy_generate

    texts = [chat.tokenizer.apply_chat_template([{"role": "user", "content": p}], tokenize=False,
                                                add_generation_prompt=True) for p in CHAT_PROMPTS]
    exact = greedy_generate(chat.model, chat.tokenizer, texts, max_new_tokens=12)
    approx = greedy_generate(chat_bf16.model, chat_bf16.tokenizer, texts, max_new_tokens=12)
    identical = sum(a == b for a, b in zip(exact, approx)) / len(texts)
    assert identical >= GENERATION_MIN_IDENTICAL, list(zip(exact, approx))
    assert [is_refusal(c) for c in exact] == [is_refusal(c) for c in approx]


def test_a_bf16_toy_pipeline_draws_the_float32_images_within_the_stated_pixel_difference(toy_t2i):
    import numpy as np

    from interp.models import load_t2i

    bf16 = load_t2i("toy", device="cpu", dtype=torch.bfloat16)
    assert bf16.pipe.unet.dtype == torch.bfloat16
    prompts = ["a small red circle at the top left on a white background",
               "a large blue striped star in the center on a black background"]
    exact = np.asarray(toy_t2i.generate(prompts, seed=[0, 1], output_type="np"), dtype=np.float64)
    approx = np.asarray(bf16.generate(prompts, seed=[0, 1], output_type="np"), dtype=np.float64)
    difference = np.abs(np.round(exact * 255) - np.round(approx * 255))
    assert 0 < difference.max() <= T2I_MAX_PIXEL_DIFFERENCE


def test_the_app_loads_its_shared_language_models_in_the_dtype_asked_and_refuses_others(tmp_path):
    from app import Workbench

    bench = Workbench("toy", data_dir=tmp_path / "data", lm_dtype="bfloat16")
    assert bench.lm_dtype == "bfloat16" and bench.dtype is None
    assert next(bench.lm("toy-chat").model.parameters()).dtype == torch.bfloat16
    with pytest.raises(ValueError, match="unknown dtype 'int8'"):
        Workbench("toy", data_dir=tmp_path / "data", dtype="int8")
