"""Steering the embedded chat model by SAE features (interp.hooks.lm_steer, flowlens steer).

The SAE is a small TopK SAE trained here on toy-chat's residuals (a few seconds) and saved in
sae-lens format with its hook and model in the metadata; test_lm_features uses it too."""

from __future__ import annotations

import functools
import subprocess
import sys
import tempfile
import threading
from pathlib import Path

import pytest
import torch

from interp.edits import EditError
from interp.hooks.lm import residual_capture
from interp.hooks.lm_steer import LMEdit, apply_lm_edits, generate, logit_effects
from interp.models.generation import greedy_generate_tokens

HOOK = "blocks.2.hook_resid_post"
ROOT = Path(__file__).resolve().parents[1]
FEATURE, STRENGTH = 5, 60.0  # a feature of the trained SAE and a strength (the stream's norm is about 100) that
#                             change the completions of all three prompts, at any positions
PROMPTS = ["What colour is the sky?", "What is 12 plus 7?", "Where does Telvor live?"]


def chat_texts(lm, examples) -> list[str]:
    return [lm.tokenizer.apply_chat_template([{"role": "user", "content": e["prompt"]},
                                              {"role": "assistant", "content": e["completion"]}], tokenize=False)
            for e in examples]


@functools.cache
def toy_lm():
    from interp.models.lm import load_lm

    return load_lm("toy-chat")


@functools.cache
def toy_lm_sae(hook: str = HOOK) -> tuple:
    """(SAE, its directory): a TopK SAE (256 features, k=8) on toy-chat's residuals at `hook` over chat-world
    conversations, trained from an in-memory batch stream and saved in sae-lens format."""
    from interp.hooks.lm import capture_residuals
    from zoo.chat.world import World
    from saes.sae import SAE
    from saes.train import TrainConfig, train

    lm = toy_lm()
    examples = World().mixture("train", 240, {"general": 0.5, "benign": 0.25, "harmful": 0.25}, seed=0)
    encoded = lm.tokenizer(chat_texts(lm, examples), add_special_tokens=False, padding=True, return_tensors="pt")
    residual = capture_residuals(lm, encoded["input_ids"], encoded["attention_mask"], [hook])[hook]
    keep = encoded["attention_mask"].bool()
    keep[:, 0] = False  # the start token's stream is an outlier no SAE is trained on
    vectors = residual[keep]
    generator = torch.Generator().manual_seed(0)
    config = TrainConfig(d_in=lm.d_model, d_sae=256, k=8, batch_size=256, lr=5e-3, total_tokens=256 * 100,
                         dead_after_tokens=20_000, metadata={"hook_name": hook, "model_name": "toy-chat"})
    batches = (vectors[torch.randint(len(vectors), (256,), generator=generator)] for _ in range(100))
    directory = Path(tempfile.mkdtemp(prefix="lm-sae-")) / hook
    train(config, batches, directory, progress=False)
    return SAE.load(directory).eval(), directory


@pytest.fixture(scope="module")
def lm():
    return toy_lm()


@pytest.fixture(scope="module")
def sae():
    return toy_lm_sae()[0]


def _prompt_ids(lm, prompt: str) -> torch.Tensor:
    text = lm.tokenizer.apply_chat_template([{"role": "user", "content": prompt}], tokenize=False,
                                            add_generation_prompt=True)
    return torch.tensor([lm.tokenizer(text, add_special_tokens=False)["input_ids"]])


def _firing_feature(lm, sae, ids) -> int:
    """The feature firing at the most positions of this prompt (after the start token)."""
    with residual_capture(lm, [HOOK]) as cap, torch.no_grad():
        lm.model(ids)
    latents = sae.encode(cap.activations[HOOK][0, 1:])
    return int((latents > 0).sum(0).argmax())


def _no_hooks_left(model) -> bool:
    return all(not m._forward_hooks and not m._forward_pre_hooks for m in model.modules())


def test_the_sae_is_saved_in_sae_lens_format_with_its_hook_and_model(sae):
    import json

    cfg = json.loads((toy_lm_sae()[1] / "cfg.json").read_text())
    assert cfg["architecture"] == "topk" and cfg["d_in"] == 128 and cfg["d_sae"] == 256
    assert cfg["metadata"]["hook_name"] == HOOK and cfg["metadata"]["model_name"] == "toy-chat"
    assert (toy_lm_sae()[1] / "sae_weights.safetensors").is_file()


