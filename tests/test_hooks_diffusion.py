"""Capture of block updates and intervention by edits, on a random-weight SDXL-built pipeline
(hooks behave the same on any weights; the code has no path special to the toy model)."""

from __future__ import annotations

import functools
import tempfile
import threading
from pathlib import Path

import numpy as np
import pytest
import torch

from interp.edits import Edit, EditError
from interp.hooks import (Cancelled, HookError, apply_edits, capture_updates, generate, hookable_blocks,
                          on_each_step, run_pipeline)
from interp.models.t2i import SDXL_BLOCKS

MID = "mid_block.attentions.0"


@functools.cache
def random_t2i():
    """A random-weight pipeline of the toy model's sizes, built once per test session."""
    from interp.models.t2i import T2IModel, block_info
    from zoo.t2i import T2IConfig, build_pipeline, build_tokenizer_files

    tokenizer_dir = Path(tempfile.mkdtemp(prefix="interp-random-t2i-"))
    build_tokenizer_files(tokenizer_dir, 48)
    torch.manual_seed(0)
    pipe = build_pipeline(T2IConfig(), tokenizer_dir)
    pipe.set_progress_bar_config(disable=True)
    return T2IModel(name="random", pipe=pipe, default_steps=1, default_guidance=0.0, blocks=block_info(pipe.unet))


