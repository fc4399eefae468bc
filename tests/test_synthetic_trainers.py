"""benchmarks/synthetic_trainers.py's core, on a tiny planted dictionary: sae-lens' own synthetic data and eval
must see a trained TopK SAE recover the planted features better than an untrained one."""

from __future__ import annotations

import pytest

pytest.importorskip("sae_lens.synthetic")

from benchmarks.synthetic_trainers import run  # noqa: E402


def test_trained_topk_recovers_planted_features_better_than_a_random_sae():
    result = run(d_in=32, n_features=32, d_sae=32, samples=81_920, batch_size=256, lr=3e-3, eval_samples=2048,
                 architectures=["topk"], curve_every=160, curve_samples=1024, log=lambda *_: None)
    random, topk = result["rows"]["random (untrained topk)"], result["rows"]["topk"]
    # the recovery curve: every 160 steps and at the end, measured on its own samples
    curve = topk["curve"]
    assert [p["step"] for p in curve] == [160, 320] and curve[-1]["samples"] == result["dataset"]["train_samples"]
    assert curve[-1]["mcc"] > random["mcc"] + 0.15 and curve[0]["l0"] == pytest.approx(result["settings"]["k"], abs=1)
    assert topk["sae_l0"] == pytest.approx(result["settings"]["k"], abs=1.0)
    assert topk["mcc"] > random["mcc"] + 0.15, (topk["mcc"], random["mcc"])
    assert topk["mcc"] > 0.5  # measured 0.61; random 0.36
    assert topk["classification"]["f1_score"] > random["classification"]["f1_score"]
    assert topk["explained_variance"] > random["explained_variance"]


def test_the_planted_dictionary_and_the_trainers_never_share_a_seed():
    """Both start from torch.randn(n, d_in) under their seed: equal seeds would plant the untrained decoder."""
    with pytest.raises(ValueError, match="data_seed must differ"):
        run(d_in=8, n_features=8, d_sae=8, samples=256, batch_size=256, data_seed=3, seed=3, architectures=["topk"])
    with pytest.raises(ValueError, match="a learning rate for a trainer not run: gated"):
        run(d_in=8, n_features=8, d_sae=8, samples=256, batch_size=256, architectures=["topk"], lrs={"gated": 1e-3})
    with pytest.raises(ValueError, match="unknown SAE trainer 'topk-transcoder'"):
        run(d_in=8, n_features=8, d_sae=8, samples=256, batch_size=256, architectures=["topk-transcoder"])
