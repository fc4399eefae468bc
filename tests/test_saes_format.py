"""SAE files: sae-lens format both ways, and import of the published SDXL Turbo layout."""

from __future__ import annotations

import json

import pytest
import torch

from saes.importers import import_openai_topk
from saes.sae import SAE, SAEFormatError
from saes.topk import TopKConfig, TrainingTopKSAE


@pytest.fixture(autouse=True)
def one_thread():
    """Tiny tensors: a second thread only adds synchronisation, badly so on a shared machine."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def _trained_like_topk(d_in=24, d_sae=64, k=5) -> SAE:
    torch.manual_seed(1)
    training = TrainingTopKSAE(TopKConfig(d_in=d_in, d_sae=d_sae, k=k))
    with torch.no_grad():
        training.encoder_bias.normal_(0, 0.2)
        training.pre_bias.normal_()
    return training.to_inference(hook_name="unet.mid_block.attentions.0")


def test_our_sae_loads_in_sae_lens_with_identical_reconstructions(tmp_path):
    import sae_lens

    ours = _trained_like_topk()
    ours.save(tmp_path / "sae")
    theirs = sae_lens.SAE.load_from_disk(str(tmp_path / "sae"))
    assert type(theirs).__name__ == "TopKSAE" and theirs.cfg.k == 5
    x = torch.randn(2, 7, 24)  # (images, positions, channels)
    with torch.no_grad():
        torch.testing.assert_close(theirs.encode(x), ours.encode(x))
        torch.testing.assert_close(theirs(x), ours(x))
    assert theirs.cfg.metadata.hook_name == "unet.mid_block.attentions.0"
    assert (ours.encode(x) > 0).sum(-1).max() <= 5


def _lens_sae(architecture: str, d_in=16, d_sae=40):
    """A sae-lens training SAE of `architecture` with non-trivial weights."""
    from sae_lens.registry import get_sae_training_class

    sae_cls, cfg_cls = get_sae_training_class(architecture)
    extra = {"k": 4} if architecture in ("topk", "batchtopk") else {}
    torch.manual_seed(2)
    sae = sae_cls(cfg_cls(d_in=d_in, d_sae=d_sae, **extra))
    with torch.no_grad():
        for name, p in sae.named_parameters():
            p.add_(0.3 * torch.randn_like(p))
        if architecture == "batchtopk":
            sae.topk_threshold.fill_(0.2)
        if architecture == "jumprelu":
            sae.threshold.abs_()
    return sae


@pytest.mark.parametrize("architecture", ["topk", "batchtopk", "jumprelu", "standard", "gated"])
def test_sae_saved_by_sae_lens_loads_into_our_editing_path(tmp_path, architecture):
    import sae_lens

    lens_training = _lens_sae(architecture)
    lens_training.save_inference_model(str(tmp_path / "inference"))
    reference = sae_lens.SAE.load_from_disk(str(tmp_path / "inference"))
    ours = SAE.load(tmp_path / "inference")
    x = torch.randn(30, 16) * 2
    with torch.no_grad():
        latents = ours.encode(x)
        assert latents.shape == (30, 40)
        torch.testing.assert_close(latents, reference.encode(x), rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(ours.decode(latents), reference.decode(reference.encode(x)), rtol=1e-5, atol=1e-5)
    assert ours.decoder_directions().shape == (40, 16)
    if architecture != "batchtopk":  # training-format checkpoints (save_model) load too
        lens_training.save_model(str(tmp_path / "training"))
        from_training = SAE.load(tmp_path / "training")
        if architecture == "topk":  # the decoder-norm rescaling is folded on load
            torch.testing.assert_close(from_training.decoder_directions().norm(dim=1), torch.ones(40))
        with torch.no_grad():
            torch.testing.assert_close(from_training(x), lens_training(x), rtol=1e-4, atol=1e-4)


def test_published_sdxl_turbo_layout_imports_with_stats(tmp_path):
    d_in, d_sae, k = 32, 80, 10
    g = torch.Generator().manual_seed(3)
    state = {"pre_bias": torch.randn(d_in, generator=g), "latent_bias": torch.randn(d_sae, generator=g) * 0.1,
             "encoder.weight": torch.randn(d_sae, d_in, generator=g),
             "decoder.weight": torch.randn(d_in, d_sae, generator=g),
             "stats_last_nonzero": torch.zeros(d_sae, dtype=torch.long)}
    folder = tmp_path / "down.2.1_k10_hidden80" / "final"
    folder.mkdir(parents=True)
    torch.save(state, folder / "state_dict.pth")
    (folder / "config.json").write_text(json.dumps({"n_dirs_local": d_sae, "d_model": d_in, "k": k, "auxk": 256}))
    torch.save(torch.rand(d_sae, generator=g) + 1, folder / "mean.pt")
    torch.save(torch.rand(d_sae, generator=g), folder / "std.pt")

    sae = import_openai_topk(folder, hook_name="unet.down_blocks.2.attentions.1")
    x = torch.randn(12, d_in, generator=g)
    # openai's definition, written out: relu(topk(encoder(x - pre_bias) + latent_bias))
    pre = (x - state["pre_bias"]) @ state["encoder.weight"].t() + state["latent_bias"]
    top = pre.topk(k, dim=-1)
    expected_latents = torch.zeros_like(pre).scatter(1, top.indices, top.values.relu())
    expected_reconstruction = expected_latents @ state["decoder.weight"].t() + state["pre_bias"]
    torch.testing.assert_close(sae.encode(x), expected_latents)
    torch.testing.assert_close(sae(x), expected_reconstruction)

    sae.save(tmp_path / "converted")
    again = SAE.load(tmp_path / "converted")
    torch.testing.assert_close(again(x), expected_reconstruction)
    torch.testing.assert_close(again.feature_mean, torch.load(folder / "mean.pt", weights_only=True))
    assert again.cfg.k == k and again.cfg.metadata["hook_name"] == "unet.down_blocks.2.attentions.1"


class NotATensor:
    """An arbitrary pickled object, which weights_only loading must refuse."""


def test_import_refuses_pickled_objects_and_wrong_layouts(tmp_path):
    torch.save({"pre_bias": NotATensor()}, tmp_path / "state_dict.pth")
    with pytest.raises(SAEFormatError, match="weights_only"):
        import_openai_topk(tmp_path)
    torch.save({"pre_bias": torch.zeros(3)}, tmp_path / "state_dict.pth")
    with pytest.raises(SAEFormatError, match="lacks"):
        import_openai_topk(tmp_path)
    with pytest.raises(SAEFormatError, match="needs cfg.json"):
        SAE.load(tmp_path)


def test_wrong_channel_count_is_a_clear_error():
    with pytest.raises(ValueError, match="expects 24 channels"):
        _trained_like_topk().encode(torch.randn(3, 25))


def test_float16_copy_saves_half_the_bytes_and_reconstructs_closely(tmp_path):
    ours = _trained_like_topk()
    ours.save(tmp_path / "fp32")
    ours.astype("float16").save(tmp_path / "fp16")
    size = lambda name: (tmp_path / name / "sae_weights.safetensors").stat().st_size  # noqa: E731
    assert size("fp16") < 0.6 * size("fp32")
    half = SAE.load(tmp_path / "fp16", dtype="float16")
    assert half.W_enc.dtype == torch.float16 and json.loads((tmp_path / "fp16" / "cfg.json").read_text())["dtype"] == "float16"
    x = torch.randn(50, 24)
    torch.testing.assert_close(half(x).float(), ours(x), rtol=0.02, atol=0.02)


def test_an_inference_architecture_is_one_registry_entry(tmp_path, monkeypatch):
    import torch

    from saes import sae as sae_module
    from saes.sae import SAE, Architecture, SAEConfig, SAEFormatError

    monkeypatch.setitem(sae_module.ARCHITECTURE_REGISTRY, "relu-shift", Architecture(
        "relu-shift", lambda sae, pre: (pre - sae.shift).relu(), extra_parameters=("shift",)))
    sae = SAE(SAEConfig("relu-shift", d_in=3, d_sae=4))
    with torch.no_grad():
        sae.W_enc.copy_(torch.eye(3, 4))
        sae.shift.fill_(0.5)
    x = torch.tensor([[1.0, 0.25, 2.0]])
    torch.testing.assert_close(sae.encode(x), torch.tensor([[0.5, 0.0, 1.5, 0.0]]))
    loaded = SAE.load(sae.save(tmp_path / "sae"))
    torch.testing.assert_close(loaded.encode(x), sae.encode(x))
    with pytest.raises(SAEFormatError, match="supported: topk, jumprelu, standard, gated, relu-shift, batchtopk"):
        SAE.from_sae_lens({"architecture": "crosscoder", "d_in": 3, "d_sae": 4},
                          dict(sae.named_parameters()))