@pytest.fixture(autouse=True)
def one_torch_thread():
    """These tiny generations run fastest on one intra-op thread; on a shared CPU, two threads
    spinning against other jobs made them 50x slower. Restored afterwards."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture
def model():
    return random_t2i()


def _no_hooks_left(unet) -> bool:
    return all(not m._forward_hooks and not m._forward_pre_hooks for m in unet.modules())


def test_captures_the_four_sdxl_blocks_per_step_as_batch_channels_height_width(model):
    with capture_updates(model, SDXL_BLOCKS) as cap:
        generate(model, ["a red circle", "a blue square"], steps=3, seed=[0, 1], output_type="latent")
    for block in SDXL_BLOCKS:
        info = model.blocks[block]
        assert cap.updates(block).shape == (3, 2, info.channels, info.height, info.width)
        assert [r.step for r in cap.records[block]] == [0, 1, 2]
    assert model.blocks[MID].channels == 64 and (model.blocks[MID].height, model.blocks[MID].width) == (8, 8)


def test_update_is_block_output_minus_block_input(model):
    module = dict(model.unet.named_modules())[MID]
    inputs = []
    handle = module.register_forward_hook(lambda m, args, out: inputs.append(args[0].detach().clone()))
    try:
        with capture_updates(model, [MID], keep_output=True) as cap:
            generate(model, "a red circle", steps=2, output_type="latent")
    finally:
        handle.remove()
    updates, outputs = cap.updates(MID), cap.outputs(MID)
    assert updates.abs().max() > 0
    torch.testing.assert_close(outputs - updates, torch.stack(inputs), rtol=0, atol=1e-5)


def test_cfg_halves_are_kept_apart(model):
    # Same seed, two prompts, guidance on: at the first step the unconditional halves (same
    # empty prompt, same noise) are identical, the conditional halves differ.
    with capture_updates(model, [MID]) as cap:
        generate(model, ["a red circle", "a blue square"], steps=2, seed=[3, 3], guidance=3.0, output_type="latent")
    cond, uncond, whole = cap.updates(MID, "cond"), cap.updates(MID, "uncond"), cap.updates(MID, "all")
    assert cond.shape == uncond.shape == (2, 2, 64, 8, 8) and whole.shape == (2, 4, 64, 8, 8)
    torch.testing.assert_close(uncond[0, 0], uncond[0, 1])
    assert not torch.allclose(cond[0, 0], cond[0, 1], atol=1e-3)
    torch.testing.assert_close(whole[:, 2:], cond)


def test_capture_also_works_through_the_plain_pipeline_call(model):
    # Not through run_pipeline: generations and CFG halves are found from the U-Net's inputs.
    with capture_updates(model, [MID]) as cap:
        model.generate("a red circle", steps=2, guidance=3.0)
        model.generate("a red circle", steps=3, guidance=0.0)
    assert cap.n_generations == 2
    assert cap.updates(MID, "uncond", generation=0).shape == (2, 1, 64, 8, 8)
    assert cap.updates(MID, generation=1).shape == (3, 1, 64, 8, 8)
    with pytest.raises(HookError, match="without classifier-free guidance"):
        cap.updates(MID, "uncond", generation=1)


def test_nothing_stays_registered_after_the_block_also_when_it_raises(model):
    with capture_updates(model, SDXL_BLOCKS):
        assert not _no_hooks_left(model.unet)
    assert _no_hooks_left(model.unet)
    with pytest.raises(RuntimeError, match="boom"):
        with capture_updates(model, SDXL_BLOCKS), apply_edits(model, [Edit(MID, "ablate")]):
            generate(model, "a red circle", output_type="latent")
            raise RuntimeError("boom")
    assert _no_hooks_left(model.unet)


def test_unknown_block_lists_the_valid_ones(model):
    with pytest.raises(HookError) as err:
        capture_updates(model, ["mid_block.attentions.7"])
    for name in hookable_blocks(model):
        assert name in str(err.value)
    assert "up_blocks.0.attentions.1" in str(err.value)
    # The module-path spelling with the `unet.` prefix names the same block.
    assert capture_updates(model, ["unet." + MID]).blocks == [MID]


def test_ablating_a_block_makes_its_update_zero_and_changes_the_image(model):
    plain = generate(model, "a red circle", steps=2, output_type="np")
    with apply_edits(model, [Edit(MID, "ablate")]), capture_updates(model, [MID]) as cap:
        edited = generate(model, "a red circle", steps=2, output_type="np")
    assert torch.count_nonzero(cap.updates(MID)) == 0
    assert not np.array_equal(plain, edited)
    assert np.array_equal(generate(model, "a red circle", steps=2, output_type="np"), plain)  # edit gone


def test_edit_acts_only_at_its_steps_and_only_in_its_cfg_half(model):
    kwargs = dict(steps=3, guidance=3.0, output_type="latent")
    with capture_updates(model, [MID]) as base:
        generate(model, "a red circle", **kwargs)
    direction = [1.0] * 64
    edits = [Edit(MID, "add", steps=[1], direction=direction, strength=2.0, cfg_half="uncond")]
    with apply_edits(model, edits, n_steps=3), capture_updates(model, [MID]) as cap:
        generate(model, "a red circle", **kwargs)
    torch.testing.assert_close(cap.updates(MID, "all")[0], base.updates(MID, "all")[0])  # step 0 untouched
    torch.testing.assert_close(cap.updates(MID, "cond")[1], base.updates(MID, "cond")[1])  # cond half untouched
    torch.testing.assert_close(cap.updates(MID, "uncond")[1], base.updates(MID, "uncond")[1] + 2.0)
    with pytest.raises(EditError, match="out of range"):
        apply_edits(model, [Edit(MID, "ablate", steps=[3])], n_steps=3)


def test_masked_edit_changes_only_the_masked_region(model):
    mask = np.zeros((8, 8))
    mask[:4, :4] = 1
    with capture_updates(model, [MID]) as base:
        generate(model, "a red circle", output_type="latent")
    with apply_edits(model, [Edit(MID, "add", direction=[0.5] * 64, mask=mask.tolist())]), \
            capture_updates(model, [MID]) as cap:
        generate(model, "a red circle", output_type="latent")
    diff = (cap.updates(MID) - base.updates(MID))[0, 0]  # (C, H, W) at step 0
    torch.testing.assert_close(diff[:, :4, :4], torch.full((64, 4, 4), 0.5))
    assert diff[:, 4:, :].abs().max() == 0 and diff[:, :, 4:].abs().max() == 0


def _generate_in_thread(model, edits, results, key, start):
    start.wait()
    with capture_updates(model, [MID]) as cap:
        if edits:
            with apply_edits(model, edits):
                image = generate(model, "a red circle", steps=4, seed=5, guidance=3.0, output_type="np")
        else:
            image = generate(model, "a red circle", steps=4, seed=5, guidance=3.0, output_type="np")
    results[key] = (image, len(cap.records[MID]))


def test_two_threads_on_one_pipeline_give_exactly_the_images_each_gives_alone(model):
    jobs = {"edited": [Edit(MID, "add", direction=[3.0] * 64), Edit("up_blocks.0.attentions.1", "ablate")],
            "plain": [],
            "other": [Edit("down_blocks.2.attentions.1", "add", direction=[-3.0] * 64, cfg_half="cond")]}
    alone = {}
    for key, edits in jobs.items():
        _generate_in_thread(model, edits, alone, key, _ready())
    assert not np.array_equal(alone["edited"], alone["plain"])
    assert not np.array_equal(alone["other"], alone["plain"])
    for _ in range(3):  # a race shows up only sometimes: several rounds
        together, start = {}, threading.Barrier(len(jobs))
        threads = [threading.Thread(target=_generate_in_thread, args=(model, edits, together, key, start))
                   for key, edits in jobs.items()]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        for key in jobs:
            assert np.array_equal(together[key][0], alone[key][0]), key
            assert together[key][1] == 4  # each capture saw its own 4 steps, none of the others'
    assert _no_hooks_left(model.unet)


def test_two_threads_capturing_neurons_on_one_pipeline_record_only_their_own_generation(model):
    """riebench's neuron capture used plain module hooks: one thread's capture recorded the other's generation."""
    from interp.hooks.diffusion import capture_neurons

    def run(key, steps, results, start):
        start.wait()
        with capture_neurons(model, [MID]) as neurons:
            generate(model, "a red circle", steps=steps, seed=5, guidance=0.0, output_type="latent")
        results[key] = neurons.records[MID]

    alone = {}
    run("two", 2, alone, _ready())
    assert len(alone["two"]) == 2 and alone["two"][0][0].ndim == 3  # per call: per layer (batch, tokens, neurons)
    for _ in range(3):
        together, start = {}, threading.Barrier(2)
        threads = [threading.Thread(target=run, args=(key, steps, together, start))
                   for key, steps in (("two", 2), ("five", 5))]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert len(together["two"]) == 2 and len(together["five"]) == 5
        for mine, theirs in zip(together["two"], alone["two"]):
            torch.testing.assert_close(mine[0], theirs[0])
    assert _no_hooks_left(model.unet)


