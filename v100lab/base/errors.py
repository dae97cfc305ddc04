"""The package's exceptions: one base class, so callers (and the CLI) catch one type.

Every message is one line that names what is wrong; the CLI prints it and exits 2.
"""

from __future__ import annotations

from v100lab.base.safeio import term_text

MAX_MESSAGE_CHARS = 1000


class V100labError(Exception):
    """Base class for every error v100lab raises on bad input.

    ``str()`` of any of them is one terminal-safe line: control characters a message may carry from a
    model file, a log or a path (ESC sequences, newlines) are escaped, and it is at most
    ``MAX_MESSAGE_CHARS`` long (cut with an ellipsis)."""

    exit_status = 2

    def __str__(self) -> str:
        return term_text(super().__str__(), limit=MAX_MESSAGE_CHARS)


class ModelNotFoundError(V100labError):
    """A model alias, path or URL that does not resolve to a GGUF file."""


class GGUFError(V100labError):
    """A malformed or hostile GGUF header. ``offset`` is the byte offset where parsing failed."""

    def __init__(self, message: str, offset: int | None = None):
        self.offset = offset
        where = f" (at byte {offset})" if offset is not None else ""
        super().__init__(f"{message}{where}")


class ConfigError(V100labError):
    """A run configuration, scenario or parameter file that names a bad key or value."""


class DeviceError(V100labError):
    """An unknown device id or a malformed device file."""


class OutputError(V100labError):
    """A file the tool was asked to write that cannot be written (a full disk, a read-only mount); what
    was there before is left as it was."""

    exit_status = 1


class RunFailed(V100labError):
    """A real llama.cpp run that failed (load error, out of memory, refused configuration)."""

    exit_status = 1
