"""The summative grader: the engine behind nbgrader's autograde step and ``python -m modern_block grade``.

The grade is decided in the grader's process, which never runs a line of student code; each submission runs in a
bubblewrap sandbox of its own (``sandbox`` and the modules it names; docs/sandbox.md says what each part stops).
``grade`` is the command, ``autograde`` nbgrader's step, ``engine`` what both share, ``session`` one submission,
``remote`` and ``wire`` the stand-ins for the student's objects and the messages between the two processes.
"""