def test_a_hook_called_by_another_thread_while_torch_registers_it_is_ignored(model):
    """torch adds a hook before marking it as taking kwargs, so another thread's forward on the shared UNet can
    call it in between without them (seen once in CI as a TypeError in that thread): it must be a no-op."""
    block = model.unet.get_submodule(MID)
    x = torch.zeros(1, 64, 8, 8)
    with capture_updates(model, [MID]) as session:
        calls = {}

        def other_thread():  # the session is not active in this thread's context
            calls["pre"] = session._on_unet_call(model.unet, (x, torch.tensor(1)))
            calls["post"] = session._make_block_hook(MID)(block, (x,), x + 1)

        worker = threading.Thread(target=other_thread)
        worker.start()
        worker.join()
        assert calls == {"pre": None, "post": None}
        with pytest.raises(HookError, match="nothing was captured"):  # nothing recorded for the other thread
            session.updates(MID)


def _ready():
    event = threading.Event()
    event.set()
    return event


def test_run_pipeline_leaves_the_shared_scheduler_untouched(model):
    before = model.pipe.scheduler.timesteps.clone() if model.pipe.scheduler.timesteps is not None else None
    run_pipeline(model.pipe, prompt=["a red circle"], num_inference_steps=7, guidance_scale=0.0,
                 output_type="latent")
    after = model.pipe.scheduler.timesteps
    assert (before is None and after is None) or torch.equal(before, after)


def test_step_callback_sees_every_step_of_this_context_only_and_can_stop_between_steps(model):
    seen, other = [], []
    worker = threading.Thread(target=lambda: other.append(generate(model, "a blue square", steps=3, seed=1,
                                                                   output_type="latent")))
    with on_each_step(lambda done, total: seen.append((done, total))):
        worker.start()  # a generation in another thread is not reported here
        generate(model, "a red circle", steps=3, seed=0, output_type="latent")
        worker.join()
    assert seen == [(0, 3), (1, 3), (2, 3), (3, 3)] and len(other) == 1

    def stop_after_one(done, total):
        if done == 2:
            raise Cancelled("stop")

    with capture_updates(model, [MID]) as cap, on_each_step(stop_after_one), pytest.raises(Cancelled):
        generate(model, "a red circle", steps=4, seed=0, output_type="latent")
    assert cap.updates(MID).shape[0] == 2  # two U-Net calls ran, the third never started
    assert _no_hooks_left(model.unet)
