"""The grader attacked where it runs a student's code with power, reads replies, walks folders and names rows.

One class folder holds honest students and one attacker per attack class; the grader grades it as the command
line does (``grade class/*``, so each student's folder is given by name, and ``class/*/*.ipynb`` for the
attackers that plant links), twice: started as root (a cgroup per sandbox where one may be made) and as an
ordinary user (no cgroup: with ``--no-cgroup-i-accept-per-process-limits``). Every attacker's row is asserted,
and every honest row, from either grader, must be exactly what the honest students get graded alone (once, by
the grader started as an ordinary user). The attack classes:

* root's powers from a cell: ``/proc/sys`` written, the host uid, system calls of the deny list (io_uring,
  keyrings, ptrace, mounts, namespaces, BPF, perf, userfaultfd, kexec, modules), sockets other than AF_UNIX;
* a reply that costs the grader: a tensor claiming gigabytes, a million values, a module description of
  500 names of thousands of parts, an int of thousands of digits;
* one student erasing the class: 20,000 notebooks in a folder that sorts first, 200 sparse 20 MB notebooks;
* reuse: lesson 07's LM built on the package's ``DecoderLM``;
* no cgroup: a writable ``/dev`` filled, processes started past the limit;
* memory no limit counts: 1.2 GB of memfd, System V shared memory and message queues, POSIX message queues,
  thousands of socket pairs with full buffers, pipes until the open-file limit, each filled;
* links: a student's notebook linked to ``solutions/``, a student folder that is a link, named by the glob;
* a returned module with a 22-million-element (88 MB) buffer, non-persistent (its data is not kept) and
  persistent (over the module limit);
* names: a newline, a Cyrillic look-alike, a C1 control, U+202E and U+2028 in a folder name, a nested folder
  named like another student; a 5,000-digit integer in the notebook's JSON;
* round 3: 3,000 cells that each raise and print format characters (the grader's memory, the report's bytes);
  names that differ only by case, surrounding space, an invisible character, or in another script (all
  Cyrillic, all Greek); a BEL in one folder's name and the letters ``\x07`` in another's; a notebook at the
  class root beside the folder of the same name; a hidden folder.

Then the sandbox itself, started as root and as an ordinary user: the student's process runs under a non-zero
host uid that is not ``nobody``'s, and another process of ``nobody`` or of the sandbox's own user can neither
trace nor read the pre-loaded interpreter, nor list or guess the notebooks' folders.
"""

import csv
import glob
import io
import json
import os
import pwd
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import nbformat
import pytest
from submissions import RIGHT_RMS, ROOT, WRONG_RMS, answered, read_report, sandbox_problem, solution_source, write

from modern_block.classroom.grading.class_folder import MAX_STUDENT_BYTES, MAX_STUDENT_ENTRIES
from modern_block.classroom.grading.engine import MAX_CELL_ROWS, MAX_REPORT_CHARS
from modern_block.classroom.grading.names import shown as one_line
from modern_block.classroom.grading.remote import MAX_MODULE_BYTES
from modern_block.classroom.grading.sandbox import OPEN_FILES
from modern_block.classroom.grading.sandbox_user import sandbox_user

REFERENCE = ROOT / "exercises"
TIMEOUT = 20  # per cell and check
L01, L07 = "01_rmsnorm", "07_llama_block"
GRADER_MEMORY = 768 << 20  # the grader's peak above its loaded interpreter in this class run (--jobs 2): its budget
# (the interpreter with torch is about 350 MB with the CPU build, about 0.6 GB more with PyPI's CUDA build)
ROOT_DENIED = ("io_uring_setup", "keyctl", "add_key", "request_key", "ptrace", "mount", "umount2", "pivot_root",
               "setns", "bpf", "perf_event_open", "userfaultfd", "kexec_load", "init_module", "finit_module")



SANDBOX_PROBLEM = sandbox_problem()
needs_sandbox = pytest.mark.skipif(SANDBOX_PROBLEM is not None, reason=f"no sandbox here: {SANDBOX_PROBLEM}")

