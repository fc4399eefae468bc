"""The text stream of joint (MMDiT) blocks, SD3's and FLUX's, as sites of their own (`<block>:text`), on the tiny
random pipelines of tests/tiny_diffusers.py: what a capture reports is checked against the blocks' true text
output minus text input, read by hooks written here without the adapter; the CFG halves, the store's honest
(steps, C, tokens) shape, an SAE trained on it, edits without a mask, and the one-line refusals (a family whose
blocks have no text stream, SD3's last block, a mask on a token sequence, feature cards)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).parent))
from tiny_diffusers import tiny_model, tiny_pipeline  # noqa: E402

from interp.edits import Edit, EditError  # noqa: E402
from interp.hooks import apply_edits, capture_updates  # noqa: E402
from interp.hooks.diffusion import HookError, hookable_sites  # noqa: E402
from interp.names import split_site, text_site  # noqa: E402

PROMPTS = ["red circle", "blue square"]
_MODELS: dict[str, object] = {}


def model_of(family: str):
    if family not in _MODELS:
        _MODELS[family] = tiny_model(family)
    return _MODELS[family]


def true_text_updates(model, sites, run):
    """{site: [text output minus text input per denoiser call, (batch, tokens, C)]}: the joint block's own
    `encoder_hidden_states` argument and the first item of the tuple it returns."""
    modules = dict(model.denoiser.named_modules())
    found: dict[str, list] = {s: [] for s in sites}
    handles = []

    def hook(site):
        def record(module, args, kwargs, output):
            text_in = kwargs["encoder_hidden_states"] if "encoder_hidden_states" in kwargs else args[1]
            found[site].append((output[0] - text_in).detach().clone())
        return record

    for site in sites:
        handles.append(modules[split_site(site)[0]].register_forward_hook(hook(site), with_kwargs=True))
    try:
        run()
    finally:
        for handle in handles:
            handle.remove()
    return found


def test_sites_are_the_joint_blocks_that_write_a_text_stream():
    sd3, flux = model_of("sd3"), model_of("flux")
    # SD3's last joint block only reads the text stream (context_pre_only): it has no text site.
    assert list(sd3.text_sites) == ["transformer_blocks.0:text"] and list(sd3.blocks)[-1] == "transformer_blocks.1"
    assert list(flux.text_sites) == [text_site(b) for b in flux.blocks]  # double and single blocks both write one
    for model in (sd3, flux):
        for site, info in model.text_sites.items():
            assert info.block == split_site(site)[0] and info.channels == model.blocks[info.block].channels
        assert set(model.sites) == set(model.blocks) | set(model.text_sites)
        assert hookable_sites(model.pipe).keys() == model.sites.keys()  # the pipeline alone says the same
    # CLIP's padded prompt (the tiny tokenizer's model_max_length) then T5's 256; FLUX: T5's 512.
    assert sd3.text_sites["transformer_blocks.0:text"].tokens == sd3.pipe.tokenizer.model_max_length + 256
    assert flux.text_sites["transformer_blocks.0:text"].tokens == 512
    for family in ("sd1", "pixart", "sana"):
        assert model_of(family).text_sites == {}


@pytest.mark.parametrize("family", ["sd3", "flux"])
def test_a_text_stream_update_is_the_true_output_minus_input_of_the_text_tokens(family):
    model = model_of(family)
    sites = list(model.text_sites)
    with capture_updates(model, sites + list(model.blocks)) as cap:
        truth = true_text_updates(model, sites, lambda: model.generate(PROMPTS, seed=[1, 2], output_type="latent"))
    for site in sites:
        info = model.text_sites[site]
        got = cap.updates(site, half="all", calls=True)  # (calls, batch, C, tokens)
        want = torch.stack(truth[site]).transpose(2, 3)
        assert got.shape[2:] == (info.channels, info.tokens)
        torch.testing.assert_close(got, want, rtol=0, atol=0)
        assert got.abs().amax() > 0
    # The image stream of the same block is still its own site, and a different tensor.
    block = model.text_sites[sites[0]].block
    assert cap.updates(block, "all").shape[2:] == (model.blocks[block].channels, model.blocks[block].height,
                                                   model.blocks[block].width)


def test_sd3_text_stream_cfg_halves_are_the_batch_halves_uncond_first():
    """Two prompts, one seed: at the first step the unconditional text rows (the same empty negative prompt, the
    same noise) are identical, the conditional rows differ; `cond` and `uncond` are those rows of the batch."""
    model = model_of("sd3")
    site = "transformer_blocks.0:text"
    with capture_updates(model, [site]) as cap:
        model.generate(PROMPTS, seed=[3, 3], guidance=3.0, output_type="latent")
    whole, cond, uncond = (cap.updates(site, half) for half in ("all", "cond", "uncond"))
    assert whole.shape[1] == 4 and cond.shape[1] == uncond.shape[1] == 2
    torch.testing.assert_close(cond, whole[:, 2:], rtol=0, atol=0)
    torch.testing.assert_close(uncond, whole[:, :2], rtol=0, atol=0)
    torch.testing.assert_close(uncond[0, 0], uncond[0, 1], rtol=0, atol=0)
    assert not torch.equal(cond[0, 0], cond[0, 1])


def test_flux_text_stream_has_no_unconditional_half():
    model = model_of("flux")
    site = "transformer_blocks.0:text"
    with capture_updates(model, [site]) as cap:
        model.generate(PROMPTS, seed=[3, 3], guidance=3.5, output_type="latent")
    assert cap.updates(site, "all").shape[1] == 2
    with pytest.raises(ValueError, match="no unconditional half"):
        cap.updates(site, "uncond")


@pytest.mark.parametrize("family", ["sd1", "pixart", "sana"])
def test_a_family_without_a_text_stream_is_refused_in_one_line(family):
    model = model_of(family)
    block = model.default_blocks[0]
    with pytest.raises(HookError) as err:
        capture_updates(model, [f"{block}:text"])
    message = str(err.value)
    assert "\n" not in message and "have no text stream" in message and "SD3 and FLUX" in message
    with pytest.raises(HookError, match="have no text stream"):
        apply_edits(model, [Edit(f"{block}:text", "ablate")])


def test_sd3s_last_block_writes_no_text_stream_and_says_so():
    with pytest.raises(HookError, match="writes no text stream"):
        capture_updates(model_of("sd3"), ["transformer_blocks.1:text"])


def test_the_store_holds_a_text_stream_as_tokens_and_an_sae_trains_on_it(tmp_path):
    from interp.collect import CollectionPlan, collect
    from interp.store import ActivationStore
    from saes.__main__ import main as saes_main
    from saes.sae import SAE

    model = model_of("sd3")
    site = "transformer_blocks.0:text"
    info = model.text_sites[site]
    plan = CollectionPlan(model=model.name, blocks=[site, "transformer_blocks.0"], prompts=PROMPTS, seeds=[4, 5],
                          steps=2, guidance=3.0, images_per_shard=1)
    truth = true_text_updates(model, [site], lambda: collect(model, plan, tmp_path / "store", progress=False))
    store = ActivationStore(tmp_path / "store")
    manifest = json.loads((tmp_path / "store" / "manifest.json").read_text())
    assert manifest["shapes"][site] == [2, info.channels, info.tokens]  # (steps, C, tokens): no invented grid
    for image in range(2):
        calls = truth[site][image * 2:(image + 1) * 2]  # one generation per shard: 2 calls
        cond = torch.stack([u[u.shape[0] // 2:] for u in calls])[:, 0].transpose(1, 2)  # (steps, C, tokens)
        torch.testing.assert_close(store.image(image, site), cond.half().float(), rtol=0, atol=0)
    assert store.channels(site) == info.channels and store.n_vectors(site) == 2 * 2 * info.tokens
    vectors = torch.cat(list(store.batches(site, 64, shuffle=False)))
    first = store.image(0, site)  # every token of every step is one (C,) vector, in store order
    torch.testing.assert_close(vectors[: 2 * info.tokens], first.transpose(1, 2).reshape(-1, info.channels))

    assert saes_main(["train", "--store", str(tmp_path / "store"), "--block", site, "--out", str(tmp_path / "sae"),
                      "--d-sae", "32", "--k", "4", "--batch-size", "64", "--tokens", "1280", "--threads", "1",
                      "--log-every", "5", "--checkpoint-every", "10"]) == 0
    sae = SAE.load(tmp_path / "sae")
    assert sae.cfg.d_in == info.channels and sae.cfg.metadata["hook_name"] == site


def test_an_unmasked_edit_acts_on_every_text_token_and_a_mask_is_refused():
    model = model_of("flux")
    site = "transformer_blocks.0:text"
    info = model.text_sites[site]
    direction = torch.linspace(-1, 1, info.channels)
    with capture_updates(model, [site]) as plain:
        model.generate(PROMPTS[:1], seed=5, output_type="latent")
    with apply_edits(model, [Edit(site, "add", direction=direction.tolist(), strength=0.0)]):
        zero = model.generate(PROMPTS[:1], seed=5, output_type="latent")
    assert torch.equal(torch.as_tensor(zero), torch.as_tensor(model.generate(PROMPTS[:1], seed=5,
                                                                             output_type="latent")))
    with apply_edits(model, [Edit(site, "add", direction=direction.tolist(), strength=2.0, steps=[0])]), \
            capture_updates(model, [site]) as edited:
        model.generate(PROMPTS[:1], seed=5, output_type="latent")
    first = edited.updates(site, "all", calls=True)[0] - plain.updates(site, "all", calls=True)[0]
    torch.testing.assert_close(first, (2.0 * direction).view(1, -1, 1).expand_as(first), rtol=1e-5, atol=1e-5)

    mask = [[1.0] * model.blocks[info.block].width] * model.blocks[info.block].height
    with pytest.raises(EditError) as err:
        apply_edits(model, [Edit(site, "add", direction=direction.tolist(), strength=1.0, mask=mask)])
    assert "\n" not in str(err.value) and "no spatial grid" in str(err.value)


def test_feature_cards_refuse_a_text_stream_in_one_line():
    from saes.pool import model_block

    with pytest.raises(ValueError, match="is a text stream"):
        model_block(model_of("flux"), "single_transformer_blocks.0:text")


def test_the_hooks_command_lists_the_text_streams(tmp_path, capsys):
    from interp.__main__ import main as interp_main

    tiny_pipeline("sd3").save_pretrained(tmp_path / "sd3")
    assert interp_main(["hooks", "--model", str(tmp_path / "sd3")]) == 0
    assert capsys.readouterr().out.split() == ["transformer_blocks.0", "transformer_blocks.1",
                                               "transformer_blocks.0:text"]
    assert interp_main(["blocks", "--model", str(tmp_path / "sd3")]) == 0
    described = json.loads(capsys.readouterr().out)
    assert described["text_sites"]["transformer_blocks.0:text"]["tokens"] == \
        tiny_pipeline("sd3").tokenizer.model_max_length + 256


def test_flux1_config_builds_at_a_reduced_depth_with_flux1s_widths():
    """The real-size benchmark's FLUX.1 config (no weights: built on the meta device): 11.9 B parameters at full
    depth; at 2 + 2 blocks its sites are 3072 wide on a 32 x 32 token grid at 512 px."""
    from diffusers import FluxTransformer2DModel

    from interp.models.t2i import block_info, text_stream_info

    config = json.loads((Path(__file__).parents[1] / "interp/models/configs/flux1-dev-transformer.json").read_text())
    config.pop("_note")
    with torch.device("meta"):
        full = FluxTransformer2DModel.from_config(config)
        assert round(sum(p.numel() for p in full.parameters()) / 1e9, 1) == 11.9
        shallow = FluxTransformer2DModel.from_config({**config, "num_layers": 2, "num_single_layers": 2})
    blocks = block_info(shallow, latent_side=64)
    assert {b: (i.channels, i.height, i.width) for b, i in blocks.items()} == {
        f"{kind}.{i}": (3072, 32, 32) for kind in ("transformer_blocks", "single_transformer_blocks") for i in (0, 1)}
    assert list(text_stream_info(shallow)) == [text_site(b) for b in blocks]
