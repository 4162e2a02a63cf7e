"""The summative grader, ``python -m modern_block grade``, against a class with attackers in it.

The grade is decided outside the student's process, each submission runs in a bubblewrap sandbox of its own,
and trust flows one way; so none of the attacks below changes a grade, loses a row or touches another
student's row. Every attack is a submission in one class folder, graded by the command line in a subprocess
together with honest submissions of the same lessons; each test looks at its own row, and
``test_every_honest_row_is_what_the_honest_class_alone_gets`` grades the honest ones alone and compares.

The attack classes (issue 25): wrong answers that change the check's inputs; facts forged by the student's
process (a tied head, the package's implementation used); reading what is not the submission's (solutions, the
reference, classmates, other users' files, the network, the grader's processes) and leaving files behind; one
notebook taking the class down (a quadratic regular expression, links to special files, undecodable names,
lone surrogates, huge numbers, planted output paths); a forged gradebook (formulas, escape sequences); and the
older ones (replaced checks, exits, endless loops, floods, allocations).
"""

import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import nbformat
import pytest
from submissions import (
    IDENTITY_RMSNORM,
    LAYERNORM_RMSNORM,
    RIGHT_RMS,
    ROOT,
    WRONG_RMS,
    answered,
    exercise,
    injected,
    read_report,
    sandbox_problem,
    solution_source,
    write,
)

from modern_block.classroom.grading import engine, grade, sandbox
from modern_block.classroom.grading.class_folder import Submission

REFERENCE = ROOT / "exercises"
TIMEOUT = 12  # seconds per cell and check in the class run; the endless notebooks cost this much each
MARKER = "4242.5"  # `sleep 4242.5`: the detached child a submission leaves behind
LEFT_BEHIND = "modern-block-left-behind"  # files the probes write into their /tmp and /dev/shm



SANDBOX_PROBLEM = sandbox_problem()
needs_sandbox = pytest.mark.skipif(SANDBOX_PROBLEM is not None, reason=f"no sandbox here: {SANDBOX_PROBLEM}")
MUTATE_TABLES = "cos.fill_(1.0)  # the check's tables, were they shared: no rotation at all\nsin.zero_()"


def probe(paths: list[str], port: int, name: str) -> str:
    """A setup cell that looks around the sandbox and reports what it saw in its error message."""
    return f"""import json, os, socket
seen = {{"read": []}}
for path in {paths!r}:
    try:
        with open(path, "rb") as f:
            f.read(1)
        seen["read"].append(path)
    except OSError:
        pass
seen["pids"] = sorted(int(p) for p in os.listdir("/proc") if p.isdigit())
try:
    socket.create_connection(("127.0.0.1", {port}), timeout=2).sendall(b"my answers")
    seen["net"] = "connected"
except OSError as err:
    seen["net"] = type(err).__name__
seen["caps"] = open("/proc/self/status").read().split("CapEff:")[1].split()[0]
seen["root"] = sorted(os.listdir("/"))
for folder in ("/tmp", "/dev/shm"):
    try:
        seen[folder] = sorted(n for n in os.listdir(folder) if n.startswith("{LEFT_BEHIND}"))
        with open(os.path.join(folder, "{LEFT_BEHIND}-{name}"), "w") as f:
            f.write("x")
    except OSError as err:  # no /dev/shm in the sandbox
        seen[folder] = type(err).__name__
raise RuntimeError("seen: " + json.dumps(seen))"""


