"""The nnsight backend (`interp.hooks.lm_nnsight`): the same site names, read and written through nnsight's trace,
give the Hugging Face backend's numbers on every verified family (tiny random models with noisy biases and norm
gains), for capture, splice, steering and greedy generation with an edit; a pass that bypasses nnsight is refused.
"""

from __future__ import annotations

import copy

import pytest
import torch

from flowlens.tiny import tiny_family_lm, word_level_tokenizer
from interp.hooks.lm import capture_residuals, forward_padded, model_sites, residual_hook_names
from interp.hooks.lm_nnsight import NNsightRouteError, call_model, state_of, wrap
from interp.hooks.lm_sites import VERIFIED_ARCHITECTURES, hf_base_model
from interp.models.lm import LanguageModel, hf_n_ctx

# one family of each layout the site table distinguishes (pre-norm rotary, parallel, post-LN and flat MLP input,
# normalised branch outputs, multipliers, learned positions); the other verified rows share one of these layouts
LABELS = ["gpt2", "gpt_neox", "llama", "qwen2", "gemma2", "phi3", "olmo2", "granite", "opt", "opt-350m"]
WORDS = "the cat sat on a mat and then it ran to see what the dog did with one red ball".split()
TOKENIZER = word_level_tokenizer([" ".join(WORDS)])


def test_the_chosen_layouts_are_verified_rows():
    assert set(LABELS) <= {label for label, _, _ in VERIFIED_ARCHITECTURES}


def as_language_model(model, tokenizer, backend):
    c = model.config
    return LanguageModel(model, tokenizer, n_layers=c.num_hidden_layers, d_model=c.hidden_size, n_ctx=hf_n_ctx(c),
                         backend=backend, name=f"tiny-{backend}")


def pair(label):
    """(the Hugging Face LanguageModel, the same weights nnsight-backed)"""
    model = tiny_family_lm(label, len(TOKENIZER))
    twin = copy.deepcopy(model)
    wrap(twin, TOKENIZER)
    return as_language_model(model, TOKENIZER, "hf"), as_language_model(twin, TOKENIZER, "nnsight")


def padded():
    rows = [TOKENIZER(" ".join(WORDS[:9]))["input_ids"], TOKENIZER(" ".join(WORDS[5:11]))["input_ids"]]
    width = max(map(len, rows))
    ids = torch.tensor([r + [0] * (width - len(r)) for r in rows])
    mask = torch.tensor([[1] * len(r) + [0] * (width - len(r)) for r in rows])
    return ids, mask