ROOT_PROBE = """import ctypes, errno, json, os, socket
print("forged\\u2028line \\x9b31m \\u202eright-to-left")  # kept as the cell's output: escaped in every report
seen = {}
try:
    with open("/proc/sys/kernel/core_pattern", "w") as f:
        f.write("|/tmp/x")
    seen["core_pattern"] = "written"
except OSError as err:
    seen["core_pattern"] = type(err).__name__
seen["writable"] = []  # every file under /proc/sys, opened for writing
for top, _, names in os.walk("/proc/sys"):
    for name in names:
        try:
            os.close(os.open(os.path.join(top, name), os.O_WRONLY))
            seen["writable"].append(os.path.join(top, name))
        except OSError:
            pass
libc = ctypes.CDLL(None, use_errno=True)
numbers = {"io_uring_setup": 425, "keyctl": 250, "add_key": 248, "request_key": 249, "ptrace": 101, "mount": 165,
           "umount2": 166, "pivot_root": 155, "setns": 308, "bpf": 321, "perf_event_open": 298, "userfaultfd": 323,
           "kexec_load": 246, "init_module": 175, "finit_module": 313, "unshare": 272}
seen["calls"] = {}
for name, number in numbers.items():
    flags = 0x10000000 if name == "unshare" else 0  # a new user namespace
    result = libc.syscall(number, ctypes.c_long(flags), 0, 0, 0, 0)
    seen["calls"][name] = "ok" if result >= 0 else errno.errorcode[ctypes.get_errno()]
for family in ("AF_INET", "AF_NETLINK", "AF_PACKET"):
    try:
        socket.socket(getattr(socket, family), socket.SOCK_RAW if family != "AF_INET" else socket.SOCK_STREAM)
        seen[family] = "opened"
    except OSError as err:
        seen[family] = errno.errorcode[err.errno]
seen["dev"] = sorted(os.listdir("/dev"))
for path in ("/dev/shm/fill", "/dev/fill", "/proc/self/oom_score_adj"):
    try:
        with open(path, "w") as f:
            f.write("1" * 4096)
        seen[path] = "written"
    except OSError as err:
        seen[path] = type(err).__name__
raise RuntimeError("seen: " + json.dumps(seen))"""

FORK_PAST_THE_LIMIT = """import subprocess
children = []
try:
    for _ in range(400):
        children.append(subprocess.Popen(["sleep", "30"]))
    started = "all"
except OSError as err:
    started = f"{len(children)}: {type(err).__name__}"
for child in children:
    child.kill()
    child.wait()
raise RuntimeError("started " + started)"""

HOLD_MEMORY = """import ctypes, errno, fcntl, json, os, socket
libc = ctypes.CDLL(None, use_errno=True)
seen = {}


def attempt(call):
    try:
        return call()
    except OSError as err:
        return errno.errorcode[err.errno]


def c_result(result):
    return "ok" if result >= 0 else errno.errorcode[ctypes.get_errno()]


def memfd():
    fd = os.memfd_create("hold")
    for _ in range(1200):  # 1.2 GB that no address-space limit counts
        os.write(fd, bytes(1 << 20))
    return "held"


def sockets():
    pairs = []
    for _ in range(5000):  # about 1 GB of socket buffers
        a, b = socket.socketpair()
        a.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 1 << 22)
        a.setblocking(False)
        try:
            while True:
                a.send(bytes(1 << 16))
        except BlockingIOError:
            pairs.append((a, b))
    return "held"


seen["memfd"] = attempt(memfd)
seen["socketpair"] = attempt(sockets)
seen["shmget"] = c_result(libc.shmget(0, 1 << 30, 0o1000 | 0o600))
seen["msgget"] = c_result(libc.msgget(0, 0o1000 | 0o600))
seen["semget"] = c_result(libc.semget(0, 1, 0o1000 | 0o600))
seen["mq_open"] = c_result(libc.mq_open(b"/hold", os.O_CREAT | os.O_RDWR, 0o600, None))
pipes, held = [], 0
try:
    while True:  # pipes until the open-file limit, each as large as the kernel lets it be, then filled
        r, w = os.pipe()
        pipes.append((r, w))
        try:
            fcntl.fcntl(w, 1031, 1 << 20)  # F_SETPIPE_SZ
        except OSError:
            pass
        os.set_blocking(w, False)
        try:
            while True:
                held += os.write(w, bytes(1 << 16))
        except BlockingIOError:
            pass
except OSError as err:
    seen["pipes"] = [len(pipes), errno.errorcode[err.errno], held]
for r, w in pipes:  # measured: let go, so that the answers can be graded
    os.close(r)
    os.close(w)
raise RuntimeError("seen: " + json.dumps(seen))"""


def _reply(payload: str) -> str:
    """A setup cell after which every reply of the student's process is the frame ``payload`` builds
    (``_frame(text, tensors, data)``: the message's text, then ``data``, the tensors' offsets after the text)."""
    return ("import modern_block.classroom.grading.wire as _wire, struct, json\n"
            "def _frame(text, tensors={}, data=b''):\n"
            "    text = text.encode()\n"
            "    head = {'message': {'dtype': 'U8', 'shape': [len(text)], 'data_offsets': [0, len(text)]}}\n"
            "    head.update({k: {**v, 'data_offsets': [len(text) + o for o in v['data_offsets']]}\n"
            "                 for k, v in tensors.items()})\n"
            "    head = json.dumps(head).encode()\n"
            "    return struct.pack('<Q', len(head)) + head + text + data\n"
            f"_evil = {payload}\n"
            "_encode = _wire.encode\n"
            "_wire.encode = lambda message: _evil if 'values' in message or 'value' in message else _encode(message)")


