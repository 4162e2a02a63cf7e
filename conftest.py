"""Every process the suite starts gets its share of the CPU cores.

pytest-xdist runs one worker per core, and each notebook nbval executes runs in a kernel of its own (a child of its
worker), as do the grader's and the browser tests' kernels. Left alone, each of those processes starts one intra-op
thread per core, so two workers on 2 cores run 4 busy threads that wait on each other (lesson 04's decoding cell:
2 s with one thread, 59 s with two beside a busy core). Setting ``OMP_NUM_THREADS`` in each worker, before any child
starts, gives each worker's processes cores / workers threads (1 on 2 cores with 2 workers).

Only a worker sets it: this file is also read by xdist's controller, whose environment the workers inherit, so a
value set there would look like the user's. A value the user set is kept; a run without xdist is left alone.

The lessons are collected before the tests: with ``--no-loadscope-reorder`` (the Makefile's; xdist otherwise
sorts files by their number of tests) xdist hands out whole files in collection order, and the lessons are the
longest files (lesson 08 alone is a sixth of a worker's time), so started last they leave one worker running a
lesson while the other has nothing to do (a run's file times, scheduled in both orders: 1,566 s against 1,501 s,
where 1,496 s is the even split).

The ipywidgets 7.7 test runs last of all: its environment takes four downloads (40 s to several minutes here),
which CI starts in the background before the suite (``.ci/run``), so that by the end of the suite the build has
finished and no worker waits on it. (The 134 s this test once took in CI, first read as that wait, was nbclient
waiting out a cell's timeout on a missed reply: see the test's ``CELL_TIMEOUT_S``.)
"""

import os

if "PYTEST_XDIST_WORKER" in os.environ:
    _workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
    os.environ.setdefault("OMP_NUM_THREADS", str(max(1, (os.cpu_count() or 1) // _workers)))


def pytest_collection_modifyitems(items):
    # stable: each file's own order is kept
    items.sort(key=lambda item: (item.path.suffix != ".ipynb", item.path.name == "test_ipywidgets77.py"))
