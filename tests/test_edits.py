"""Edits as data: JSON round trip, validation, and what each mode does to a block update."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from interp.edits import Edit, EditError, downsample_mask, edit_update, edits_from_json, edits_to_json, validate_edits
from interp.hooks import apply_edits, capture_updates, generate
from test_hooks_diffusion import MID, one_torch_thread, random_t2i  # noqa: F401 - fixture reused

UP = "up_blocks.0.attentions.1"


class ReluSAE:
    """The protocol interp expects of an SAE: encode (N, C) -> (N, F), decode (N, F) -> (N, C), W_dec (F, C)."""

    def __init__(self, channels: int = 64, features: int = 96, seed: int = 0):
        g = torch.Generator().manual_seed(seed)
        self.W_enc = torch.randn(channels, features, generator=g) / channels ** 0.5
        self.b_enc = torch.full((features,), 0.05)
        self.W_dec = torch.randn(features, channels, generator=g) / channels ** 0.5
        self.b_dec = torch.randn(channels, generator=g) * 0.01

    def encode(self, x):
        return torch.relu((x - self.b_dec) @ self.W_enc + self.b_enc)

    def decode(self, z):
        return z @ self.W_dec + self.b_dec


@pytest.fixture
def model():
    return random_t2i()


@pytest.fixture
def update():
    return torch.randn(2, 64, 8, 8, generator=torch.Generator().manual_seed(1))


def _vectors(u):
    return u.permute(0, 2, 3, 1).reshape(-1, u.shape[1])


def test_edits_round_trip_through_json():
    mask = np.zeros((8, 8), dtype=bool)
    mask[2:5, 1:3] = True
    edits = [Edit(MID, "add", steps=[2, 0], direction=list(np.linspace(-1, 1, 64)), strength=2.5,
                  mask=mask.tolist(), cfg_half="cond"),
             Edit(UP, "scale", feature=7, strength=0.0),
             Edit(UP, "splice", keep_error=False)]
    again = edits_from_json(edits_to_json(edits))
    assert again == edits
    assert again[0].steps == [0, 2] and again[0].mask[2][1] == 1.0
    assert Edit.from_json(edits[1].to_json()) == edits[1]


def test_malformed_edits_get_clear_errors():
    with pytest.raises(EditError, match="unknown edit mode 'boost'.*add, scale, set, ablate, splice"):
        Edit(MID, "boost")
    with pytest.raises(EditError, match="exactly one of `direction` or `feature`"):
        Edit(MID, "add")
    with pytest.raises(EditError, match="needs `feature`"):
        Edit(MID, "scale", strength=0.0)
    with pytest.raises(EditError, match="cfg_half"):
        Edit(MID, "ablate", cfg_half="negative")
    with pytest.raises(EditError, match="step indices start at 0"):
        Edit(MID, "ablate", steps=[-1])
    with pytest.raises(EditError, match="unknown edit field"):
        Edit.from_dict({"block": MID, "mode": "ablate", "strenght": 2})


def test_validation_against_the_model_names_what_is_wrong(model):
    blocks, saes = model.blocks, {UP: ReluSAE()}
    with pytest.raises(EditError) as err:
        validate_edits([Edit("mid_block.attentions.9", "ablate")], blocks)
    assert "unknown block" in str(err.value) and all(b in str(err.value) for b in blocks)
    with pytest.raises(EditError, match="mask is 4 x 4 but the block has 8 x 8"):
        validate_edits([Edit(MID, "ablate", mask=np.ones((4, 4)).tolist())], blocks)
    with pytest.raises(EditError, match="direction has 63 values but the block has 64 channels"):
        validate_edits([Edit(MID, "add", direction=[1.0] * 63)], blocks)
    with pytest.raises(EditError, match="step 5 is out of range: the generation has 2 step"):
        validate_edits([Edit(MID, "ablate", steps=[0, 5])], blocks, n_steps=2)
    with pytest.raises(EditError, match="feature 96 is out of range: the SAE has 96 features"):
        validate_edits([Edit(UP, "set", feature=96)], blocks, saes=saes)
    with pytest.raises(EditError, match="needs an SAE for block mid_block"):
        validate_edits([Edit(MID, "splice")], blocks, saes=saes)
    with pytest.raises(EditError, match="reads 32 channels"):
        validate_edits([Edit(UP, "splice")], blocks, saes={UP: ReluSAE(channels=32)})
    with pytest.raises(EditError, match="step 4 is out of range"):
        apply_edits(model, [Edit(MID, "ablate", steps=[4])], n_steps=4)


def test_add_moves_only_masked_positions_by_strength_times_direction(update):
    direction = torch.linspace(-1, 1, 64)
    mask = torch.zeros(8, 8)
    mask[3:, :2] = 1
    out = edit_update(update, Edit(MID, "add", direction=direction.tolist(), strength=3.0, mask=mask.tolist()))
    expected = update + 3.0 * direction.view(1, 64, 1, 1) * mask
    torch.testing.assert_close(out, expected)


def test_add_of_a_feature_adds_its_decoder_row(update):
    sae = ReluSAE()
    out = edit_update(update, Edit(UP, "add", feature=5, strength=-2.0), sae)
    torch.testing.assert_close(out, update - 2.0 * sae.W_dec[5].view(1, 64, 1, 1))


def test_scale_zero_removes_exactly_the_features_own_contribution(update):
    sae = ReluSAE()
    a = sae.encode(_vectors(update))
    feature = int(torch.argmax((a > 0).sum(0)))  # a feature active somewhere
    out = edit_update(update, Edit(UP, "scale", feature=feature, strength=0.0), sae)
    removed = _vectors(update) - _vectors(out)
    torch.testing.assert_close(removed, a[:, feature:feature + 1] * sae.W_dec[feature], rtol=1e-5, atol=1e-5)
    doubled = edit_update(update, Edit(UP, "scale", feature=feature, strength=2.0), sae)
    torch.testing.assert_close(_vectors(doubled) - _vectors(update), removed, rtol=1e-5, atol=1e-5)


def test_set_makes_the_feature_activation_equal_to_strength(update):
    sae = ReluSAE()
    out = edit_update(update, Edit(UP, "set", feature=3, strength=4.0), sae)
    before = sae.encode(_vectors(update))[:, 3]
    change = _vectors(out) - _vectors(update)
    torch.testing.assert_close(change, (4.0 - before)[:, None] * sae.W_dec[3], rtol=1e-5, atol=1e-5)


def test_ablate_zeroes_the_update_inside_the_mask_only(update):
    mask = torch.zeros(8, 8)
    mask[:, 4:] = 1
    out = edit_update(update, Edit(MID, "ablate", mask=mask.bool().tolist()))
    assert out[..., 4:].abs().max() == 0
    torch.testing.assert_close(out[..., :4], update[..., :4])


def test_splice_replaces_the_update_by_the_reconstruction_with_or_without_error(update):
    sae = ReluSAE()
    reconstruction = sae.decode(sae.encode(_vectors(update)))
    without = edit_update(update, Edit(UP, "splice", keep_error=False), sae)
    torch.testing.assert_close(_vectors(without), reconstruction)
    with_error = edit_update(update, Edit(UP, "splice", keep_error=True), sae)
    torch.testing.assert_close(with_error, update, rtol=1e-5, atol=1e-5)
    assert (without - update).abs().max() > 0.1  # the reconstruction is not the update


def test_downsample_mask_gives_coverage_at_block_resolution(model):
    image_mask = np.zeros((64, 64), dtype=bool)
    image_mask[:32, :16] = True
    grid = np.array(downsample_mask(image_mask, model.blocks[MID]))
    assert grid.shape == (8, 8)
    assert grid[:4, :2].min() == 1.0 and grid[4:].max() == 0.0 and grid[:, 2:].max() == 0.0
    half = np.array(downsample_mask(np.pad(np.ones((64, 4)), ((0, 0), (0, 60))), (8, 8), threshold=0.5))
    assert half[:, 0].tolist() == [1.0] * 8 and half[:, 1:].max() == 0.0


def test_feature_edits_and_splices_run_during_generation(model):
    sae = ReluSAE()
    with capture_updates(model, [UP]) as base:
        plain = generate(model, "a red circle", steps=2, output_type="np")
    edits = [Edit(UP, "scale", feature=0, strength=0.0, steps=[0]), Edit(UP, "set", feature=1, strength=3.0)]
    with apply_edits(model, edits, saes={UP: sae}), capture_updates(model, [UP]) as cap:
        edited = generate(model, "a red circle", steps=2, output_type="np")
    assert not np.array_equal(plain, edited)
    step0 = cap.updates(UP)[0, 0]
    expected = edit_update(edit_update(base.updates(UP)[0], edits[0], sae), edits[1], sae)[0]
    torch.testing.assert_close(step0, expected, rtol=1e-4, atol=1e-4)
    with apply_edits(model, [Edit(UP, "splice", keep_error=True)], saes={UP: sae}):
        spliced = generate(model, "a red circle", steps=2, output_type="np")
    np.testing.assert_allclose(spliced, plain, atol=1e-4)
