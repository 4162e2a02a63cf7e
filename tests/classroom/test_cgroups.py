"""The cgroup of each sandbox (``grading.cgroups``): v1 where its controllers are writable, a delegated v2 subtree
(tested on a stand-in of the cgroup file system: this machine mounts memory and pids as v1), a systemd scope
(tested with a stand-in for ``systemd-run``), and no sandbox at all without one unless the instructor passes
``--no-cgroup-i-accept-per-process-limits``."""

import os
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

import pytest
from submissions import sandbox_problem

from modern_block.classroom.grading import cgroups, sandbox
from modern_block.classroom.grading.cgroups import LEAF, Cgroups, Group, scope_command
from modern_block.classroom.grading.sandbox import NO_CGROUP_FLAG, Launcher, Limits, SandboxError

SANDBOX_PROBLEM = sandbox_problem() if os.geteuid() == 0 else "the sandbox tests of this file run as root"
needs_sandbox = pytest.mark.skipif(SANDBOX_PROBLEM is not None, reason=f"no sandbox here: {SANDBOX_PROBLEM}")


def test_cgroups_open_only_where_they_may():
    groups = Cgroups.open()
    if groups is None:
        pytest.skip("no cgroup may be created here")
    group = groups.create(64 << 20, 8)
    assert all(folder.is_dir() for folder in group.folders.values())
    group.remove()
    groups.close()
    assert not any(folder.exists() for folder in groups.parents.values())


@needs_sandbox
def test_a_cgroup_bounds_the_whole_sandbox():
    launcher = Launcher(limits=Limits(memory_mb=2049))
    box = launcher.spawn(frozenset(), None)
    try:
        memory, pids = box.group.folders["memory"], box.group.folders["pids"]
        limit = "memory.max" if launcher.cgroups.version == 2 else "memory.limit_in_bytes"
        assert int((memory / limit).read_text()) == (2049 << 20) + (1 << 30) + (256 << 20)
        assert (pids / "pids.max").read_text().strip() == "128"
        procs = (pids / "cgroup.procs").read_text().split()
        assert sorted(procs) == sorted([str(box.joining), str(box.pid)])  # the process that entered, the student
        assert "cgroup v" in launcher.whole_sandbox_limits
    finally:
        box.close()
        launcher.close()
    assert not box.group.folders["memory"].exists()


def _fake_v2(tmp_path: Path, procs: str = "4242\n") -> Path:
    """A delegated v2 group as the kernel shows it, with the grader's process in it."""
    base = tmp_path / "grader.scope"
    base.mkdir()
    (base / "cgroup.controllers").write_text("cpuset cpu io memory pids\n")
    (base / "cgroup.subtree_control").write_text("\n")
    (base / "cgroup.procs").write_text(procs)
    return base


def test_a_delegated_v2_subtree_hands_memory_processes_and_cpu_to_each_sandbox(tmp_path):
    base = _fake_v2(tmp_path)
    groups = Cgroups.open(base)
    assert groups is not None and groups.version == 2
    # its processes went to the leaf first, then the controllers were handed down, to our parent too
    assert (base / LEAF / "cgroup.procs").read_text() == "4242"
    assert (base / "cgroup.subtree_control").read_text() == "+memory +pids +cpu"
    parent = groups.parents["memory"]
    assert parent.parent == base and (parent / "cgroup.subtree_control").read_text() == "+memory +pids +cpu"
    group = groups.create(300 << 20, 128)
    folder = group.folders["memory"]
    assert set(group.folders.values()) == {folder} and folder.parent == parent
    assert {f.name: f.read_text() for f in folder.iterdir()} == {"memory.max": str(300 << 20), "pids.max": "128",
                                                                 "cpu.max": "100000 100000"}
    group.add(5151)
    assert (folder / "cgroup.procs").read_text() == "5151" and not group.out_of_memory()
    (folder / "memory.events").write_text("low 0\nhigh 0\nmax 3\noom 1\noom_kill 1\n")
    assert group.out_of_memory()
    for name in os.listdir(folder):  # the kernel's files go with the folder
        os.unlink(folder / name)
    group.remove(wait=0)
    assert not folder.exists()