def attacks(folder: Path, secret: Path, port: int) -> dict[tuple[str, str], list[str]]:
    """Write the class folder; returns, per (student, lesson), the statuses the grade must have."""
    victim = folder / "honest_right" / "01_rmsnorm.ipynb"
    l01 = "01_rmsnorm"
    expected: dict[tuple[str, str], list[str]] = {}

    def add(student, lesson, statuses, answers=None, setup=None, base="exercises"):
        write(folder, student, lesson, answered(lesson, answers or {}, setup, base=base))
        expected[(student, lesson)] = statuses

    # honest students, one right and one wrong per lesson where the attacks are
    for lesson, n in (("01_rmsnorm", 2), ("03_rope", 3), ("04_gqa_kv_cache", 3), ("06_qk_norm", 2),
                      ("07_llama_block", 3)):
        add("honest_right", lesson, ["passed"] * n, base="solutions")
    add("honest_wrong", l01, ["failed", "failed"], dict(ex1_rms=WRONG_RMS, ex2_rmsnorm=LAYERNORM_RMSNORM))
    add("helper_named_check_something", l01, ["passed", "not attempted"], dict(
        ex1_rms="def check_finite(t):\n    assert torch.isfinite(t).all()\n    return t\n\n\n" + RIGHT_RMS
                + "\n\n\ncheck_finite(rms(torch.ones(3)))"))

    # wrong answers that change the check's inputs (the tables) so that the expected value would follow them
    add("mutates_the_tables", "03_rope", ["not attempted", "failed", "failed"], dict(
        ex2_apply_rope=f"def apply_rope(x, cos, sin):\n    {MUTATE_TABLES.replace(chr(10), chr(10) + '    ')}\n"
                       "    return x.clone()",
        ex3_interleaved="def apply_rope_interleaved(x, cos, sin):\n    cos.fill_(1.0)\n    sin.zero_()\n"
                        "    return x.clone()"))
    add("mutates_the_tables", "04_gqa_kv_cache", ["not attempted", "not attempted", "failed"], dict(
        ex3_kv_cache=injected("04_gqa_kv_cache", "ex3_kv_cache", "B, T, _ = x.shape", MUTATE_TABLES)))
    add("mutates_the_tables", "06_qk_norm", ["failed", "not attempted"], dict(
        ex1_qk_norm_rope=injected("06_qk_norm", "ex1_qk_norm_rope", "q, k = q_norm(q)", MUTATE_TABLES)))
    add("mutates_the_tables", "07_llama_block", ["failed", "not attempted", "not attempted"], dict(
        ex1_block=injected("07_llama_block", "ex1_block", "x = x + self.attn", MUTATE_TABLES)))

    # a forbidden torch function with the checks' import deleted: the sandbox's stub hides it all the same
    dropped = answered("00_gpt2_block", dict(ex2_causal_attention="def causal_attention(q, k, v):\n"
                       "    return F.scaled_dot_product_attention(q, k, v, is_causal=True)"), base="solutions")
    dropped.cells[3].source = dropped.cells[3].source.replace("\n\nfrom modern_block.classroom import checks", "")
    assert "checks" not in dropped.cells[3].source
    write(folder, "drops_the_checks_import", "00_gpt2_block", dropped)
    expected[("drops_the_checks_import", "00_gpt2_block")] = ["passed", "failed", "passed", "passed"]

    # facts the student's process reports: a tied head, which implementation ran
    untied = solution_source("07_llama_block", "ex2_llama_lm").replace(
        "self.head.weight = self.emb.weight  # one matrix, two uses", "self.tie_claimed = True")
    forge_tie = """import modern_block.classroom.grading.runner as _runner
_describe = _runner.Runner.describe_module


def _forged(module):  # report head.weight as the embedding's, though it is a matrix of its own
    desc = _describe(module)
    if getattr(module, "tie_claimed", False):
        for param in desc["params"]:
            if param[0] == "head.weight":
                param[1], param[2] = None, "emb.weight"
    return desc


_runner.Runner.describe_module = staticmethod(_forged)"""
    add("forges_the_tie", "07_llama_block", ["not attempted", "failed", "not attempted"], dict(ex2_llama_lm=untied),
        setup=forge_tie)
    add("switches_off_reuse_detection", l01, ["not attempted", "failed"], dict(
        ex2_rmsnorm="import sys\nimport modern_block.classroom.grading.runner as _runner\n"
                    "sys.setprofile = lambda *a, **k: None\n_runner.origin = lambda obj: []\n"
                    "_runner.tracing = lambda entered: __import__('contextlib').nullcontext()\n"
                    "from modern_block import RMSNorm"))
    add("execs_the_package_source", l01, ["not attempted", "failed"], dict(
        ex2_rmsnorm="import inspect, modern_block.rmsnorm as _m\nexec(inspect.getsource(_m))"))
    add("uses_the_checks_reference", l01, ["failed", "not attempted"], dict(
        ex1_rms="from modern_block.classroom.checks.formulas import rms_norm64\n\n\ndef rms(x, eps=1e-6):\n"
                "    return rms_norm64(x, None, eps).float() * 0 + (x.float().pow(2).mean(-1, keepdim=True) "
                "+ eps).sqrt()"))
    add("searches_for_the_package", l01, ["not attempted", "failed"], dict(
        ex2_rmsnorm="import os, sys\nfor top in [*sys.path, '/work', '/root', '/home', '/usr']:\n"
                    "    for dirpath, _, files in os.walk(top):\n"
                    "        if 'rmsnorm.py' in files:\n"
                    "            text = open(os.path.join(dirpath, 'rmsnorm.py')).read()\n"
                    "            if 'x32 * torch.rsqrt' in text:\n"
                    "                exec(text)\n                break\n"
                    "    if 'RMSNorm' in globals() and 'x32' in open(os.path.join(dirpath, 'rmsnorm.py')).read():\n"
                    "        break"))

    # reading what is not the submission's, reaching out, leaving files behind
    readable = [str(ROOT / "solutions" / "01_rmsnorm.ipynb"), str(REFERENCE / "01_rmsnorm.ipynb"), str(victim),
                str(secret), "/etc/passwd", "/root/.bashrc", str(Path.home())]
    add("reads_the_solutions", l01, ["failed", "not attempted"], dict(
        ex1_rms="import json\nfor path in " + repr(readable[:3]) + ":\n    try:\n"
                "        cells = json.loads(open(path).read())['cells']\n    except OSError:\n        continue\n"
                "    for c in cells:\n        if 'def rms' in ''.join(c['source']):\n"
                "            exec(''.join(c['source']))\nif 'rms' not in globals():\n" + "\n".join(
                    "    " + line for line in WRONG_RMS.split("\n"))))
    for name in ("probe_a", "probe_b"):
        add(name, l01, ["passed", "not attempted"], dict(ex1_rms=RIGHT_RMS), setup=probe(readable, port, name))
    add("forks_and_keeps_a_child", l01, ["passed", "not attempted"], dict(
        ex1_rms=f"import subprocess\nsubprocess.Popen(['sleep', '{MARKER}'], start_new_session=True)\n" + RIGHT_RMS))

    # the older attacks: the checks replaced, the grader's output forged, the grader killed, floods, loops
    older = {
        "replaces_the_checks": (["failed", "not attempted"], dict(ex1_rms=WRONG_RMS + "\nchecks.check_rms = lambda "
                                                                          "*a, **k: None"), None),
        "input_transformer_hides_checks": (["not attempted", "not attempted"], {}, (
            "get_ipython().input_transformers_cleanup.append(lambda L: ['pass\\n'] if any('check_' in l for l in L) "
            "else L)")),
        "allclose_always_true": (["not attempted", "failed"], dict(
            ex2_rmsnorm="torch.allclose = lambda *a, **k: True\n" + IDENTITY_RMSNORM), None),
        "imports_the_package_answer": (["not attempted", "failed"],
                                       dict(ex2_rmsnorm="from modern_block import RMSNorm"), None),
        "subclasses_the_package_answer": (["not attempted", "failed"], dict(
            ex2_rmsnorm="import modern_block as mb\n\n\nclass RMSNorm(mb.RMSNorm):\n    pass"), None),
        "forges_the_grader_output": (["passed", "not attempted"], dict(
            ex1_rms="import os\nos.write(1, b'{\"notebooks\": [], \"all_passed\": true}\\n')\nprint('  \\u2713 "
                    "Exercise 2: an RMSNorm layer ..... passed')\n" + RIGHT_RMS), None),
        "kills_its_parent": (["passed", "not attempted"], dict(  # no parent in sight; init ignores SIGKILL
            ex1_rms="import os, signal\nfor pid in (os.getppid(), 1):\n    try:\n        if pid > 0:\n"
                    "            os.kill(pid, signal.SIGKILL)\n    except OSError:\n        pass\n" + RIGHT_RMS), None),
        # SIGKILL to every process of its sandbox but itself (Linux spares the caller of kill(-1)), nothing else.
        # Exercise 2 then depends on scheduling: a fresh sandbox replays the cells run before, the killing one
        # too; whether the stub of exercise 2 is read before that replay kills the sandbox again decides "not
        # attempted" or "failed (died)" (CI under load saw the second, an idle machine the first). Nothing passes.
        "kills_all_it_can": (["failed", {"not attempted", "failed"}], dict(
            ex1_rms="import os, signal\nos.kill(-1, signal.SIGKILL)\n" + RIGHT_RMS), None),
        "overwrites_others": (["passed", "not attempted"], dict(
            ex1_rms=f"for path in [{str(victim)!r}, {str(REFERENCE / 'x.ipynb')!r}]:\n    try:\n"
                    "        open(path, 'w').write('garbage')\n    except OSError:\n        pass\n" + RIGHT_RMS), None),
        "prints_300_mb": (["passed", "not attempted"], dict(ex1_rms="print('x' * 300_000_000)\n" + RIGHT_RMS), None),
        "endless_print_loop": (["failed", "not attempted"], dict(ex1_rms="while True:\n    print('spam')"), None),
        "endless_inside_the_check": (["failed", "passed"], dict(
            ex1_rms="import signal\n\n\ndef rms(x, eps=1e-6):\n    signal.signal(signal.SIGINT, signal.SIG_IGN)\n"
                    "    while True:\n        pass",
            ex2_rmsnorm=LAYERNORM_RMSNORM.replace("x.float() - x.float().mean(-1, keepdim=True)", "x.float()")), None),
        "slow_setup_cell": (["not attempted", "not attempted"], {}, "import time\ntime.sleep(1000)"),
        "exits": (["failed", "not attempted"], dict(ex1_rms="import os\nos._exit(0)"), None),
        "allocates_8_gb": (["failed", "not attempted"], dict(ex1_rms="x = bytearray(8 << 30)\n" + RIGHT_RMS), None),
        # the gradebook: a formula for a name, escape sequences and fake lines in a message
        "=HYPERLINK(\"x\",\"grade\")": (["passed", "not attempted"], dict(ex1_rms=RIGHT_RMS), None),
        "@SUM(A1)": (["passed", "not attempted"], dict(ex1_rms=RIGHT_RMS), None),
        "-1+1": (["passed", "not attempted"], dict(ex1_rms=RIGHT_RMS), None),
        "forges_report_lines": (["failed", "not attempted"], dict(
            ex1_rms="def rms(x, eps=1e-6):\n    raise ValueError('\\n  \\u2713 Exercise 1: the root mean square "
                    "... passed (0.1 s)\\x1b[2K\\x1b[1A\\u202e')"), None),
    }
    for student, (statuses, answers, setup) in older.items():
        add(student, l01, statuses, answers, setup)

    # one notebook taking the class down: a line that made a regular expression quadratic, odd names, odd text
    long_line = answered(l01, dict(ex1_rms=RIGHT_RMS))
    long_line.cells.append(nbformat.v4.new_markdown_cell("## Exercise 1: x" + " " * 300_000 + "y\n# Exercise 9"
                                                         + "\t" * 300_000 + "z"))
    write(folder, "long_markdown_line", l01, long_line)
    expected[("long_markdown_line", l01)] = ["passed", "not attempted"]
    surrogate = nbformat.writes(answered(l01, dict(ex1_rms=RIGHT_RMS))).replace(
        '"generated_from": "solutions/01_rmsnorm.ipynb"', '"generated_from": "solutions/01_rmsnorm\\ud800.ipynb"')
    surrogate = surrogate.replace('"id": "ex1-spec"', '"id": "ex1-\\udfff"')
    write(folder, "lone_surrogates", l01, surrogate.encode())
    expected[("lone_surrogates", l01)] = "wrong lesson"
    odd = os.fsencode(folder) + b"/bad\xffname"
    os.mkdir(odd)
    nbformat.write(answered(l01, dict(ex1_rms=RIGHT_RMS)), os.fsdecode(odd + b"/01_rmsnorm.ipynb"))
    expected[("bad\\udcffname", l01)] = "bad name"  # an error row under the escaped name
    return expected


