"""The grader's parts, one at a time: the sandbox (bubblewrap's command line, the zygote entering it, the cgroups),
the package copy a submission sees, the messages and stand-ins that carry only data, fresh copies and declared
outputs, bounded parsing of student text, the class folder read safely, the outputs written atomically, and
reports that escape what a student wrote. ``test_grade.py`` grades whole classes with attackers in them."""

import glob
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import weakref
from pathlib import Path

import pytest
import torch
import torch.nn as nn
from submissions import ROOT

import modern_block as mb
from modern_block.classroom import checks
from modern_block.classroom.checks.core import Output, call_student
from modern_block.classroom.grading import class_folder, grade, notebook, package_copy, wire
from modern_block.classroom.grading.bwrap import COPY_MOUNT, Interpreter, bwrap_command
from modern_block.classroom.grading.grade_report import Exercise, Report, format_report, gradebook, one_line, printable
from modern_block.classroom.grading.remote import MAX_MODULE_BYTES, Link, RemoteModule, module_spec
from modern_block.classroom.grading.runner import BoundedText, Runner, build_module
from modern_block.classroom.grading.sandbox import Launcher, Limits, SandboxError, SandboxLost
from modern_block.classroom.grading.session import groups


def _launcher() -> Launcher | None:
    """The sandbox (a cgroup where one may be made: ``test_cgroups.py`` tests that part)."""
    try:
        return grade.launcher_for(None, Limits(without_cgroup=True))
    except SandboxError:
        return None


# ---- the sandbox -------------------------------------------------------------------------------------------


def test_the_bubblewrap_command_unshares_everything_and_shows_only_the_interpreter():
    interp = Interpreter.of(None)
    cmd = bwrap_command("bwrap", interp, "/copy", "/nb.ipynb", [str(ROOT), str(package_copy.PACKAGE)],
                        ["python", "-c", "pass"], seccomp_fd=7)
    for flag in ("--unshare-all", "--unshare-user", "--disable-userns", "--die-with-parent", "--new-session",
                 "--clearenv", "--proc"):
        assert flag in cmd
    assert "--dev" not in cmd and cmd[1:3] == ["--seccomp", "7"]
    assert cmd[cmd.index("--cap-drop") + 1] == "ALL" and cmd[-4:] == ["--", "python", "-c", "pass"]
    # /proc and /dev read-only; /dev holds four devices and nothing writable
    assert [cmd[i + 1] for i, arg in enumerate(cmd) if arg == "--remount-ro"] == ["/proc", "/dev"]
    assert [cmd[i + 1] for i, arg in enumerate(cmd) if arg == "--dev-bind"] == [f"/dev/{d}" for d in
                                                                               ("null", "zero", "random", "urandom")]
    binds = [cmd[i + 1] for i, arg in enumerate(cmd) if arg == "--ro-bind"]
    assert binds[0] == "/usr" and "/copy" in binds and "/nb.ipynb" in binds
    assert not any(b in ("/", "/home", "/root", "/etc", "/work", str(ROOT)) for b in binds), binds
    assert cmd[cmd.index("/copy") + 1] == COPY_MOUNT
    tmpfs = [cmd[i + 1] for i, arg in enumerate(cmd) if arg == "--tmpfs"]
    private_tmp = next(i for i, arg in enumerate(cmd) if arg == "--tmpfs" and cmd[i + 1] == "/tmp")
    assert tmpfs[0] == "/dev" and cmd.index("--remount-ro", cmd.index("/dev")) < private_tmp
    tmpfs = tmpfs[1:]
    assert tmpfs[0] == "/tmp" and cmd[cmd.index("--size") + 1:cmd.index("--size") + 4] == [str(256 << 20), "--tmpfs",
                                                                                             "/tmp"]
    # the private /tmp comes before the interpreter's folders, so a virtual environment under /tmp stays visible
    system = {"/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32"}
    assert private_tmp < min(i for i, arg in enumerate(cmd) if arg == "--ro-bind" and cmd[i + 1] not in system)
    assert all(Path(t).is_relative_to(b) for t in tmpfs[1:] for b in binds if Path(t).is_relative_to(b))
    if str(ROOT) in tmpfs or any(Path(str(ROOT)).is_relative_to(b) for b in binds):
        assert str(ROOT) in tmpfs  # a checkout inside a shown folder is covered by an empty one