@pytest.mark.parametrize("label", LABELS)
def test_nnsight_backend_equals_hf_at_every_site_and_under_every_edit(label):
    from interp.hooks.lm_splice import residual_replacement
    from interp.hooks.lm_steer import LMEdit, apply_lm_edits

    hf, nn = pair(label)
    ids, mask = padded()
    names = residual_hook_names(hf.n_layers, model_sites(hf))
    ours, theirs = capture_residuals(nn, ids, mask, names), capture_residuals(hf, ids, mask, names)
    keep = mask.bool()
    for name in names:
        torch.testing.assert_close(ours[name][keep], theirs[name][keep], rtol=1e-5, atol=1e-5)
    vector = torch.randn(hf.d_model, generator=torch.Generator().manual_seed(1))
    site = "blocks.0.hook_resid_mid" if "resid_mid" in model_sites(hf) else "blocks.0.hook_resid_post"
    later = f"blocks.{hf.n_layers - 1}.hook_resid_post"
    results = []
    for lm in (hf, nn):
        with residual_replacement(lm, site, lambda x: x + vector):
            spliced = capture_residuals(lm, ids, mask, [later])[later]
        edit = LMEdit(site, "add", direction=vector.tolist(), strength=2.0, positions="all")
        with apply_lm_edits(lm, [edit], prompt_length=ids.shape[1]):
            steered = capture_residuals(lm, ids, mask, [later])[later]
        results.append((spliced, steered))
    clean = theirs[later]
    assert (results[0][0] - clean)[keep].abs().max() > 1e-3           # the edits move the stream
    for a, b in zip(*results):
        torch.testing.assert_close(a[keep], b[keep], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("label", ["llama", "gpt2", "gemma2"])
def test_nnsight_backend_generates_as_hf_with_and_without_an_edit(label):
    from interp.hooks.lm_steer import LMEdit, generate

    hf, nn = pair(label)
    texts = [" ".join(WORDS[:6]), " ".join(WORDS[3:7])]
    vector = torch.randn(hf.d_model, generator=torch.Generator().manual_seed(2))
    edit = LMEdit("blocks.1.hook_resid_pre", "add", direction=vector.tolist(), strength=4.0, positions="all")
    for edits in ([], [edit]):
        a = generate(hf, texts, edits=edits, max_new_tokens=5)
        b = generate(nn, texts, edits=edits, max_new_tokens=5)
        assert a == b


def test_a_pass_that_bypasses_nnsight_while_a_site_is_hooked_is_refused():
    from interp.hooks.lm import residual_capture

    _, nn = pair("llama")
    ids, mask = padded()
    with residual_capture(nn, ["blocks.0.hook_resid_post"]) as capture:
        with pytest.raises(NNsightRouteError, match="does not run through nnsight"):
            nn.model(input_ids=ids, attention_mask=mask)
        forward_padded(nn, ids, mask)
    assert capture.activations["blocks.0.hook_resid_post"].shape[:2] == ids.shape
    nn.model(input_ids=ids, attention_mask=mask)  # nothing hooked: a plain pass runs
    assert state_of(nn.model) is not None and state_of(hf_base_model(nn.model)) is state_of(nn.model)
    assert call_model(nn.model, input_ids=ids, attention_mask=mask).logits.shape[:2] == ids.shape


def test_nnsight_diffusion_model_reads_the_blocks_the_workbench_captures():
    """What docs/lm-architectures.md reports of nnsight's DiffusionModel: it reaches the denoiser's blocks as envoys,
    and a block's output read through it at every step equals the workbench's capture of the same pipeline call
    (tiny SD1: both classifier-free halves, two steps); the workbench still refuses it as a backend (next test)."""
    import nnsight
    from nnsight.modeling.diffusion import DiffusionModel, _PipelineModule
    from tiny_diffusers import tiny_model  # tests/ is on the path

    from interp.hooks import capture_updates

    model = tiny_model("sd1")
    block = "up_blocks.1.attentions.1"
    with capture_updates(model, [block], keep_output=True) as capture:
        model.pipe("red circle", num_inference_steps=2, output_type="latent",
                   generator=torch.Generator().manual_seed(1))
    ours = capture.outputs(block, half="all")                       # (steps, 2 halves, c, h, w)
    wrapper = DiffusionModel(_PipelineModule(model.pipe))          # a loaded pipeline: only through its private class
    envoy = wrapper.unet.up_blocks[1].attentions[1]
    with wrapper.trace("red circle", num_inference_steps=2, output_type="latent",
                       generator=torch.Generator().manual_seed(1)) as tracer:
        theirs = list().save()
        for _ in tracer.iter[:]:
            theirs.append(envoy.output[0])
    assert isinstance(nnsight.__version__, str) and len(theirs) == 2
    for step in range(2):
        assert torch.equal(theirs[step], ours[step].reshape(theirs[step].shape))


@pytest.mark.parametrize("argv", [
    ["interp", "collect", "--model", "toy", "--world", "2", "--backend", "nnsight"],
    ["interp", "hooks", "--model", "toy", "--backend", "nnsight"],
    ["saes", "features", "--model", "toy", "--sae", "saes/pretrained/toy", "--world", "2", "--backend", "nnsight"],
    ["saes", "eval", "--model", "toy", "--sae", "saes/pretrained/toy/up_blocks.1.attentions.1", "--world", "2",
     "--backend", "nnsight"],
])
def test_backend_nnsight_for_a_text_to_image_model_is_one_line(argv, tmp_path, capsys, monkeypatch):
    import importlib

    from pathlib import Path

    monkeypatch.chdir(Path(__file__).resolve().parents[1])
    main = importlib.import_module(f"{argv[0]}.__main__").main
    out = tmp_path / "out"
    args = argv[1:] + (["--out", str(out)] if argv[1] not in ("hooks", "eval") else [])
    args += ["--pool-dir", str(tmp_path / "pool")] if argv[1] == "features" else []
    try:
        code = main(args)
    except SystemExit as exit_:
        code = exit_.code
    err = capsys.readouterr().err
    assert code == 2 and "Traceback" not in err and len(err.strip().splitlines()) == 1, err
    assert "--backend nnsight is for language models; toy is a text-to-image model" in err
    assert not out.exists() and not (tmp_path / "pool").exists()


def test_a_model_nnsight_cannot_wrap_is_one_line(tmp_path, capsys):
    """A family the site table lacks (MPT) is refused before nnsight wraps it: the sites would be guessed."""
    from transformers import MptConfig, MptForCausalLM

    from interp.__main__ import main

    MptForCausalLM(MptConfig(d_model=16, n_heads=2, n_layers=1, vocab_size=len(TOKENIZER))).save_pretrained(tmp_path)
    TOKENIZER.save_pretrained(tmp_path)
    capsys.readouterr()
    try:
        code = main(["hooks", "--model", str(tmp_path), "--backend", "nnsight"])
    except SystemExit as exit_:
        code = exit_.code
    lines = [line for line in capsys.readouterr().err.splitlines() if line.strip() and "it/s]" not in line]
    assert code == 2 and len(lines) == 1 and lines[0].startswith("error: the workbench has no site table for "
                                                                 "model_type 'mpt'"), lines
