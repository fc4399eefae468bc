"""Every supported denoiser family (SD 1.x and 2.x U-Nets, SD3, FLUX, PixArt-Sigma, Sana) on tiny random pipelines built
here from configs (tests/tiny_diffusers.py): blocks, CFG halves, the store, edits, scheduler steps.

What the hooks report is checked against what the blocks really compute, read by hooks written here without the
adapter table (`true_updates`), so an adapter that read the wrong stream, the wrong rows or laid tokens out in the
wrong order would fail."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).parent))
from tiny_diffusers import FAMILIES, tiny_model, tiny_pipeline  # noqa: E402

from interp.edits import Edit  # noqa: E402
from interp.hooks import apply_edits, capture_updates  # noqa: E402
from interp.models.t2i import ModelError, load_t2i, on_each_step  # noqa: E402

CFG_FAMILIES = ("sd1", "sd2", "sd3", "pixart", "sana")
PROMPTS = ["red circle", "blue square"]
# The module whose output is the image tokens a DiT's first block reads (patch embedding), for the geometry test.
PATCH_EMBEDDING = {"sd3": "pos_embed", "flux": "x_embedder", "pixart": "pos_embed", "sana": "patch_embed"}


_MODELS: dict[str, object] = {}


def model_of(family: str):
    if family not in _MODELS:
        _MODELS[family] = tiny_model(family)
    return _MODELS[family]


def _image_stream(output):
    """A block's image stream, read without the adapter: joint blocks return (text, image)."""
    if isinstance(output, tuple):  # SD3 / FLUX blocks: (text, image), text None after SD3's last block
        return output[1] if len(output) == 2 else output[0]
    return output if isinstance(output, torch.Tensor) else output.sample


def true_updates(model, blocks, run):
    """{block: [update per denoiser call (batch, C, H, W)]}: output minus input of each block's image stream,
    token sequences laid out row by row on the block grid of the default size."""
    modules = dict(model.denoiser.named_modules())
    found: dict[str, list] = {b: [] for b in blocks}
    handles = []

    def hook(name):
        def record(module, args, kwargs, output):
            x_in = args[0] if args else kwargs["hidden_states"]
            x_out = _image_stream(output)
            update = (x_out - x_in).detach()
            if update.ndim == 3:  # (batch, tokens, C) -> (batch, C, H, W)
                info = model.blocks[name]
                update = update.reshape(update.shape[0], info.height, info.width, -1).permute(0, 3, 1, 2)
            found[name].append(update.clone())
        return record

    for name in blocks:
        handles.append(modules[name].register_forward_hook(hook(name), with_kwargs=True))
    try:
        run()
    finally:
        for handle in handles:
            handle.remove()
    return found


@pytest.mark.parametrize("family", FAMILIES)
def test_block_updates_are_the_true_output_minus_input_of_the_image_stream(family):
    model = model_of(family)
    blocks = list(model.blocks)
    with capture_updates(model, blocks) as cap:
        truth = true_updates(model, blocks, lambda: model.generate(PROMPTS, seed=[1, 2], output_type="latent"))
    for block in blocks:
        info = model.blocks[block]
        got = cap.updates(block, half="all", calls=True)
        assert got.shape[2:] == (info.channels, info.height, info.width)
        torch.testing.assert_close(got, torch.stack(truth[block]), rtol=0, atol=0)
        assert got.abs().amax() > 0


