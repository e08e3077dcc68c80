"""Checks for the exercise notebooks (book/exercises/): run your code on fresh inputs, say in
words what is wrong.

One module per chapter, in chapter order, each holding the ``check_*`` functions its notebook
calls: ``primer`` (0), ``naive`` (1), ``inplace`` (2), ``sdpa`` (3), ``triton`` (4),
``occupancy`` (4 and 5), ``cuda`` (5), ``showdown`` (6), ``compiled`` (7), ``block`` (8),
``backward`` (9), ``decoding`` (10), ``context_parallel`` (11), ``real_models`` (12).
``judge`` holds what they share: the verdicts below, the seed a failure names, and the comparisons.
"""
from kernels.exercises.judge import ExerciseFailed, Passed, showing_solutions

__all__ = ["ExerciseFailed", "Passed", "showing_solutions"]