def test_the_grading_runs_group_exercises_that_build_on_each_others_pieces():
    refs = grade.load_reference(ROOT / "exercises")
    runs = {name: groups(ref) for name, ref in refs.items()}
    # 00: exercise 2 forbids PyTorch's fused attention, which exercise 3 may use
    assert {name: len(r) for name, r in runs.items() if len(r) > 1} == {"00_gpt2_block.ipynb": 2,
                                                                        "07_llama_block.ipynb": 2}
    first, second = runs["07_llama_block.ipynb"]
    assert "Block" in first[0] and "Block" not in second[0] and "LlamaStyleLM" in second[0]
    assert [e.number for e in first[1]] == [1, 3] and [e.number for e in second[1]] == [2]


PROBE = """
import importlib, json, pkgutil, sys, torch
results = []
for site, hidden, uses in json.loads(sys.argv[1]):
    for name in [m for m in sys.modules if m == 'modern_block' or m.startswith('modern_block.')]:
        del sys.modules[name]
    sys.path[:1] = [site]
    import modern_block as mb
    from modern_block.classroom import checks
    assert mb.__file__.startswith(site), mb.__file__
    models = [importlib.import_module('modern_block.' + m.name) for m in pkgutil.iter_modules(mb.__path__)
              if not m.ispkg and m.name != '__main__']
    found, refused_all, working = [], [], []
    for name in hidden:
        base, _, method = name.partition('.')
        owner = next((m for m in models if getattr(vars(m).get(base), '__module__', None) == m.__name__), None)
        if owner is None:
            continue  # defined outside the model files: not in the copy at all
        found.append(name)
        obj = vars(owner)[base]
        targets = [obj.__dict__[method]] if method else list(vars(obj).values()) if isinstance(obj, type) else [obj]
        targets = [getattr(getattr(t, 'fget', t), '__func__', getattr(t, 'fget', t)) for t in targets]
        targets = [t for t in targets if getattr(t, '__code__', None) and t.__code__.co_filename == owner.__file__]
        refused = 0
        for fn in targets:
            try:
                fn(*[None] * fn.__code__.co_argcount)
            except RuntimeError as err:
                refused += 'is not available while this notebook is graded' in str(err)
        if targets and refused == len(targets):
            refused_all.append(name)
    for name, make in (('RMSNorm', lambda: mb.RMSNorm(8)(torch.ones(2, 8))), ('apply_rope', lambda: mb.apply_rope(
            torch.ones(1, 1, 2, 4), *mb.rope_cache(2, 4))), ('Block', lambda: mb.Block(8, 2, 1, 16)),
            ('rope_cache', lambda: mb.rope_cache(4, 4))):
        if name in uses:
            make()
            working.append(name)
    assert checks.check_rms(None) is None  # the checks do nothing here
    results.append([found, refused_all, working])
print(json.dumps(results))
"""


def test_the_package_copy_hides_exactly_the_exercised_pieces(tmp_path):
    """Every run of every lesson: its copy imports, each hidden component raises, what a right answer uses works."""
    runs = []
    for name, ref in sorted(grade.load_reference(ROOT / "exercises").items()):
        for hidden, members in groups(ref):
            uses = {u for ex in members for call in ex.calls for u in getattr(checks, call.check).uses}
            runs.append((name, str(package_copy.build(tmp_path, hidden)), sorted(hidden), sorted(uses)))
    out = subprocess.run([sys.executable, "-I", "-c", PROBE, json.dumps([r[1:] for r in runs])], capture_output=True,
                         text=True, env={"PATH": os.environ["PATH"]}, timeout=600)
    assert out.returncode == 0, out.stderr[-2000:]
    for (name, _, hidden, uses), (found, refused, working) in zip(runs, json.loads(out.stdout), strict=True):
        assert refused == found, (name, set(found) - set(refused))
        assert set(found) >= set(hidden) & set(dir(mb)), (name, hidden)
        assert set(working) == set(uses) & {"RMSNorm", "apply_rope", "Block", "rope_cache"}, name


