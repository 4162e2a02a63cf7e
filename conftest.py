"""Every process the suite starts gets its share of the CPU cores.

pytest-xdist runs one worker per core, and each notebook nbval executes runs in a kernel of its own (a child of its
worker), as do the grader's and the browser tests' kernels. Left alone, each of those processes starts one intra-op
thread per core, so two workers on 2 cores run 4 busy threads that wait on each other. Setting ``OMP_NUM_THREADS``
here, before any child starts, gives each worker's processes cores / workers threads (1 on 2 cores with 2 workers).
A value the user set is kept.
"""

import os

_workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
os.environ.setdefault("OMP_NUM_THREADS", str(max(1, (os.cpu_count() or 1) // _workers)))