REPLIES = {  # student -> the frame every reply becomes
    "reply_claims_4_gib": """_frame('{"T": 0}',
                                  {"0": {"dtype": "F32", "shape": [1 << 30], "data_offsets": [0, 4 << 30]}},
                                  bytes(4096))""",
    "reply_of_a_million_lists": '_frame("[" + "[]," * 1_000_000 + "[]]")',
    "reply_of_a_huge_int": """_frame('{"d": {"values": {"d": {"rms": ' + "7" * 5000 + ', "RMSNorm": 7}}}}')""",
}
DEEP_MODULE = """import modern_block.classroom.grading.runner as _runner
_runner.Runner.describe_module = staticmethod(lambda module: {"params": [], "buffers": [], "attrs": {},
                                                              "modules": [".".join(["a"] * 5000)] * 500})"""
ON_DECODER_LM = """class LlamaStyleLM(mb.DecoderLM):
    def __init__(self, V, d=256, n_layers=4, n_heads=8, n_kv_heads=2, d_ff=688, max_len=1024, rope_base=10000.0,
                 tie=False):
        super().__init__(emb=nn.Embedding(V, d), blocks=[mb.Block(d, n_heads, n_kv_heads, d_ff)
                                                         for _ in range(n_layers)],
                         norm=mb.RMSNorm(d), rope=mb.RotaryEmbedding(d // n_heads, max_len, rope_base),
                         max_len=max_len, tie=tie)"""
RMSNORM_WITH_BUFFER = """class RMSNorm(nn.Module):
    def __init__(self, d, eps=1e-6):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(d))
        self.register_buffer("junk", torch.zeros(22_000_000), persistent={persistent})  # 88 MB

    def forward(self, x):
        x32 = x.float()
        return (x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)).type_as(x) * self.weight"""
BAD_NAMES = {"h\u043enest01": "more than one script", "new\nline": "control", "c1\x9bcontrol": "control",
             "rlo\u202eevil": "control", "sep\u2028arator": "control", "\uff41lice": "stand for others",
             "honest01 ": "space before or after", " honest01": "space before or after",
             "honest01\ufe0f": "invisible (default-ignorable) characters (U+FE0F)",
             "honest01\u034f": "invisible (default-ignorable) characters (U+034F)", "honest01\u115f": "not graded",
             "zed\x07": "control"}
# by case, all Cyrillic, all Greek
LOOK_ALIKES = {"HONEST01": "honest01", "\u0430\u0441\u0435": "ace", "\u0391\u0392\u0395": "ABE"}
THREE_THOUSAND = 3000  # cells that each raise, printing format characters (each is escaped to six characters)


def honest(folder: Path) -> None:
    write(folder, "ace", L01, answered(L01, base="solutions"))  # names that other scripts can copy
    write(folder, "ABE", L01, answered(L01, dict(ex1_rms=RIGHT_RMS)))
    write(folder, "honest01", L01, answered(L01, base="solutions"))
    write(folder, "honest01", L07, answered(L07, base="solutions"))
    write(folder, "honest02", L01, answered(L01, dict(ex1_rms=WRONG_RMS, ex2_rmsnorm=solution_source(L01,
                                                                                                  "ex2_rmsnorm"))))


