"""Splice-in fidelity: the SAE reconstruction in place of a block's update, against the original
generation and against ablating the block; the probe's reading on the shapes world; the eval CLI."""

from __future__ import annotations

import functools
import json

import pytest
import torch

from saes.fidelity import VARIANTS, fidelity_table, splice_fidelity
from saes.train import TrainConfig, train

MID = "mid_block.attentions.0"
PROMPTS = ["a red circle on a blue background", "a small green star at the top left on a white background",
           "a big yellow square on the left and a purple cross on the right on a gray background",
           "a striped orange triangle in the center on a black background"]


@functools.cache
def fitted_sae():
    """A small TopK SAE fitted to the random pipeline's mid-block updates (a few seconds)."""
    import tempfile

    from test_hooks_diffusion import random_t2i

    from zoo.shapes import world_prompts
    from saes.pool import generate_pool

    pool = generate_pool(random_t2i(), [MID], world_prompts(48, seed=5), list(range(48)), progress=False)
    vectors = pool.updates[MID].permute(0, 2, 3, 1).reshape(-1, 64)
    generator = torch.Generator().manual_seed(0)
    config = TrainConfig(d_in=64, d_sae=128, k=8, batch_size=256, lr=3e-3, total_tokens=256 * 150,
                         dead_after_tokens=5000, metadata={"hook_name": MID})
    batches = (vectors[torch.randint(len(vectors), (256,), generator=generator)] for _ in range(150))
    return train(config, batches, tempfile.mkdtemp(prefix="saes-fidelity-"), progress=False)


def test_splice_without_error_changes_the_image_less_than_ablating_the_block():
    from test_hooks_diffusion import random_t2i

    result = splice_fidelity(random_t2i(), fitted_sae(), MID, PROMPTS, seeds=[0, 1, 2, 3], batch_size=2)
    variants = result["variants"]
    assert set(variants) == set(VARIANTS) and result["n_images"] == 4
    assert 0 < variants["splice"]["pixel_mae"] < variants["ablate"]["pixel_mae"]
    assert variants["splice"]["psnr"] > variants["ablate"]["psnr"]
    # With the error term added back the block writes its own update again: (almost) the original.
    assert variants["splice_with_error"]["pixel_mae"] < 0.05 * variants["splice"]["pixel_mae"]
    # Every prompt is a caption of the world: the probe reads each variant.
    assert result["probe"] and set(variants["original"]["probe_accuracy"]) >= {"all", "colour", "shape"}
    assert all(0.0 <= v <= 1.0 for v in variants["ablate"]["probe_accuracy"].values())
    table = fidelity_table({MID: result})
    assert table.count(f"| {MID} |") == 4 and "| probe all |" in table


def test_probe_is_skipped_for_prompts_outside_the_world_and_refused_when_forced():
    from test_hooks_diffusion import random_t2i

    result = splice_fidelity(random_t2i(), fitted_sae(), MID, ["a red circle", "a cat"], seeds=[0, 1])
    assert not result["probe"] and "probe_accuracy" not in result["variants"]["splice"]
    assert "probe" not in fidelity_table({MID: result})
    with pytest.raises(ValueError, match="captions of the shapes world"):
        splice_fidelity(random_t2i(), fitted_sae(), MID, ["a cat"], probe=True)
    with pytest.raises(ValueError, match="2 prompts but 1 seeds"):
        splice_fidelity(random_t2i(), fitted_sae(), MID, ["a red circle", "a cat"], seeds=[0])


def test_eval_command_adds_splice_fidelity_when_a_model_is_given(tmp_path, capsys):
    from test_store import saved_random_pipeline

    from saes.__main__ import main

    sae_dir = tmp_path / "sae"
    fitted_sae().save(sae_dir)
    args = ["eval", "--sae", str(sae_dir), "--model", saved_random_pipeline(), "--world", "4", "--steps", "1",
            "--fidelity-images", "2"]
    assert main(args) == 0
    result = json.loads((sae_dir / "eval.json").read_text())
    assert result["tokens"] == 4 * 64 and result["explained_variance"] > 0.5
    fidelity = result["splice_fidelity"]
    assert fidelity["n_images"] == 2 and fidelity["block"] == MID
    assert fidelity["variants"]["splice"]["pixel_mae"] >= 0
    markdown = (sae_dir / "eval.md").read_text()
    assert "| explained variance |" in markdown and "| splice |" in markdown
    assert "splice_with_error" in capsys.readouterr().out

    assert main(["eval", "--sae", str(sae_dir), "--world", "4"]) == 2
    assert "--world generates fresh images: it needs --model" in capsys.readouterr().err
    assert main(["eval", "--sae", str(sae_dir)]) == 2
    assert "--store DIR or --world N" in capsys.readouterr().err


def test_block_ablations_find_the_block_the_toys_images_need_and_not_an_inert_one(toy_t2i):
    """The embedded toy draws colour in up_blocks.1.attentions.2 (docs/saes.md): ablating it makes the probe misread
    objects; its mid block does nothing the image depends on (issue 22's starting point)."""
    from saes.fidelity import ablation_table, block_ablations

    colour_block = "up_blocks.1.attentions.2"
    result = block_ablations(toy_t2i, [MID, colour_block], PROMPTS, seeds=[0, 1, 2, 3])
    assert result["n_images"] == 4 and result["original"]["all"] == 1.0
    mid, colour = result["blocks"][MID], result["blocks"][colour_block]
    assert mid["probe_accuracy"]["all"] == 1.0 and mid["psnr"] > 50
    assert colour["drop"]["colour"] >= 0.5 and colour["psnr"] < 30
    table = ablation_table(result)
    assert f"| {MID} |" in table and table.splitlines()[-2].endswith("| nothing |")
    assert "colour" in table.splitlines()[-1].split("|")[-2]
    with pytest.raises(ValueError, match="not captions"):
        block_ablations(toy_t2i, [MID], ["a photo of a cat"])
