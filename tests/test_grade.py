"""The summative grader, ``python -m modern_block grade``: the grade is decided outside the student's
process, so none of the cheats below changes a grade; a broken, hostile or endless submission gets an
error row (or a failed exercise) of its own and nothing else changes; bad arguments are clean errors.

The cheats and hostile notebooks are graded in one class folder, by the command line in a subprocess
(so that what a student writes to file descriptor 1 could only ever reach a real stdout), and each test
then looks at its own row.
"""

import io
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import nbformat
import pytest
import torch
import torch.nn as nn
from submissions import (
    IDENTITY_RMSNORM,
    LAYERNORM_RMSNORM,
    RIGHT_RMS,
    ROOT,
    WRONG_RMS,
    answered,
    exercise,
    write,
)

import modern_block as mb
from modern_block.classroom import grade
from modern_block.classroom.grading import wire
from modern_block.classroom.grading.remote import RemoteModule
from modern_block.classroom.grading.runner import BoundedText, Runner
from modern_block.classroom.grading.sandbox import Limits
from modern_block.classroom.grading.session import Options

LESSON = "01_rmsnorm"
REFERENCE = ROOT / "exercises" / f"{LESSON}.ipynb"
TIMEOUT = 12  # seconds per cell and check in the class run; the endless notebooks cost this much each
MARKER = "4242.5"  # `sleep 4242.5`: the detached child a submission leaves behind