def malformed(folder: Path, fifo: Path) -> dict[tuple[str, str], str]:
    """Files that are not a notebook of the lesson, links and special files: an error row each."""
    rows = {"not_json": b"this is not JSON {", "empty": b"", "binary": bytes(range(256)) * 8,
            "nbformat_99": json.dumps({"nbformat": 99, "nbformat_minor": 0, "metadata": {}, "cells": []}).encode(),
            "no_cells": json.dumps({"nbformat": 4, "nbformat_minor": 5, "metadata": {}, "cells": []}).encode(),
            "other_lesson": exercise("02_swiglu")}
    for student, content in rows.items():
        write(folder, student, "01_rmsnorm", content)
    (folder / "a_folder" / "01_rmsnorm.ipynb").mkdir(parents=True)
    os.mkfifo(folder / "a_fifo.ipynb")  # reading it would block for ever
    links = {"link_to_a_fifo": fifo, "link_to_dev_zero": Path("/dev/zero"),
             "link_to_the_solution": ROOT / "solutions" / "01_rmsnorm.ipynb"}
    for student, target in links.items():
        (folder / student).mkdir()
        (folder / student / "01_rmsnorm.ipynb").symlink_to(target)
    (folder / "linked_folder").symlink_to(ROOT / "solutions")
    reasons = {"not_json": "not a notebook: not valid JSON", "empty": "the file is empty", "binary": "not UTF-8 text",
               "nbformat_99": "nbformat 99 is not supported", "no_cells": "the notebook has no cells",
               "other_lesson": "graded against the wrong lesson?", "a_folder": "not a regular file",
               **{s: "a symbolic link" for s in links}}
    return {**{(s, "01_rmsnorm"): r for s, r in reasons.items()}, ("a_fifo", "a_fifo"): "not a regular file",
            ("linked_folder", "linked_folder"): "a symbolic link"}