def _cgroup2_mount() -> Path | None:
    mount = cgroups._mount("cgroup2")
    return mount[0] if mount and os.geteuid() == 0 and os.access(mount[0], os.W_OK) else None


@pytest.mark.skipif(_cgroup2_mount() is None, reason="needs root and a cgroup v2 hierarchy")
def test_on_the_kernels_own_cgroup2_the_processes_move_before_the_controllers_are_handed_down(monkeypatch):
    """A real v2 hierarchy: the kernel refuses to hand controllers down from a group with processes in it, so the
    grader must move them to the leaf first; then a sandbox's process moves into its group. It uses the
    controllers the hierarchy's root already hands down (memory and pids on a v2 host; on a hybrid host, whatever
    v2 has, if anything: the test changes nothing outside its own groups)."""
    mount = _cgroup2_mount()
    available = (mount / "cgroup.subtree_control").read_text().split()
    if not available:
        pytest.skip("the v2 hierarchy's root hands no controller down here")
    if not set(cgroups.REQUIRED) <= set(available):
        monkeypatch.setattr(cgroups, "REQUIRED", tuple(available[:1]))
        monkeypatch.setattr(cgroups, "CONTROLLERS", tuple(available[:1]))
    wanted = [c for c in cgroups.CONTROLLERS if c in available]
    base = mount / f"mb-test-{os.getpid()}"
    holder = subprocess.Popen(["sleep", "60"])
    try:
        base.mkdir()
        (base / "cgroup.procs").write_text(str(holder.pid))  # a process in the group, as the grader in its own
        groups = Cgroups.open(base)
        assert groups is not None and groups.version == 2
        assert (base / LEAF / "cgroup.procs").read_text().split() == [str(holder.pid)]
        assert set(wanted) <= set((base / "cgroup.subtree_control").read_text().split())
        group = groups.create(64 << 20, 8)
        group.add(holder.pid)  # from the leaf into the sandbox's group, by the grader
        folder = group.folders[wanted[0]]
        assert cgroups.cgroup_paths(holder.pid)[""].endswith(f"/{folder.parent.name}/{folder.name}")
        if "memory" in wanted:
            assert int((folder / "memory.max").read_text()) == 64 << 20
        holder.kill()
        holder.wait()
        group.remove()
        groups.close()
        assert not folder.exists() and not folder.parent.exists()
    finally:
        holder.kill()
        holder.wait()
        for leftover in sorted(base.glob("**/"), key=lambda p: -len(p.parts)) if base.exists() else []:
            leftover.rmdir()


def test_a_v2_group_without_memory_or_pids_or_not_ours_is_not_used(tmp_path, monkeypatch):
    base = _fake_v2(tmp_path)
    (base / "cgroup.controllers").write_text("cpu io\n")
    assert Cgroups.open(base) is None
    monkeypatch.setattr(cgroups, "v2_group", lambda pid="self": base)
    monkeypatch.setattr(cgroups.Cgroups, "_v1", classmethod(lambda cls, name: None))
    base.chmod(0o500)  # not writable: not delegated to this process (root may write anyway)
    try:
        assert cgroups.delegated(base) == (os.geteuid() == 0 and not cgroups.SYSTEMD.is_dir())
    finally:
        base.chmod(0o700)


def test_the_systemd_scope_is_delegated_and_runs_the_command_as_the_sandbox_user(tmp_path, monkeypatch):
    (tmp_path / "cgroup.controllers").write_text("cpu memory pids\n")
    monkeypatch.setattr(cgroups, "SYSTEMD", tmp_path)  # as where systemd manages the machine
    monkeypatch.setattr(cgroups, "_mount", lambda kind, controller="": (tmp_path, "/") if kind == "cgroup2" else None)
    monkeypatch.setattr(cgroups.shutil, "which", lambda name: f"/usr/bin/{name}")
    cmd = scope_command(["python", "-c", "pass"], (999, 995))
    manager = [] if os.geteuid() == 0 else ["--user"]  # root: the system's manager; anyone else: their own
    assert cmd[:7 + len(manager)] == ["/usr/bin/systemd-run", *manager, "--scope", "--quiet", "--collect", "-p",
                                      "Delegate=yes", "--"]
    assert cmd[-9:] == ["--", "/usr/bin/setpriv", "--reuid=999", "--regid=995", "--clear-groups", "--", "python",
                        "-c", "pass"]
    assert scope_command(["python", "-c", "print('$HOME')"], None) is None  # systemd-run would expand it
    (tmp_path / "cgroup.controllers").write_text("cpu\n")
    assert scope_command(["python"], None) is None  # no memory controller in v2: not for us