def test_an_lm_edit_is_json_data_and_refuses_what_it_cannot_do():
    edit = LMEdit(HOOK, "set", feature=3, strength=2, positions="generated")
    assert LMEdit.from_json(edit.to_json()) == edit and edit.to_dict()["positions"] == "generated"
    for bad in (dict(mode="boost", feature=1), dict(mode="add", feature=1, positions="middle"),
                dict(mode="add"), dict(mode="ablate"), dict(mode="scale", feature=1, direction=[1.0]),
                dict(mode="add", feature=1, strength=float("nan")), dict(mode="add", feature=-1)):
        with pytest.raises(EditError):
            LMEdit(HOOK, **bad)
    with pytest.raises(EditError, match="unknown edit field"):
        LMEdit.from_dict({"hook": HOOK, "mode": "add", "feature": 1, "mask": None})


@pytest.mark.parametrize("mode,strength", [("ablate", 1.0), ("scale", 2.5), ("set", 7.0)])
def test_a_feature_edit_changes_the_stream_by_exactly_its_share_of_the_decoder_direction(lm, sae, mode, strength):
    ids = _prompt_ids(lm, PROMPTS[0])
    feature = _firing_feature(lm, sae, ids)
    downstream = "blocks.3.hook_resid_pre"  # what the next block reads: the edited resid_post of block 2
    with residual_capture(lm, [HOOK, downstream]) as plain, torch.no_grad():
        lm.model(ids)
    with apply_lm_edits(lm, [LMEdit(HOOK, mode, feature=feature, strength=strength)], {HOOK: sae}), \
            residual_capture(lm, [downstream]) as edited, torch.no_grad():
        lm.model(ids)
    x = plain.activations[HOOK][0]
    activation = sae.encode(x)[:, feature]
    assert (activation > 0).sum() >= 2 and (activation == 0).any()
    target = {"ablate": torch.zeros_like(activation), "scale": strength * activation,
              "set": torch.full_like(activation, strength)}[mode]
    expected = (target - activation)[:, None] * sae.W_dec[feature]
    torch.testing.assert_close(edited.activations[downstream][0] - plain.activations[downstream][0], expected,
                               atol=2e-5, rtol=0)
    if mode == "ablate":  # where the feature does not fire, the stream is untouched, bit for bit
        silent = activation == 0
        assert torch.equal(edited.activations[downstream][0][silent], plain.activations[downstream][0][silent])
    assert _no_hooks_left(lm.model)


@pytest.mark.parametrize("hook", ["blocks.1.hook_resid_pre", "blocks.1.hook_resid_mid", "blocks.1.hook_resid_post"])
def test_an_added_direction_shows_at_its_own_hook_at_every_position(lm, hook):
    ids = _prompt_ids(lm, PROMPTS[1])
    direction = torch.randn(lm.d_model, generator=torch.Generator().manual_seed(1))
    with residual_capture(lm, [hook]) as plain, torch.no_grad():
        lm.model(ids)
    with apply_lm_edits(lm, [LMEdit(hook, "add", direction=direction.tolist(), strength=3.0)]), \
            residual_capture(lm, [hook]) as edited, torch.no_grad():
        lm.model(ids)
    difference = edited.activations[hook][0] - plain.activations[hook][0]
    torch.testing.assert_close(difference, (3.0 * direction).expand_as(difference), atol=1e-4, rtol=0)


def test_ablating_a_direction_projects_it_out_at_every_position_and_keeps_the_rest(lm):
    hook = "blocks.1.hook_resid_post"
    ids = _prompt_ids(lm, PROMPTS[1])
    direction = torch.randn(lm.d_model, generator=torch.Generator().manual_seed(2)) * 7.0  # any length
    with residual_capture(lm, [hook]) as plain, torch.no_grad():
        lm.model(ids)
    with apply_lm_edits(lm, [LMEdit(hook, "ablate", direction=direction.tolist())]), \
            residual_capture(lm, [hook]) as edited, torch.no_grad():
        lm.model(ids)
    unit = direction / direction.norm()
    x, y = plain.activations[hook][0], edited.activations[hook][0]
    assert (x @ unit).abs().min() > 1e-3  # there was something to remove at every position
    torch.testing.assert_close(y @ unit, torch.zeros(len(y)), atol=1e-4, rtol=0)
    torch.testing.assert_close(y, x - (x @ unit)[:, None] * unit, atol=1e-4, rtol=0)
    for bad in (dict(direction=[0.0] * lm.d_model), dict(direction=[1.0] * lm.d_model, feature=1)):
        with pytest.raises(EditError):
            LMEdit(hook, "ablate", **bad)


