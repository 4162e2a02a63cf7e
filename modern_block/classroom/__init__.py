"""The classroom: everything around the lessons that checks, grades and engages a learner.

* ``checks``: diagnosing checks for the exercises (one module per lesson);
* ``exercises``: writes ``exercises/`` from ``solutions/`` (``python -m modern_block exercises build``);
* ``grading``: the grader for a class folder (``python -m modern_block grade``, ``grading.grade``);
* ``quiz`` and ``widgets``: the "Check your understanding" quizzes and the interactive calculators.
"""
