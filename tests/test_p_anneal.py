"""The P-annealing trainer (saes/trainers.py PAnnealTrainer; dictionary_learning's PAnnealTrainer, one of SAEBench's
baseline trainers): the schedule of p and of the penalty's coefficient, the loss, the unit-norm decoder, resuming
from a checkpoint, the inference export, and bad options."""

from __future__ import annotations

import io

import pytest
import torch

from saes.train import TrainConfig
from saes.trainers import make_trainer


def config(**options) -> TrainConfig:
    return TrainConfig(architecture="p-anneal", d_in=16, d_sae=48, batch_size=64, lr=1e-3, total_tokens=64 * 20,
                       dead_after_tokens=64 * 5, options={"warmup_steps": 2, "n_sparsity_updates": 5, **options})


def batches(n, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(64, 16, generator=g).relu() + 0.1 for _ in range(n)]


def test_p_anneals_from_l1_and_the_coefficient_carries_the_penalty_over():
    trainer = make_trainer(config(anneal_start=0.5, p_end=0.2))
    assert trainer.update_steps == [10, 12, 15, 17, 20] and trainer.p_values[0] == 1.0
    history = [trainer.step(x) for x in batches(20)]
    ps = [h["p"] for h in history]
    # L1 until the anneal starts; an update at step s sets p (and the coefficient) for the steps after s
    assert ps[:13] == [1.0] * 13
    assert ps[13] == pytest.approx(0.8) and ps[16] == pytest.approx(0.6) and ps[18] == pytest.approx(0.4)
    coefficients = [h["sparsity_coeff"] for h in history]
    assert coefficients[:13] == [0.1] * 13
    # from the second update on, the coefficient is rescaled by mean L_p / mean L_next_p over the queue
    assert coefficients[13] != 0.1 and all(c > 0 for c in coefficients)
    # the loss is dictionary_learning's: mean ||x - x_hat||_2 + coeff * mean ||f||_p
    x = batches(1, seed=3)[0]
    with torch.no_grad():
        x_hat, f = trainer.sae(x)  # the weights the next step's loss is computed with
    step = trainer.step(x)  # step 20: the last update, p = p_end from the next step on
    assert step["p"] == pytest.approx(0.4) and trainer.state["p"] == pytest.approx(0.2)
    expected = torch.linalg.norm(x - x_hat, dim=-1).mean() + step["sparsity_coeff"] * (
        f.pow(step["p"]).sum(-1).pow(1 / step["p"]).mean())
    assert step["loss"] == pytest.approx(float(expected), rel=1e-5)
    torch.testing.assert_close(trainer.sae.W_dec.norm(dim=1), torch.ones(48))


def test_resume_from_checkpoint_is_exact():
    data = batches(16)
    first = make_trainer(config())
    for x in data[:8]:
        first.step(x)
    buffer = io.BytesIO()
    torch.save(first.state_dict(), buffer)
    buffer.seek(0)
    second = make_trainer(config())
    second.load_state_dict(torch.load(buffer, weights_only=True))
    for x in data[8:]:
        a, b = first.step(x), second.step(x)
        assert a == b
    torch.testing.assert_close(first.sae.W_enc, second.sae.W_enc, rtol=0, atol=0)


def test_inference_export_is_the_trained_relu_sae():
    trainer = make_trainer(config())
    for x in batches(5):
        trainer.step(x)
    sae = trainer.to_inference(hook_name="blocks.0.hook_resid_post")
    assert sae.cfg.architecture == "standard"
    x = batches(1, seed=7)[0]
    with torch.no_grad():
        x_hat, f = trainer.sae(x)
        torch.testing.assert_close(sae.encode(x), f)
        torch.testing.assert_close(sae(x), x_hat)


@pytest.mark.parametrize("options, message", [({"p_end": 0.0}, "anneal within"), ({"sparsity_function": "L0"},
                                               "sparsity_function"), ({"anneal_start": 1.5}, "anneal_start"),
                                              ({"bogus": 1}, "unknown option")])
def test_bad_options_are_one_line(options, message):
    with pytest.raises(ValueError, match=message):
        make_trainer(config(**options))