def test_adding_a_feature_with_strength_zero_leaves_tokens_and_logits_bit_for_bit(lm, sae):
    ids = _prompt_ids(lm, PROMPTS[2])
    with torch.no_grad():
        plain = lm.model(ids).logits
        with apply_lm_edits(lm, [LMEdit(HOOK, "add", feature=5, strength=0.0)], {HOOK: sae}):
            edited = lm.model(ids).logits
    assert torch.equal(plain, edited)
    edits = [LMEdit(HOOK, "add", feature=5, strength=0.0)]
    assert generate(lm, PROMPTS, edits, {HOOK: sae}, max_new_tokens=12) == generate(lm, PROMPTS, max_new_tokens=12)


def test_steering_moves_the_next_token_logits_along_the_features_unembedded_direction(lm, sae):
    """Added at the last block's output, a feature's decoder direction moves the next-token logits along its
    logit effect (the linear regime: a small strength), and at a large strength the logits become that
    effect and the steered model's next token is one of the tokens the feature promotes."""
    last = "blocks.3.hook_resid_post"
    ids = _prompt_ids(lm, PROMPTS[0])
    effects = logit_effects(lm, sae.W_dec)  # the SAE reads block 2; its directions live in the same stream
    bias = (lm.model.lm_head.weight @ lm.model.transformer.ln_f.bias).detach()  # what ln_f's shift adds

    def cosine(a, b):
        return float(torch.nn.functional.cosine_similarity(a - a.mean(), b - b.mean(), dim=0))

    with torch.no_grad():
        plain = lm.model(ids).logits[0, -1]
    for feature in (0, 17, 101):
        steered = {}
        for strength in (5.0, 2000.0):
            edit = LMEdit(last, "add", direction=sae.W_dec[feature].tolist(), strength=strength)
            with apply_lm_edits(lm, [edit]), torch.no_grad():
                steered[strength] = lm.model(ids).logits[0, -1]
        assert cosine(steered[5.0] - plain, effects[feature]) > 0.95, feature
        assert cosine(steered[2000.0] - bias, effects[feature]) > 0.99, feature
        assert int(steered[2000.0].argmax()) in effects[feature].topk(10).indices.tolist()
        assert int(plain.argmax()) != int(steered[2000.0].argmax())


def test_the_unembedding_of_a_direction_matches_the_models_logits_through_its_final_layernorm(lm):
    """logit_effects is the linear part of ln_f then lm_head: a tiny step along d changes the logits by
    (effect / the stream's standard deviation), up to the projection of d on the stream itself."""
    ids = _prompt_ids(lm, PROMPTS[1])
    with residual_capture(lm, ["blocks.3.hook_resid_post"]) as cap, torch.no_grad():
        lm.model(ids)
    x = cap.activations["blocks.3.hook_resid_post"][0, -1].double()
    d = torch.randn(lm.d_model, generator=torch.Generator().manual_seed(2)).double()
    xc = x - x.mean()
    d = (d - d.mean()) - ((d - d.mean()) @ xc) / (xc @ xc) * xc  # orthogonal to the centred stream: sigma fixed
    ln, head = lm.model.transformer.ln_f, lm.model.lm_head
    eps = 1e-3

    def logits(v):
        return head.weight.double() @ torch.nn.functional.layer_norm(v, (lm.d_model,), ln.weight.double(),
                                                                     ln.bias.double(), ln.eps)

    numeric = (logits(x + eps * d) - logits(x)) / eps
    sigma = torch.sqrt(xc.pow(2).mean() + ln.eps)
    torch.testing.assert_close(numeric, logit_effects(lm, d[None].float())[0].double() / sigma, atol=1e-3, rtol=1e-3)