def test_hiding_replaces_bodies_and_keeps_signatures():
    source = ("class A:\n    '''doc'''\n    x = 1\n\n    def f(self, a):\n        return a\n\n    def g(self):\n"
              "        return 2\n\n\ndef h(b=3):\n    '''the formula'''\n    return b\n")
    hidden, found = package_copy.hide(source, {"A.f", "h"})
    assert found == {"A.f", "h"} and "the formula" not in hidden and "return 2" in hidden
    namespace: dict = {}
    exec(hidden, namespace)
    assert namespace["A"]().g() == 2 and namespace["A"].x == 1
    for call in (lambda: namespace["A"]().f(1), lambda: namespace["h"]()):
        with pytest.raises(RuntimeError, match="is not available while this notebook is graded"):
            call()


@pytest.mark.skipif(_launcher() is None, reason="no sandbox here (bubblewrap cannot start)")
def test_a_sandbox_ends_with_everything_it_started():
    launcher = _launcher()
    box = launcher.spawn(frozenset({"RMSNorm"}), b'{"cells": []}')
    deadline = time.monotonic() + 60
    reply = box.request({"op": "exec", "source": "import subprocess, os\n"
                         "subprocess.Popen(['sleep', '4343.5'], start_new_session=True)\n"
                         "print(os.getpid(), open('/submission/notebook.ipynb').read())"}, deadline)
    assert reply["error"] is None and reply["output"].split("\n")[0] == '3 {"cells": []}', reply
    reply = box.request({"op": "exec", "source": "import modern_block as mb\nmb.RMSNorm(4)"}, deadline)
    assert reply["error"][0] == "RuntimeError" and "not available" in reply["error"][1]
    assert any(b"4343.5" in Path(f"/proc/{p}/cmdline").read_bytes() for p in os.listdir("/proc") if p.isdigit()
               and Path(f"/proc/{p}/cmdline").exists())
    (folder,) = box.files  # the notebook alone in a folder with a random name, the sandbox user's only
    assert folder.parent == launcher.run_dir and folder.stat().st_mode & 0o777 == 0o700
    assert folder.stat().st_uid == launcher.uid and os.listdir(folder) == ["notebook.ipynb"]
    box.close()
    assert not folder.exists()
    time.sleep(0.3)
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            assert b"4343.5" not in Path(f"/proc/{pid}/cmdline").read_bytes()
        except OSError:
            pass
    with pytest.raises(SandboxLost):
        box.request({"op": "exec", "source": "1"}, time.monotonic() + 5)


# ---- data only, fresh copies, declared outputs -----------------------------------------------------------


def test_a_module_stand_in_has_the_students_layout_and_sends_a_tied_matrix_once():
    model = mb.LlamaStyleLM(50, d=16, n_layers=1, n_heads=2, n_kv_heads=1, d_ff=24, max_len=8, tie=True)
    model.register_buffer("step", torch.zeros(3))  # a persistent buffer
    stand_in = RemoteModule(link=None, number=1, desc=wire.clean({"module": Runner.describe_module(model)}))
    assert stand_in.state_dict().keys() == model.state_dict().keys()
    assert stand_in.head.weight is stand_in.emb.weight and mb.count_parameters(stand_in) == model.num_parameters()
    assert {n for n, _ in stand_in.named_buffers()} == {"rope.cos", "rope.sin", "step"}
    assert "rope.cos" not in stand_in.state_dict()
    # a non-persistent buffer is kept by name, shape and dtype, without its data, and never sent back
    assert stand_in.rope.cos.device.type == "meta" and stand_in.rope.cos.shape == model.rope.cos.shape
    assert stand_in.get_submodule("blocks.0.attn").kv == 1
    pushed = stand_in._state()
    assert "emb.weight" in pushed["params"] and "head.weight" not in pushed["params"]  # a claimed tie gets no head
    assert set(pushed["buffers"]) == {"step"}


