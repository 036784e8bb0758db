"""Errors raised by training/ (all ``LenslabError``: one line, no traceback at the CLI)."""

from lenslab.tasks.errors import LenslabError


class ConfigError(LenslabError):
    """A model or training setting is invalid."""


class RunError(LenslabError):
    """A run directory or checkpoint is missing, foreign, corrupted or locked."""


class TrainingDiverged(LenslabError):
    """The loss or the weights became NaN/inf; the last good checkpoint is kept."""