def _teacher_forced(lm, edits, saes, prompt_ids: list[int], new_tokens: list[int]) -> list[int]:
    """The argmax at each position of one forward pass (no cache) over prompt + completion, with the edits
    told where the prompt ends: what cached generation must have computed step by step."""
    ids = torch.tensor([prompt_ids + new_tokens[:-1]])
    with apply_lm_edits(lm, edits, saes, prompt_length=len(prompt_ids)), torch.no_grad():
        logits = lm.model(ids).logits[0]
    return logits[len(prompt_ids) - 1:].argmax(-1).tolist()


@pytest.mark.parametrize("positions", ["prompt", "generated", "all"])
def test_edits_with_a_kv_cache_act_where_a_full_forward_pass_says_they_do(lm, sae, positions):
    prompt_ids = _prompt_ids(lm, PROMPTS[0])[0].tolist()
    text = lm.tokenizer.decode(prompt_ids)
    edits = [LMEdit(HOOK, "add", feature=FEATURE, strength=STRENGTH, positions=positions)]
    plain = greedy_generate_tokens(lm.model, lm.tokenizer, [text], max_new_tokens=10)[0]
    with apply_lm_edits(lm, edits, {HOOK: sae}) as session:
        steered = greedy_generate_tokens(lm.model, lm.tokenizer, [text], max_new_tokens=10)[0]
    assert session.calls == len(steered)  # one prefill, then one pass per new token but the last
    assert steered != plain
    if positions == "generated":  # the first new token is predicted from the prompt alone
        assert steered[0] == plain[0]
    assert _teacher_forced(lm, edits, {HOOK: sae}, prompt_ids, steered) == steered
    # and the plain model does not produce the steered completion
    assert _teacher_forced(lm, [LMEdit(HOOK, "add", feature=FEATURE, strength=0.0)], {HOOK: sae}, prompt_ids,
                           steered) != steered


@pytest.mark.parametrize("positions", ["prompt", "generated", "all"])
def test_hugging_faces_own_generate_is_steered_as_greedy_generate_is(lm, sae, positions):
    ids = _prompt_ids(lm, PROMPTS[0])
    edits = [LMEdit(HOOK, "add", feature=FEATURE, strength=STRENGTH, positions=positions)]
    with apply_lm_edits(lm, edits, {HOOK: sae}):
        ours = greedy_generate_tokens(lm.model, lm.tokenizer, [lm.tokenizer.decode(ids[0])], max_new_tokens=10)[0]
        theirs = lm.model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=10, do_sample=False,
                                   pad_token_id=lm.tokenizer.pad_token_id)[0, ids.shape[1]:].tolist()
    assert theirs[:len(ours)] == ours


def test_a_prompt_edit_acts_only_in_the_first_pass_and_a_generated_edit_only_after_it(lm, sae):
    seen = []
    edits = {"prompt": LMEdit(HOOK, "add", feature=3, strength=1.0, positions="prompt"),
             "generated": LMEdit(HOOK, "add", feature=3, strength=1.0, positions="generated")}
    for name, edit in edits.items():
        with apply_lm_edits(lm, [edit], {HOOK: sae}) as session:
            original = session.edit_stream

            def spy(hook, hidden, original=original, name=name, session=session):
                out = original(hook, hidden)
                seen.append((name, session.calls, hidden.shape[1], out is not hidden))
                return out

            session.edit_stream = spy
            generate(lm, PROMPTS[0], [], max_new_tokens=4)  # the edit list of generate is empty: the session acts
    prompt_passes = [s for s in seen if s[0] == "prompt"]
    generated_passes = [s for s in seen if s[0] == "generated"]
    assert [s[3] for s in prompt_passes] == [True, False, False, False]
    assert [s[3] for s in generated_passes] == [False, True, True, True]
    assert prompt_passes[0][2] > 1 and all(s[2] == 1 for s in prompt_passes[1:])


