"""Limits for a whole sandbox (all its processes together): a control group per sandbox, with memory (its
``/tmp`` included, no swap), pids and, where there, cpu (one CPU's worth of time per second).

The groups live, tried in order, in cgroup v1 under the grader's own group; in a delegated cgroup v2 subtree (its
processes moved to a ``LEAF`` first: v2 hands controllers down only from a group without processes); or in a
transient systemd scope with delegation (``scope_command``). The grader moves each sandbox's first process into its
group (``Group.add``) before it enters the sandbox, so no cgroup file is handed to the sandbox's user. Where none
is possible ``Cgroups.open`` returns None and the grader refuses, unless ``sandbox.NO_CGROUP_FLAG`` is passed.
"""

from __future__ import annotations

import os
import secrets
import shutil
import time
from pathlib import Path

CONTROLLERS = ("memory", "pids", "cpu")
REQUIRED = ("memory", "pids")
LEAF = "leaf"  # v2: where the processes of a delegated group go, so that it may hand its controllers down
SYSTEMD = Path("/run/systemd/system")  # present where systemd manages the machine (sd_booted)


def _read(path: Path) -> str:
    try:
        return path.read_text()
    except OSError:
        return ""


def cgroup_paths(pid: int | str = "self") -> dict[str, str]:
    """A process's group in each v1 controller's hierarchy, and in v2 under the key ``""``
    (``/proc/PID/cgroup``)."""
    paths: dict[str, str] = {}
    for line in _read(Path(f"/proc/{pid}/cgroup")).splitlines():
        parts = line.split(":", 2)
        if len(parts) == 3:
            for controller in parts[1].split(",") if parts[1] else [""]:
                paths[controller] = parts[2]
    return paths


def _mount(kind: str, controller: str = "") -> tuple[Path, str] | None:
    """Where a hierarchy is mounted (``kind`` "cgroup" with ``controller``, or "cgroup2"), and which of its
    groups is mounted there (``/proc/self/mountinfo``)."""
    for line in _read(Path("/proc/self/mountinfo")).splitlines():
        head, sep, tail = line.partition(" - ")
        fields, rest = head.split(), tail.split(" ")
        if sep and len(fields) >= 5 and len(rest) >= 3 and rest[0] == kind and \
                (not controller or controller in rest[2].split(",")):
            return Path(fields[4]), fields[3]
    return None


def _folder(mount: tuple[Path, str], path: str) -> Path:
    """The folder of group ``path`` under ``mount`` (a mount of a subgroup: its prefix taken off)."""
    mounted = mount[1].rstrip("/")
    if mounted and (path + "/").startswith(mounted + "/"):
        path = path[len(mounted):]
    return mount[0] / path.lstrip("/")


def v2_group(pid: int | str = "self") -> Path | None:
    """A process's cgroup v2 folder, where the v2 hierarchy is mounted."""
    mount, path = _mount("cgroup2"), cgroup_paths(pid).get("")
    return _folder(mount, path) if mount and path is not None else None


def delegated(folder: Path) -> bool:
    """Whether this process may manage the v2 group ``folder``: it may write the group's files, and where
    systemd manages the tree and this process is root (who may write anything), systemd marked the group
    delegated (the ``trusted.delegate`` attribute)."""
    if not all(os.access(p, os.W_OK) for p in (folder, folder / "cgroup.procs", folder / "cgroup.subtree_control")):
        return False
    if os.geteuid() != 0 or not SYSTEMD.is_dir():
        return True
    try:
        return os.getxattr(folder, "trusted.delegate") == b"1"
    except OSError:
        return False


def scope_command(argv: list[str], user: tuple[int, int] | None) -> list[str] | None:
    """``argv`` run in a transient systemd scope with delegation (the system's manager for root, which starts it
    as ``user`` through setpriv; the user's own manager otherwise), or None where systemd does not manage a
    cgroup v2 hierarchy with memory and pids here."""
    systemd_run, setpriv = shutil.which("systemd-run"), shutil.which("setpriv")
    mount = _mount("cgroup2")
    if systemd_run is None or not SYSTEMD.is_dir() or mount is None or any("$" in arg for arg in argv) or \
            not set(REQUIRED) <= set(_read(mount[0] / "cgroup.controllers").split()):
        return None  # ($: systemd-run may expand variables in the command line)
    cmd = [systemd_run, *([] if os.geteuid() == 0 else ["--user"]), "--scope", "--quiet", "--collect",
           "-p", "Delegate=yes", "--"]
    if user is not None:
        if setpriv is None:
            return None
        cmd += [setpriv, f"--reuid={user[0]}", f"--regid={user[1]}", "--clear-groups", "--"]
    return cmd + argv