def test_a_returned_module_is_bounded_in_bytes_and_released_with_the_check():
    class Big(nn.Module):
        def __init__(self, persistent):
            super().__init__()
            self.weight = nn.Parameter(torch.ones(4))
            self.register_buffer("junk", torch.zeros(22_000_000), persistent=persistent)  # 88 MB

    desc = wire.clean({"module": Runner.describe_module(Big(persistent=False))})
    stand_in = RemoteModule(link=None, number=1, desc=desc)
    assert stand_in.junk.device.type == "meta" and stand_in._state()["buffers"] == {}
    sent = Runner.describe_module(Big(persistent=False))  # by shape and dtype: its data never leaves the sandbox
    assert sent["buffers"] == [["junk", ((22_000_000,), torch.float32), False]] and len(wire.encode(sent)) < 4096
    desc["module"]["buffers"] = [["junk", torch.zeros(5), False]]  # a tensor sent instead: its shape alone kept
    assert RemoteModule(link=None, number=3, desc=desc).junk.device.type == "meta"
    del desc
    with pytest.raises(ValueError, match=f"at most {MAX_MODULE_BYTES >> 20} MB"):
        RemoteModule(link=None, number=2, desc=wire.clean({"module": Runner.describe_module(Big(persistent=True))}))
    link = Link(sandbox=None, deadline=0)
    proxy = link.decode({"__remote__": 5, "type": "Big", "module": Runner.describe_module(nn.Linear(3, 3))})
    assert link.decode({"__remote__": 5, "type": "Big", "module": Runner.describe_module(nn.Linear(3, 3))}) is proxy
    released = weakref.ref(proxy)
    del proxy
    assert released() is None and len(link.proxies) == 0  # the link keeps no stand-in the check let go of


def test_a_module_of_the_graders_travels_by_value_and_is_rebuilt_fresh():
    attn = mb.GQAttention(16, 4, 2, qk_norm=True)
    spec = wire.clean(module_spec(attn))
    first, second = build_module(spec), build_module(spec)
    assert type(first) is mb.GQAttention and first is not second and first.wq.weight is not second.wq.weight
    assert (first.h, first.kv, first.dh) == (4, 2, 4) and isinstance(first.q_norm, mb.RMSNorm)
    x = torch.randn(2, 3, 16)
    cos, sin = mb.rope_cache(3, 4)
    assert torch.equal(first(x, cos, sin), attn(x, cos, sin))
    class Mine(nn.Linear):
        pass

    for other in (RemoteModule(link=None, number=1, desc={"module": Runner.describe_module(nn.Linear(2, 2))}),
                  Mine(2, 2)):
        with pytest.raises(TypeError, match="cannot send"):
            module_spec(other)


def test_every_argument_is_a_fresh_copy_and_only_declared_outputs_come_back():
    x, table = torch.ones(3), torch.zeros(3)
    ref = mb.RMSNorm(3)

    def vandal(a, b, module, cache):
        a.mul_(0)
        b.fill_(7)
        module.weight.data.fill_(5)
        cache["k"] = torch.ones(1)
        return a + b

    cache = Output({"k": None})
    got = call_student("check_x", "vandal", vandal, x, table, ref, cache)
    assert torch.equal(x, torch.ones(3)) and torch.equal(table, torch.zeros(3)) and torch.equal(ref.weight,
                                                                                              torch.ones(3))
    assert torch.equal(got, torch.full((3,), 7.0)) and torch.equal(cache.value["k"], torch.ones(1))


def test_output_is_kept_bounded():
    out = BoundedText(20)
    for text in ["abc", "defghijklmn", "o" * 5, "p" * 30, "qr"]:
        assert out.write(text) == len(text)
    assert out.text() == "abcdefghij\n[... 31 characters of output left out ...]\nppppppppqr"


# ---- student text: bounded parsing, escaped reports -----------------------------------------------------


def _seconds(fn, text) -> float:
    """The CPU time of ``fn(text)`` in this process: a busy machine's preemption does not count (wall time did:
    8x the text measured at 156x the time while other jobs loaded the 2 cores)."""
    started = time.process_time()
    fn(text)
    return time.process_time() - started