def attackers(folder: Path) -> dict:
    """Write the attackers; returns student -> what its row must be."""
    want: dict = {}
    right = dict(ex1_rms=RIGHT_RMS)
    write(folder, "root_probe", L01, answered(L01, right, before_first=ROOT_PROBE))
    want["root_probe"] = ["passed", "not attempted"]
    for student, payload in REPLIES.items():
        write(folder, student, L01, answered(L01, right, before_first=_reply(payload)))
        want[student] = ["failed", "failed"]
    for student in ("reply_at_the_limits_a", "reply_at_the_limits_b"):  # 92 MB each, graded side by side
        big = "def rms(x, eps=1e-6):\n    return torch.zeros(23_000_000)"
        write(folder, student, L01, answered(L01, dict(ex1_rms=big)))
        want[student] = ["failed", "not attempted"]
    write(folder, "reply_of_a_deep_module", L01, answered(L01, base="solutions", before_first=DEEP_MODULE))
    want["reply_of_a_deep_module"] = ["passed", "failed"]
    write(folder, "reuses_decoder_lm", L07, answered(L07, dict(ex2_llama_lm=ON_DECODER_LM)))
    want["reuses_decoder_lm"] = ["not attempted", "failed", "not attempted"]
    write(folder, "forks_past_the_limit", L01, answered(L01, right, before_first=FORK_PAST_THE_LIMIT))
    want["forks_past_the_limit"] = ["passed", "not attempted"]
    many = folder / "aaa_many_files"  # sorts first
    many.mkdir()
    for k in range(20_000):
        (many / f"{k:05d}.ipynb").touch()
    sparse = folder / "aab_sparse_notebooks"
    sparse.mkdir()
    for k in range(200):
        with open(sparse / f"{k:03d}.ipynb", "wb") as f:
            f.truncate(20_000_000)  # 20 MB each, nothing on disk
    want["aaa_many_files"] = f"more than {MAX_STUDENT_ENTRIES:,} files and folders"
    want["aab_sparse_notebooks"] = f"more than {MAX_STUDENT_BYTES >> 20} MB of notebooks"
    text = json.dumps(answered(L01, right)).replace('"nbformat": 4', '"nbformat": 4, "x": ' + "7" * 5000, 1)
    write(folder, "huge_integer", L01, text.encode())
    want["huge_integer"] = "a number of thousands of digits"
    for name, why in BAD_NAMES.items():
        write(folder, name, L01, answered(L01, right))
        want[name] = why
    write(folder / "nested_in_alice", "honest02", L01, answered(L01, right))  # a nested folder named like another
    want["nested_in_alice"] = ["passed", "not attempted"]
    write(folder, "holds_memory_outside_limits", L01, answered(L01, right, before_first=HOLD_MEMORY))
    want["holds_memory_outside_limits"] = ["passed", "not attempted"]
    for persistent, statuses_ in ((False, ["passed", "passed"]), (True, ["passed", "failed"])):
        student = f"module_with_{'persistent' if persistent else 'nonpersistent'}_88_mb"
        write(folder, student, L01, answered(L01, dict(ex1_rms=RIGHT_RMS, ex2_rmsnorm=RMSNORM_WITH_BUFFER.format(
            persistent=persistent))))
        want[student] = statuses_
    (folder / "links_to_the_solution").mkdir()
    (folder / "links_to_the_solution" / f"{L01}.ipynb").symlink_to(ROOT / "solutions" / f"{L01}.ipynb")
    outside = folder.parent / "outside"  # a folder of right answers outside the class, the student's folder a link
    write(outside, "copy", L01, answered(L01, base="solutions"))
    (folder / "folder_is_a_link").symlink_to(outside / "copy", target_is_directory=True)
    for student in ("links_to_the_solution", "folder_is_a_link"):
        want[student] = "a symbolic link"
    for name in LOOK_ALIKES:  # graded as themselves, flagged
        write(folder, name, L01, answered(L01, right))
        want[name] = ["passed", "not attempted"]
    write(folder, "zed\\x07", L01, answered(L01, right))  # the letters: not the BEL of "zed\x07"
    want["zed\\x07"] = ["passed", "not attempted"]
    many_cells = answered(L01, right)
    first = next(i for i, c in enumerate(many_cells.cells) if c.cell_type == "markdown" and "## Exercise" in c.source)
    flood = "print('\\u202e' * 5000)\nraise ValueError('\\u2066' * 3000)"
    many_cells.cells[first:first] = [nbformat.v4.new_code_cell(flood) for _ in range(THREE_THOUSAND)]
    write(folder, "three_thousand_cells", L01, many_cells)
    want["three_thousand_cells"] = ["passed", "not attempted"]
    write(folder, ".sneaky", L01, answered(L01, base="solutions"))
    want[".sneaky"] = "a hidden name"
    (folder / "honest01.ipynb").write_text(json.dumps(answered(L01, dict(ex1_rms=WRONG_RMS))))  # beside honest01/
    return want


LINKERS = ("links_to_the_solution", "folder_is_a_link")  # named by the shell's glob, class/*/*.ipynb


# the grader's own peak: VmHWM of its memory since exec (getrusage's ru_maxrss also counts the RSS of the process
# that started it, here a test worker's: 2 GB in a full suite run). Without a cgroup (none made, even where
# one could be) it grades with --no-cgroup-i-accept-per-process-limits.
GRADER = """import json, re, sys
from modern_block.classroom.grading import grade
from modern_block.classroom.grading import cgroups, sandbox
args = json.loads(sys.argv[1])
if sys.argv[2] == "no cgroup":
    cgroups.Cgroups.open = classmethod(lambda cls, base=None: None)
    sandbox.scope_command = lambda argv, user: None
    args.append(sandbox.NO_CGROUP_FLAG)
base = int(re.search(r"VmRSS:\\s+(\\d+) kB", open("/proc/self/status").read()).group(1)) << 10
status = grade.main(args)
peak = int(re.search(r"VmHWM:\\s+(\\d+) kB", open("/proc/self/status").read()).group(1)) << 10
print("@@", json.dumps({"status": status, "max_rss": peak, "loaded": base}))"""
ORDINARY = pwd.getpwnam("nobody")  # the ordinary user a root suite starts the grader as
GRADERS = ["root", "an ordinary user"]


