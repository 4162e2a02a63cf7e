"""The summative grader's parts: the engine behind nbgrader's autograde step and ``python -m modern_block grade``.

The grade is decided in the grader's process, which never runs a line of student code:

* ``grade``: the command (``python -m modern_block grade``): a class folder graded, submissions side by side;
* ``class_folder``: the class folder, looked at lazily and bounded per student, each notebook read when it is graded,
  without following links or blocking; the outputs, written atomically;
* ``notebook``: read and validate notebooks, find the exercises of the reference (the notebook handed out),
  their points and ids, and the cells of a submission that answer them (no regular expression can take long
  on student text);
* ``sandbox``, ``bwrap``, ``cgroups``, ``zygote``, ``seccomp_filter``, ``sandbox_user``: each submission's
  process in a bubblewrap sandbox of its own (never host uid 0; new user, mount, pid, network and IPC namespaces;
  a seccomp filter; memory, processes and CPU bounded for the whole sandbox; docs/sandbox.md);
* ``package_copy``: the package as a submission sees it, without the code of the pieces the exercises ask for;
* ``runner``: what that process runs: it executes the submission's cells and answers calls;
* ``wire``: the messages between the two: length-prefixed safetensors buffers with the message as JSON in
  their header (no pickle, no compression), every size checked before anything is allocated;
* ``remote``: stand-ins for the student's functions, classes and modules, so the package's own checks
  (``modern_block.classroom.checks``, under ``graded``: inputs drawn from a per-run secret) judge them unchanged;
  arguments go as fresh copies, only declared outputs come back;
* ``session``: grade one submission (time limits, restarts, the runs with different pieces hidden);
* ``engine``: one submission graded against a trusted reference, its points, caps and its verdicts written
  into the notebook's check cells where nbgrader reads them;
* ``autograde``: nbgrader's autograde step with the engine in place of nbgrader's kernel;
* ``names``: student names compared as a person sees them (TR39 skeletons), flagged where two look alike;
* ``grade_report``: text, JSON lines and the long CSV, with every student-supplied string made harmless;
* ``feedback``: one Markdown file per student and notebook (``grade --feedback``; nbgrader writes its own).
"""
