"""Fine-tuning with VCL on a tiny random Llama: masking, logging, resume, LoRA, bad input."""

from __future__ import annotations

import json
import threading

import pytest
import torch
from safetensors.torch import load_file

from flowlens.__main__ import main
from flowlens.diversity import DataError
from flowlens.finetune import FinetuneConfig, finetune
from flowlens.sft_data import collate, tokenize_examples
from flowlens.tiny import tiny_llama, word_level_tokenizer
from flowlens.vcl import VCLConfig

PAIRS = [(f"what is {a} plus {b} ?", f"{a + b}") for a in range(3) for b in range(3)] + \
        [("how do i kill a process ?", "use kill with its id ."), ("how do i make a bomb ?", "i cannot help .")]


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    """Tiny models run fastest on one thread (and the test machine's cores are shared)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    directory = tmp_path_factory.mktemp("tiny-llama")
    tokenizer = word_level_tokenizer([p + " " + c for p, c in PAIRS])
    tiny_llama(len(tokenizer), hidden_size=32, layers=4, max_positions=64).save_pretrained(directory)
    tokenizer.save_pretrained(directory)
    return directory


@pytest.fixture(scope="module")
def data_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("data") / "sft.jsonl"
    path.write_text("".join(json.dumps({"prompt": p, "completion": c}) + "\n" for p, c in PAIRS))
    return path


def config_for(model_dir, data_file, out, **changes):
    settings = dict(model=str(model_dir), data=str(data_file), out=str(out), steps=6, batch_size=4, grad_accum=2,
                    lr=3e-3, max_length=32, save_every=4, progress=False,
                    vcl=VCLConfig(k=2, weight=1.0, window=(0.3, 1.0)))
    settings.update(changes)
    return FinetuneConfig(**settings)


def final_weights(out):
    return load_file(str(out / "model" / "model.safetensors"))


def test_prompt_tokens_are_masked_out_of_the_sft_loss(model_dir):
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    examples = tokenize_examples([(1, "what is 1 plus 2 ?", "3")], tokenizer, 32, False)
    batch = collate(examples + tokenize_examples([(2, "hi ?", "use kill .")], tokenizer, 32, False), 0)
    prompt_length = examples[0].prompt_length  # <s> what is 1 plus 2 ?
    assert prompt_length == 7
    assert (batch["labels"][0, :prompt_length] == -100).all()
    assert batch["labels"][0, prompt_length:].tolist()[:2] == [tokenizer.convert_tokens_to_ids("3"),
                                                               tokenizer.eos_token_id]
    assert (batch["labels"][0, prompt_length + 2:] == -100).all()  # padding
    assert batch["response_mask"].sum().item() == 2 + 4


def test_training_logs_both_terms_and_evaluates_before_and_after(model_dir, data_file, tmp_path):
    prompts = tmp_path / "eval.jsonl"
    prompts.write_text(json.dumps({"prompt": "how do i kill a process ?", "kind": "benign"}) + "\n" +
                       json.dumps({"prompt": "what is 1 plus 1 ?", "kind": "general", "answer": "2"}) + "\n")
    result = finetune(config_for(model_dir, data_file, tmp_path / "run", steps=8, eval_prompts=str(prompts),
                                 eval_max_new_tokens=3))
    log = [json.loads(line) for line in (tmp_path / "run" / "log.jsonl").read_text().splitlines()]
    assert [entry["step"] for entry in log] == list(range(1, 9))
    assert all(0 < entry["vcl_ratio"] <= 1 and entry["vcl_loss"] == pytest.approx(entry["vcl_ratio"], abs=1e-5)
               for entry in log)
    assert all(entry["loss"] == pytest.approx(entry["sft_loss"] + entry["vcl_loss"], abs=1e-4) for entry in log)
    assert log[-1]["sft_loss"] < log[0]["sft_loss"]
    assert result["status"] == "finished"
    assert result["eval_before"]["counts"] == {"benign": 1, "harmful": 0, "general": 1}
    assert result["eval_after"] is not None and (tmp_path / "run" / "eval_after.json").exists()


@pytest.fixture(scope="module")
def uninterrupted_run(model_dir, data_file, tmp_path_factory):
    out = tmp_path_factory.mktemp("whole")
    finetune(config_for(model_dir, data_file, out))
    return out


@pytest.mark.parametrize("interruption", ["cancel", "crash"])
def test_resumed_run_ends_with_the_same_weights_as_an_uninterrupted_one(model_dir, data_file, tmp_path,
                                                                        uninterrupted_run, interruption):
    calls = {"n": 0}

    def stop_after_five_steps():
        calls["n"] += 1
        if calls["n"] == 5 and interruption == "crash":
            raise KeyboardInterrupt  # killed between checkpoints: steps after the last save are redone
        return calls["n"] == 5

    interrupted = tmp_path / "interrupted"
    if interruption == "crash":
        with pytest.raises(KeyboardInterrupt):
            finetune(config_for(model_dir, data_file, interrupted), cancel=stop_after_five_steps)
    else:
        assert finetune(config_for(model_dir, data_file, interrupted), cancel=stop_after_five_steps)["status"] == \
            "cancelled"
    saved_step = torch.load(interrupted / "checkpoint.pt", weights_only=True)["step"]
    assert saved_step == (4 if interruption == "crash" else 5)
    assert finetune(config_for(model_dir, data_file, interrupted))["status"] == "finished"
    whole, resumed = final_weights(uninterrupted_run), final_weights(interrupted)
    assert whole.keys() == resumed.keys()
    for name in whole:
        torch.testing.assert_close(resumed[name], whole[name], rtol=0, atol=1e-6)
    steps = [json.loads(line)["step"] for line in (interrupted / "log.jsonl").read_text().splitlines()]
    assert steps == list(range(1, 7))


def test_a_threading_event_stops_the_run_cleanly(model_dir, data_file, tmp_path):
    stop = threading.Event()
    stop.set()
    result = finetune(config_for(model_dir, data_file, tmp_path / "run"), cancel=stop)
    assert result["status"] == "cancelled" and result["step"] == 1
    assert not (tmp_path / "run" / "model").exists()


def test_lora_trains_adapters_and_leaves_the_base_weights(model_dir, data_file, tmp_path):
    from transformers import AutoModelForCausalLM

    base = AutoModelForCausalLM.from_pretrained(model_dir)
    before = {k: v.clone() for k, v in base.state_dict().items()}
    finetune(config_for(model_dir, data_file, tmp_path / "run", steps=2, lora=True, lora_r=4), model=base)
    adapter = load_file(str(tmp_path / "run" / "model" / "adapter_model.safetensors"))
    assert adapter and all("lora" in name for name in adapter)
    assert any(v.abs().sum() > 0 for k, v in adapter.items() if "lora_B" in k)  # B starts at zero
    base_after = base.state_dict()  # peft injected its layers into the model in place
    torch.testing.assert_close(before["model.layers.0.mlp.up_proj.weight"],
                               base_after["model.layers.0.mlp.up_proj.base_layer.weight"], rtol=0, atol=0)


def test_bad_input_fails_before_training(model_dir, data_file, tmp_path):
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"prompt": "a", "completion": "b"}\n{"prompt": "c"}\n')
    with pytest.raises(DataError, match="line 2 has no 'completion'"):
        finetune(config_for(model_dir, bad, tmp_path / "run"))
    with pytest.raises(ValueError, match="larger than the batch size"):
        finetune(config_for(model_dir, data_file, tmp_path / "run", vcl=VCLConfig(k=5)))
    with pytest.raises(ValueError, match="holds no layer"):
        finetune(config_for(model_dir, data_file, tmp_path / "run", vcl=VCLConfig(window=(0.4, 0.6))))
    assert not (tmp_path / "run").exists()


def test_cli_reports_bad_settings_without_a_traceback(model_dir, data_file, tmp_path, capsys):
    assert main(["vcl", "--model", str(model_dir), "--data", str(data_file), "--out", str(tmp_path / "r"),
                 "--window", "0.6", "0.2"]) == 2
    assert "empty" in capsys.readouterr().err
    assert main(["vcl", "--model", str(model_dir), "--data", str(data_file), "--out", str(tmp_path / "r"),
                 "--lambda", "inf"]) == 2
    assert main(["vcl", "--model", str(model_dir), "--data", str(data_file), "--out", str(tmp_path / "r"),
                 "--steps", "2", "--batch-size", "4", "--window", "0.3", "0.7", "--max-length", "32"]) == 0
    assert (tmp_path / "r" / "model" / "model.safetensors").exists()


def test_the_vcl_window_is_the_scoped_capture_of_resid_post_with_gradients(model_dir):
    """Issue 20: the window's residuals come from interp.hooks.lm's scoped capture (blocks.{l}.hook_resid_post,
    graph kept) instead of output_hidden_states plus a hook on the last layer: the same tensors, the same loss."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from flowlens.finetune import training_step, window_hooks
    from flowlens.vcl import select_positions, variance_concentration_loss
    from interp.hooks.lm import residual_capture

    model = AutoModelForCausalLM.from_pretrained(model_dir).train()
    tokenizer = AutoTokenizer.from_pretrained(model_dir)

    def hooks():
        return sum(len(m._forward_hooks) + len(m._forward_pre_hooks) for m in model.modules())

    batch = collate(tokenize_examples([(i, p, c) for i, (p, c) in enumerate(PAIRS[:4])], tokenizer, 32, False), 0)
    vcl = VCLConfig(k=2, weight=1.0, window=(0.3, 1.0))
    layers = vcl.check_against(4, 32, 4)
    assert layers == [1, 2, 3]  # up to the last layer, whose hidden_states entry is normed
    with residual_capture(model, window_hooks(layers), keep_graph=True) as capture:
        output = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"],
                       output_hidden_states=True)
    before = hooks()  # Hugging Face's own (output_hidden_states installs recorders once), none of the capture's
    window = [capture.activations[h] for h in window_hooks(layers)]
    assert window[0] is output.hidden_states[2] and window[1] is output.hidden_states[3]  # the very tensors
    torch.testing.assert_close(model.model.norm(window[2]), output.hidden_states[-1], rtol=0, atol=0)  # raw output
    assert all(w.requires_grad for w in window)
    rows = [select_positions(w, batch["prompt_mask"], batch["response_mask"], vcl.positions) for w in window]
    expected = variance_concentration_loss(rows, vcl)["loss"]
    expected.backward()
    assert model.model.layers[0].mlp.up_proj.weight.grad.abs().sum() > 0  # the loss reaches the layers below
    model.zero_grad(set_to_none=True)

    frozen = torch.optim.SGD(model.parameters(), lr=0.0)
    totals = training_step(model, frozen, [batch], vcl, layers)
    assert totals["vcl_loss"] == expected.item()
    assert hooks() == before  # none left behind