def run_grader(args: list[str], grader: str) -> tuple[dict, str]:
    """``python -m modern_block grade ARGS`` in a subprocess, started as root (a cgroup where one may be made) or
    as an ordinary user (no cgroup); its status and peak memory."""
    as_other = grader != "root" and os.geteuid() == 0
    prefix = ["setpriv", f"--reuid={ORDINARY.pw_uid}", f"--regid={ORDINARY.pw_gid}", "--clear-groups"] \
        if as_other else []
    done = subprocess.run([*prefix, sys.executable, "-c", GRADER, json.dumps(args),
                           "cgroup" if grader == "root" else "no cgroup"], capture_output=True, timeout=1200,
                          cwd=ROOT, env={**os.environ, "HOME": "/tmp"})
    out = done.stdout.decode("utf-8")
    last = [line for line in out.splitlines() if line.startswith("@@ ")]
    assert last, done.stderr.decode()[-3000:]
    return json.loads(last[-1][3:]), out


@pytest.fixture(scope="module")
def open_base():
    """A folder every user may read and write below: the grader may run as an unprivileged user."""
    base = Path(tempfile.mkdtemp(prefix="attacks-"))
    base.chmod(0o777)
    yield base
    shutil.rmtree(base, ignore_errors=True)


@pytest.fixture(scope="module")
def class_folder(open_base):
    if SANDBOX_PROBLEM:
        pytest.skip(f"no sandbox here: {SANDBOX_PROBLEM}")
    folder, alone = open_base / "class", open_base / "alone"
    honest(folder)
    honest(alone)
    return folder, alone, attackers(folder)


@pytest.fixture(scope="module")
def alone_rows(open_base, class_folder):
    """The honest students graded alone, once, by the grader started as an ordinary user (the one that runs
    whoever runs the suite): every honest row of the class, from either grader, must be this one."""
    _, alone, _ = class_folder
    out = open_base / "alone_report"
    out.mkdir(mode=0o777)
    out.chmod(0o777)
    run_grader([str(alone), "--reference", str(REFERENCE), "--jobs", "2", "--timeout", str(TIMEOUT), "--json-file",
                str(out / "alone.json")], GRADERS[-1])
    return {(r["student"], Path(r["notebook"]).stem): r for r in
            read_report((out / "alone.json").read_text())["notebooks"]}


@pytest.fixture(scope="module", params=GRADERS)
def class_run(request, open_base, class_folder, alone_rows):
    grader = request.param
    if grader == "root" and os.geteuid() != 0:
        pytest.skip("the suite runs as an ordinary user")
    folder, _, want = class_folder
    core_pattern = Path("/proc/sys/kernel/core_pattern").read_text()
    out = open_base / grader.replace(" ", "_")
    out.mkdir(mode=0o777)
    out.chmod(0o777)
    outputs = [str(out / "grades.csv"), str(out / "report.json")]
    named = [str(p) for p in folder.iterdir() if p.name not in LINKERS]
    named += [p for student in LINKERS for p in glob.glob(str(folder / student / "*.ipynb"))]  # as a shell would
    started = time.monotonic()
    result, stdout = run_grader([*sorted(named), "--reference", str(REFERENCE), "--jobs", "2", "--timeout",
                                 str(TIMEOUT), "--csv", outputs[0], "--json-file", outputs[1]], grader)
    seconds = time.monotonic() - started
    doc = read_report(Path(outputs[1]).read_text(encoding="utf-8"))
    rows: dict = {}
    for r in doc["notebooks"]:
        rows.setdefault(r["student"], []).append(r)
    return {"result": result, "stdout": stdout, "rows": rows, "want": want, "alone": alone_rows, "seconds": seconds,
            "csv": Path(outputs[0]).read_text(encoding="utf-8"), "json": Path(outputs[1]).read_text(encoding="utf-8"),
            "core_pattern": core_pattern, "grader": grader}


def statuses(row) -> list[str]:
    return [e["status"] for e in row["exercises"]]


def _seen(row) -> dict:
    return json.loads("\n".join(c["error"] for c in row["cells"]).split("seen: ", 1)[1].split("\\n")[0])


@needs_sandbox
def test_the_class_is_graded_within_the_memory_budget_and_every_row_is_there(class_run):
    assert class_run["result"]["status"] == 1
    assert class_run["result"]["max_rss"] - class_run["result"]["loaded"] < GRADER_MEMORY, class_run["result"]
    honest_keys = set(class_run["alone"])
    got = {(s, Path(r["notebook"]).stem) for s, rs in class_run["rows"].items() for r in rs}
    assert honest_keys <= got and {one_line(s) for s in class_run["want"]} <= {s for s, _ in got}
    peak, loaded = class_run["result"]["max_rss"] >> 20, class_run["result"]["loaded"] >> 20
    print(f"\n[attacks, grader started as {class_run['grader']}] {len(got)} rows in {class_run['seconds']:.0f} s; "
          f"grader peak memory {peak} MB, {loaded} MB of it the loaded interpreter (budget above it "
          f"{GRADER_MEMORY >> 20} MB)")


