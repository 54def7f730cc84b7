"""One root error; every message is one line that says what failed and what to do instead."""


class ScaffoldError(Exception):
    """Root of scaffold's errors; the CLI prints the message (no traceback) and exits 2."""


class AnswerError(ScaffoldError, ValueError):
    """An answer that is unknown, malformed, or impossible on the chosen hardware."""


class NotAvailableYet(AnswerError):
    """A known answer value that this version of the template cannot render yet."""


class DestinationError(ScaffoldError):
    """The destination folder cannot receive a new project."""


class ProjectError(ScaffoldError):
    """An existing project that cannot be updated as it is (no answers file, no git, dirty...)."""


class RenderError(ScaffoldError):
    """copier, ruff or git failed while writing the project."""
