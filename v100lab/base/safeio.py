"""Input and output at the boundary: bounded reads of files a user names, and strings safe to print.

Layer 1 (imports nothing of v100lab but :mod:`v100lab.base.errors`), so every reader of user files and the
error class itself can use it.

* :func:`read_bounded` reads a file a user named (a log, a device file, a parameter file) without trusting
  ``st_size``: ``/proc`` files report 0, ``/dev/zero`` and a FIFO have no size, and a FIFO without a writer
  blocks a plain ``open()`` forever. It opens non-blocking, refuses directories, and stops at
  ``max_bytes`` *actually read*; a device or FIFO that sends nothing for ``idle_s`` seconds is an error.
* :func:`term_text` makes any string safe for a terminal: control characters (ESC, CR, BEL, C1
  controls, bidi overrides, ...) are written as Python-style escapes (``\\x1b``), so text from a model's
  metadata or a log line cannot move the cursor, recolour or retitle the terminal, and long text can be
  shortened with an ellipsis.
* :func:`check_creatable` says, before any work is done, whether a file or folder can be written where
  a user asked (it exists as the right kind and is writable, or its nearest existing ancestor is a
  writable folder), creating nothing.
* :func:`redact_url` hides the secrets a URL can carry (``user:password@``, query values such as
  signatures and tokens) before the URL is echoed in a message.
"""

from __future__ import annotations

import json
import logging
import math
import os
import re
import select
import stat
from collections.abc import Mapping
from pathlib import Path
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

log = logging.getLogger(__name__)

ELLIPSIS = "…"
_CHUNK = 1 << 20
_NAMED_ESCAPES = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}


# ------------------------------------------------------------------------------------------------
# terminal-safe text
# ------------------------------------------------------------------------------------------------

def _escape_char(c: str) -> str:
    if c in _NAMED_ESCAPES:
        return _NAMED_ESCAPES[c]
    n = ord(c)
    if n < 0x100:
        return f"\\x{n:02x}"
    if n < 0x10000:
        return f"\\u{n:04x}"
    return f"\\U{n:08x}"


def term_text(value, limit: int | None = None) -> str:
    """``str(value)`` safe to print on a terminal, on one line.

    Every character Python does not call printable (C0/C1 controls such as ESC, newlines, tabs, DEL,
    format characters such as bidi overrides and zero-width marks, unpaired surrogates) becomes an
    escape (``\\x1b``, ``\\n``, ``\\u202e``); everything else (letters of any script, "€", "…") is
    kept. With ``limit``, text longer than ``limit`` characters is cut to ``limit`` characters, the
    last one an ellipsis.
    """
    text = "" if value is None else str(value)
    if not text.isprintable():
        text = "".join(c if c.isprintable() else _escape_char(c) for c in text)
    return shorten(text, limit) if limit is not None else text


def term_lines(text) -> str:
    """A multi-line report safe to print: :func:`term_text` applied line by line (its newlines kept)."""
    return "\n".join(term_text(line) for line in str(text).split("\n"))


