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
* :func:`shell_join` writes a command for the user to copy: every argument one shell word (``shlex``
  quoting), control characters written as bash ``$'\\n'`` escapes, so a pasted command runs only itself.
* :func:`check_creatable` says, before any work is done, whether a file or folder can be written where
  a user asked (it exists as the right kind and is writable, or its nearest existing ancestor is a
  writable folder), creating nothing.
* :func:`write_atomic` replaces a file whole or not at all: a failed write (a full disk) leaves the old
  file as it was and no temporary file behind.
* :func:`short_repr` is a bounded ``repr()`` for messages: it looks at a few items of a few levels of a
  value, so a huge value (an expanded YAML alias bomb, an integer of a million digits) costs nothing.
* :func:`load_yaml` parses YAML written by a user with aliases bounded before they are expanded.
* :func:`open_url` and :func:`read_response` hold an HTTP exchange to one deadline (connect, status line,
  headers and body together), so a server that trickles a byte at a time cannot hold a command.
* :func:`redact_url` hides the secrets a URL can carry (``user:password@``, query values such as
  signatures and tokens) before the URL is echoed in a message.
"""

from __future__ import annotations

import json
import logging
import math
import os
import re
import reprlib
import select
import shlex
import stat
import tempfile
import threading
import time
import urllib.request
from collections.abc import Mapping
from pathlib import Path
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

import yaml

log = logging.getLogger(__name__)

ELLIPSIS = "…"
_CHUNK = 1 << 20
_NAMED_ESCAPES = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}


# ------------------------------------------------------------------------------------------------
# terminal-safe text
# ------------------------------------------------------------------------------------------------

def json_number(x, nd: int = 3) -> float | None:
    """A figure as JSON output shows it: rounded to ``nd`` decimals; None when missing or not finite."""
    return None if x is None or not math.isfinite(x) else round(float(x), nd)


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


def shell_word(value) -> str:
    """``str(value)`` as one shell word: ``shlex.quote`` when every character is printable, else bash's
    ANSI-C quoting (``$'m\\nx.gguf'``) with each control character escaped, so the word stays on one
    line, holds no terminal escape and expands nothing."""
    text = str(value)
    if text.isprintable():
        return shlex.quote(text)
    return "$'" + "".join(_shell_char(c) for c in text) + "'"


def _shell_char(c: str) -> str:
    if c in "\\'":
        return "\\" + c
    if c.isprintable():
        return c
    n = ord(c)
    if 0x80 <= n < 0x100:     # bash's \xHH is a byte; a character above 0x7f is \uHHHH
        return f"\\u{n:04x}"
    return _escape_char(c)


def shell_join(argv) -> str:
    """A command line to copy and paste: each argument :func:`shell_word`, joined by spaces."""
    return " ".join(shell_word(a) for a in argv)


def term_lines(text) -> str:
    """A multi-line report safe to print: :func:`term_text` applied line by line (its newlines kept)."""
    return "\n".join(term_text(line) for line in str(text).split("\n"))


class _BoundedRepr(reprlib.Repr):
    def __init__(self):
        super().__init__()
        self.maxlevel, self.maxdict, self.maxlist, self.maxtuple, self.maxset = 3, 4, 6, 6, 6
        self.maxstring, self.maxlong, self.maxother = 60, 40, 60

    def repr_int(self, x, level):
        if x.bit_length() > 128:   # repr() of a huge int is slow, and refused past 4300 digits
            return f"an integer of {x.bit_length()} bits"
        return super().repr_int(x, level)


_REPR = _BoundedRepr()


def short_repr(value, limit: int = 60) -> str:
    """A terminal-safe ``repr()`` of ``value`` of at most ``limit`` characters, built from a bounded view
    (a few items of a few levels), never from the whole value."""
    try:
        text = _REPR.repr(value)
    except Exception:   # a hostile __repr__: name the type only
        text = f"a {type(value).__name__}"
    return term_text(text, limit=limit)


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
# HTTP held to one deadline
# ------------------------------------------------------------------------------------------------

def open_url(req, deadline: float):
    """``urllib.request.urlopen(req)`` that returns or raises ``TimeoutError`` by ``deadline``
    (``time.monotonic()`` seconds) for the connect, status line and headers together.

    urllib's own timeout bounds each socket read, and a server may send its headers a byte at a time;
    so the exchange runs in a daemon thread, whose socket times out on its own if it is left behind."""
    box: dict = {}

    def work():
        try:
            box["resp"] = urllib.request.urlopen(req, timeout=max(deadline - time.monotonic(), 0.05))
        except BaseException as exc:   # handed to the caller's thread
            box["exc"] = exc

    t = threading.Thread(target=work, name="v100lab-http", daemon=True)
    t.start()
    t.join(max(deadline - time.monotonic(), 0))
    if t.is_alive():
        raise TimeoutError("no answer before the deadline")
    if "exc" in box:
        raise box["exc"]
    return box["resp"]


def read_response(resp, n: int, deadline: float) -> bytes:
    """Up to ``n`` bytes of ``resp``'s body (fewer when it ends), each socket read bounded by what is
    left before ``deadline``; ``TimeoutError`` when the deadline passes first."""
    sock = getattr(getattr(getattr(resp, "fp", None), "raw", None), "_sock", None)
    out = bytearray()
    while len(out) < n:
        left = deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError("the body did not arrive before the deadline")
        if sock is not None:
            sock.settimeout(left)
        chunk = resp.read1(min(n - len(out), 1 << 20))
        if not chunk:
            break
        out += chunk
    return bytes(out)


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
    way that is a file, no write permission (``os.access``), a path that cannot exist (a NUL byte), and a
    place no file can be stored: a read-only mount, a kernel pseudo file system (``/proc``, ``/sys``; root
    passes ``os.access`` there) or a device with no space left."""
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
        _check_storage(p, label, error)
        if not os.access(p, os.W_OK | (os.X_OK if folder else 0)):
            raise error(f"{label} is not writable (permission denied)")
        return
    parent = p.parent
    while not (parent.exists() or parent.is_symlink()) and parent != parent.parent:
        parent = parent.parent
    if not parent.is_dir():
        raise error(f"{label} cannot be created: {term_text(parent)} is a file, not a folder")
    _check_storage(parent, label, error)
    if not os.access(parent, os.W_OK | os.X_OK):
        raise error(f"{label} cannot be created: folder {term_text(parent)} is not writable")


