"""Shared fixtures: the embedded models, loaded once per test session."""

from __future__ import annotations

import os

import pytest
import torch

import zoo  # noqa: F401 - registers the embedded models and worlds, as every entry point does

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # tests never reach a model hub
torch.set_num_threads(1)  # the CI machine has 2 cores shared by the app server and the tests


@pytest.fixture(autouse=True)
def one_thread():
    """Every test runs on one thread and leaves it so, whatever a command it calls sets (--threads)."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="session")
def toy_t2i():
    """The embedded text-to-image model (float32, CPU)."""
    from interp.models import load_t2i

    return load_t2i("toy", device="cpu")


@pytest.fixture(scope="session")
def tiny_toy_base(tmp_path_factory):
    """A toy-base recipe run at tiny size (2 UNet steps, v prediction, 3 sampling steps with guidance 2): the run
    directory; its saved pipeline is `<run>/pipeline`. Trained once per session (tests/test_t2i_recipe.py checks
    what it saves; tests/test_step_transfer.py measures on it)."""
    import argparse

    from zoo import t2i_recipe

    run = tmp_path_factory.mktemp("toy-base")
    parser = argparse.ArgumentParser()
    t2i_recipe.add_arguments(parser)
    t2i_recipe.main(parser.parse_args(
        ["--out", str(run), "--scenes", "32", "--vae-steps", "2", "--decoder-steps", "2", "--unet-steps", "2",
         "--batch", "4", "--checkpoint-every", "2", "--probe-every", "0", "--threads", "1",
         "--objective", "v_prediction", "--sampling-steps", "3", "--guidance", "2"]))
    return run
