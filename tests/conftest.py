"""Shared test setup: one intra-op thread (the models here are tiny, so threads only add overhead and
make timings swing when the machine is busy), a fixed seed before every test, and the ``gpu`` marker:
those tests are skipped, with the reason shown, where there is no CUDA device."""

import pytest
import torch

torch.set_num_threads(1)


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)


def pytest_collection_modifyitems(config, items):
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU (benchmarks/gpu_check.sh runs these on one)")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)