def cheats(folder: Path) -> dict[str, list[str]]:
    """Write the class folder; returns, per student, the statuses the grade must have."""
    victim = folder / "honest_right" / f"{LESSON}.ipynb"
    hostile = {
        # the cheats of issue 16, each with an answer it must not rescue
        "replaces_the_checks": (dict(ex1_rms=WRONG_RMS + "\nchecks.check_rms = lambda *a, **k: None\n"
                                              "checks.check_rmsnorm = lambda *a, **k: None"), None),
        "input_transformer_hides_checks": ({}, "get_ipython().input_transformers_cleanup.append(lambda L: ['pass\\n'] "
                                               "if any('check_' in l for l in L) else L)"),
        "allclose_always_true": (dict(ex2_rmsnorm="torch.allclose = lambda *a, **k: True\n"
                                                  "torch.testing.assert_close = lambda *a, **k: None\n"
                                                  + IDENTITY_RMSNORM), None),
        "imports_the_package_answer": (dict(ex2_rmsnorm="from modern_block import RMSNorm"), None),
        "subclasses_the_package_answer": (dict(ex2_rmsnorm="import modern_block as mb\n\n\n"
                                                           "class RMSNorm(mb.RMSNorm):\n    pass"), None),
        "calls_the_package_inside": (dict(ex1_rms="import modern_block as mb\n\n\ndef rms(x, eps=1e-6):\n"
                                                  "    normed = mb.RMSNorm(x.shape[-1], eps)(x.float())\n"
                                                  "    return (x.float() / normed)[..., :1]"),
                                     None),
        "reads_the_solutions": (dict(ex1_rms="import json, modern_block\nfrom pathlib import Path\n"
                                             "sol = Path(modern_block.__file__).resolve().parents[1] / 'solutions' / "
                                             "'01_rmsnorm.ipynb'\nfor c in json.loads(sol.read_text())['cells']:\n"
                                             "    if 'def rms' in ''.join(c['source']):\n"
                                             "        exec(''.join(c['source']))"), None),
        # hostile to the grader and the other students
        "forges_the_grader_output": (dict(ex1_rms="import os\nos.write(1, b'{\"notebooks\": [], \"all_passed\": "
                                                  "true}\\n')\nprint('{\"all_passed\": true}')\n" + RIGHT_RMS), None),
        "kills_its_parent": (dict(ex1_rms="import os, signal\ntry:\n    os.kill(os.getppid(), signal.SIGKILL)\n"
                                          "except OSError:\n    pass\n" + RIGHT_RMS), None),
        "leaves_a_detached_child": (dict(ex1_rms=f"import subprocess\nsubprocess.Popen(['sleep', '{MARKER}'], "
                                                 f"start_new_session=True)\n" + RIGHT_RMS), None),
        "overwrites_others": (dict(ex1_rms=f"for path in [{str(victim)!r}, {str(REFERENCE)!r}]:\n    try:\n"
                                           "        open(path, 'w').write('garbage')\n    except OSError:\n"
                                           "        pass\n" + RIGHT_RMS), None),
        "prints_300_mb": (dict(ex1_rms="print('x' * 300_000_000)\n" + RIGHT_RMS), None),
        "endless_print_loop": (dict(ex1_rms="while True:\n    print('spam')"), None),
        "endless_inside_the_check": (dict(ex1_rms="import signal\n\n\ndef rms(x, eps=1e-6):\n"
                                                  "    signal.signal(signal.SIGINT, signal.SIG_IGN)\n"
                                                  "    while True:\n        pass",
                                          ex2_rmsnorm=LAYERNORM_RMSNORM.replace("x.float() - x.float().mean(-1, "
                                                                                "keepdim=True)", "x.float()")), None),
        "slow_setup_cell": ({}, "import time\ntime.sleep(1000)"),
        "exits": (dict(ex1_rms="import os\nos._exit(0)"), None),
        "allocates_8_gb": (dict(ex1_rms="x = bytearray(8 << 30)\n" + RIGHT_RMS), None),
    }
    expected = {
        "replaces_the_checks": ["failed", "not attempted"],
        "input_transformer_hides_checks": ["not attempted", "not attempted"],
        "allclose_always_true": ["not attempted", "failed"],
        "imports_the_package_answer": ["not attempted", "failed"],
        "subclasses_the_package_answer": ["not attempted", "failed"],
        "calls_the_package_inside": ["failed", "not attempted"],
        "reads_the_solutions": ["failed", "not attempted"],
        "forges_the_grader_output": ["passed", "not attempted"],
        "kills_its_parent": ["passed", "not attempted"],
        "leaves_a_detached_child": ["passed", "not attempted"],
        "overwrites_others": ["passed", "not attempted"],
        "prints_300_mb": ["passed", "not attempted"],
        "endless_print_loop": ["failed", "not attempted"],
        "endless_inside_the_check": ["failed", "passed"],
        "slow_setup_cell": ["not attempted", "not attempted"],
        "exits": ["failed", "not attempted"],
        "allocates_8_gb": ["failed", "not attempted"],
        "honest_right": ["passed", "passed"],
        "honest_wrong": ["failed", "failed"],
        "helper_named_check_something": ["passed", "not attempted"],
    }
    for student, (answers, setup) in hostile.items():
        write(folder, student, LESSON, answered(LESSON, answers, setup))
    write(folder, "honest_right", LESSON, answered(LESSON, {}, base="solutions"))
    write(folder, "honest_wrong", LESSON, answered(LESSON, dict(ex1_rms=WRONG_RMS, ex2_rmsnorm=LAYERNORM_RMSNORM)))
    write(folder, "helper_named_check_something", LESSON, answered(LESSON, dict(
        ex1_rms="def check_finite(t):\n    assert torch.isfinite(t).all()\n    return t\n\n\n" + RIGHT_RMS
                + "\n\n\ncheck_finite(rms(torch.ones(3)))")))
    # files that are no notebook of this lesson: an error row each
    malformed = {"not_json": b"this is not JSON {", "empty": b"", "binary": bytes(range(256)) * 8,
                 "nbformat_99": json.dumps({"nbformat": 99, "nbformat_minor": 0, "metadata": {}, "cells": []}).encode(),
                 "no_cells": json.dumps({"nbformat": 4, "nbformat_minor": 5, "metadata": {}, "cells": []}).encode(),
                 "other_lesson": exercise("02_swiglu")}
    for student, content in malformed.items():
        write(folder, student, LESSON, content)
    (folder / "a_folder" / f"{LESSON}.ipynb").mkdir(parents=True)
    os.mkfifo(folder / "a_fifo.ipynb")  # reading it would block for ever
    return expected


@pytest.fixture(scope="module")
def class_run(tmp_path_factory):
    folder = tmp_path_factory.mktemp("class")
    expected = cheats(folder)
    reference_bytes = REFERENCE.read_bytes()
    victim_bytes = (folder / "honest_right" / f"{LESSON}.ipynb").read_bytes()
    csv_path = folder.parent / "gradebook.csv"
    started = time.monotonic()
    proc = subprocess.run([sys.executable, "-m", "modern_block", "grade", str(folder), "--reference", str(REFERENCE),
                           "--jobs", "2", "--json", "--csv", str(csv_path), "--timeout", str(TIMEOUT)],
                          capture_output=True, text=True, timeout=900, cwd=ROOT)
    seconds = time.monotonic() - started
    assert REFERENCE.read_bytes() == reference_bytes, "a submission overwrote the reference"
    if (folder / "honest_right" / f"{LESSON}.ipynb").read_bytes() != victim_bytes:  # only possible as one user
        (folder / "honest_right" / f"{LESSON}.ipynb").write_bytes(victim_bytes)
    doc = json.loads(proc.stdout)  # the whole stdout is one JSON document: nothing a student wrote is in it
    rows = {r["student"]: r for r in doc["notebooks"]}
    return {"proc": proc, "doc": doc, "rows": rows, "expected": expected, "csv": csv_path.read_text(),
            "seconds": seconds}