@needs_sandbox
def test_every_honest_row_is_what_the_honest_students_alone_get(class_run):
    for (student, lesson), alone in class_run["alone"].items():
        (row,) = [r for r in class_run["rows"][student] if Path(r["notebook"]).stem == lesson]
        assert statuses(row) == statuses(alone) and row["error"] == alone["error"] is None, (student, lesson)
        assert [e["detail"].split(" by up to ")[0] for e in row["exercises"]] == \
            [e["detail"].split(" by up to ")[0] for e in alone["exercises"]]
    assert statuses(class_run["alone"][("honest01", L07)]) == ["passed"] * 3


@needs_sandbox
def test_each_attacker_gets_its_own_row_and_nothing_more(class_run):
    rows = class_run["rows"]
    for student, want in class_run["want"].items():
        (row,) = [r for r in rows[one_line(student)] if not r["notebook"].endswith(f"{student}.ipynb")]
        if isinstance(want, list):
            assert row["status"] == "graded" and statuses(row) == want, (student, json.dumps(row)[:2000])
        else:
            assert row["status"] == "error" and want in row["error"], (student, row["error"])


@needs_sandbox
def test_no_cell_has_roots_powers(class_run):
    (row,) = class_run["rows"]["root_probe"]
    seen = _seen(row)
    assert seen["core_pattern"] in ("PermissionError", "OSError"), seen  # /proc is read-only, the uid not 0
    assert seen["writable"] == [], seen
    assert Path("/proc/sys/kernel/core_pattern").read_text() == class_run["core_pattern"]
    assert {name: seen["calls"][name] for name in ROOT_DENIED} == dict.fromkeys(ROOT_DENIED, "EPERM"), seen
    assert seen["calls"]["unshare"] == "EPERM"
    assert seen["AF_INET"] == seen["AF_NETLINK"] == seen["AF_PACKET"] == "EAFNOSUPPORT", seen
    assert seen["dev"] == ["fd", "null", "random", "stderr", "stdin", "stdout", "urandom", "zero"], seen
    assert seen["/dev/shm/fill"] == "FileNotFoundError" and seen["/dev/fill"] == "OSError", seen
    assert seen["/proc/self/oom_score_adj"] == "OSError", seen  # no knob of /proc is writable


@needs_sandbox
def test_a_reply_that_would_cost_the_grader_only_fails_its_exercise(class_run):
    rows = class_run["rows"]
    for student in REPLIES:
        details = [e["detail"] for e in rows[student][0]["exercises"]]
        if student == "reply_of_a_huge_int":  # read, the int left out: the check cannot call it
            assert "'Unsupported' object is not callable" in details[0] and "internal error" not in details[1], details
            continue
        assert all("sent a reply the grader cannot read" in d for d in details), (student, details)
    assert "a name longer than" in rows["reply_of_a_deep_module"][0]["exercises"][1]["detail"]
    assert "not a valid safetensors frame" in rows["reply_claims_4_gib"][0]["exercises"][0]["detail"]
    assert "too many values" in rows["reply_of_a_million_lists"][0]["exercises"][0]["detail"]


@needs_sandbox
def test_reuse_of_the_packages_base_class_does_not_pass(class_run):
    detail = class_run["rows"]["reuses_decoder_lm"][0]["exercises"][1]["detail"]
    assert "modern_block.DecoderLM is not available while this notebook is graded" in detail, detail


@needs_sandbox
def test_without_a_cgroup_the_process_limit_holds(class_run):
    (row,) = class_run["rows"]["forks_past_the_limit"]
    error = "\n".join(c["error"] for c in row["cells"])
    assert "started " in error and "started all" not in error and "BlockingIOError" in error, error


@needs_sandbox
def test_names_are_escaped_flagged_and_never_taken_from_deeper_folders(class_run):
    rows, text = class_run["rows"], class_run["csv"] + class_run["json"] + class_run["stdout"]
    assert len(rows["nested_in_alice"]) == 1 and len(rows["honest02"]) == 1  # the nested one is alice's own
    assert not {"\x9b", "\u202e", "\u2028"} & set(text)  # shown escaped everywhere
    assert "forged\\u2028line \\x9b31m \\u202eright" in rows["root_probe"][0]["cells"][0]["output"]  # a cell's output
    assert rows["h\u043enest01"][0]["status"] == "error" and rows["honest01"][0]["status"] == "graded"
    book = list(csv.reader(io.StringIO(class_run["csv"])))
    records = 1 + sum(max(1, len(report["exercises"])) for reports in rows.values() for report in reports)
    assert len(class_run["csv"].splitlines()) == len(book) == records  # one line per record: nothing forged
    assert {"new\\nline", "c1\\x9bcontrol", "rlo\\u202eevil", "sep\\u2028arator"} <= {row[0] for row in book}