@pytest.fixture(scope="module")
def class_run(tmp_path_factory):
    if SANDBOX_PROBLEM:
        pytest.skip(f"no sandbox here: {SANDBOX_PROBLEM}")
    base = tmp_path_factory.mktemp("grading")
    folder, secret = base / "class", base / "private" / "key.txt"
    secret.parent.mkdir()
    secret.write_text("another user's secret")
    secret.chmod(0o600)
    fifo = base / "fifo"
    os.mkfifo(fifo)
    listener = socket.create_server(("127.0.0.1", 0))
    listener.settimeout(0.2)
    connections = []

    def accept():
        while listener.fileno() != -1:
            try:
                connections.append(listener.accept()[0].recv(100))
            except OSError:
                continue

    threading.Thread(target=accept, daemon=True).start()
    expected = attacks(folder, secret, listener.getsockname()[1])
    errors = malformed(folder, fifo)
    protected = {p: p.read_bytes() for p in (folder / "honest_right" / "01_rmsnorm.ipynb",
                                             REFERENCE / "01_rmsnorm.ipynb")}
    started = time.monotonic()
    proc = subprocess.run([sys.executable, "-m", "modern_block", "grade", str(folder), "--reference", str(REFERENCE),
                           "--jobs", "2", "--json-file", str(base / "report.json"), "--csv", str(base / "grades.csv"),
                           "--timeout", str(TIMEOUT)], capture_output=True, timeout=1200, cwd=ROOT)
    seconds = time.monotonic() - started
    listener.close()
    doc = read_report((base / "report.json").read_text(encoding="utf-8"))
    rows = {(r["student"], Path(r["notebook"]).stem): r for r in doc["notebooks"]}
    return {"proc": proc, "doc": doc, "rows": rows, "expected": expected, "errors": errors, "base": base,
            "csv": (base / "grades.csv").read_text(encoding="utf-8"), "seconds": seconds, "protected": protected,
            "connections": connections, "stdout": proc.stdout.decode("utf-8")}


def statuses(row) -> list[str]:
    return [e["status"] for e in row["exercises"]]


def as_expected(got: list[str], want: list) -> bool:
    """Each exercise's status is the one expected, or one of a set where scheduling decides between them."""
    if len(got) != len(want):
        return False
    return all(g in w if isinstance(w, set) else g == w for g, w in zip(got, want, strict=True))


def cell_errors(row) -> str:
    return "\n".join(c["error"] for c in row["cells"])


@needs_sandbox
def test_the_class_run_ends_with_exit_status_1_and_every_row(class_run):
    assert class_run["proc"].returncode == 1, class_run["proc"].stderr.decode()
    assert class_run["proc"].stderr == b""
    rows, expected = class_run["rows"], class_run["expected"]
    assert set(rows) == set(expected) | set(class_run["errors"])
    print(f"[class run] {len(rows)} submissions with attacks graded in {class_run['seconds']:.0f} s")


@needs_sandbox
@pytest.mark.parametrize("kind", ["honest", "attack"])
def test_no_attack_changes_a_grade(class_run, kind):
    for key, want in class_run["expected"].items():
        if key[0].startswith(("honest", "helper")) != (kind == "honest") or want in ("wrong lesson", "bad name"):
            continue
        row = class_run["rows"][key]
        assert row["status"] == "graded", (key, row["error"])
        assert as_expected(statuses(row), want), (key, json.dumps(row, indent=1, ensure_ascii=True)[:3000])


@needs_sandbox
def test_every_honest_row_is_what_the_honest_class_alone_gets(class_run, tmp_path):
    """The honest submissions, graded alone: the same statuses, cell errors and row errors."""
    for key in class_run["expected"]:
        if key[0].startswith(("honest", "helper")):
            source = class_run["base"] / "class" / key[0] / f"{key[1]}.ipynb"
            write(tmp_path, key[0], key[1], source.read_bytes())
    alone = grade.grade_paths([tmp_path], REFERENCE, jobs=2, options=grade.Options(timeout=TIMEOUT))
    assert len(alone) == sum(k[0].startswith(("honest", "helper")) for k in class_run["expected"])
    for report in alone:
        row = class_run["rows"][(report.student, Path(report.notebook).stem)]
        assert statuses(row) == [e.status for e in report.exercises]
        assert [d["detail"].split(" by up to ")[0] for d in row["exercises"]] == \
            [e.detail.split(" by up to ")[0] for e in report.exercises]
        assert row["error"] == report.error and [c["cell"] for c in row["cells"]] == [c["cell"] for c in report.cells]


@needs_sandbox
def test_changed_inputs_do_not_flow_back(class_run):
    rows = class_run["rows"]
    assert "x is returned unrotated" in rows[("mutates_the_tables", "03_rope")]["exercises"][1]["detail"]
    assert "was not rotated" in rows[("mutates_the_tables", "06_qk_norm")]["exercises"][0]["detail"]
    for lesson, n in (("04_gqa_kv_cache", 2), ("07_llama_block", 0)):
        assert rows[("mutates_the_tables", lesson)]["exercises"][n]["status"] == "failed"


@needs_sandbox
def test_a_forbidden_torch_function_raises_without_the_checks_import(class_run):
    detail = class_run["rows"][("drops_the_checks_import", "00_gpt2_block")]["exercises"][1]["detail"]
    assert "scaled_dot_product_attention is not available in this exercise" in detail, detail


@needs_sandbox
def test_facts_are_established_by_behaviour(class_run):
    rows = class_run["rows"]
    detail = rows[("forges_the_tie", "07_llama_block")]["exercises"][1]["detail"]
    assert detail.startswith("check_llama_lm: forward(idx) with the same model with tie=True"), detail
    for student in ("switches_off_reuse_detection", "execs_the_package_source", "imports_the_package_answer",
                    "subclasses_the_package_answer", "searches_for_the_package"):
        detail = rows[(student, "01_rmsnorm")]["exercises"][1]["detail"]
        assert "modern_block.RMSNorm is not available while this notebook is graded" in detail or \
            "RMSNorm is not defined" in detail, (student, detail)
    assert "No module named 'modern_block.classroom.checks.formulas'" in \
        rows[("uses_the_checks_reference", "01_rmsnorm")]["exercises"][0]["detail"]


