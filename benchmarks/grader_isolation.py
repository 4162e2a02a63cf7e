"""Does the grader's hand-written machinery pay? The 40-notebook class of tests/classroom/test_class_folder.py graded
(--jobs 2, quick mode) in interleaved rounds, three ways:

* ``zygote+cgroup``: as shipped where a cgroup may be made: the pre-loaded interpreter (``zygote.py``) forks
  each submission's process into the sandbox, and a cgroup bounds each sandbox;
* ``zygote``: the same without a cgroup (limits on every process, as in Docker);
* ``fresh``: no zygote: bubblewrap starts a fresh interpreter in each sandbox, which imports torch and IPython
  itself (its seccomp filter is bubblewrap's ``--seccomp``), no cgroup.

    MODERN_BLOCK_QUICK=1 PYTHONPATH=tests:tests/classroom python benchmarks/grader_isolation.py [--rounds 2]

It prints each configuration's wall-clock seconds per round and the ratios to the first, timed in the same run.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from test_class_folder import make_class

from modern_block.classroom.grading import engine, grade, package_copy, wire
from modern_block.classroom.grading.bwrap import COPY_MOUNT, ENV, bwrap_command
from modern_block.classroom.grading.sandbox import STARTUP_TIMEOUT, Launcher, Limits, Sandbox, SandboxLost
from modern_block.classroom.grading.sandbox_user import user_processes

FRESH = """import json, os, sys
spec = json.loads(sys.argv[1])
sys.path[:] = spec["path"]
fd = spec["fd"]
os.closerange(3, fd)
os.closerange(fd + 1, 1 << 16)
os.chdir("/tmp")
from modern_block.classroom.grading.runner import boot
boot(spec)"""


class FreshLauncher(Launcher):
    """Sandboxes without the zygote: bubblewrap runs a fresh interpreter that imports everything itself."""

    def _start_zygote(self) -> None:
        pass

    def spawn(self, hidden: frozenset[str], notebook: bytes | None = None) -> Sandbox:
        with self.lock:
            self.count += 1
            number = self.count
            copy = package_copy.build(self.run_dir, hidden)
        files: list[Path] = []
        nb = self._notebook_file(number, notebook, files)
        ours, theirs = socket.socketpair()
        status, status_theirs = socket.socketpair()
        status_theirs.close()
        spec = {"fd": theirs.fileno(), "memory_mb": self.limits.memory_mb, "cpu_seconds": self.limits.cpu_seconds,
                "processes": user_processes(self.uid) + 64, "path": [COPY_MOUNT, *self.interpreter.path],
                "workdir": "/tmp", "env": ENV}
        seccomp = self._seccomp_fd()
        argv = [self.interpreter.executable, "-I", "-S", "-c", FRESH, json.dumps(spec)]
        cmd = bwrap_command(self._bwrap, self.interpreter, str(copy), str(nb) if nb else None, self.hidden, argv,
                            self.features, seccomp)
        try:
            holder = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                      stderr=subprocess.DEVNULL, pass_fds=[theirs.fileno(), seccomp],
                                      start_new_session=True, cwd="/", **self.as_user)
        finally:
            theirs.close()
            os.close(seccomp)
        box = Sandbox(ours, status, holder, None, files)
        try:
            ready = wire.receive(ours, time.monotonic() + STARTUP_TIMEOUT)
        except (TimeoutError, EOFError, OSError, wire.ProtocolError) as err:
            box.close()
            raise SandboxLost("died", f"the sandboxed process did not start ({type(err).__name__})") from None
        if ready != {"ready": True}:
            box.close()
            raise SandboxLost("garbled", "an unexpected first message")
        return box


def launchers() -> dict[str, tuple[Limits, Launcher]]:
    out = {}
    for k, (name, cls, cgroup) in enumerate((("zygote+cgroup", Launcher, True), ("zygote", Launcher, False),
                                              ("fresh", FreshLauncher, False))):
        limits = Limits(memory_mb=2048 + k)  # a key of its own in the engine's table of launchers
        launcher = cls(None, limits)
        if not cgroup and launcher.cgroups is not None:
            launcher.cgroups.close()
            launcher.cgroups = None
        engine._LAUNCHERS[(sys.executable, limits)] = launcher
        out[name] = (limits, launcher)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()
    folder = Path(tempfile.mkdtemp(prefix="grader-isolation-"))
    make_class(folder / "class")
    subs = grade.collect([folder / "class"])
    refs = grade.load_reference(Path(__file__).resolve().parents[1] / "exercises")
    configs = launchers()
    if configs["zygote+cgroup"][1].cgroups is None:
        del configs["zygote+cgroup"]  # no cgroup may be made here
    times: dict[str, list[float]] = {name: [] for name in configs}
    for _ in range(args.rounds):
        for name, (limits, _) in configs.items():
            started = time.monotonic()
            reports = grade.grade_all(subs, refs, grade.Options(timeout=15), jobs=2, limits=limits)
            times[name].append(time.monotonic() - started)
            assert len(reports) == 40
    first = next(iter(times))
    for name, seconds in times.items():
        ratio = sum(seconds) / sum(times[first])
        print(f"{name:14s} {' '.join(f'{s:5.1f}' for s in seconds)} s   {ratio:.2f}x of {first}")
    for _, launcher in configs.values():
        launcher.close()


if __name__ == "__main__":
    main()