@needs_sandbox
def test_no_memory_that_no_limit_counts_can_be_held(class_run):
    (row,) = class_run["rows"]["holds_memory_outside_limits"]
    seen = _seen(row)
    refused = ("memfd", "socketpair", "shmget", "msgget", "semget", "mq_open")
    assert {k: seen[k] for k in refused} == dict.fromkeys(refused, "EPERM"), seen
    count, why, held = seen["pipes"]  # pipes: up to the open-file limit, their buffers within the user's allowance
    allowance = int(Path("/proc/sys/fs/pipe-user-pages-soft").read_text()) * 4096
    assert why == "EMFILE" and count <= OPEN_FILES // 2 and held <= allowance + (1 << 20) + count * (8 << 10), seen


@needs_sandbox
def test_a_returned_module_is_held_without_its_recomputed_buffers_and_bounded(class_run):
    rows = class_run["rows"]
    assert statuses(rows["module_with_nonpersistent_88_mb"][0]) == ["passed", "passed"]  # its formula is right
    detail = rows["module_with_persistent_88_mb"][0]["exercises"][1]["detail"]
    assert f"at most {MAX_MODULE_BYTES >> 20} MB" in detail and "a module of 84 MB" in detail, detail


@needs_sandbox
def test_no_link_is_followed_out_of_a_students_folder(class_run):
    for student in LINKERS:
        (row,) = class_run["rows"][student]
        assert row["status"] == "error" and row["exercises"] == [] and "symbolic link" in row["error"], row


@needs_sandbox
def test_one_notebook_of_3000_raising_cells_costs_the_grader_a_bounded_report(class_run):
    """Round 3: 3,000 cells each printing 5,000 format characters (30,000 once escaped) and raising with 3,000
    more took the grader to 1.3 GB and report.json to 174 MB. Escaped before cut, the first cells listed."""
    (row,) = class_run["rows"]["three_thousand_cells"]
    assert len(row["cells"]) == MAX_CELL_ROWS and f"{THREE_THOUSAND - MAX_CELL_ROWS:,} more cells" in row["notes"][0]
    kept = sum(len(c["error"]) + len(c["output"]) for c in row["cells"]) + sum(map(len, row["notes"]))
    assert kept < MAX_REPORT_CHARS, kept
    line = next(x for x in class_run["json"].splitlines() if '"three_thousand_cells"' in x)
    assert len(line.encode()) < 3 * MAX_REPORT_CHARS  # the whole report of the notebook, as JSON (backslashes doubled)
    assert all(len(c["output"]) <= 1_500 + 20 and "\\u202e" in c["output"] for c in row["cells"])


@needs_sandbox
def test_look_alike_names_are_flagged_and_keep_their_own_rows(class_run):
    rows = class_run["rows"]
    for name, honest_name in LOOK_ALIKES.items():
        (row,) = rows[name]
        note = " ".join(row["notes"])
        assert "looks like" in note and repr(honest_name) in note, note
        honest_notes = " ".join(n for r in rows[honest_name] for n in r["notes"])
        assert repr(name) in honest_notes, honest_notes  # both are told, neither loses its grade
    assert rows["zed\\\\x07"][0]["status"] == "graded" and rows["zed\\x07"][0]["status"] == "error"  # two rows
    beside = [r for r in rows["honest01"] if r["notebook"].endswith("class/honest01.ipynb")]
    assert len(beside) == 1 and "beside the folder of the same name" in beside[0]["error"]
    assert "a hidden name" in rows[".sneaky"][0]["error"]


# ---- the sandbox as root and as an ordinary user ----------------------------------------------------------

UID_PROBE = """import json, sys, time
from modern_block.classroom.grading.sandbox import Launcher, Limits
launcher = Launcher(limits=Limits(without_cgroup=True))  # a cgroup where one may be made
box = launcher.spawn(frozenset(), None)
reply = box.request({"op": "exec", "source": sys.argv[1]}, time.monotonic() + 60)
uid = int(open(f"/proc/{box.pid}/status").read().split("Uid:")[1].split()[0])
seccomp = open(f"/proc/{box.pid}/status").read().split("Seccomp:")[1].split()[0]
box.close()
launcher.close()
print("@@", json.dumps({"uid": uid, "seccomp": seccomp, "error": reply["error"]}))"""