def statuses(row) -> list[str]:
    return [e["status"] for e in row["exercises"]]


def test_the_class_run_finishes_with_exit_status_1_and_one_json_document(class_run):
    assert class_run["proc"].returncode == 1, class_run["proc"].stderr
    assert class_run["proc"].stderr == ""
    print(f"class folder of {len(class_run['rows'])} submissions graded in {class_run['seconds']:.0f} s")


@pytest.mark.parametrize("student", [
    "replaces_the_checks", "input_transformer_hides_checks", "allclose_always_true", "imports_the_package_answer",
    "subclasses_the_package_answer", "calls_the_package_inside", "reads_the_solutions", "forges_the_grader_output",
    "kills_its_parent", "leaves_a_detached_child", "overwrites_others", "prints_300_mb", "endless_print_loop",
    "endless_inside_the_check", "slow_setup_cell", "exits", "allocates_8_gb", "honest_right", "honest_wrong",
    "helper_named_check_something"])
def test_no_cheat_changes_a_grade(class_run, student):
    row = class_run["rows"][student]
    assert row["status"] == "graded", row["error"]
    assert statuses(row) == class_run["expected"][student], json.dumps(row, indent=1)


def test_the_diagnoses_come_through(class_run):
    rows = class_run["rows"]
    assert "the mean was subtracted" in rows["replaces_the_checks"]["exercises"][0]["detail"]
    assert "LayerNorm" in rows["honest_wrong"]["exercises"][1]["detail"]
    for student in ("imports_the_package_answer", "subclasses_the_package_answer"):
        detail = rows[student]["exercises"][1]["detail"]
        assert detail.startswith("uses the package's own implementation (modern_block.RMSNorm"), detail
    assert "modern_block.RMSNorm" in rows["calls_the_package_inside"]["exercises"][0]["detail"]
    assert "No such file" in rows["reads_the_solutions"]["exercises"][0]["detail"]
    assert rows["endless_inside_the_check"]["exercises"][0]["detail"].startswith("timed out")
    assert rows["endless_inside_the_check"]["restarts"] == 1
    assert "timed out" in rows["endless_print_loop"]["exercises"][0]["detail"]
    assert "timed out" in rows["slow_setup_cell"]["cells"][0]["error"]
    assert rows["slow_setup_cell"]["seconds"] < 2 * TIMEOUT + 20  # the cell is stopped once, never re-run
    assert "MemoryError" in rows["allocates_8_gb"]["exercises"][0]["detail"]
    assert "exited with status 0" in rows["exits"]["exercises"][0]["detail"]


def test_nothing_a_submission_started_is_left_running(class_run):
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ")
        except OSError:
            continue
        assert MARKER.encode() not in cmdline, f"process {pid} ({cmdline!r}) survived its submission"


@pytest.mark.parametrize("student, reason", [
    ("not_json", "not a notebook: not valid JSON"), ("empty", "the file is empty"),
    ("binary", "not UTF-8 text"), ("nbformat_99", "nbformat 99 is not supported"),
    ("no_cells", "the notebook has no cells"), ("other_lesson", "graded against the wrong lesson?"),
    ("a_folder", "not a regular file"), ("a_fifo", "not a regular file")])
def test_a_malformed_submission_gets_an_error_row(class_run, student, reason):
    row = class_run["rows"][student]
    assert row["status"] == "error" and reason in row["error"], row["error"]


def test_the_gradebook_has_one_row_per_submission(class_run):
    lines = class_run["csv"].splitlines()
    assert lines[0] == "student,notebook,reference,status,passed,failed,not_attempted,total,ex1,ex2,error"
    by_student = {line.split(",")[0]: line for line in lines[1:]}
    assert len(by_student) == len(class_run["rows"]) == len(lines) - 1
    assert by_student["honest_right"].endswith(",graded,2,0,0,2,passed,passed,")
    assert ",error,0,0,0,0,,,error: not a notebook: not valid JSON" in by_student["not_json"]