@needs_sandbox
def test_the_sandbox_shows_nothing_but_the_submission(class_run):
    rows = class_run["rows"]
    assert "No such file" in rows[("reads_the_solutions", "01_rmsnorm")]["exercises"][0]["detail"] or \
        "the mean was subtracted" in rows[("reads_the_solutions", "01_rmsnorm")]["exercises"][0]["detail"]
    for name in ("probe_a", "probe_b"):
        seen = json.loads(cell_errors(rows[(name, "01_rmsnorm")]).split("seen: ", 1)[1])
        assert seen["read"] == [], seen  # no solution, reference, classmate, other user's file, /etc or home
        assert seen["pids"] == [1, 2, 3], seen  # bubblewrap's init, its holder, the student's process
        assert seen["net"] in ("ConnectionRefusedError", "OSError", "TimeoutError"), seen
        assert seen["caps"] == "0000000000000000" and seen["/tmp"] == [] and seen["/dev/shm"] == "FileNotFoundError", \
            seen
        assert not {"etc", "home", "sys", "var", "mnt"} & set(seen["root"]), seen  # only what the sandbox lists
    assert class_run["connections"] == []
    for folder in ("/tmp", "/dev/shm"):
        assert not [n for n in os.listdir(folder) if n.startswith(LEFT_BEHIND)]
    for path, content in class_run["protected"].items():
        assert path.read_bytes() == content, f"a submission changed {path}"


@needs_sandbox
def test_nothing_a_submission_started_is_left_running(class_run):
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ")
        except OSError:
            continue
        assert MARKER.encode() not in cmdline, f"process {pid} ({cmdline!r}) survived its submission"


@needs_sandbox
def test_the_older_attacks_are_still_diagnosed(class_run):
    rows = {s: r for (s, lesson), r in class_run["rows"].items() if lesson == "01_rmsnorm"}
    assert "the mean was subtracted" in rows["replaces_the_checks"]["exercises"][0]["detail"]
    assert "LayerNorm" in rows["honest_wrong"]["exercises"][1]["detail"]
    assert rows["endless_inside_the_check"]["exercises"][0]["detail"].startswith("timed out")
    assert rows["endless_inside_the_check"]["restarts"] == 1
    assert "timed out" in rows["endless_print_loop"]["exercises"][0]["detail"]
    assert "timed out" in rows["slow_setup_cell"]["cells"][0]["error"]
    assert rows["slow_setup_cell"]["seconds"] < 2 * TIMEOUT + 20  # the cell is stopped once, never re-run
    assert "MemoryError" in rows["allocates_8_gb"]["exercises"][0]["detail"]
    assert "exited with status 0" in rows["exits"]["exercises"][0]["detail"]
    assert "died" in rows["kills_all_it_can"]["exercises"][0]["detail"]


@needs_sandbox
def test_hostile_text_stays_in_its_row(class_run):
    rows, errors = class_run["rows"], class_run["errors"]
    for key, reason in errors.items():
        row = rows[key]
        assert row["status"] == "error" and reason in row["error"], (key, row["error"])
    assert rows[("long_markdown_line", "01_rmsnorm")]["seconds"] < 3 * TIMEOUT
    wrong = rows[("lone_surrogates", "01_rmsnorm")]
    assert "01_rmsnorm\\ud800.ipynb" in wrong["error"] and "graded against the wrong lesson?" in wrong["error"]
    bad = rows[("bad\\udcffname", "01_rmsnorm")]  # an undecodable name: escaped, and its row an error
    assert bad["status"] == "error" and "control or invisible characters" in bad["error"], bad
    stdout = class_run["stdout"]
    assert "\x1b" not in stdout and "\u202e" not in stdout and "all_passed" not in stdout
    forged = [line for line in stdout.splitlines() if line.startswith("  ✓ Exercise 1: the root mean square")]
    passed_ex1 = sum(r["exercises"][0]["status"] == "passed" for (s, lesson), r in class_run["rows"].items()
                     if lesson == "01_rmsnorm" and r["exercises"])
    assert len(forged) == passed_ex1  # no line a student wrote looks like a result
    assert "\\x1b[2K" in stdout and "\\n  ✓ Exercise 1" in stdout  # shown, escaped, on its row's line


@needs_sandbox
def test_the_gradebook_has_one_safe_row_per_submission(class_run):
    import csv
    import io

    book = list(csv.reader(io.StringIO(class_run["csv"])))
    assert book[0][:6] == ["student", "notebook", "reference", "status", "lesson", "exercise"]
    # one row per student and exercise; a notebook that could not be graded: one row per exercise of its
    # lesson where the reference is known, else one row
    assert len(book) - 1 == sum(len(r["exercises"]) or 1 for r in class_run["rows"].values())
    assert len({row[1] for row in book[1:]}) == len(class_run["rows"])  # every notebook has its rows
    for row in book[1:]:
        assert not any(cell.startswith(("=", "+", "-", "@")) for cell in row), row
    students = {row[0] for row in book[1:]}
    assert {"'=HYPERLINK(\"x\",\"grade\")", "'@SUM(A1)", "'-1+1", "bad\\udcffname"} <= students
    honest = [row for row in book[1:] if row[0] == "honest_right" and row[1].endswith("01_rmsnorm.ipynb")]
    assert [row[3:11] for row in honest] == [
        ["graded", "01_rmsnorm", "ex1_rms", "1", "the root mean square", "passed", "1", "1"],
        ["graded", "01_rmsnorm", "ex2_rmsnorm", "2", "an RMSNorm layer", "passed", "1", "1"]]


# ---- one at a time: no reference, planted outputs, a full or read-only disk ----------------------------------


