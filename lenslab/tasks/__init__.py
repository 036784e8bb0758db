"""Synthetic tasks: pure functions of (parameters, seed) -> int64 tensors."""

from lenslab.tasks.errors import TaskError
from lenslab.tasks.modadd import ModAddTask, make_modadd_splits
from lenslab.tasks.mpsp import LABELS, SHORTCUTS, MPSPTask
from lenslab.tasks.splits import counterfactual_partners, make_mpsp_splits, n_consistent

__all__ = [
    "LABELS",
    "SHORTCUTS",
    "MPSPTask",
    "ModAddTask",
    "TaskError",
    "counterfactual_partners",
    "make_modadd_splits",
    "make_mpsp_splits",
    "n_consistent",
]