@pytest.mark.parametrize("name, make", [
    ("spaces inside a heading", lambda n: "# Exercise 1: x" + " " * n + "y"),
    ("tabs after a hash", lambda n: "#" + "\t" * n + "Exercise"),
    ("a check name without a call", lambda n: "check_" + "a" * n),
    ("a call name then spaces", lambda n: "check_a" + " " * n + "x"),
    ("many check names", lambda n: "check_a " * (n // 8)),
])
def test_parsing_student_text_takes_linear_time(name, make):
    def parse(text):
        notebook.sections([notebook.Cell(0, "markdown", text), notebook.Cell(1, "code", text)])
        notebook.calls_a_check(text)

    small, large = make(200_000), make(1_600_000)
    parse(small)  # warm
    ratio = min(_seconds(parse, large) for _ in range(3)) / max(min(_seconds(parse, small) for _ in range(3)), 1e-4)
    assert ratio < 30, f"{name}: 8x the text took {ratio:.0f}x the time"  # quadratic would be 64x
    assert _seconds(parse, large) < 5


def test_headings_are_read_without_regular_expressions():
    assert notebook.exercise_heading("## Exercise 3: the cache") == (2, 3, "the cache")
    assert notebook.exercise_heading("#Exercise 12 — b") == (1, 12, "b")
    assert notebook.exercise_heading("### exercise 4") == (3, 4, "")
    for line in ("## Exercises", "####### Exercise 1", "## Exercise " + "9" * 20, "## Exercise 1: " + "x" * 600):
        assert notebook.exercise_heading(line) is None, line
    assert notebook.heading("## Hints") == (2, "Hints") and notebook.heading("##Hints") is None


def test_a_huge_literal_or_deep_nesting_in_a_check_cell_is_a_bad_reference():
    for source in ("checks.check_rms(0x" + "f" * 5000 + ")", "checks.check_rms(" + "(" * 5000 + ")" * 5000 + ")",
                   "checks.check_rms(" + "1" * 5000 + ")"):
        with pytest.raises(notebook.BadReference):
            notebook.parse_check_cell(notebook.Cell(0, "code", source))


def test_reports_escape_every_character_of_the_escaped_categories_and_nothing_else():
    """The escaping, character by character, against its rule: a control (Cc), format character (Cf), lone
    surrogate (Cs) or line/paragraph separator (Zl, Zp) is escaped, line feeds and tabs kept only with
    ``newlines``, every other character kept; over the first 0x3100 code points, the surrogates and astral ones."""
    import unicodedata

    def rule(ch, newlines):
        if ch in "\n\t":
            return ch if newlines else {"\n": "\\n", "\t": "\\t"}[ch]
        if unicodedata.category(ch) not in ("Cc", "Cf", "Cs", "Zl", "Zp"):
            return ch
        code = ord(ch)
        return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}" if code < 0x10000 else f"\\U{code:08x}"

    chars = [chr(c) for c in (*range(0x3100), *range(0xD800, 0xE000), 0xFEFF, 0x1F600, 0xE0001, 0xE007F, 0x10FFFF)]
    for newlines in (True, False):
        assert printable("".join(chars), newlines) == "".join(rule(ch, newlines) for ch in chars)
        assert [printable(ch, newlines) for ch in chars] == [rule(ch, newlines) for ch in chars]


def test_reports_escape_what_a_student_wrote():
    assert one_line("a\nb\x1b[2K\r\u202e\ud800") == "a\\nb\\x1b[2K\\x0d\\u202e\\ud800"
    assert printable("keep\nthe lines\x07") == "keep\nthe lines\\x07"
    report = Report("=cmd|' /C calc'!A0", "+1", "ref", [Exercise(1, "t\x1b]0;x\x07", [], "failed",
                                                                 "line one\nhalf\x1b[1A  ✓ forged")],
                    notes=["@note"], cells=[{"cell": 1, "error": "E: a\nb", "output": ""}])
    text = format_report(report)
    assert "\x1b" not in text and "\x07" not in text
    assert [line for line in text.splitlines() if line.lstrip().startswith("✓")] == []
    assert "      | line one" in text and "! cell 1: E: a\\nb" in text
    row = gradebook([report]).splitlines()[1]
    assert row.startswith("'+1,'=cmd|' /C calc'!A0,ref,graded")
    doc = json.dumps(Report("x\ud800", "s").to_dict(), ensure_ascii=False)
    doc.encode("utf-8")  # no lone surrogate left to crash an encoder


# ---- the class folder and the outputs -------------------------------------------------------------------


def test_collection_refuses_links_special_files_and_oversized_files(tmp_path):
    folder = tmp_path / "class"
    (folder / "ok").mkdir(parents=True)
    (folder / "ok" / "01.ipynb").write_text("{}")
    (folder / "link").mkdir()
    (folder / "link" / "01.ipynb").symlink_to(folder / "ok" / "01.ipynb")
    (folder / "linked_folder").symlink_to(folder / "ok")
    os.mkfifo(folder / "pipe.ipynb")
    (folder / "big").mkdir()
    with open(folder / "big" / "01.ipynb", "wb") as f:
        f.truncate(class_folder.MAX_NOTEBOOK_BYTES + 1)  # sparse: never read
    (folder / "dir.ipynb").mkdir()
    os.mkdir(os.fsencode(folder) + b"/\xff")
    (Path(os.fsdecode(os.fsencode(folder) + b"/\xff")) / "01.ipynb").write_text("{}")
    subs = {(s.student, Path(s.path).name): s for s in class_folder.collect([folder])}
    assert subs[("ok", "01.ipynb")].read() == (b"{}", None)
    assert subs[(one_line(os.fsdecode(b"\xff")), "01.ipynb")].read()[0] is None  # an undecodable name: refused
    for key, reason in {("link", "01.ipynb"): "a symbolic link", ("linked_folder", "linked_folder"): "a symbolic link",
                        ("pipe", "pipe.ipynb"): "not a regular file", ("big", "01.ipynb"): "larger than",
                        ("dir", "dir.ipynb"): "not a regular file"}.items():
        assert subs[key].read()[0] is None and reason in subs[key].read_error, (key, subs[key].read_error)


def test_no_link_below_the_class_root_is_followed_whatever_paths_are_given(tmp_path):
    """``grade class/*/*.ipynb``: the shell names a student's link to the solutions, and a notebook inside a
    student folder that is itself a link, by their paths; neither is read, and the honest notebook is."""
    solutions, folder = tmp_path / "solutions", tmp_path / "class"
    solutions.mkdir()
    (solutions / "01.ipynb").write_text('{"secret": 1}')
    for student in ("honest", "linker", "deep"):
        (folder / student / "sub").mkdir(parents=True)
    (folder / "honest" / "01.ipynb").write_text("{}")
    (folder / "linker" / "01.ipynb").symlink_to(solutions / "01.ipynb")
    (folder / "folder_link").symlink_to(solutions, target_is_directory=True)
    (folder / "deep" / "sub" / "inner").symlink_to(solutions, target_is_directory=True)
    named = sorted(glob.glob(str(folder / "*" / "*.ipynb")) + glob.glob(str(folder / "*" / "sub" / "*" / "*.ipynb")))
    assert len(named) == 4  # the shell's expansion follows the links: the grader must not
    subs = {s.student: s for s in class_folder.collect(named)}
    assert subs["honest"].read() == (b"{}", None)
    for student in ("linker", "folder_link", "deep"):
        data, error = subs[student].read()
        assert data is None and "symbolic link" in error, (student, error)
    inner = str(folder / "deep" / "sub" / "inner" / "01.ipynb")
    assert class_folder.read_inside(inner, str(folder / "deep"))[0] is None
    assert class_folder.read_inside(str(solutions / "01.ipynb"), str(folder))[1] == "not inside the class folder"
    (tmp_path / "root_link").symlink_to(folder, target_is_directory=True)  # the root itself: the instructor's
    via_root = {s.student: s.read() for s in class_folder.collect([tmp_path / "root_link"])}
    assert via_root["honest"] == (b"{}", None) and via_root["linker"][0] is None


def test_outputs_are_written_whole_and_never_through_a_link(tmp_path):
    target = tmp_path / "grades.csv"
    class_folder.write_atomic(str(target), "a,b\n", "--csv")
    class_folder.write_atomic(str(target), "c,d\n", "--csv")
    assert target.read_text() == "c,d\n" and os.listdir(tmp_path) == ["grades.csv"]
    victim = tmp_path / "victim"
    victim.write_text("keep")
    (tmp_path / "link.csv").symlink_to(victim)
    (tmp_path / "folder.csv").mkdir()
    for planted, message in (("link.csv", "symbolic link"), ("folder.csv", "not a regular file")):
        with pytest.raises(class_folder.OutputError, match=message):
            class_folder.write_atomic(str(tmp_path / planted), "x", "--csv")
    with pytest.raises(class_folder.OutputError, match="File name too long"):
        class_folder.write_atomic(str(tmp_path / ("x" * 300)), "x", "--csv")
    assert victim.read_text() == "keep" and sorted(os.listdir(tmp_path)) == ["folder.csv", "grades.csv", "link.csv",
                                                                            "victim"]


@pytest.fixture
def open_tmp():
    """A folder every user may read: under a root grader the sandboxes run as an unprivileged user, and
    pytest's own temporary folders are its runner's alone."""
    path = Path(tempfile.mkdtemp())
    path.chmod(0o755)
    yield path
    shutil.rmtree(path, ignore_errors=True)


FAILING_BWRAP = "#!/bin/sh\necho 'bwrap: No permissions to create new namespace' >&2\nexit 1\n"


@pytest.mark.parametrize("bwrap", [None, FAILING_BWRAP], ids=["not installed", "no user namespaces"])
def test_without_a_working_sandbox_the_grader_refuses_and_names_the_flag(bwrap, open_tmp, monkeypatch, capsys):
    tmp_path = open_tmp
    if bwrap is not None:
        (tmp_path / "bwrap").write_text(bwrap)
        (tmp_path / "bwrap").chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}:/usr/bin:/bin" if bwrap else str(tmp_path))
    with pytest.raises(SandboxError) as refused:
        Launcher(limits=Limits(memory_mb=1234))
    message = str(refused.value)
    assert "--no-sandbox-i-trust-these-notebooks" in message
    assert ("bubblewrap is not installed" if bwrap is None else "No permissions to create new namespace") in message
    solution = str(ROOT / "solutions" / "01_rmsnorm.ipynb")
    assert grade.main([solution, "--reference", str(ROOT / "exercises"), "--memory-mb", "1235"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: the grader runs every submission in a bubblewrap sandbox") and err.count("\n") == 1


@pytest.mark.skipif(_launcher() is None, reason="no sandbox here (bubblewrap cannot start)")
def test_without_a_cgroup_every_process_is_limited_and_the_pid_namespace_ends_them():
    launcher = Launcher(limits=Limits(memory_mb=300, cpu_seconds=77, without_cgroup=True))
    if launcher.cgroups is not None:
        launcher.cgroups.close()
        launcher.cgroups = None  # as where no cgroup may be made
    try:
        box = launcher.spawn(frozenset(), None)
        reply = box.request({"op": "exec", "source": "import subprocess\nprint(subprocess.run(['cat', "
                             "'/proc/self/limits'], capture_output=True, text=True).stdout)"}, time.monotonic() + 60)
        limits = {line[:26].strip(): line[26:].split()[:2] for line in reply["output"].splitlines()[1:] if line}
        assert limits["Max cpu time"] == ["77", "82"] and limits["Max file size"] == [str(16 << 20)] * 2
        assert limits["Max core file size"] == ["0", "0"] and limits["Max processes"][0] != "unlimited"
        assert int(limits["Max address space"][0]) > 300 << 20 and box.group is None
        assert limits["Max open files"] == ["256", "256"]  # so no process holds more pipes
        box.close()
    finally:
        launcher.close()