@needs_sandbox
def test_without_a_reference_a_folder_is_never_graded_by_its_own_check_cells(tmp_path, capsys):
    """Round 3: a notebook graded against its own check cells awarded itself 50/50 and a new 100/100 lesson. Now
    only --self grades a notebook against its own cells (1 point per check, no lesson); a folder without a
    trusted reference gets error rows; a number too large to print in a check cell is refused there."""
    right = answered("01_rmsnorm", base="solutions")
    huge = answered("01_rmsnorm", dict(ex1_rms=RIGHT_RMS))
    rich = answered("01_rmsnorm", base="solutions")
    for nb in (right, huge, rich):
        nb.metadata.pop("modern_block", None)  # not generated from the solutions: no course reference
    for cell in huge.cells:
        if cell.source.startswith("checks.check_rms"):
            cell.source = "checks.check_rms(0x" + "f" * 5000 + ")"
    for cell in rich.cells:
        if cell.metadata.get("nbgrader", {}).get("grade"):
            cell.metadata["nbgrader"]["points"] = 50  # what it says it is worth
    rich.cells.append(nbformat.v4.new_markdown_cell("## Exercise 9: free points"))
    rich.cells.append(nbformat.v4.new_code_cell("checks.check_rms(rms)", metadata={"nbgrader": {"points": 100}}))
    write(tmp_path, "honest", "01_rmsnorm", right)
    write(tmp_path, "huge_number", "01_rmsnorm", huge)
    write(tmp_path, "rich", "01_rmsnorm", rich)
    assert grade.main([str(tmp_path), "--json"]) == 1
    rows = {r["student"]: r for r in read_report(capsys.readouterr().out)["notebooks"]}
    assert all(r["status"] == "error" and "no reference" in r["error"] and r["lesson"] == "" for r in rows.values())
    assert grade.main([str(tmp_path / "rich" / "01_rmsnorm.ipynb"), "--self", "--json"]) == 0
    (own,) = read_report(capsys.readouterr().out)["notebooks"]
    assert own["lesson"] == "" and own["summary"]["max_score"] == 3 and own["summary"]["score"] == 3  # 1 per check
    assert grade.main([str(tmp_path / "huge_number" / "01_rmsnorm.ipynb"), "--self", "--json"]) == 1
    (own,) = read_report(capsys.readouterr().out)["notebooks"]
    assert own["status"] == "error" and "short literals" in own["error"]


@pytest.mark.parametrize("option", ["--csv", "--json-file"])
def test_a_planted_output_path_is_refused_before_grading(tmp_path, option, capsys):
    solution = str(ROOT / "solutions" / "01_rmsnorm.ipynb")
    target = tmp_path / "victim.txt"
    target.write_text("keep me")
    (tmp_path / "a_link").symlink_to(target)
    (tmp_path / "a_folder").mkdir()
    for planted, message in (("a_link", "a symbolic link is there"), ("a_folder", "not a regular file")):
        assert grade.main([solution, "--reference", str(REFERENCE), option, str(tmp_path / planted)]) == 2
        err = capsys.readouterr().err
        assert message in err and "Traceback" not in err and err.count("\n") == 1
    assert target.read_text() == "keep me" and (tmp_path / "a_folder").is_dir()


def _mount_tmpfs(path: Path, options: str) -> bool:
    path.mkdir()
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(path)], capture_output=True)
    return done.returncode == 0


@needs_sandbox
@pytest.mark.parametrize("disk", ["full", "read-only"])
def test_a_full_or_read_only_disk_ends_with_one_line_after_the_report(tmp_path, disk, capsys):
    target = tmp_path / "out"
    if not _mount_tmpfs(target, "size=16k" if disk == "full" else "ro,size=16k"):
        pytest.skip("this process may not mount a tmpfs (root in a VM or a privileged container can)")
    try:
        if disk == "full":
            with open(target / "filler", "wb", buffering=0) as f:  # every byte of it
                try:
                    for _ in range(64):
                        f.write(b"x" * 1024)
                except OSError:
                    pass
        solution = str(ROOT / "solutions" / "01_rmsnorm.ipynb")
        status = grade.main([solution, "--reference", str(REFERENCE), "--csv", str(target / "grades.csv"),
                             "--json-file", str(target / "report.json")])
        out, err = capsys.readouterr()
        lines = err.splitlines()
        if disk == "read-only":  # the outputs are opened before grading: refused at once
            assert status == 2 and out == "" and len(lines) == 1 and "Read-only file system" in lines[0], err
            return
        assert status == 1 and "2 exercises: 2 passed" in out  # the report is printed whole
        assert lines and all("not written (the report above is complete)" in line for line in lines), err
        assert "No space left" in lines[0]
    finally:
        subprocess.run(["umount", str(target)], check=False)