# ---- the whole course: solutions pass, untouched exercises are not attempted ------------------------------


def test_every_solution_passes_and_every_untouched_exercise_is_not_attempted():
    refs = grade.load_reference(ROOT / "exercises")
    subs = grade.collect([ROOT / "solutions", ROOT / "exercises"])
    reports = grade.grade_all(subs, refs, Options(timeout=120), jobs=2)
    solutions = [r for r in reports if r.notebook.startswith(str(ROOT / "solutions"))]
    untouched = [r for r in reports if r.notebook.startswith(str(ROOT / "exercises"))]
    assert len(solutions) == len(untouched) == len(refs) == 10  # lessons 00-09
    for r in solutions:
        assert r.all_passed and not r.cells and r.restarts == 0, grade.format_report(r)
    for r in untouched:
        assert r.exercises and {e.status for e in r.exercises} == {grade.NOT_ATTEMPTED}, grade.format_report(r)
        assert all(": not implemented yet (the stub says:" in e.detail for e in r.exercises)


def test_without_a_reference_a_deleted_check_does_not_pass(tmp_path):
    nb = answered(LESSON, dict(ex1_rms=RIGHT_RMS, ex2_rmsnorm=IDENTITY_RMSNORM))
    for cell in nb.cells:
        if cell.source.startswith("checks.check_rmsnorm"):
            cell.source = "# " + cell.source  # the check commented out
    nb.metadata.pop("modern_block")  # nor can the course's reference be found from the metadata
    own = write(tmp_path, "s", LESSON, nb)
    (report,) = grade.grade_paths([own])
    assert [(e.number, e.status) for e in report.exercises] == [(1, "passed"), (2, "failed")]
    assert "no check cell" in report.exercises[1].detail and "--reference" in report.notes[0]
    nb = answered(LESSON, dict(ex1_rms=RIGHT_RMS, ex2_rmsnorm=IDENTITY_RMSNORM))  # with the metadata
    for cell in nb.cells:
        if cell.source.startswith("checks.check_rmsnorm"):
            cell.source = "print('all good')"
    (report,) = grade.grade_paths([write(tmp_path, "t", LESSON, nb)])
    assert [e.status for e in report.exercises] == ["passed", "failed"]
    assert "the course's solutions/01_rmsnorm.ipynb" in report.notes[0]


def test_the_notebook_time_limit_gives_an_error_row(tmp_path):
    nb = answered(LESSON, dict(ex1_rms="import time\ntime.sleep(3)\n" + RIGHT_RMS,
                               ex2_rmsnorm="import time\ntime.sleep(3)\n" + IDENTITY_RMSNORM))
    subs = grade.collect([write(tmp_path, "slow", LESSON, nb)])
    (report,) = grade.grade_all(subs, grade.load_reference(REFERENCE), Options(timeout=10, notebook_timeout=4.5))
    assert report.error.startswith("the notebook ran past its time limit (4.5 s)")
    assert [e.status for e in report.exercises] == ["passed", "not graded"]
    assert report.seconds < 9


@pytest.mark.skipif(os.geteuid() != 0, reason="as another user than root, --same-user is what the class run did")
def test_as_one_user_a_submission_that_kills_its_parent_only_loses_its_own_process(tmp_path):
    victim = write(tmp_path, "victim", LESSON, answered(LESSON, {}, base="solutions"))
    write(tmp_path, "killer", LESSON, answered(LESSON, dict(
        ex1_rms=f"import os, signal\nopen({str(victim)!r}, 'w').write('garbage')\n"
                "os.kill(os.getppid(), signal.SIGKILL)\nos.kill(os.getpid(), signal.SIGKILL)")))
    subs = grade.collect([tmp_path])
    reports = grade.grade_all(subs, grade.load_reference(REFERENCE), Options(timeout=20), jobs=2,
                              limits=Limits(same_user=True))
    killed, spared = reports
    assert victim.read_text() == "garbage"  # it could write there as the same user ...
    assert spared.all_passed  # ... but the file had been read before any student code ran
    assert killed.status == "graded" and killed.exercises[0].status == "failed"
    assert "the process" in killed.exercises[0].detail and killed.restarts >= 1


# ---- the command line -----------------------------------------------------------------------------------