def test_a_batch_of_prompts_of_different_lengths_steers_each_as_it_steers_alone(lm, sae):
    edits = [LMEdit(HOOK, "add", feature=FEATURE, strength=STRENGTH, positions="all")]
    together = generate(lm, PROMPTS, edits, {HOOK: sae}, max_new_tokens=10, batch_size=8)
    alone = [generate(lm, p, edits, {HOOK: sae}, max_new_tokens=10)[0] for p in PROMPTS]
    assert together == alone
    assert together != generate(lm, PROMPTS, max_new_tokens=10)


def _generate_in_thread(lm, sae, edits, results, key, start):
    start.wait()
    results[key] = generate(lm, PROMPTS, edits, {HOOK: sae} if edits else None, max_new_tokens=12)


def test_two_threads_on_one_model_give_exactly_the_completions_each_gives_alone(lm, sae):
    jobs = {"steered": [LMEdit(HOOK, "add", feature=FEATURE, strength=STRENGTH)],
            "plain": [],
            "other": [LMEdit(HOOK, "add", feature=101, strength=-40.0, positions="generated"),
                      LMEdit("blocks.0.hook_resid_post", "add", direction=[2.0] * 128, positions="prompt")]}
    alone = {}
    for key, edits in jobs.items():
        _generate_in_thread(lm, sae, edits, alone, key, _ready())
    assert alone["steered"] != alone["plain"] and alone["other"] != alone["plain"]
    for _ in range(3):  # a race shows up only sometimes: several rounds
        together, start = {}, threading.Barrier(len(jobs))
        threads = [threading.Thread(target=_generate_in_thread, args=(lm, sae, edits, together, key, start))
                   for key, edits in jobs.items()]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert together == alone
    assert _no_hooks_left(lm.model)


def test_a_hook_called_by_another_thread_is_a_no_op(lm, sae):
    """Another thread's forward pass on the shared model (or torch calling a hook before it is marked as
    taking kwargs) never sees this context's session."""
    ids = _prompt_ids(lm, PROMPTS[0])
    with torch.no_grad():
        plain = lm.model(ids).logits
    with apply_lm_edits(lm, [LMEdit(HOOK, "add", feature=FEATURE, strength=STRENGTH)], {HOOK: sae}) as session:
        out = {}

        def other():
            with torch.no_grad():
                out["logits"] = lm.model(ids).logits
            out["pre"] = session._on_model_call(lm.model, (ids,))

        worker = threading.Thread(target=other)
        worker.start()
        worker.join()
        with torch.no_grad():
            mine = lm.model(ids).logits
    assert torch.equal(out["logits"], plain) and out["pre"] is None and not torch.equal(mine, plain)
    assert _no_hooks_left(lm.model)


def _ready():
    event = threading.Event()
    event.set()
    return event


def test_edits_are_checked_against_the_model_and_the_sae(lm, sae):
    from saes.sae import SAE, SAEConfig

    cases = [([LMEdit(HOOK, "add", feature=256)], {HOOK: sae}, "feature 256 is out of range"),
             ([LMEdit("blocks.9.hook_resid_post", "add", direction=[0.0] * 128)], {}, "has no hook"),
             ([LMEdit(HOOK, "add", direction=[0.0] * 64)], {}, "64 values"),
             ([LMEdit(HOOK, "scale", feature=1)], {}, "needs an SAE"),
             ([LMEdit(HOOK, "add", feature=1)], {HOOK: SAE(SAEConfig("topk", 64, 32, k=4))}, "reads 64 dimensions"),
             ([LMEdit(HOOK, "add", feature=1)],
              {HOOK: SAE(SAEConfig("topk", 128, 32, k=4, metadata={"hook_name": "blocks.1.hook_resid_post"}))},
              "trained on blocks.1.hook_resid_post")]
    for edits, saes, message in cases:
        with pytest.raises(EditError, match=message):
            apply_lm_edits(lm, edits, saes)
    with pytest.raises(EditError, match="empty"):
        generate(lm, "   ", [], max_new_tokens=2)
    assert _no_hooks_left(lm.model)


def test_the_transformer_lens_backend_is_steered_the_same(lm, sae):
    from interp.models.lm import load_lm

    tl = load_lm("toy-chat", backend="transformer_lens")
    edits = [LMEdit(HOOK, "add", feature=1, strength=20.0, positions="generated")]
    steered = generate(lm, PROMPTS[:2], edits, {HOOK: sae}, max_new_tokens=8)
    assert steered != generate(lm, PROMPTS[:2], max_new_tokens=8)
    assert generate(tl, PROMPTS[:2], edits, {HOOK: sae}, max_new_tokens=8) == steered