FAKE_SYSTEMD_RUN = """#!/bin/sh
echo "$@" >> {log}
{fail}
while [ "$1" != "--" ]; do shift; done
shift
exec "$@"
"""


@needs_sandbox
@pytest.mark.parametrize("works", [True, False], ids=["scope", "systemd-run fails"])
def test_the_zygote_starts_in_a_systemd_scope_where_no_other_cgroup_may_be_made(works, monkeypatch):
    tmp = Path(tempfile.mkdtemp())
    try:
        tmp.chmod(0o755)
        log = tmp / "log"
        fail = "" if works else "echo 'Failed to connect to bus: No such file or directory' >&2; exit 1"
        (tmp / "systemd-run").write_text(FAKE_SYSTEMD_RUN.format(log=log, fail=fail))
        (tmp / "systemd-run").chmod(0o755)
        (tmp / "cgroup.controllers").write_text("memory pids\n")
        monkeypatch.setenv("PATH", f"{tmp}:{os.environ['PATH']}")
        monkeypatch.setattr(cgroups, "SYSTEMD", tmp)
        real_mount, real_open = cgroups._mount, Cgroups.open.__func__
        monkeypatch.setattr(cgroups, "_mount", lambda kind, c="": (tmp, "/") if kind == "cgroup2" else
                            real_mount(kind, c))
        # no cgroup but the "scope" the zygote runs in (this machine's v1 groups stand in for it)
        monkeypatch.setattr(sandbox.Cgroups, "open", classmethod(lambda cls, base=None: real_open(cls) if base else
                                                                 None))
        monkeypatch.setattr(sandbox, "v2_group", lambda pid: tmp)
        if not works:
            with pytest.raises(SandboxError) as refused:
                Launcher(limits=Limits(memory_mb=2050))
            assert NO_CGROUP_FLAG in str(refused.value) and "systemd-run: " in str(refused.value)
            assert "Failed to connect to bus" in str(refused.value)
            return
        launcher = Launcher(limits=Limits(memory_mb=2051))
        try:
            assert "--scope" in log.read_text() and "Delegate=yes" in log.read_text()
            status = Path(f"/proc/{launcher.zygote.pid}/status").read_text()
            assert status.split("Uid:")[1].split()[0] == str(launcher.uid) != "0"
            assert status.split("Groups:")[1].split("\n")[0].strip() == ""  # setpriv cleared root's groups
            box = launcher.spawn(frozenset(), None)
            reply = box.request({"op": "exec", "source": "print(6 * 7)"}, time.monotonic() + 60)
            assert reply["output"].strip() == "42" and box.group is not None
            box.close()
        finally:
            launcher.close()
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def test_without_any_cgroup_the_grader_refuses_unless_told_and_says_how(monkeypatch):
    monkeypatch.setattr(sandbox.Cgroups, "open", classmethod(lambda cls, base=None: None))
    monkeypatch.setattr(sandbox, "scope_command", lambda argv, user: None)
    monkeypatch.setattr(Launcher, "_probe", lambda self: None)
    if shutil.which("bwrap") is None:
        pytest.skip("bubblewrap is not installed")
    with pytest.raises(SandboxError) as refused:
        Launcher(limits=Limits(memory_mb=2052))
    message = str(refused.value)
    assert NO_CGROUP_FLAG in message and "Delegate=yes" in message and "memfd" in message


def test_a_group_is_one_folder_per_controller_in_v1_and_one_in_v2(tmp_path):
    for controller in ("memory", "pids"):
        (tmp_path / controller).mkdir()
    group = Group({c: tmp_path / c for c in ("memory", "pids")})
    group.add(77)
    assert all((tmp_path / c / "cgroup.procs").read_text() == "77" for c in ("memory", "pids"))
    (tmp_path / "memory" / "memory.failcnt").write_text("2\n")
    assert group.out_of_memory()
