"""Shared fixtures: the embedded models, loaded once per test session."""

from __future__ import annotations

import os

import pytest
import torch

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
