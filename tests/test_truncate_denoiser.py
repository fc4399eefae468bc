"""A generation's final denoiser call ends after the last hooked block (`capture_updates(..., stop_after_last=True)`,
`interp.hooks.truncate.stop_after_blocks`): the captures are bit-identical to a whole generation's, the blocks after
the last hooked one really do not run in that call, and it runs whole wherever the last call cannot be known.
Tiny models only (the embedded toy and tests/tiny_diffusers.py's pipelines); behaviour, never timings."""

from __future__ import annotations

import sys
from contextlib import contextmanager
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).parent))
from tiny_diffusers import tiny_model  # noqa: E402

from interp.hooks import capture_updates  # noqa: E402
from interp.hooks.truncate import last_needed_block, stop_after_blocks  # noqa: E402
from interp.models.t2i import generate, on_each_step  # noqa: E402

PROMPTS = ["red circle", "blue square"]
MID = "mid_block.attentions.0"


@contextmanager
def counting(denoiser, names):
    """{module name: forward calls} of the named modules, and the denoiser's own calls under ``None``."""
    counts = {name: 0 for name in names}
    counts[None] = 0
    modules = dict(denoiser.named_modules())

    def hook_for(name):
        def hook(module, args, output):
            counts[name] += 1
        return hook

    def on_call(module, args):
        counts[None] += 1

    handles = [modules[name].register_forward_hook(hook_for(name)) for name in names]
    handles.append(denoiser.register_forward_pre_hook(on_call))
    try:
        yield counts
    finally:
        for handle in handles:
            handle.remove()


def records_of(model, sites, steps, stop, **kwargs):
    result = None
    with capture_updates(model, sites, stop_after_last=stop) as cap:
        result = generate(model, PROMPTS, steps=steps, seed=[3, 4], output_type="latent", **kwargs)
    return cap, result


def assert_same_records(whole, cut, sites):
    for site in sites:
        assert len(whole.records[site]) == len(cut.records[site]) > 0
        for a, b in zip(whole.records[site], cut.records[site]):
            assert (a.step, a.call, a.sub_call, a.cfg) == (b.step, b.call, b.sub_call, b.cfg)
            assert torch.equal(a.update, b.update)


def test_the_unet_runs_its_blocks_down_mid_then_up_not_in_module_order(toy_t2i):
    order = toy_t2i.family.execution_order(toy_t2i.denoiser)
    registered = [n for n in dict(toy_t2i.denoiser.named_modules()) if n in order]
    assert registered != order  # diffusers registers up_blocks before mid_block
    kinds = [n.split(".")[0] for n in order]
    assert kinds == sorted(kinds, key=["down_blocks", "mid_block", "up_blocks"].index)
    assert last_needed_block(toy_t2i, ["up_blocks.0.attentions.0", MID, "down_blocks.1.attentions.1"]) == \
        "up_blocks.0.attentions.0"
    assert last_needed_block(toy_t2i, [MID, "down_blocks.2.attentions.0"]) == MID


@pytest.mark.parametrize("steps", [1, 3])
@pytest.mark.parametrize("sites", [[MID], "default"])
def test_toy_captures_are_bit_identical_and_the_rest_of_the_final_call_does_not_run(toy_t2i, steps, sites):
    sites = list(toy_t2i.default_blocks) if sites == "default" else sites
    order = toy_t2i.family.execution_order(toy_t2i.denoiser)
    last = max(order.index(s) for s in sites)
    later = order[last + 1:] + ["up_blocks.2", "conv_out"]  # the U-Net after the last hooked block
    earlier = order[:last + 1]
    whole, image = records_of(toy_t2i, sites, steps, stop=False)
    assert image is not None
    with counting(toy_t2i.denoiser, later + earlier) as counts:
        cut, nothing = records_of(toy_t2i, sites, steps, stop=True)
    assert nothing is None and cut.stop.stopped == 1  # the pipeline call ended inside the final call
    assert_same_records(whole, cut, sites)
    assert all(torch.equal(whole.updates(s), cut.updates(s)) for s in sites)
    assert counts[None] == steps
    assert all(counts[name] == steps for name in earlier)       # every call runs up to the last hooked block
    assert all(counts[name] == steps - 1 for name in later)     # the final call stops there


def test_one_step_mid_block_capture_skips_the_whole_up_path_and_the_vae(toy_t2i, monkeypatch):
    decoded = []
    vae = toy_t2i.pipe.vae
    original = vae.decode
    monkeypatch.setattr(vae, "decode", lambda *a, **k: decoded.append(1) or original(*a, **k))
    up = [n for n, _ in toy_t2i.denoiser.named_children() if n in ("up_blocks", "conv_norm_out", "conv_out")]
    with counting(toy_t2i.denoiser, up) as counts, capture_updates(toy_t2i, [MID], stop_after_last=True) as cap:
        generate(toy_t2i, PROMPTS, steps=1, seed=[3, 4], output_type="pil")
    assert cap.stop.stopped == 1 and counts[None] == 1 and not decoded
    assert all(counts[name] == 0 for name in up)


def test_progress_still_reports_the_last_step(toy_t2i):
    progress = []
    with on_each_step(lambda done, total: progress.append((done, total))):
        with capture_updates(toy_t2i, [MID], stop_after_last=True):
            generate(toy_t2i, PROMPTS, steps=2, seed=[3, 4], output_type="latent")
    assert progress == [(0, 2), (1, 2), (2, 2)]


