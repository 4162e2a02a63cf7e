"""The summative grader's parts (the command is ``python -m modern_block grade``).

The grade is decided in the grader's process, which never runs a line of student code:

* ``notebook``: read and validate notebooks, find the exercises of the reference (the notebook handed out)
  and the cells of a submission that answer them;
* ``sandbox``: the student's code runs in a process of its own (forked from a pre-loaded zygote, behind a
  shield process, in its own session and working folder, with memory, file-size and CPU limits, as
  ``nobody`` when the grader is root), which never sees the grader's stdout;
* ``runner``: what that process runs: it executes the submission's cells and answers calls;
* ``wire``: the messages between the two: length-prefixed ``torch.save`` frames, read with
  ``torch.load(weights_only=True)`` and checked (types, sizes) before use;
* ``remote``: stand-ins for the student's functions, classes and modules, so the package's own checks
  (``modern_block.classroom.checks``, under ``graded``: inputs drawn from a per-run secret) judge them unchanged;
* ``session``: grade one submission (time limits, restarts, reuse of the package's implementation);
* ``report``: text, JSON and the CSV gradebook.
"""