# kernel file systems whose files are interfaces, not storage: nothing v100lab writes belongs there
_PSEUDO_FS = frozenset({"proc", "sysfs", "devtmpfs", "devpts", "cgroup", "cgroup2", "debugfs", "tracefs",
                        "securityfs", "configfs", "bpf", "pstore", "efivarfs", "fusectl", "mqueue",
                        "binfmt_misc", "autofs", "nsfs", "rpc_pipefs", "selinuxfs"})


def _fs_type(path: Path) -> tuple[str, str] | None:
    """(file system type, mount point) of the mount holding ``path``, from /proc/self/mountinfo."""
    try:
        real = os.path.realpath(path)
        with open("/proc/self/mountinfo", encoding="utf-8", errors="replace") as f:
            text = f.read(4 << 20)
    except OSError:
        return None
    best = None
    for line in text.splitlines():
        left, sep, right = line.partition(" - ")
        fields = left.split()
        if not sep or len(fields) < 5 or not right.split():
            continue
        mount = re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), fields[4])   # \040 is a space
        if real == mount or real.startswith(mount.rstrip("/") + "/"):
            if best is None or len(mount) >= len(best[1]):
                best = (right.split()[0], mount)
    return best


def _check_storage(existing: Path, label: str, error) -> None:
    """``error`` when ``existing`` (a path that exists) lies on a read-only mount, a pseudo file system
    or a device with no space left."""
    fs = _fs_type(existing)
    if fs and fs[0] in _PSEUDO_FS:
        raise error(f"{label} is on the kernel's {fs[0]} file system ({term_text(fs[1])}), not storage; "
                    "name a path on a disk")
    try:
        st = os.statvfs(existing)
    except OSError:
        return
    if st.f_flag & os.ST_RDONLY:
        raise error(f"{label} is on a read-only file system")
    free = st.f_bfree if os.geteuid() == 0 else st.f_bavail   # root may use the reserved blocks
    if st.f_blocks and free == 0:
        raise error(f"{label} cannot be written: no space left on the device holding {term_text(existing)}")


def write_atomic(path: str | os.PathLike, data: bytes | str, *, what: str, error: type[Exception]) -> Path:
    """Replace the file at ``path`` with ``data`` whole (written to a temporary file beside it, fsync'ed,
    then renamed over it). On any failure (a full disk, a read-only folder) the old file is untouched,
    the temporary file is removed and ``error`` (one line naming ``what`` and the path) is raised."""
    p = Path(path)
    raw = data.encode("utf-8") if isinstance(data, str) else data
    tmp = None
    try:
        fd, tmp = tempfile.mkstemp(dir=p.parent, prefix=f".{p.name[:100]}.", suffix=".tmp")
        with os.fdopen(fd, "wb") as f:
            f.write(raw)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, p)
        tmp = None
    except OSError as exc:
        raise error(f"{what} {term_text(p)}: cannot write it ({exc.strerror or exc})") from None
    finally:
        if tmp is not None:
            try:
                os.unlink(tmp)
            except OSError:
                pass
    return p


# ------------------------------------------------------------------------------------------------
# YAML with bounded aliases
# ------------------------------------------------------------------------------------------------

#: the most nodes a YAML document may hold once its aliases are expanded (a parameter or device file
#: holds dozens; an alias bomb of nine levels holds a billion)
MAX_YAML_NODES = 100_000


class _BoundedLoader(yaml.SafeLoader):
    """PyYAML's safe loader that counts a document's nodes as its aliases would expand them (each
    alias counts the whole node it names) and refuses the document past :data:`MAX_YAML_NODES`, before
    anything is constructed or walked. An alias to a node that contains it is refused too."""

    def compose_document(self):
        node = super().compose_document()
        _expanded_size(node, {}, MAX_YAML_NODES)
        return node


def _expanded_size(node, memo: dict, cap: int) -> int:
    key = id(node)
    if key in memo:
        if memo[key] is None:
            raise yaml.composer.ComposerError(None, None, "an alias refers to a node that contains it",
                                              node.start_mark)
        return memo[key]
    memo[key] = None
    n = 1
    if isinstance(node, yaml.SequenceNode):
        n += sum(_expanded_size(child, memo, cap) for child in node.value)
    elif isinstance(node, yaml.MappingNode):
        n += sum(_expanded_size(k, memo, cap) + _expanded_size(v, memo, cap) for k, v in node.value)
    if n > cap:
        raise yaml.composer.ComposerError(None, None, f"its aliases expand to more than {cap:,} values "
                                          "(an alias bomb?)", node.start_mark)
    memo[key] = n
    return n


def load_yaml(text: str):
    """``yaml.safe_load(text)`` with aliases bounded (see :class:`_BoundedLoader`); raises
    ``yaml.YAMLError`` as ``safe_load`` does."""
    loader = _BoundedLoader(text)
    try:
        return loader.get_single_data()
    finally:
        loader.dispose()


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