@pytest.mark.parametrize("family", ["sd3", "flux", "pixart", "sana"])
def test_a_latent_pixel_lands_in_its_block_grid_cell(family):
    """Perturb one latent pixel: the patch embedding's tokens change only at the grid cell that holds it."""
    model = model_of(family)
    family_adapter, denoiser = model.family, model.denoiser
    patch = family_adapter.patch(denoiser)
    module = dict(denoiser.named_modules())[PATCH_EMBEDDING[family]]
    side = model.default_size // model.pipe.vae_scale_factor
    c = family_adapter.latent_channels(denoiser)
    y, x = side - 3, 2
    outputs = []
    for bump in (0.0, 5.0):
        latent = torch.zeros(1, c, side, side)
        latent[0, :, y, x] = bump
        if family == "flux":  # the pipeline packs 2 x 2 latent pixels into a token and says where in img_ids
            ids = model.pipe._prepare_latent_image_ids(1, side // 2, side // 2, "cpu", torch.float32)
            grid = family_adapter.token_grid(denoiser, {"img_ids": ids})
            tokens = module(model.pipe._pack_latents(latent, 1, c, side, side))
        else:
            grid = family_adapter.token_grid(denoiser, {"hidden_states": latent})
            tokens = module(latent)
        outputs.append(family_adapter.to_grid(tokens.detach(), grid))
    changed = (outputs[1] - outputs[0]).abs().sum(1)[0] > 0  # (H, W) of the block grid
    expected = torch.zeros_like(changed)
    expected[y // patch, x // patch] = True
    assert torch.equal(changed, expected)


@pytest.mark.parametrize("family", CFG_FAMILIES)
def test_cfg_halves_are_the_batch_halves_uncond_first(family):
    """Two prompts, one seed: at the first step the unconditional rows (same negative prompt, same noise) are
    identical and the conditional rows differ; `cond` and `uncond` are those rows of the whole batch."""
    model = model_of(family)
    block = model.default_blocks[-1]
    with capture_updates(model, [block]) as cap:
        model.generate(PROMPTS, seed=[3, 3], guidance=3.0, output_type="latent")
    whole, cond, uncond = (cap.updates(block, half) for half in ("all", "cond", "uncond"))
    assert whole.shape[1] == 4 and cond.shape[1] == uncond.shape[1] == 2
    torch.testing.assert_close(cond, whole[:, 2:], rtol=0, atol=0)
    torch.testing.assert_close(uncond, whole[:, :2], rtol=0, atol=0)
    # At the first step (after it, guidance has mixed each prompt into its own latents):
    torch.testing.assert_close(uncond[0, 0], uncond[0, 1], rtol=0, atol=0)
    assert not torch.equal(cond[0, 0], cond[0, 1])


def test_flux_guidance_has_no_unconditional_half():
    model = model_of("flux")
    block = model.default_blocks[0]
    with capture_updates(model, [block]) as cap:
        model.generate(PROMPTS, seed=[3, 3], guidance=3.5, output_type="latent")
    assert cap.updates(block, "all").shape[1] == 2
    torch.testing.assert_close(cap.updates(block, "cond"), cap.updates(block, "all"), rtol=0, atol=0)
    with pytest.raises(ValueError, match="no unconditional half"):
        cap.updates(block, "uncond")


@pytest.mark.parametrize("family", FAMILIES)
def test_an_edit_of_strength_zero_leaves_the_generation_bit_identical(family):
    model = model_of(family)
    block = model.default_blocks[0]
    plain = model.generate(PROMPTS, seed=[1, 2], output_type="latent")
    direction = torch.ones(model.blocks[block].channels).tolist()
    with apply_edits(model, [Edit(block, "add", direction=direction, strength=0.0)]):
        edited = model.generate(PROMPTS, seed=[1, 2], output_type="latent")
    assert torch.equal(torch.as_tensor(plain), torch.as_tensor(edited))


@pytest.mark.parametrize("family", FAMILIES)
def test_a_paint_changes_the_block_update_only_inside_its_mask(family):
    model = model_of(family)
    block = model.default_blocks[0]
    info = model.blocks[block]
    mask = torch.zeros(info.height, info.width)
    mask[1:3, : info.width // 2] = 1.0
    direction = torch.linspace(-1, 1, info.channels)
    with capture_updates(model, [block]) as plain:
        model.generate(PROMPTS[:1], seed=5, output_type="latent")
    with apply_edits(model, [Edit(block, "add", direction=direction.tolist(), strength=2.0, mask=mask.tolist(),
                                  steps=[0])]), capture_updates(model, [block]) as painted:
        model.generate(PROMPTS[:1], seed=5, output_type="latent")
    first_call = painted.updates(block, "all", calls=True)[0] - plain.updates(block, "all", calls=True)[0]
    expected = 2.0 * direction.view(1, -1, 1, 1) * mask.view(1, 1, *mask.shape)
    torch.testing.assert_close(first_call, expected.expand_as(first_call), rtol=1e-5, atol=1e-5)
    latents_differ = not torch.equal(painted.updates(block, "all")[-1], plain.updates(block, "all")[-1])
    assert latents_differ  # the paint at step 0 changed what followed


@pytest.mark.parametrize("family", FAMILIES)
def test_the_store_holds_the_true_updates_of_the_conditional_half(family, tmp_path):
    from interp.collect import CollectionPlan, collect
    from interp.store import ActivationStore

    model = model_of(family)
    blocks = list(model.default_blocks)
    plan = CollectionPlan(model=model.name, blocks=blocks, prompts=PROMPTS, seeds=[4, 5], steps=2, guidance=3.0,
                          images_per_shard=1)
    truth = true_updates(model, blocks, lambda: collect(model, plan, tmp_path / "store", progress=False))
    store = ActivationStore(tmp_path / "store")
    manifest = json.loads((tmp_path / "store" / "manifest.json").read_text())
    assert manifest["calls_per_step"] == [1, 1] and manifest["step_reduction"] == "mean"
    for block in blocks:
        for image in range(2):
            calls = truth[block][image * 2:(image + 1) * 2]  # one generation per shard: 2 calls
            cond = torch.stack([u[u.shape[0] // 2:] if model.family.cfg_batch else u for u in calls])[:, 0]
            stored = store.image(image, block)
            assert stored.shape == (2, *cond.shape[1:])
            torch.testing.assert_close(stored, cond.half().float(), rtol=0, atol=0)


def heun_model():
    from diffusers import HeunDiscreteScheduler

    return tiny_model("sd1", scheduler=HeunDiscreteScheduler(beta_schedule="scaled_linear", beta_start=0.00085,
                                                            beta_end=0.012), steps=4, guidance=0.0)


def test_heun_steps_are_scheduler_steps_each_the_mean_of_its_calls(tmp_path):
    from interp.collect import CollectionPlan, collect
    from interp.store import ActivationStore

    model = heun_model()
    block = model.default_blocks[0]
    progress = []
    with capture_updates(model, [block]) as cap, on_each_step(lambda done, total: progress.append((done, total))):
        model.generate("red circle", seed=1, output_type="latent")
    calls = cap.updates(block, calls=True)
    assert calls.shape[0] == 7 and cap.calls_per_step(block) == [2, 2, 2, 1]
    assert [r.step for r in cap.records[block]] == [0, 0, 1, 1, 2, 2, 3]
    assert [r.sub_call for r in cap.records[block]] == [0, 1, 0, 1, 0, 1, 0]
    steps = cap.updates(block)
    assert steps.shape[0] == 4
    torch.testing.assert_close(steps[1], (calls[2] + calls[3]) / 2)
    torch.testing.assert_close(steps[3], calls[6])
    assert progress == [(0, 4), (1, 4), (2, 4), (3, 4), (4, 4)]

    # An edit of step 3 acts on the last call only (the unreachable "call 6" of old), step 1 on calls 2 and 3.
    with apply_edits(model, [Edit(block, "ablate", steps=[3])], n_steps=4), capture_updates(model, [block]) as ed:
        model.generate("red circle", seed=1, output_type="latent")
    assert torch.equal(ed.updates(block, calls=True)[:6], calls[:6])
    assert ed.updates(block, calls=True)[6].abs().amax() == 0

    plan = CollectionPlan(model="heun", blocks=[block], prompts=["red circle"], seeds=[1], steps=4, guidance=0.0)
    collect(model, plan, tmp_path / "store", progress=False)
    store = ActivationStore(tmp_path / "store")
    manifest = json.loads((tmp_path / "store" / "manifest.json").read_text())
    assert manifest["steps"] == 4 and manifest["calls_per_step"] == [2, 2, 2, 1]
    torch.testing.assert_close(store.image(0, block), steps[:, 0].half().float())


def test_pndm_warm_up_call_belongs_to_the_first_step():
    from diffusers import PNDMScheduler

    model = tiny_model("sd1", scheduler=PNDMScheduler(skip_prk_steps=True), steps=4, guidance=0.0)
    block = model.default_blocks[0]
    with capture_updates(model, [block]) as cap:
        model.generate("red circle", seed=1, output_type="latent")
    assert cap.calls_per_step(block) == [2, 1, 1, 1] and cap.updates(block).shape[0] == 4


@pytest.mark.parametrize("family", FAMILIES)
def test_a_saved_pipeline_loads_as_its_own_class(family, tmp_path):
    pipe = tiny_pipeline(family)
    pipe.save_pretrained(tmp_path / family)
    model = load_t2i(str(tmp_path / family), device="cpu")
    assert type(model.pipe) is type(pipe) and model.family.name == ("unet" if family in ("sd1", "sd2") else family)
    assert set(model.blocks) and set(model.default_blocks) <= set(model.blocks)
    assert model.check_prompt("  red circle ") == "red circle"


def test_a_pipeline_without_an_adapter_is_refused_in_one_line(tmp_path):
    pipe = tiny_pipeline("pixart")
    pipe.save_pretrained(tmp_path / "p")
    index = json.loads((tmp_path / "p" / "model_index.json").read_text())
    index["_class_name"], index["transformer"] = "HunyuanDiTPipeline", ["diffusers", "HunyuanDiT2DModel"]
    (tmp_path / "p" / "model_index.json").write_text(json.dumps(index))
    with pytest.raises(ModelError) as err:
        load_t2i(str(tmp_path / "p"), device="cpu")
    message = str(err.value)
    assert "\n" not in message and "HunyuanDiTPipeline" in message and "HunyuanDiT2DModel" in message
    assert all(name in message for name in ("UNet2DConditionModel", "SD3Transformer2DModel", "FluxTransformer2DModel",
                                            "PixArtTransformer2DModel", "SanaTransformer2DModel"))


def test_sd1_works_end_to_end_from_the_command_line(tmp_path, capsys):
    """SD 1.x (one text encoder, no tokenizer_2): collect a store, train an SAE on it, paint one of its
    features."""
    from interp.__main__ import main as interp_main
    from saes.__main__ import main as saes_main
    from saes.sae import SAE

    tiny_pipeline("sd1").save_pretrained(tmp_path / "sd1")
    (tmp_path / "prompts.txt").write_text("red circle\nblue square\ngreen circle\n")
    block = "mid_block.attentions.0"
    assert interp_main(["collect", "--model", str(tmp_path / "sd1"), "--prompts", str(tmp_path / "prompts.txt"),
                        "--blocks", block, "--steps", "2", "--device", "cpu", "--out", str(tmp_path / "store")]) == 0
    assert saes_main(["train", "--store", str(tmp_path / "store"), "--block", block, "--out", str(tmp_path / "sae"),
                      "--d-sae", "32", "--k", "4", "--batch-size", "16", "--tokens", "320", "--threads", "1",
                      "--log-every", "5", "--checkpoint-every", "10"]) == 0
    sae = SAE.load(tmp_path / "sae")
    model = load_t2i(str(tmp_path / "sd1"), device="cpu")
    assert type(model.pipe).__name__ == "StableDiffusionPipeline" and not hasattr(model.pipe, "tokenizer_2")
    assert model.check_prompt("red circle") == "red circle"  # reads the one tokenizer there is
    plain = model.generate("red circle", seed=0, steps=2, output_type="latent")
    with apply_edits(model, [Edit(block, "add", feature=3, strength=4.0)], saes={block: sae}):
        painted = model.generate("red circle", seed=0, steps=2, output_type="latent")
    assert not torch.equal(torch.as_tensor(plain), torch.as_tensor(painted))
    with pytest.raises(ModelError, match="tokens long"):
        model.check_prompt("red " * 100)


def test_a_collection_whose_first_generation_fails_leaves_no_plan_to_resume(tmp_path, monkeypatch):
    import interp.collect as collect_module

    model = model_of("sd1")
    plan = collect_module.CollectionPlan(model="sd1", blocks=list(model.default_blocks), prompts=["red circle"],
                                         seeds=[0], steps=1, guidance=0.0)

    def broken(*args, **kwargs):
        raise RuntimeError("the text encoder failed")

    monkeypatch.setattr(collect_module, "generate", broken)
    with pytest.raises(RuntimeError):
        collect_module.collect(model, plan, tmp_path / "store", progress=False)
    assert not (tmp_path / "store" / "plan.json").exists()


def test_riebench_refuses_to_score_the_shapes_suite_on_a_model_without_ground_truth(tmp_path):
    from interp.ground_truth import GroundTruthError
    from riebench.methods import MethodConfig
    from riebench.runner import RunConfig, Runner

    with pytest.raises(GroundTruthError, match="tiny-sd1 has no ground truth"):
        Runner(RunConfig(configs=[MethodConfig("prompt-swap")]), tmp_path, model=model_of("sd1"), progress=False)


def test_outside_run_pipeline_heun_is_one_generation_and_one_step_generations_stay_apart():
    """Called directly (no `run_pipeline`), the scheduler is unknown: calls are steps, Heun's repeated timesteps
    stay in their generation, and back-to-back one-step generations (the same timestep each) are apart."""
    model = heun_model()
    block = model.default_blocks[0]
    with capture_updates(model, [block]) as cap:
        model.pipe("red circle", num_inference_steps=4, guidance_scale=0.0, output_type="latent")
        model.pipe("red circle", num_inference_steps=4, guidance_scale=0.0, output_type="latent")
    assert cap.n_generations == 2 and cap.updates(block).shape[0] == 7
    one_step = model_of("sd1")
    with capture_updates(one_step, [block]) as cap:
        for _ in range(3):
            one_step.pipe("red circle", num_inference_steps=1, guidance_scale=0.0, output_type="latent")
    assert cap.n_generations == 3 and cap.updates(block).shape[0] == 1


def test_neuron_records_know_their_scheduler_step_under_heun():
    from interp.hooks.diffusion import capture_neurons

    model = heun_model()
    block = model.default_blocks[0]
    with capture_neurons(model, [block]) as neurons:
        model.generate("red circle", seed=1, output_type="latent")
    assert neurons.steps[block] == [0, 0, 1, 1, 2, 2, 3]
    per_step = neurons.per_step(block)
    assert len(per_step) == 4
    torch.testing.assert_close(per_step[0][0], (neurons.records[block][0][0] + neurons.records[block][1][0]) / 2)
    assert per_step[3][0] is neurons.records[block][6][0]


def test_neuron_sites_of_a_dit_block_are_refused_by_name():
    from interp.hooks.diffusion import HookError, capture_neurons

    with pytest.raises(HookError, match="MLP neuron sites are a U-Net's"):
        capture_neurons(model_of("sd3"), ["transformer_blocks.0"])


@pytest.mark.parametrize("family", ["sd3", "flux", "pixart", "sana"])
def test_a_dit_works_end_to_end_from_the_command_line(family, tmp_path):
    """Collect a DiT's default blocks from a saved pipeline, train an SAE on one, paint its feature in a mask on
    the token grid: the image changes."""
    from interp.__main__ import main as interp_main
    from interp.edits import downsample_mask
    from interp.store import ActivationStore
    from saes.__main__ import main as saes_main
    from saes.sae import SAE

    pipe = tiny_pipeline(family)
    pipe.save_pretrained(tmp_path / family)
    (tmp_path / "prompts.txt").write_text("red circle\nblue square\n")
    model = load_t2i(str(tmp_path / family), device="cpu")
    block = model.default_blocks[-1]
    assert interp_main(["collect", "--model", str(tmp_path / family), "--prompts", str(tmp_path / "prompts.txt"),
                        "--blocks", block, "--steps", "1", "--guidance", "2.0", "--device", "cpu",
                        "--out", str(tmp_path / "store")]) == 0
    store = ActivationStore(tmp_path / "store")
    info = model.blocks[block]
    assert store.image(0, block).shape == (1, info.channels, info.height, info.width)
    assert saes_main(["train", "--store", str(tmp_path / "store"), "--block", block, "--out", str(tmp_path / "sae"),
                      "--d-sae", "64", "--k", "4", "--batch-size", "32", "--tokens", "640", "--threads", "1",
                      "--log-every", "5", "--checkpoint-every", "10"]) == 0
    sae = SAE.load(tmp_path / "sae")
    size = model.default_size
    mask = downsample_mask([[1.0 if x < size // 2 else 0.0 for x in range(size)] for _ in range(size)], info)
    plain = model.generate("red circle", seed=0, steps=1, guidance=2.0, output_type="latent")
    with apply_edits(model, [Edit(block, "add", feature=3, strength=8.0, mask=mask)], saes={block: sae}):
        painted = model.generate("red circle", seed=0, steps=1, guidance=2.0, output_type="latent")
    assert not torch.equal(torch.as_tensor(plain), torch.as_tensor(painted))


# ----------------------------------------------------------------------------- stochastic schedulers (issue 41)
#
# Euler-ancestral, DPM++ 2M SDE, LCM and FlowMatch's stochastic sampling add fresh noise at every step. It must come
# from the request's seeds (one generator per image), not torch's global generator: each run below first sets the
# global generator to another state, so a draw from it would show as a difference.

def _stochastic(name: str):
    from diffusers import (DPMSolverMultistepScheduler, EulerAncestralDiscreteScheduler,
                           FlowMatchEulerDiscreteScheduler, LCMScheduler)

    if name == "euler-ancestral":
        return tiny_model("sd1", scheduler=EulerAncestralDiscreteScheduler(steps_offset=1), steps=3)
    if name == "dpm++-2m-sde":
        return tiny_model("sd1", scheduler=DPMSolverMultistepScheduler(algorithm_type="sde-dpmsolver++",
                                                                       steps_offset=1), steps=3)
    if name == "lcm":
        return tiny_model("sd1", scheduler=LCMScheduler(steps_offset=1), steps=3, guidance=0.0)
    # FLUX's pipeline passes no generator to its scheduler's step (SD3's neither): the workbench seeds it
    return tiny_model("flux", scheduler=FlowMatchEulerDiscreteScheduler(stochastic_sampling=True), steps=3)


STOCHASTIC = ("euler-ancestral", "dpm++-2m-sde", "lcm", "flux-stochastic")


def stochastic_model(name: str):
    if name not in _MODELS:
        _MODELS[name] = _stochastic(name)
    return _MODELS[name]


def _run(model, run, global_seed: int):
    torch.manual_seed(global_seed)  # a stray draw from the global generator would differ between runs
    return run()


@pytest.mark.parametrize("name", STOCHASTIC)
def test_a_stochastic_scheduler_gives_the_same_images_for_the_same_seeds(name):
    model = stochastic_model(name)
    run = lambda: model.generate(PROMPTS, seed=[1, 2], output_type="latent")  # noqa: E731
    first, second = _run(model, run, 10), _run(model, run, 11)
    assert torch.equal(first, second)
    # an image's noise is its own seed's, whatever batch it is generated in
    alone = _run(model, lambda: model.generate(PROMPTS[1:], seed=[2], output_type="latent"), 12)
    torch.testing.assert_close(alone[0], first[1], rtol=0, atol=1e-5)
    # and another seed is another image: the step noise does depend on the seed
    other = _run(model, lambda: model.generate(PROMPTS, seed=[1, 3], output_type="latent"), 10)
    assert torch.equal(other[0], first[0]) and not torch.allclose(other[1], first[1])


@pytest.mark.parametrize("family", FAMILIES)
def test_every_family_gives_the_same_images_for_the_same_seeds(family):
    model = model_of(family)
    run = lambda: model.generate(PROMPTS, seed=[1, 2], output_type="latent")  # noqa: E731
    assert torch.equal(_run(model, run, 10), _run(model, run, 11))


@pytest.mark.parametrize("name", ["euler-ancestral", "flux-stochastic"])
def test_stores_of_a_stochastic_scheduler_are_identical_and_hold_their_seeds_true_updates(name, tmp_path):
    """Two collections of one plan are the same store, and each image's stored updates are those of its seed
    generated alone (collect batches two images a generation)."""
    from interp.collect import CollectionPlan, collect
    from interp.store import ActivationStore

    model = stochastic_model(name)
    block = model.default_blocks[0]
    plan = CollectionPlan(model=model.name, blocks=[block], prompts=PROMPTS, seeds=[4, 5], steps=3, guidance=3.0,
                          images_per_shard=2)
    for run, global_seed in (("a", 20), ("b", 21)):
        _run(model, lambda: collect(model, plan, tmp_path / run, progress=False), global_seed)
    stores = [ActivationStore(tmp_path / run) for run in ("a", "b")]
    for image, (prompt, seed) in enumerate(zip(PROMPTS, [4, 5])):
        assert torch.equal(stores[0].image(image, block), stores[1].image(image, block))
        with capture_updates(model, [block]) as cap:
            _run(model, lambda: model.generate(prompt, seed=seed, guidance=3.0, steps=3, output_type="latent"), 22)
        torch.testing.assert_close(stores[0].image(image, block), cap.updates(block, "cond")[:, 0].half().float(),
                                   rtol=0, atol=2e-3)


@pytest.mark.parametrize("name", ["dpm++-2m-sde", "flux-stochastic"])
def test_a_paint_of_strength_zero_leaves_a_stochastic_generation_unchanged(name):
    model = stochastic_model(name)
    block = model.default_blocks[0]
    info = model.blocks[block]
    mask = torch.zeros(info.height, info.width)
    mask[: info.height // 2] = 1.0
    plain = _run(model, lambda: model.generate(PROMPTS, seed=[1, 2], output_type="latent"), 30)
    with apply_edits(model, [Edit(block, "add", direction=torch.ones(info.channels).tolist(), strength=0.0,
                                  mask=mask.tolist())]):
        painted = _run(model, lambda: model.generate(PROMPTS, seed=[1, 2], output_type="latent"), 31)
    assert torch.equal(plain, painted)
