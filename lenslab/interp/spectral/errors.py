"""The one error type of interp.spectral (a ``LenslabError``: one line naming the bad value and the fix)."""

from lenslab.tasks.errors import LenslabError


class SpectralError(LenslabError):
    """Bad input to a spectral analysis: unreadable path, wrong shape, unknown mode, missing extra."""