@needs_sandbox
@pytest.mark.parametrize("user", ["the grader's", "an ordinary user"])
def test_the_students_process_never_runs_as_host_root(user):
    if user == "an ordinary user" and os.geteuid() != 0:
        pytest.skip("the suite already runs as an ordinary user")
    nobody = ORDINARY
    prefix = [] if user == "the grader's" else ["setpriv", f"--reuid={nobody.pw_uid}", f"--regid={nobody.pw_gid}",
                                                "--clear-groups"]
    done = subprocess.run([*prefix, sys.executable, "-c", UID_PROBE, ROOT_PROBE], capture_output=True, text=True,
                          timeout=300, cwd="/", env={**os.environ, "HOME": "/tmp"})
    last = [line for line in done.stdout.splitlines() if line.startswith("@@ ")]
    assert last, done.stderr[-3000:]
    seen = json.loads(last[-1][3:])
    expected_uid = nobody.pw_uid if prefix else (sandbox_user() or (os.getuid(), 0))[0]
    assert seen["uid"] == expected_uid != 0 and seen["seccomp"] == "2", seen  # 2: a seccomp filter is loaded
    assert prefix or os.geteuid() != 0 or seen["uid"] != nobody.pw_uid  # a root grader's sandboxes: never nobody
    inside = json.loads(seen["error"][1].split("seen: ", 1)[1])
    assert inside["core_pattern"] in ("PermissionError", "OSError") and set(inside["calls"].values()) == {"EPERM"}, \
        inside
    assert inside["writable"] == [], inside
    assert inside["AF_INET"] == "EAFNOSUPPORT" and inside["/proc/self/oom_score_adj"] == "OSError", inside


ZYGOTE_PROBE = """import json, os, pwd, subprocess, sys
from modern_block.classroom.grading.sandbox import Launcher, Limits
launcher = Launcher(limits=Limits(without_cgroup=True))
box = launcher.spawn(frozenset(), b'{"cells": []}')
(folder,) = box.files
zygote = launcher.zygote.pid
targets = {"mem": f"/proc/{zygote}/mem", "environ": f"/proc/{zygote}/environ", "run folder": str(launcher.run_dir),
           "notebook": str(folder / "notebook.ipynb"), "guessed": str(launcher.run_dir / "notebook-1.ipynb")}
others = {"the same user": []}
if os.geteuid() == 0:  # nobody, and another process of the sandbox's own user
    nobody = pwd.getpwnam("nobody")
    others = {"nobody": ["setpriv", f"--reuid={nobody.pw_uid}", f"--regid={nobody.pw_gid}", "--clear-groups"],
              "the sandbox user": ["setpriv", f"--reuid={launcher.uid}", f"--regid={launcher.user[1]}",
                                   "--clear-groups"]}
seen = {}
for who, prefix in others.items():
    done = subprocess.run([*prefix, sys.executable, "-c", sys.argv[1], json.dumps(targets), str(zygote)],
                          capture_output=True, text=True, cwd="/")
    seen[who] = json.loads(done.stdout.splitlines()[-1]) if done.stdout else done.stderr[-2000:]
box.close()
launcher.close()
print("@@", json.dumps({"uid": launcher.uid, "seen": seen}))"""
ATTEMPT = """import ctypes, errno, json, os, sys
targets, zygote = json.loads(sys.argv[1]), int(sys.argv[2])
out = {}
for name, path in targets.items():
    try:
        if os.path.isdir(path):
            os.listdir(path)
        else:
            os.close(os.open(path, os.O_RDONLY))
        out[name] = "opened"
    except OSError as err:
        out[name] = errno.errorcode[err.errno]
libc = ctypes.CDLL(None, use_errno=True)
attached = libc.ptrace(16, zygote, 0, 0)  # PTRACE_ATTACH
out["ptrace"] = "attached" if attached == 0 else errno.errorcode[ctypes.get_errno()]
if attached == 0:
    libc.ptrace(17, zygote, 0, 0)  # PTRACE_DETACH
print(json.dumps(out))"""


@needs_sandbox
@pytest.mark.parametrize("grader", GRADERS)
def test_no_other_process_reads_the_preloaded_interpreter_or_finds_the_notebooks(grader):
    if grader == "root" and os.geteuid() != 0:
        pytest.skip("the suite runs as an ordinary user")
    prefix = ["setpriv", f"--reuid={ORDINARY.pw_uid}", f"--regid={ORDINARY.pw_gid}", "--clear-groups"] \
        if grader != "root" and os.geteuid() == 0 else []
    done = subprocess.run([*prefix, sys.executable, "-c", ZYGOTE_PROBE, ATTEMPT], capture_output=True, text=True,
                          timeout=300, cwd="/", env={**os.environ, "HOME": "/tmp"})
    last = [line for line in done.stdout.splitlines() if line.startswith("@@ ")]
    assert last, done.stderr[-3000:]
    result = json.loads(last[-1][3:])
    for who, seen in result["seen"].items():  # the zygote is not dumpable: no process of any user may trace it
        assert isinstance(seen, dict) and seen["mem"] == seen["environ"] == "EACCES" and seen["ptrace"] == "EPERM", \
            (who, seen)
    if grader == "root":  # a user of its own, not nobody's; its run folder unlistable, each notebook's name random
        assert result["uid"] not in (0, ORDINARY.pw_uid)
        nobody, own = result["seen"]["nobody"], result["seen"]["the sandbox user"]
        assert nobody["run folder"] == nobody["notebook"] == own["run folder"] == "EACCES", result
        assert nobody["guessed"] == own["guessed"] == "ENOENT", result