@needs_sandbox
def test_the_outputs_are_written_afresh_as_each_notebook_is_graded(tmp_path, capsys):
    csv_path, json_path = tmp_path / "grades.csv", tmp_path / "report.json"
    csv_path.write_text("an old file")
    for student in ("ada", "ben"):
        write(tmp_path / "class", student, "01_rmsnorm", answered("01_rmsnorm", base="solutions"))
    argv = [str(tmp_path / "class"), "--reference", str(REFERENCE), "--csv", str(csv_path), "--json-file",
            str(json_path)]
    assert grade.main(argv) == 0
    assert csv_path.read_text().startswith("student,") and len(csv_path.read_text().splitlines()) == 1 + 4
    assert [r["student"] for r in read_report(json_path.read_text())["notebooks"]] == ["ada", "ben"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["class", "grades.csv", "report.json"]


# ---- the whole course: solutions pass, untouched exercises are not attempted ------------------------------


@needs_sandbox
def test_every_solution_passes_and_every_untouched_exercise_is_not_attempted():
    refs = grade.load_reference(REFERENCE)
    subs = grade.collect([ROOT / "solutions", REFERENCE])
    reports = grade.grade_all(subs, refs, grade.Options(timeout=120), jobs=2)
    solutions = [r for r in reports if r.notebook.startswith(str(ROOT / "solutions"))]
    untouched = [r for r in reports if r.notebook.startswith(str(REFERENCE))]
    assert len(solutions) == len(untouched) == len(refs) == 14  # lessons 00-11, 08b and 09b
    for r in solutions:
        assert r.all_passed and not r.cells and r.restarts == 0, grade.format_report(r)
    for r in untouched:
        assert r.exercises and {e.status for e in r.exercises} == {grade.NOT_ATTEMPTED}, grade.format_report(r)
        assert all(": not implemented yet (the stub says:" in e.detail for e in r.exercises)


@needs_sandbox
def test_without_a_reference_a_deleted_check_does_not_pass(tmp_path):
    nb = answered("01_rmsnorm", dict(ex1_rms=RIGHT_RMS, ex2_rmsnorm=IDENTITY_RMSNORM))
    for cell in nb.cells:
        if cell.source.startswith("checks.check_rmsnorm"):
            cell.source = "# " + cell.source  # the check commented out
    nb.metadata.pop("modern_block")  # nor can the course's reference be found from the metadata
    own = write(tmp_path, "s", "01_rmsnorm", nb)
    (report,) = grade.grade_paths([own], own=True)  # --self
    assert [(e.number, e.status) for e in report.exercises] == [(1, "passed"), (2, "failed")]
    assert "no check cell" in report.exercises[1].detail and "--reference" in report.notes[0]
    nb = answered("01_rmsnorm", dict(ex1_rms=RIGHT_RMS, ex2_rmsnorm=IDENTITY_RMSNORM))  # with the metadata
    for cell in nb.cells:
        if cell.source.startswith("checks.check_rmsnorm"):
            cell.source = "print('all good')"
    (report,) = grade.grade_paths([write(tmp_path, "t", "01_rmsnorm", nb)])
    assert [e.status for e in report.exercises] == ["passed", "failed"]
    assert "the course's solutions/01_rmsnorm.ipynb" in report.notes[0]


@needs_sandbox
def test_the_notebook_time_limit_gives_an_error_row(tmp_path):
    nb = answered("01_rmsnorm", dict(ex1_rms="import time\ntime.sleep(3)\n" + RIGHT_RMS,
                                     ex2_rmsnorm="import time\ntime.sleep(3)\n" + IDENTITY_RMSNORM))
    subs = grade.collect([write(tmp_path, "slow", "01_rmsnorm", nb)])
    (report,) = grade.grade_all(subs, grade.load_reference(REFERENCE / "01_rmsnorm.ipynb"),
                                grade.Options(timeout=10, notebook_timeout=4.5))
    assert report.error.startswith("the notebook ran past its time limit (4.5 s)")
    assert [e.status for e in report.exercises] == ["passed", "not graded"]
    assert report.seconds < 9


@needs_sandbox
def test_memory_is_bounded_for_the_whole_sandbox(tmp_path):
    """Four children of 500 MB each: each is within the per-process limit, together they are not. Each holds its
    memory for 6 s, long enough for all four to hold it at once (they start within a second)."""
    launcher = grade.launcher_for(None, grade.Limits(memory_mb=256, cpu_seconds=120))
    if launcher.cgroups is None:
        pytest.skip("no cgroup may be created here: memory is bounded per process (and the pid namespace)")
    hog = ("import subprocess, sys\nchildren = [subprocess.Popen([sys.executable, '-c', 'import time; "
           "b = bytearray(500 << 20); b[::4096] = bytes(len(b[::4096])); time.sleep(6)']) for _ in range(4)]\n"
           "codes = [c.wait() for c in children]\n"
           "def rms(x, eps=1e-6):\n    assert codes == [0, 0, 0, 0], codes\n"
           "    return (x.float().pow(2).mean(-1, keepdim=True) + eps).sqrt()")
    write(tmp_path, "hog", "01_rmsnorm", answered("01_rmsnorm", dict(ex1_rms=hog)))
    write(tmp_path, "honest", "01_rmsnorm", answered("01_rmsnorm", base="solutions"))
    reports = grade.grade_all(grade.collect([tmp_path]), grade.load_reference(REFERENCE / "01_rmsnorm.ipynb"),
                              grade.Options(timeout=60), jobs=2, limits=grade.Limits(memory_mb=256, cpu_seconds=120))
    rows = {r.student: r for r in reports}
    assert rows["honest"].all_passed
    assert rows["hog"].exercises[0].status == "failed", grade.format_report(rows["hog"])


@needs_sandbox
def test_without_the_sandbox_flag_the_submissions_run_as_plain_processes(tmp_path):
    write(tmp_path, "right", "01_rmsnorm", answered("01_rmsnorm", base="solutions"))
    (report,) = grade.grade_all(grade.collect([tmp_path]), grade.load_reference(REFERENCE / "01_rmsnorm.ipynb"),
                                limits=grade.Limits(sandbox=False))
    assert report.all_passed, grade.format_report(report)


@needs_sandbox
def test_without_a_cgroup_only_the_flag_or_self_grades_in_the_sandbox(tmp_path, monkeypatch, capsys):
    """No cgroup can be made: a class is refused with the flag named; --no-cgroup-i-accept-per-process-limits
    grades it in the sandbox, and so does --self (one notebook of the student's own), never as plain processes."""
    monkeypatch.setattr(sandbox.Cgroups, "open", classmethod(lambda cls, base=None: None))
    monkeypatch.setattr(sandbox, "scope_command", lambda argv, user: None)
    monkeypatch.setattr(engine, "_LAUNCHERS", {})  # launchers of their own, closed at the end
    notebook = write(tmp_path, "ada", "01_rmsnorm", answered("01_rmsnorm", base="solutions"))
    reference = str(REFERENCE / "01_rmsnorm.ipynb")
    try:
        assert grade.main([str(tmp_path), "--reference", reference]) == 2
        err = capsys.readouterr().err
        assert sandbox.NO_CGROUP_FLAG in err and "Traceback" not in err
        assert grade.main([str(tmp_path), "--reference", reference, sandbox.NO_CGROUP_FLAG, "--json"]) == 0
        assert grade.main([str(notebook), "--self", "--json"]) == 0
        for line in capsys.readouterr().out.splitlines():
            assert json.loads(line)["exercises"] and "WITHOUT isolation" not in line, line
        (used,) = engine._LAUNCHERS.values()  # one sandboxed launcher served both, without a cgroup
        assert used.limits == sandbox.Limits(without_cgroup=True) and used.cgroups is None and used.bwrap
    finally:
        for launcher in engine._LAUNCHERS.values():
            launcher.close()


# ---- the command line -----------------------------------------------------------------------------------


@pytest.mark.parametrize("args, message", [
    (["--timeout", "nan"], "--timeout: must be between"), (["--timeout", "0"], "--timeout: must be between"),
    (["--jobs", "0"], "--jobs: must be between"), (["--kernel", "no-such-kernel"], "no Jupyter kernel named"),
    (["--csv", "/no/such/folder/g.csv"], "--csv: the folder of"),
])
def test_bad_arguments_are_clean_errors(args, message, capsys):
    assert grade.main([str(ROOT / "solutions" / "01_rmsnorm.ipynb"), "--reference", str(REFERENCE), *args]) == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err


def test_an_unusable_reference_or_no_submissions_is_a_clean_error(tmp_path, capsys):
    bad = tmp_path / "ref.ipynb"
    bad.write_text("{ not json")
    no_exercises = write(tmp_path, "x", "plain", nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell("1")]))
    solution = str(ROOT / "solutions" / "01_rmsnorm.ipynb")
    for argv, message in [([solution, "--reference", str(bad)], "not a notebook: not valid JSON"),
                          ([solution, "--reference", str(no_exercises)], "no exercises found"),
                          ([solution, "--reference", str(tmp_path / "missing.ipynb")], "no such notebook"),
                          ([str(tmp_path / "missing.ipynb")], "no such notebook or folder"),
                          ([str(tmp_path / "x")], "no notebooks found")]:
        if argv == [str(tmp_path / "x")]:
            (tmp_path / "x" / "plain.ipynb").unlink()
        assert grade.main(argv) == 2, argv
        err = capsys.readouterr().err
        assert message in err and "Traceback" not in err, err