class Group:
    """One sandbox's cgroup: its folder for each controller (in v2 the same folder for all)."""

    def __init__(self, folders: dict[str, Path], version: int = 1):
        self.folders, self.version = folders, version

    def add(self, pid: int) -> None:
        """Move process ``pid`` (all its threads) into the group. Raises OSError."""
        for folder in dict.fromkeys(self.folders.values()):
            (folder / "cgroup.procs").write_text(str(pid))

    def out_of_memory(self) -> bool:
        """Whether the memory limit was hit (a process was killed or refused memory for it)."""
        memory = self.folders.get("memory")
        if memory is None:
            return False
        try:
            if self.version == 2:
                events = dict(line.split() for line in _read(memory / "memory.events").splitlines())
                return int(events.get("oom", 0)) + int(events.get("oom_kill", 0)) > 0
            control = _read(memory / "memory.oom_control")
            kills = [int(line.split()[1]) for line in control.splitlines() if line.startswith("oom_kill ")]
            return bool(kills and kills[0]) or int(_read(memory / "memory.failcnt") or 0) > 0
        except ValueError:
            return False

    def remove(self, wait: float = 2.0) -> None:
        """Remove the folders (their processes have been killed; the kernel may take a moment to let go)."""
        deadline = time.monotonic() + wait
        for folder in dict.fromkeys(self.folders.values()):
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
    """The grader's parent group (one per v1 controller, one in v2); a child per sandbox."""

    def __init__(self, parents: dict[str, Path], version: int = 1):
        self.parents, self.version = parents, version
        self.count = 0

    @classmethod
    def open(cls, base: Path | None = None) -> Cgroups | None:
        """The parent groups: in the v2 group ``base`` (the pre-loaded interpreter's systemd scope) where given,
        else in v1 where this process may make groups, else in its own v2 group where delegated to it; None
        where there is no such place."""
        name = f"modern-block-grade-{os.getpid()}-{secrets.token_hex(3)}"
        if base is None:
            found = cls._v1(name)
            if found is not None:
                return found
            base = v2_group()
            if base is None or not delegated(base):
                return None
        return cls._v2(base, name)

    @classmethod
    def _v1(cls, name: str) -> Cgroups | None:
        own = cgroup_paths()
        parents: dict[str, Path] = {}
        try:
            for controller in CONTROLLERS:
                mount = _mount("cgroup", controller)
                if mount is None or controller not in own:
                    raise OSError(f"no cgroup v1 {controller} hierarchy")
                folder = _folder(mount, own[controller]) / name
                folder.mkdir()
                parents[controller] = folder
            return cls(parents, 1)
        except OSError:
            Group(parents).remove(wait=0)
            return None

    @classmethod
    def _v2(cls, base: Path, name: str) -> Cgroups | None:
        """Hand ``base``'s controllers down (its processes moved to its leaf first) to a parent group of ours."""
        available = _read(base / "cgroup.controllers").split()
        if not set(REQUIRED) <= set(available):
            return None
        wanted = [c for c in CONTROLLERS if c in available]
        enable = " ".join(f"+{c}" for c in wanted)
        parent = base / name
        try:
            for _ in range(3):  # a process may arrive while the others move
                if set(wanted) <= set(_read(base / "cgroup.subtree_control").replace("+", "").split()):
                    break
                for pid in _read(base / "cgroup.procs").split():
                    (base / LEAF).mkdir(exist_ok=True)
                    try:
                        (base / LEAF / "cgroup.procs").write_text(pid)
                    except ProcessLookupError:
                        pass
                try:
                    (base / "cgroup.subtree_control").write_text(enable)
                except OSError:
                    continue
            parent.mkdir()
            (parent / "cgroup.subtree_control").write_text(enable)
            return cls(dict.fromkeys(wanted, parent), 2)
        except OSError:
            Group({"": parent}).remove(wait=0)
            return None

    def create(self, memory_bytes: int, processes: int) -> Group:
        """A child group limiting memory (no swap), processes and CPU (one CPU). Raises OSError."""
        self.count += 1
        group = Group({}, self.version)
        try:
            for controller, parent in self.parents.items():
                folder = parent / f"s{self.count}"
                if folder not in group.folders.values():
                    folder.mkdir()
                group.folders[controller] = folder
            if self.version == 2:
                settings = {("memory", "memory.max"): memory_bytes, ("memory", "memory.swap.max"): 0,
                            ("pids", "pids.max"): processes, ("cpu", "cpu.max"): "100000 100000"}
            else:
                settings = {("memory", "memory.limit_in_bytes"): memory_bytes,
                            ("memory", "memory.memsw.limit_in_bytes"): memory_bytes, ("pids", "pids.max"): processes,
                            ("cpu", "cpu.cfs_period_us"): 100000, ("cpu", "cpu.cfs_quota_us"): 100000}
            optional = {"memory.swap.max", "memory.memsw.limit_in_bytes"}  # where swap is not accounted: absent
            for (controller, file), value in settings.items():
                path = group.folders[controller] / file if controller in group.folders else None
                if path is not None and (file not in optional or path.exists()):
                    path.write_text(str(value))
        except OSError:
            group.remove(wait=0)
            raise OSError("cannot create a cgroup with its limits") from None
        return group

    def close(self) -> None:
        Group(self.parents).remove(wait=1.0)
