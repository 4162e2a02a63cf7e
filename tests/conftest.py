"""Shared test setup: one intra-op thread (the models here are tiny, so threads only add overhead and
make timings swing when the machine is busy), and a fixed seed before every test."""

import pytest
import torch

torch.set_num_threads(1)


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)