# ----------------------------------------------------------------------------- the command line

def _run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "flowlens", "steer", *args], cwd=ROOT, capture_output=True,
                          text=True, timeout=300, env={**__import__("os").environ, "HF_HUB_OFFLINE": "1"})


def test_flowlens_steer_prints_both_completions_and_refuses_bad_input_in_one_line(lm, sae, capsys):
    from flowlens.__main__ import main

    directory = str(toy_lm_sae()[1])
    capsys.readouterr()
    assert main(["steer", "--model", "toy-chat", "--sae", directory, "--feature", str(FEATURE), "--strength",
                 str(STRENGTH), "--prompt", PROMPTS[0], "--max-new-tokens", "10"]) == 0
    printed = capsys.readouterr().out
    edits = [LMEdit(HOOK, "add", feature=FEATURE, strength=STRENGTH)]
    without, steered = generate(lm, PROMPTS[0], max_new_tokens=10)[0], generate(lm, PROMPTS[0], edits, {HOOK: sae},
                                                                                max_new_tokens=10)[0]
    assert "without the edit" in printed and "with the edit" in printed
    assert without in printed and steered in printed and without != steered
    assert main(["steer", "--model", "toy-chat", "--sae", directory, "--feature", str(FEATURE), "--mode", "ablate",
                 "--prompt", PROMPTS[0], "--max-new-tokens", "10"]) == 0
    ablated = generate(lm, PROMPTS[0], [LMEdit(HOOK, "ablate", feature=FEATURE)], {HOOK: sae}, max_new_tokens=10)[0]
    printed = capsys.readouterr().out
    assert f"edit: ablate feature {FEATURE} at {HOOK}" in printed and ablated in printed.split("with the edit")[-1]

    other = Path(tempfile.mkdtemp(prefix="lm-sae-bad-"))
    from saes.sae import SAE, SAEConfig

    SAE(SAEConfig("topk", 64, 32, k=4, metadata={"hook_name": HOOK})).save(other / "narrow")
    SAE(SAEConfig("topk", 128, 32, k=4, metadata={"hook_name": "mid_block.attentions.0"})).save(other / "unet")
    SAE(SAEConfig("topk", 128, 32, k=4, metadata={"hook_name": "blocks.15.hook_resid_post",
                                                   "model_name": "smollm2-135m-instruct"})).save(other / "deep")
    common = ["--prompt", "hi", "--strength", "1"]
    for args, message in [
            (["--model", "toy-chat", "--sae", directory, "--feature", "999", *common], "feature 999 is out of range"),
            (["--model", "toy-chat", "--sae", str(other / "narrow"), "--feature", "1", *common],
             "reads 64 dimensions but toy-chat's residual stream has 128"),
            (["--model", "toy-chat", "--sae", str(other / "unet"), "--feature", "1", *common],
             "not a language-model residual hook"),
            (["--model", "toy-chat", "--sae", str(other / "deep"), "--feature", "1", *common],
             "reads blocks.15.hook_resid_post, which toy-chat does not have; it was trained on smollm2-135m-instruct"),
            (["--model", "toy-chat", "--sae", directory, "--feature", "1", "--strength", "1", "--prompt", " "],
             "the prompt is empty"),
            (["--model", "toy-chatt", "--sae", directory, "--feature", "1", *common], "did you mean toy-chat"),
            (["--model", "toy-chat", "--sae", str(other), "--feature", "1", *common], "not an SAE directory"),
            (["--model", "toy-chat", "--sae", directory, "--feature", "1", "--prompt", "hi"], "needs --strength"),
            (["--model", "toy-chat", "--sae", directory, "--feature", "1", "--mode", "ablate", *common],
             "takes no --strength")]:
        capsys.readouterr()
        status = main(["steer", *args])
        lines = [line for line in capsys.readouterr().err.strip().splitlines() if not line.startswith("Loading")]
        assert status == 2 and len(lines) == 1 and lines[0].startswith("error: ") and message in lines[0], (args, lines)
    # the real command line: the same one line and exit status 2
    result = _run("--model", "toy-chat", "--sae", directory, "--feature", "256", *common)
    assert result.returncode == 2 and result.stderr.strip().splitlines()[-1] == \
        "error: feature 256 is out of range: the SAE has 256 features, 0 to 255"