def heun_model():
    from diffusers import HeunDiscreteScheduler

    return tiny_model("sd1", scheduler=HeunDiscreteScheduler(beta_schedule="scaled_linear", beta_start=0.00085,
                                                            beta_end=0.012), steps=4, guidance=3.0)


def test_heun_the_final_call_is_the_schedulers_seventh_of_four_steps():
    model = heun_model()
    block = model.family.execution_order(model.denoiser)[0]
    whole, _ = records_of(model, [block], 4, stop=False)
    with counting(model.denoiser, ["up_blocks.0", "mid_block"]) as counts:
        cut, _ = records_of(model, [block], 4, stop=True)
    assert cut.calls_per_step(block) == whole.calls_per_step(block) == [2, 2, 2, 1]
    assert_same_records(whole, cut, [block])
    assert cut.records[block][0].cfg  # CFG batches [uncond, cond] in every call
    assert counts[None] == 7 and counts["mid_block"] == 6 and counts["up_blocks.0"] == 6


@pytest.mark.parametrize("family", ["sd3", "flux"])
def test_dit_blocks_after_the_last_hooked_one_do_not_run_in_the_final_call(family):
    model = tiny_model(family)
    order = model.family.execution_order(model.denoiser)
    if family == "flux":  # joint blocks, then single blocks
        assert order.index("transformer_blocks.0") < order.index("single_transformer_blocks.0")
        sites = ["transformer_blocks.0", "transformer_blocks.0:text"]
    else:
        sites = ["transformer_blocks.0"]
    later = order[1:]
    whole, _ = records_of(model, sites, 2, stop=False)
    with counting(model.denoiser, later + ["proj_out"]) as counts:
        cut, nothing = records_of(model, sites, 2, stop=True)
    assert nothing is None and cut.stop.stopped == 1
    assert_same_records(whole, cut, sites)
    assert counts[None] == 2 and all(counts[name] == 1 for name in later + ["proj_out"])


def test_a_store_collected_with_truncation_equals_one_collected_without(toy_t2i, tmp_path):
    from interp.collect import CollectionPlan, collect
    from interp.store import ActivationStore

    blocks = list(toy_t2i.default_blocks)
    stores = {}
    for stop in (False, True):
        plan = CollectionPlan(model="toy", blocks=blocks, prompts=PROMPTS * 2, seeds=[0, 1, 2, 3], steps=2,
                              guidance=0.0, images_per_shard=3)
        collect(toy_t2i, plan, tmp_path / str(stop), progress=False, stop_after_last=stop)
        stores[stop] = ActivationStore(tmp_path / str(stop))
    assert stores[True].manifest == stores[False].manifest
    for block in blocks:
        for image in range(4):
            assert torch.equal(stores[True].image(image, block), stores[False].image(image, block))


def test_stream_vectors_are_the_same_with_and_without_truncation(toy_t2i):
    from interp.collect import stream_vectors

    runs = [list(stream_vectors(toy_t2i, MID, PROMPTS * 2, batch_size=64, steps=1, images_per_generation=3,
                                stop_after_last=stop)) for stop in (False, True)]
    assert len(runs[0]) == len(runs[1]) and all(torch.equal(a, b) for a, b in zip(*runs))


def test_it_runs_whole_where_the_last_call_cannot_be_known_or_another_session_reads_on(toy_t2i):
    up = "up_blocks.1.attentions.2"
    # Outside `run_pipeline` the scheduler is unknown: the pipeline runs whole and returns its latents.
    with capture_updates(toy_t2i, [MID], stop_after_last=True) as cap:
        out = toy_t2i.pipe(PROMPTS, num_inference_steps=1, guidance_scale=0.0, output_type="latent")
    assert cap.stop.stopped == 0 and out.images is not None
    # Options that cut the timesteps short: whole.
    with capture_updates(toy_t2i, [MID], stop_after_last=True) as cap:
        out = generate_with(toy_t2i, denoising_end=0.99)
    assert cap.stop.stopped == 0 and out is not None
    # An outer capture of a later block in the same context still gets the final call's record.
    with capture_updates(toy_t2i, [up]) as outer:
        with capture_updates(toy_t2i, [MID], stop_after_last=True) as cap:
            generate(toy_t2i, PROMPTS, steps=2, seed=[3, 4], output_type="latent")
    assert cap.stop.stopped == 0 and len(outer.records[up]) == 2
    # Two stopping sessions: the one whose block runs later decides.
    with capture_updates(toy_t2i, [up], stop_after_last=True) as late:
        with capture_updates(toy_t2i, [MID], stop_after_last=True) as early:
            generate(toy_t2i, PROMPTS, steps=2, seed=[3, 4], output_type="latent")
    assert early.stop.stopped == 0 and late.stop.stopped == 1 and len(late.records[up]) == 2


def generate_with(model, **options):
    from interp.models.t2i import run_pipeline

    with torch.inference_mode():
        return run_pipeline(model.pipe, prompt=PROMPTS, num_inference_steps=2, guidance_scale=0.0,
                            output_type="latent", **options)


def test_the_session_alone_serves_another_capture(toy_t2i):
    whole, _ = records_of(toy_t2i, [MID], 1, stop=False)
    with capture_updates(toy_t2i, [MID]) as cap, stop_after_blocks(toy_t2i, [MID]) as stop:
        generate(toy_t2i, PROMPTS, steps=1, seed=[3, 4], output_type="latent")
    assert stop.stopped == 1 and torch.equal(cap.updates(MID), whole.updates(MID))
