"""Limits for a whole sandbox (all its processes together): a cgroup per sandbox, where this process may make one.

Linux offers this through control groups. Where the grader may create child groups of its own (cgroup v1
controllers mounted writable, as on this project's machines, or running as root on most v1 hosts), each sandbox
gets one group under the grader's own, with

* ``memory``: the memory of all its processes (and their files in the sandbox's tmpfs) together, swap included;
* ``pids``: the number of its processes and threads;
* ``cpu``: one CPU's worth of time per wall-clock second, so with the grader's wall-clock limit the CPU time of
  the whole sandbox is bounded.

Elsewhere (cgroup v2 without delegation, containers with a read-only ``/sys/fs/cgroup``) ``Cgroups.open``
returns None and the sandbox falls back to limits on every process (address space, CPU time, processes; set by
the sandboxed process before any submission code, inherited by every process it starts) plus its pid
namespace, which ends every process with the sandbox.
"""

from __future__ import annotations

import os
import secrets
import time
from pathlib import Path

CONTROLLERS = ("memory", "pids", "cpu")
ROOT = Path("/sys/fs/cgroup")


def _own_paths() -> dict[str, str]:
    """This process's cgroup path for each v1 controller (``/proc/self/cgroup``)."""
    paths: dict[str, str] = {}
    try:
        lines = Path("/proc/self/cgroup").read_text().splitlines()
    except OSError:
        return paths
    for line in lines:
        _, controllers, path = line.split(":", 2)
        for controller in controllers.split(","):
            paths[controller] = path
    return paths


def _mount_of(controller: str) -> tuple[Path, str] | None:
    """Where the v1 hierarchy of ``controller`` is mounted, and which of its folders is mounted there
    (``/proc/self/mountinfo``)."""
    try:
        lines = Path("/proc/self/mountinfo").read_text().splitlines()
    except OSError:
        return None
    for line in lines:
        fields = line.split(" - ", 1)
        if len(fields) != 2 or len(fields[0].split()) < 5 or len(fields[1].split(" ")) < 3:
            continue
        kind, _, options = fields[1].split(" ", 2)
        if kind == "cgroup" and controller in options.split(" ")[-1].split(","):
            return Path(fields[0].split()[4]), fields[0].split()[3]
    return None


class Group:
    """One sandbox's cgroup: one folder per controller."""

    def __init__(self, folders: dict[str, Path]):
        self.folders = folders

    @property
    def procs_files(self) -> list[str]:
        return [str(folder / "cgroup.procs") for folder in self.folders.values()]

    def out_of_memory(self) -> bool:
        """Whether the memory limit was hit (a process was killed or refused memory for it)."""
        try:
            control = (self.folders["memory"] / "memory.oom_control").read_text()
            kills = [int(line.split()[1]) for line in control.splitlines() if line.startswith("oom_kill ")]
            return bool(kills and kills[0]) or int((self.folders["memory"] / "memory.failcnt").read_text()) > 0
        except (OSError, ValueError, IndexError):
            return False

    def remove(self, wait: float = 2.0) -> None:
        """Remove the folders (their processes have been killed; the kernel may take a moment to let go)."""
        deadline = time.monotonic() + wait
        for folder in self.folders.values():
            while True:
                try:
                    folder.rmdir()
                    break
                except FileNotFoundError:
                    break
                except OSError:
                    if time.monotonic() > deadline:
                        break
                    time.sleep(0.02)


class Cgroups:
    """The grader's parent group in each controller, under its own cgroup; one child per sandbox."""

    def __init__(self, parents: dict[str, Path]):
        self.parents = parents
        self.count = 0

    @classmethod
    def open(cls) -> Cgroups | None:
        """The parent groups, or None where this process may not create cgroups (say so in the docs)."""
        own = _own_paths()
        name = f"modern-block-grade-{os.getpid()}-{secrets.token_hex(3)}"
        parents: dict[str, Path] = {}
        try:
            for controller in CONTROLLERS:
                found = _mount_of(controller)
                if found is None or controller not in own:
                    raise OSError(f"no cgroup v1 {controller} hierarchy")
                mount, mounted = found
                path = own[controller]
                if mounted != "/" and (path + "/").startswith(mounted.rstrip("/") + "/"):
                    path = path[len(mounted.rstrip("/")):]
                folder = mount / path.lstrip("/") / name
                folder.mkdir()
                parents[controller] = folder
            return cls(parents)
        except OSError:
            Group(parents).remove(wait=0)
            return None

    def create(self, memory_bytes: int, processes: int, owner: tuple[int, int] | None = None) -> Group:
        """A child group limiting memory (swap included), processes and CPU (one CPU); ``owner`` (uid, gid) may
        move its own processes into it. Raises OSError."""
        self.count += 1
        folders = {c: parent / f"s{self.count}" for c, parent in self.parents.items()}
        group = Group({})
        try:
            for controller, folder in folders.items():
                folder.mkdir()
                group.folders[controller] = folder
            memory = folders["memory"]
            (memory / "memory.limit_in_bytes").write_text(str(memory_bytes))
            if (memory / "memory.memsw.limit_in_bytes").exists():
                (memory / "memory.memsw.limit_in_bytes").write_text(str(memory_bytes))
            (folders["pids"] / "pids.max").write_text(str(processes))
            (folders["cpu"] / "cpu.cfs_period_us").write_text("100000")
            (folders["cpu"] / "cpu.cfs_quota_us").write_text("100000")
            if owner is not None:
                for folder in folders.values():
                    os.chown(folder / "cgroup.procs", *owner)
        except OSError:
            group.remove(wait=0)
            raise
        return group

    def close(self) -> None:
        Group(self.parents).remove(wait=1.0)