def json_safe(value):
    """``value`` with every NaN or infinite float replaced by None, so ``json.dump(allow_nan=False)`` holds."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, Mapping):
        return {k: json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [json_safe(v) for v in value]
    return value


def shorten(text: str, limit: int) -> str:
    """``text`` if it has at most ``limit`` characters, else its first ``limit - 1`` and "…"."""
    if limit < 1:
        raise ValueError(f"limit must be >= 1, got {limit}")
    return text if len(text) <= limit else text[:limit - 1] + ELLIPSIS


# ------------------------------------------------------------------------------------------------
# URLs
# ------------------------------------------------------------------------------------------------

_USERINFO_RE = re.compile(r"(?<=://)[^/?#@]*@")


def redact_url(url: str) -> str:
    """``url`` without its secrets: the user-info becomes ``***@`` (``user:***@`` when a user name is
    given with a password) and every query value ``***``; an unparsable URL is redacted by pattern."""
    text = str(url)
    try:
        parts = urlsplit(text)
        netloc = parts.netloc
    except ValueError:
        text = _USERINFO_RE.sub("***@", text)
        return text.split("?", 1)[0] + ("?***" if "?" in text else "")
    if "@" in netloc:
        userinfo, _, hostport = netloc.rpartition("@")
        user, has_password, _ = userinfo.partition(":")
        netloc = f"{user}:***@{hostport}" if has_password and user else f"***@{hostport}"
    query = parts.query
    if query:
        pairs = parse_qsl(query, keep_blank_values=True)
        query = urlencode([(k, "***") for k, _ in pairs], safe="*") if pairs else "***"
    return urlunsplit((parts.scheme, netloc, parts.path, query, parts.fragment and "***"))


# ------------------------------------------------------------------------------------------------
# bounded reads
# ------------------------------------------------------------------------------------------------

def _kind(mode: int) -> str:
    if stat.S_ISFIFO(mode):
        return "a FIFO"
    if stat.S_ISCHR(mode):
        return "a character device"
    if stat.S_ISBLK(mode):
        return "a block device"
    if stat.S_ISSOCK(mode):
        return "a socket"
    return "not a regular file"


def read_bounded(path: str | os.PathLike, max_bytes: int, *, what: str, error: type[Exception],
                 idle_s: float = 30.0, refuse_binary: bool = False) -> bytes:
    """The bytes of the file at ``path``, at most ``max_bytes`` of them; ``error`` (one line, naming
    ``what`` and the path) when it is missing, a directory, unreadable, larger, silent for ``idle_s``
    seconds (a FIFO or device), or, with ``refuse_binary``, holds a NUL byte in its first 64 KiB.

    Bounded by the bytes actually read, never by ``st_size``: a ``/proc`` file (size 0) is read whole,
    ``/dev/zero`` stops at ``max_bytes`` (or at its first NUL with ``refuse_binary``), and a FIFO
    without a writer reads as empty instead of blocking ``open()``.
    """
    p = Path(path)
    label = f"{what} {term_text(p)}"
    try:
        fd = os.open(p, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0) | getattr(os, "O_NOCTTY", 0))
    except FileNotFoundError:
        raise error(f"{label}: no such file") from None
    except (OSError, ValueError) as exc:    # ValueError: a NUL byte in the path
        raise error(f"{label}: cannot open ({getattr(exc, 'strerror', None) or exc})") from None
    try:
        mode = os.fstat(fd).st_mode
        if stat.S_ISDIR(mode):
            raise error(f"{label}: is a directory, not a file")
        regular = stat.S_ISREG(mode)
        return _read_fd(fd, max_bytes, label, error, None if regular else (idle_s, _kind(mode)),
                        refuse_binary)
    finally:
        os.close(fd)


def _read_fd(fd: int, max_bytes: int, label: str, error, wait: tuple[float, str] | None,
             refuse_binary: bool) -> bytes:
    out = bytearray()
    sniffed = not refuse_binary
    poller = None
    while True:
        try:
            chunk = os.read(fd, min(_CHUNK, max_bytes + 1 - len(out)))
        except BlockingIOError:
            # a FIFO or device with a writer but no data yet: wait, bounded
            if wait is None:
                raise error(f"{label}: cannot read (would block)") from None
            if poller is None:
                poller = select.poll()
                poller.register(fd, select.POLLIN | select.POLLHUP | select.POLLERR)
            if not poller.poll(wait[0] * 1000):
                raise error(f"{label}: {wait[1]} that sent nothing for {wait[0]:g} s") from None
            continue
        except OSError as exc:
            raise error(f"{label}: cannot read ({exc.strerror or exc})") from None
        if not chunk:
            return bytes(out)
        out += chunk
        if not sniffed and (len(out) >= 65536 or b"\0" in out):
            if b"\0" in out[:65536]:
                raise error(f"{label}: binary data (a NUL byte at byte {out.index(0)}), not text")
            sniffed = True
        if len(out) > max_bytes:
            raise error(f"{label}: larger than {_size(max_bytes)} (read {_size(len(out))} and stopped)")


def read_text_bounded(path: str | os.PathLike, max_bytes: int, *, what: str, error: type[Exception],
                      errors: str = "strict", idle_s: float = 30.0) -> str:
    """:func:`read_bounded` decoded as UTF-8 (binary data refused); with ``errors="strict"`` a file
    that is not UTF-8 is ``error`` naming the byte offset."""
    data = read_bounded(path, max_bytes, what=what, error=error, idle_s=idle_s, refuse_binary=True)
    try:
        return data.decode("utf-8", errors=errors)
    except UnicodeDecodeError as exc:
        raise error(f"{what} {term_text(Path(path))}: not UTF-8 text (byte {exc.start})") from None


def _size(n: int) -> str:
    if n >= 2**20:
        return f"{n / 2**20:.0f} MiB"
    if n >= 2**10:
        return f"{n / 2**10:.0f} KiB"
    return f"{n} bytes"


# ------------------------------------------------------------------------------------------------
# can it be written?
# ------------------------------------------------------------------------------------------------

def check_creatable(path: str | os.PathLike, *, what: str, error: type[Exception], folder: bool = False) -> None:
    """``error`` (one line) unless a file (or with ``folder`` a folder) can be written at ``path``: it exists
    as that kind and is writable, or its nearest existing ancestor is a writable folder. Creates nothing.

    Refused: a file where a folder is wanted and the reverse, a special file (FIFO, device), a parent on the
    way that is a file, no write permission (``os.access``; root passes it, as root's writes would), and a
    path that cannot exist (a NUL byte)."""
    p = Path(path)
    label = f"{what} {term_text(p)}"
    if "\0" in str(p):
        raise error(f"{label}: not a usable path (it holds a NUL byte)")
    try:
        _check_creatable(p, label, error, folder)
    except OSError as exc:
        raise error(f"{label}: cannot check it ({exc.strerror or exc})") from None
    except ValueError as exc:   # a NUL byte in the path
        raise error(f"{label}: not a usable path ({exc})") from None


def _check_creatable(p: Path, label: str, error, folder: bool) -> None:
    if p.exists() or p.is_symlink():
        mode = p.stat().st_mode
        if folder and not stat.S_ISDIR(mode):
            raise error(f"{label} exists and is not a folder")
        if not folder and stat.S_ISDIR(mode):
            raise error(f"{label} is a folder; name a file in it")
        if not folder and not stat.S_ISREG(mode):
            raise error(f"{label} is {_kind(mode)}, not a regular file")
        if not os.access(p, os.W_OK | (os.X_OK if folder else 0)):
            raise error(f"{label} is not writable (permission denied)")
        return
    parent = p.parent
    while not (parent.exists() or parent.is_symlink()) and parent != parent.parent:
        parent = parent.parent
    if not parent.is_dir():
        raise error(f"{label} cannot be created: {term_text(parent)} is a file, not a folder")
    if not os.access(parent, os.W_OK | os.X_OK):
        raise error(f"{label} cannot be created: folder {term_text(parent)} is not writable")


#: the environment variable that moves v100lab's cache directory
CACHE_ENV = "V100LAB_CACHE"


def cache_dir() -> Path:
    """The one directory where v100lab keeps what it builds and measures (``$V100LAB_CACHE`` or
    ``~/.cache/v100lab``), created when missing."""
    root = os.environ.get(CACHE_ENV) or os.path.join(Path.home(), ".cache", "v100lab")
    path = Path(root).expanduser()
    path.mkdir(parents=True, exist_ok=True)
    return path


def read_json_dict(path: Path, what: str) -> dict | None:
    """A small JSON file this package wrote (a profile, a stored calibration) as a dict; None when it does not
    exist, is not a JSON object, or cannot be read (then a warning naming ``what`` and the reason)."""
    try:
        data = json.loads(Path(path).read_text())
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as exc:
        log.warning("ignoring unreadable %s %s: %s", what, path, exc)
        return None
    return data if isinstance(data, dict) else None
