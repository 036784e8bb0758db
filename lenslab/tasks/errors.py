"""Exception types whose message is one readable line (the CLI prints it and exits 2)."""


class LenslabError(ValueError):
    """Base class: bad input that the user can fix; the message names the value and the fix."""


class TaskError(LenslabError):
    """A task or split parameter is invalid."""
