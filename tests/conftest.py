"""Shared test setup: one intra-op thread (the models here are tiny, so threads only add overhead and
make timings swing when the machine is busy), a fixed seed before every test, the ``gpu`` marker (those tests
are skipped, with the reason shown, where there is no CUDA device) and the ``sandbox`` marker, given here to
every test of the grader's files (they start bubblewrap sandboxes or graders: ``make test-fast`` leaves them out)."""

import pytest
import torch

torch.set_num_threads(1)


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)


SANDBOX_FILES = {"test_attacks.py", "test_cgroups.py", "test_class_folder.py", "test_class_grades.py",
                 "test_grade.py", "test_instructors_doc.py", "test_nbgrader.py", "test_notebook_and_grader.py",
                 "test_sandbox.py", "test_sandbox_user.py", "test_seccomp_filter.py"}


def pytest_collection_modifyitems(config, items):
    for item in items:
        if item.path.name in SANDBOX_FILES:
            item.add_marker(pytest.mark.sandbox)
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU (benchmarks/gpu_check.sh runs these on one)")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)
