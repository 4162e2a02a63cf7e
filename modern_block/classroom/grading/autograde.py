"""nbgrader's autograde step with the course's engine in place of nbgrader's kernel (``nbgrader_config.py``).

``ReadSubmission`` replaces the notebook nbgrader read (following links) by the submitted file read again with
``class_folder.read_inside``, bounded, without following links. ``SandboxedExecute`` replaces nbgrader's
``Execute`` (which runs the checks in the student's kernel, so a replaced check function scores): the student's
cells run in the sandbox, the checks here against the instructor's source notebook, and ``engine.annotate``
writes each verdict where ``SaveAutoGrades`` reads it. nbgrader does the rest (gradebook, feedback, export).
"""

from __future__ import annotations

import os

import nbformat
from nbconvert.preprocessors import Preprocessor
from traitlets import Bool, Float, Integer

from .class_folder import read_inside
from .engine import annotate, grade_notebook, launcher_for, read_reference
from .grade_report import one_line
from .notebook import BadReference, NotebookError, Reference, read_notebook
from .sandbox import Limits
from .session import Options

CONFIG = '''c = get_config()  # noqa: F821
c.CourseDirectory.course_id = "modern-block"
# each submitted notebook read again from submitted/ down without following a link, before nbgrader's sanitizing
c.Autograde.sanitize_preprocessors = [
    "modern_block.classroom.grading.autograde.ReadSubmission",
    "nbgrader.preprocessors.ClearOutput",
    "nbgrader.preprocessors.DeduplicateIds",
    "nbgrader.preprocessors.OverwriteKernelspec",
    "nbgrader.preprocessors.OverwriteCells",
    "nbgrader.preprocessors.CheckCellMetadata",
]
# the course's engine in place of nbgrader's Execute: student cells in the sandbox, checks in the grader
c.Autograde.autograde_preprocessors = [
    "modern_block.classroom.grading.autograde.SandboxedExecute",
    "nbgrader.preprocessors.IgnorePattern",
    "nbconvert.preprocessors.ClearMetadataPreprocessor",
    "nbgrader.preprocessors.LimitOutput",
    "nbgrader.preprocessors.SaveAutoGrades",
    "nbgrader.preprocessors.AssignLatePenalties",
    "nbgrader.preprocessors.CheckCellMetadata",
]
c.OverwriteCells.add_missing_cells = True  # a deleted check cell is put back, and graded
c.SandboxedExecute.timeout = 60  # seconds per cell and per check
c.SandboxedExecute.notebook_timeout = 600  # seconds per submission
c.SandboxedExecute.memory_mb = 2048  # what a submission may allocate above the loaded interpreter
# True only where no cgroup can be made: each process of a submission bounded, not the submission as a whole
c.SandboxedExecute.without_cgroup = False
'''
NOT_READ = "modern_block_not_read"  # notebook metadata: why ReadSubmission refused the file (set by it alone)


def _course(config):
    """nbgrader's course folders (nbgrader imported when it runs the step)."""
    from nbgrader.coursedir import CourseDirectory

    return CourseDirectory(config=config)


class ReadSubmission(Preprocessor):
    """The submitted notebook as ``read_inside`` reads it from ``submitted/``. A refused one keeps only its
    cells' types and nbgrader ids, every source and output emptied, under a cell saying why (nbgrader puts the
    locked cells back from its database, and the checks are not graded)."""

    enabled = Bool(True).tag(config=True)

    def preprocess(self, nb, resources):
        info = resources["nbgrader"]
        course = _course(self.config)
        folder = os.path.join(course.root, course.submitted_directory)
        path = os.path.join(course.format_path(course.submitted_directory, info["student"], info["assignment"]),
                            f"{info['notebook']}.ipynb")
        data, error = read_inside(path, folder)
        if data is not None and not error:
            try:
                read_notebook(data)  # bounded before it is parsed
                nb = nbformat.reads(data.decode("utf-8-sig"), as_version=4)
                nb.metadata.pop(NOT_READ, None)  # only this step sets it
                return nb, resources
            except (NotebookError, ValueError) as err:
                error = str(err)
        why = one_line(error or "no data")
        self.log.warning("%s: not read (%s)", path, why)
        cells = [nbformat.v4.new_markdown_cell(f"**Not graded**: {why}")]
        for cell in nb.cells:  # what nbgrader read through the link: its ids only
            kept = {"nbgrader": cell.metadata["nbgrader"]} if "nbgrader" in cell.metadata else {}
            new = nbformat.v4.new_code_cell if cell.cell_type == "code" else nbformat.v4.new_markdown_cell
            cells.append(new("", metadata=kept))
        refused = nbformat.v4.new_notebook(cells=cells)
        refused.metadata[NOT_READ] = why
        return refused, resources


class SandboxedExecute(Preprocessor):
    """Grade the notebook with the course's engine and write the verdicts into its check cells."""

    enabled = Bool(True).tag(config=True)
    timeout = Float(60.0, help="seconds for each cell and each exercise's check").tag(config=True)
    notebook_timeout = Float(600.0, help="seconds for a whole submission").tag(config=True)
    memory_mb = Integer(2048, help="memory a submission may use above the loaded interpreter").tag(config=True)
    without_cgroup = Bool(False, help="where no cgroup can be made: limits on each process of a submission only "
                                      "(as grade's --no-cgroup-i-accept-per-process-limits)").tag(config=True)

    def reference(self, assignment: str, notebook: str) -> Reference:
        """The instructor's source notebook of this assignment: the trusted reference."""
        course = _course(self.config)
        path = os.path.join(course.format_path(course.source_directory, ".", assignment), f"{notebook}.ipynb")
        try:
            return read_reference(path)
        except (NotebookError, BadReference) as err:
            raise RuntimeError(f"the source notebook {path} cannot be the reference: {err}") from None

    def preprocess(self, nb, resources):
        info = resources["nbgrader"]
        reference = self.reference(info["assignment"], info["notebook"])
        limits = Limits(memory_mb=self.memory_mb, cpu_seconds=int(self.notebook_timeout) + 30,
                        without_cgroup=self.without_cgroup)
        options = Options(timeout=self.timeout, notebook_timeout=self.notebook_timeout)
        refused = nb.metadata.pop(NOT_READ, None)
        data = None if refused else nbformat.writes(nb).encode("utf-8")
        report = grade_notebook(data, f"{info['notebook']}.ipynb", info["student"], reference,
                                launcher_for(None, limits), options, read_error=refused)
        self.log.info("%s: %s", info["student"], "; ".join(f"exercise {e.number} {e.status} {e.points:g}/"
                                                           f"{e.max_points:g}" for e in report.exercises)
                      or report.error)
        for cell in nb.cells:  # the outputs of the run: only what the grader wrote
            if cell.cell_type == "code":
                cell.outputs = []
        annotate(nb, report, reference)
        nb.cells = [nbformat.from_dict(cell) for cell in nb.cells]
        return nb, resources
