"""Shared test setup: one intra-op thread (the models here are tiny, so threads only add overhead and
make timings swing when the machine is busy), a fixed seed before every test, the ``gpu`` marker (those tests
are skipped, with the reason shown, where there is no CUDA device) and the ``sandbox`` marker, given here to
every test of the grader's files (they start bubblewrap sandboxes or graders: ``make test-fast`` leaves them out);
the files in ``SLOW_FILES`` (processes, kernels, the real checkpoint, training runs) are ``slow`` as a whole; and
every part's folder on the import path, so that a file run alone finds another part's helpers."""

import sys
from pathlib import Path

import pytest
import torch

torch.set_num_threads(1)

# every part's folder on the import path, whichever files a run selects: a test may use another part's helpers by
# module name (tests/fast/test_fast.py takes tests/interop/test_hf.py's tiny Hugging Face models), which pytest
# alone makes importable only once a file of that folder has been collected
for _part in sorted(p for p in Path(__file__).parent.iterdir() if p.is_dir() and not p.name.startswith(("_", "."))):
    if str(_part) not in sys.path:
        sys.path.append(str(_part))


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)


SANDBOX_FILES = {"test_attacks.py", "test_cgroups.py", "test_class_folder.py", "test_class_grades.py",
                 "test_grade.py", "test_instructors_doc.py", "test_nbgrader.py", "test_notebook_and_grader.py",
                 "test_sandbox.py", "test_sandbox_user.py", "test_seccomp_filter.py"}

SLOW_FILES = {"test_benchmarks.py", "test_committed_studies.py", "test_distributed.py", "test_faults.py",
              "test_gguf.py", "test_in_notebook.py", "test_lesson_times.py", "test_perf.py", "test_weights.py"}


def pytest_collection_modifyitems(config, items):
    for item in items:
        if item.path.name in SANDBOX_FILES:
            item.add_marker(pytest.mark.sandbox)
        if item.path.name in SLOW_FILES:
            item.add_marker(pytest.mark.slow)
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU (benchmarks/gpu_check.sh runs these on one)")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)