# ----------------------------------------------------------------------------- the UI tab

def test_the_ui_panel_shows_both_completions_and_the_saes_cards_and_refuses_bad_input(lm, sae, tmp_path):
    import json
    import shutil

    import gradio as gr

    from app import Workbench
    from saes.lm_features import LMAnalysisConfig, analyse_lm_sae
    from ui.lm_steer import LMSteerTab, build_lm_steer_tab

    root = tmp_path / "saes"
    directory = root / HOOK
    shutil.copytree(toy_lm_sae()[1], directory)
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("What colour is the sky?\nSay these words backwards: apple river\nWhat is 12 plus 7?\n")
    analyse_lm_sae(lm, sae, corpus, directory, LMAnalysisConfig(tokens=200))
    bench = Workbench("toy", data_dir=tmp_path / "data")
    with gr.Blocks():
        panel = build_lm_steer_tab(bench, sae_roots=[root])
    assert isinstance(panel, LMSteerTab) and str(directory) in panel.sae_choices()
    bench._lms["toy-chat"] = lm  # the module's model in the Workbench's cache: no second load
    without, steered, status = panel.steer("toy-chat", str(directory), FEATURE, STRENGTH, "add", "all", PROMPTS[0], 10)
    edits = [LMEdit(HOOK, "add", feature=FEATURE, strength=STRENGTH)]
    assert (without, steered) == (generate(lm, PROMPTS[0], max_new_tokens=10)[0],
                                  generate(lm, PROMPTS[0], edits, {HOOK: sae}, max_new_tokens=10)[0])
    assert f"feature #{FEATURE}" in status and without != steered
    rows, summary = panel.feature_table(str(directory), "frequency")
    cards = {c["id"]: c for c in json.loads((directory / "features.json").read_text())["features"]}
    assert rows and [r[1] for r in rows] == sorted((r[1] for r in rows), reverse=True)
    assert rows[0][1] == round(100 * cards[rows[0][0]]["frequency"], 3) and "fire on" in summary
    assert f"#{rows[0][0]}" in panel.feature_card(str(directory), rows[0][0])
    for args, message in [(("toy-chat", str(directory), 256, 1.0, "add", "all", "hi", 4), "feature must be"),
                          (("toy-chat", str(directory), 1, 1.0, "add", "all", "  ", 4), "prompt is empty"),
                          (("toy-chat", str(tmp_path), 1, 1.0, "add", "all", "hi", 4), "not an SAE directory"),
                          (("toy-chat", str(directory), 1, float("inf"), "add", "all", "hi", 4), "finite"),
                          (("nope", str(directory), 1, 1.0, "add", "all", "hi", 4), "unknown model")]:
        with pytest.raises(gr.Error, match=message):
            panel.steer(*args)


def test_the_tab_offers_each_models_own_sae_so_the_default_steer_fits(tmp_path):
    """With a SmolLM2 SAE shipped beside the toy-chat one, the tab opened on toy-chat with SmolLM2's SAE."""
    import gradio as gr

    from app import Workbench
    from ui.lm_steer import LMSteerTab, build_lm_steer_tab, sae_model

    bench = Workbench("toy", data_dir=tmp_path / "data")
    panel = LMSteerTab(bench)
    assert sae_model(panel.sae_for("toy-chat")) == "toy-chat"
    smol = panel.sae_for("smollm2-135m-instruct")
    assert sae_model(smol) == "smollm2-135m-instruct"
    update, rows, summary = panel.model_changed("smollm2-135m-instruct", "frequency")
    assert update["value"] == smol and smol in update["choices"] and len(rows) and "smollm2-135m-instruct" in summary
    with gr.Blocks() as demo:
        build_lm_steer_tab(bench)
    boxes = {b.elem_id: b for b in demo.blocks.values() if getattr(b, "elem_id", None)}
    assert sae_model(boxes["lm-steer-sae"].value) == boxes["lm-steer-model"].value == "toy-chat"