@needs_sandbox
def test_a_cp1252_console_gets_the_text_report(monkeypatch):
    import io

    raw = io.BytesIO()
    monkeypatch.setattr(sys, "stdout", io.TextIOWrapper(raw, encoding="cp1252"))
    solution = str(ROOT / "solutions" / "01_rmsnorm.ipynb")
    assert grade.main([solution, "--reference", str(REFERENCE)]) == 0
    text = raw.getvalue().decode("cp1252")
    assert "? Exercise 1: the root mean square" in text and "passed" in text
    monkeypatch.setattr(sys, "stdout", io.TextIOWrapper(raw := io.BytesIO(), encoding="cp1252"))
    assert grade.main([solution, "--reference", str(REFERENCE), "--json"]) == 0
    assert json.loads(raw.getvalue().decode("cp1252"))["summary"]["passed"] == 2


@needs_sandbox
def test_a_typed_in_value_fails_in_the_grader_and_a_computed_one_passes(tmp_path):
    """A value item whose text asks for the value computed: the grader reads the submission's cells, as the
    notebook reads its input history."""
    right = 61 * (512 + 64) * 2
    reports = {}
    for student, answer in (("typed", f"kimi_k2_cache_bytes = {right}"),
                            ("computed", "n_layers = 61\nkimi_k2_cache_bytes = n_layers * (512 + 64) * 2")):
        nb = answered("05_mla", dict(ex5_kimi_k2_cache=answer), base="solutions")
        (reports[student],) = grade.grade_paths([write(tmp_path, student, "05_mla", nb)], REFERENCE)
    status = {k: {e.number: (e.status, e.detail) for e in r.exercises}[5] for k, r in reports.items()}
    assert status["computed"][0] == "passed", status
    assert status["typed"][0] == "failed" and "typed in" in status["typed"][1], status


def test_a_renamed_notebook_is_matched_to_its_lesson_by_its_prefix_08_or_08b():
    # no metadata and no check cells to go by: the file name's lesson prefix decides, and "08b_" is not "08_"
    refs = grade.load_reference(ROOT / "exercises")
    empty = json.dumps({"cells": [], "metadata": {}, "nbformat": 4, "nbformat_minor": 5}).encode()
    for name, lesson in (("08b_mine.ipynb", "08b_ladder_and_ablations.ipynb"),
                         ("08_mine.ipynb", "08_train_llama_vs_gpt2.ipynb")):
        ref, problem = grade._reference_for(Submission(name, name, "ada"), empty, refs, own=False)
        assert problem is None and ref is refs[lesson], (name, problem)


@needs_sandbox
def test_a_run_stopped_midway_keeps_what_it_graded(tmp_path):
    """Round 3: the outputs were written only at the end, so a grader stopped by one endless submission lost the
    class's grades. Each notebook's rows are written as soon as it is graded."""
    write(tmp_path / "class", "ada", "01_rmsnorm", answered("01_rmsnorm", base="solutions"))
    write(tmp_path / "class", "zed", "01_rmsnorm", answered("01_rmsnorm", before_first="import time\ntime.sleep(1000)"))
    csv_path, json_path = tmp_path / "grades.csv", tmp_path / "report.jsonl"
    # the grader's working folder, which a killed grader cannot remove, goes in a folder this test removes (one
    # the sandbox's user may traverse, as /tmp)
    work = Path(tempfile.mkdtemp(prefix="stopped-grader-"))
    work.chmod(0o711)
    proc = subprocess.Popen([sys.executable, "-m", "modern_block", "grade", str(tmp_path / "class"), "--reference",
                             str(REFERENCE), "--timeout", "900", "--csv", str(csv_path), "--json-file", str(json_path)],
                            cwd=ROOT, env={**os.environ, "TMPDIR": str(work)}, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 600
        while time.monotonic() < deadline and not (json_path.exists() and json_path.read_text().count("\n") >= 1):
            time.sleep(1)
        time.sleep(3)  # zed's notebook is running now, for 1,000 s
        assert proc.poll() is None
    finally:
        proc.kill()
        proc.wait()
        leftover = [p.name for p in work.iterdir()]
        shutil.rmtree(work, ignore_errors=True)
    assert [name.split("-")[:3] for name in leftover] == [["modern", "block", "grade"]]  # it went there
    rows = csv_path.read_text(encoding="utf-8").splitlines()
    assert rows[0].startswith("student,") and [r.split(",")[0] for r in rows[1:]] == ["ada", "ada"]
    assert [r["student"] for r in read_report(json_path.read_text(encoding="utf-8"))["notebooks"]] == ["ada"]