@pytest.mark.parametrize("args, message", [
    (["--timeout", "nan"], "--timeout: must be between"), (["--timeout", "0"], "--timeout: must be between"),
    (["--jobs", "0"], "--jobs: must be between"), (["--kernel", "no-such-kernel"], "no Jupyter kernel named"),
    (["--csv", "/no/such/folder/g.csv"], "--csv: the folder of"),
])
def test_bad_arguments_are_clean_errors(args, message, capsys):
    assert grade.main([str(ROOT / "solutions" / f"{LESSON}.ipynb"), "--reference", str(REFERENCE), *args]) == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err


def test_an_unusable_reference_or_no_submissions_is_a_clean_error(tmp_path, capsys):
    bad = tmp_path / "ref.ipynb"
    bad.write_text("{ not json")
    no_exercises = write(tmp_path, "x", "plain", nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell("1")]))
    solution = str(ROOT / "solutions" / f"{LESSON}.ipynb")
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


def test_a_cp1252_console_gets_the_text_report(monkeypatch):
    raw = io.BytesIO()
    monkeypatch.setattr(sys, "stdout", io.TextIOWrapper(raw, encoding="cp1252"))
    solution = str(ROOT / "solutions" / f"{LESSON}.ipynb")
    assert grade.main([solution, "--reference", str(REFERENCE)]) == 0
    text = raw.getvalue().decode("cp1252")
    assert "? Exercise 1: the root mean square" in text and "passed" in text
    monkeypatch.setattr(sys, "stdout", io.TextIOWrapper(raw := io.BytesIO(), encoding="cp1252"))
    assert grade.main([solution, "--reference", str(REFERENCE), "--json"]) == 0
    assert json.loads(raw.getvalue().decode("cp1252"))["notebooks"][0]["summary"]["passed"] == 2


# ---- the parts, without a student process --------------------------------------------------------------


def test_the_wire_refuses_what_it_must_not_use(tmp_path):
    huge_view = torch.zeros(1).expand(1 << 26)  # a 4-byte storage that claims 67 M elements
    assert isinstance(wire.clean(torch.zeros(2, dtype=torch.complex64)), wire.Unsupported)
    with pytest.raises(wire.ProtocolError, match="more than"):
        wire.clean([huge_view])
    nested = []
    for _ in range(100):
        nested = [nested]
    with pytest.raises(wire.ProtocolError, match="nested too deep"):
        wire.clean(nested)
    out = wire.clean({"p": nn.Parameter(torch.ones(2)), "n": 2**300, "t": torch.arange(6).view(2, 3).T})
    assert type(out["p"]) is torch.Tensor and isinstance(out["n"], wire.Unsupported)
    assert out["t"].is_contiguous() and out["t"].tolist() == [[0, 3], [1, 4], [2, 5]]
    a, b = __import__("socket").socketpair()
    import pickle

    evil = pickle.dumps(os.system, protocol=2)  # a payload that would run code if it were unpickled freely
    a.sendall(wire._HEADER.pack(len(evil)) + evil)
    with pytest.raises(wire.ProtocolError, match="unreadable"):
        wire.receive(b, time.monotonic() + 5)
    a.sendall(wire._HEADER.pack(wire.MAX_FRAME + 1))
    with pytest.raises(wire.ProtocolError, match="over the"):
        wire.receive(b, time.monotonic() + 5)
    with pytest.raises(TimeoutError):
        wire.receive(b, time.monotonic() + 0.2)


def test_a_module_stand_in_has_the_students_layout_and_tying():
    model = mb.LlamaStyleLM(50, d=16, n_layers=1, n_heads=2, n_kv_heads=1, d_ff=24, max_len=8, tie=True)
    desc = {"module": Runner.describe_module(model), "origin": ["LlamaStyleLM"]}
    stand_in = RemoteModule(link=None, number=1, desc=wire.clean(desc))
    assert stand_in.state_dict().keys() == model.state_dict().keys()
    assert stand_in.head.weight is stand_in.emb.weight and mb.count_parameters(stand_in) == model.num_parameters()
    assert {n for n, _ in stand_in.named_buffers()} == {"cos", "sin"} and "cos" not in stand_in.state_dict()
    assert stand_in.get_submodule("blocks.0.attn").kv == 1 and stand_in._origin == ["LlamaStyleLM"]


def test_output_is_kept_bounded():
    out = BoundedText(20)
    for text in ["abc", "defghijklmn", "o" * 5, "p" * 30, "qr"]:
        assert out.write(text) == len(text)
    assert out.text() == "abcdefghij\n[... 31 characters of output left out ...]\nppppppppqr"
