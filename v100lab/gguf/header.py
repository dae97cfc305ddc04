"""A bounded GGUF header reader: metadata and tensor infos only, from a path, a file object or a URL.

Why not ``gguf.GGUFReader``: it memory-maps the whole file and walks every tokenizer array element
by element through numpy (about 2.6 s on the default model here), and it loops forever on a 43-byte
file that declares an array of 2**62 elements. This reader

* reads the header through a small buffered reader in growing chunks (1 MiB, then up to 8 MiB, then
  doubling), so a local parse reads at most the header plus one chunk and a remote parse of a header
  under 8 MiB takes at most 2-3 HTTP Range requests; tensor data is never read;
* checks every count and length against the bytes that can still follow (the file's real size, or
  the cap ``max_header_bytes`` when the size is unknown) *before* allocating anything, so memory
  stays bounded by the file's real size;
* raises :class:`~v100lab.base.errors.GGUFError` (message + byte offset) on anything malformed, mirroring
  the checks of llama.cpp's own loader (ggml/src/gguf.cpp, ``gguf_init_from_file_impl``): magic,
  version, alignment, tensor name length, n_dims, dimension overflow, ggml type, block size,
  and that tensor offsets follow each other in order with alignment padding.

Types, type sizes and key names come from the ``gguf`` package (``GGUFValueType``,
``GGMLQuantizationType``, ``GGML_QUANT_SIZES``, ``LlamaFileType``); the parsing itself is ours.

A file whose tensor data runs past its end is refused (:class:`~v100lab.base.errors.GGUFError` naming the
byte where it ends): llama.cpp refuses it too (src/llama-model-loader.h, ``llama_tensor_weight``:
"tensor '%s' data is not within the file bounds, model is corrupted or incomplete"), and a partial
download must not get a prediction. The size is the file's, or the total of an HTTP ``Content-Range``.
Two files without their data are accepted as descriptions: a header-only file (it ends before the data
section starts) and a *skeleton* (see :mod:`v100lab.gguf.skeleton`, marked in ``general.description``);
:attr:`GGUFHeader.data_complete` says whether the data is all there.

Public API: :func:`read_header` (the raw header), :func:`read_spec` (the derived ``ModelSpec``) and
:func:`spec_from_header` (derivation, shared with the skeleton writer). The reader parses what it is
given — a path, an http(s) URL or a binary file object — and nothing else: a model alias
(``default``, ``synth-1b:Q4_0``) or a skeleton name is turned into a path and ModelSpec by
:func:`v100lab.models.resolve.resolve`, which is where building a model is asked for explicitly.
"""

from __future__ import annotations

import base64
import http.client
import io
import logging
import math
import os
import re
import stat
import struct
import time
import urllib.error
import urllib.request
from urllib.parse import unquote, urlsplit, urlunsplit
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType
from typing import BinaryIO, Mapping, Sequence

import gguf
import numpy as np

from v100lab.base.errors import ConfigError, GGUFError, ModelNotFoundError
from v100lab.base.safeio import redact_url, term_text, open_url, read_response
from v100lab.facts.spec import ModelSpec, TensorInfo

log = logging.getLogger(__name__)

DEFAULT_MAX_HEADER_BYTES = 64 * 2**20
MAX_STRING_BYTES = 2**30            # a string longer than 1 GiB is hostile, whatever the file size
GGML_MAX_NAME = 64                  # ggml.h: tensor names are shorter than this
GGML_MAX_DIMS = 4                   # ggml.h
INT64_MAX = 2**63 - 1
FIRST_CHUNK = 1 << 20               # first read: 1 MiB
SECOND_CHUNK_TOTAL = 8 << 20        # second read brings the buffer to 8 MiB, then doubling
MAX_TIMEOUT_S = 3600.0              # an HTTP timeout beyond an hour is a typo
SKELETON_MARK = "v100lab skeleton"  # general.description of v100lab.gguf.skeleton's header-only files

VT = gguf.GGUFValueType
# value type → (struct format, size); STRING and ARRAY are handled separately
_SCALAR = {
    VT.UINT8: ("<B", 1), VT.INT8: ("<b", 1), VT.UINT16: ("<H", 2), VT.INT16: ("<h", 2),
    VT.UINT32: ("<I", 4), VT.INT32: ("<i", 4), VT.FLOAT32: ("<f", 4), VT.BOOL: ("<B", 1),
    VT.UINT64: ("<Q", 8), VT.INT64: ("<q", 8), VT.FLOAT64: ("<d", 8),
}
_NP_DTYPE = {  # numpy reads numeric arrays in one call (then .tolist())
    VT.UINT8: "<u1", VT.INT8: "<i1", VT.UINT16: "<u2", VT.INT16: "<i2", VT.UINT32: "<u4",
    VT.INT32: "<i4", VT.FLOAT32: "<f4", VT.BOOL: "<u1", VT.UINT64: "<u8", VT.INT64: "<i8",
    VT.FLOAT64: "<f8",
}
_SCALAR_STRUCT = {vt: struct.Struct(fmt) for vt, (fmt, _) in _SCALAR.items()}
_U32 = struct.Struct("<I")
_I32 = struct.Struct("<i")
_U64 = struct.Struct("<Q")
_I64 = struct.Struct("<q")
_LAYER_RE = re.compile(r"^blk\.(\d+)\.")


# ------------------------------------------------------------------------------------------------
# results
# ------------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class GGUFHeader:
    """The raw header.

    ``metadata``: key → value. Scalars are Python ``int``/``float``/``bool``/``str``; arrays are
    tuples of those (so metadata compares, hashes and serialises like plain data). ``value_types``: key → ``GGUFValueType`` (for arrays, ``(ARRAY, element)``).
    ``tensors``: in file order, ``offset`` relative to the data section. ``tensor_infos_end`` = end
    of the tensor infos; ``header_bytes`` = ``data_offset`` = where the data section starts (the
    end of the infos padded to ``alignment``). ``file_bytes``: the real size when known. ``bytes_read`` / ``requests``: what it
    cost to read (for the benchmark).
    """

    version: int
    metadata: Mapping[str, object]
    value_types: Mapping[str, object]
    tensors: tuple[TensorInfo, ...]
    alignment: int
    header_bytes: int
    data_offset: int
    tensor_infos_end: int
    file_bytes: int | None
    bytes_read: int = 0
    requests: int = 0

    @property
    def data_bytes(self) -> int:
        """Size of the data section the tensor infos describe (last tensor end, unpadded)."""
        return max((t.offset + t.n_bytes for t in self.tensors), default=0)

    @property
    def data_complete(self) -> bool | None:
        """Whether the file holds all tensor data (False for a skeleton; None when size unknown)."""
        if self.file_bytes is None:
            return None
        return self.file_bytes >= self.data_offset + self.data_bytes


# ------------------------------------------------------------------------------------------------
# byte sources
# ------------------------------------------------------------------------------------------------

class _Source:
    """Where header bytes come from. ``fetch(start, n)`` returns up to ``n`` bytes at ``start``;
    fewer only at the end of the file."""

    size: int | None = None
    bytes_read = 0
    requests = 0

    def next_total(self, have: int) -> int:
        """How many bytes the buffer should hold after the next read (before clamping)."""
        return have + FIRST_CHUNK

    def fetch(self, start: int, n: int) -> bytes:  # pragma: no cover - interface
        raise NotImplementedError

    def close(self) -> None:
        pass


class _FileSource(_Source):
    def __init__(self, f: BinaryIO, own: bool = False):
        self.f = f
        self.own = own
        self.base = 0
        self.seekable = False
        try:
            self.seekable = bool(f.seekable())
        except (AttributeError, OSError, ValueError):
            self.seekable = False
        if self.seekable:
            try:
                self.base = f.tell()
                end = f.seek(0, io.SEEK_END)
                f.seek(self.base)
                self.size = max(0, end - self.base)
            except (OSError, ValueError):
                # /proc files claim to seek but refuse SEEK_END: read them as a stream of unknown
                # size (the cap bounds it), from where the reader stands
                self.seekable, self.base, self.size = False, 0, None
        self.pos = 0

    def fetch(self, start: int, n: int) -> bytes:
        if start != self.pos:
            if not self.seekable:
                raise GGUFError("cannot seek in a non-seekable stream", start)
            self.f.seek(self.base + start)
        out = bytearray()
        while len(out) < n:
            chunk = self.f.read(n - len(out))
            if not chunk:
                break
            out += chunk
        self.pos = start + len(out)
        self.bytes_read += len(out)
        self.requests += 1
        return bytes(out)

    def close(self) -> None:
        if self.own:
            self.f.close()


_CONTENT_RANGE_RE = re.compile(r"^\s*bytes\s+(\d{1,20})-(\d{1,20})/(\d{1,20}|\*)\s*$", re.I)


class _HTTPSource(_Source):
    """HTTP(S) Range requests. A server must answer 206 with a matching Content-Range; anything
    else (200 with the whole body, 416, a body shorter than announced) is a clear error, and the
    body is never read beyond what was asked. ``timeout`` is one deadline for the whole header
    (every connect, status line, headers and body byte), so a server that trickles cannot hold it."""

    def __init__(self, url: str, timeout: float):
        self.label = redact_url(url)        # what messages show: never a password or a token
        self.url, self.auth = _split_credentials(url, self.label)
        self.timeout = timeout
        self.deadline = time.monotonic() + timeout

    def next_total(self, have: int) -> int:
        # few round trips: 1 MiB, then 8 MiB in all, then doubling
        if have == 0:
            return FIRST_CHUNK
        return SECOND_CHUNK_TOTAL if have < SECOND_CHUNK_TOTAL else 2 * have

    def fetch(self, start: int, n: int) -> bytes:
        if self.size is not None:
            n = min(n, self.size - start)
            if n <= 0:
                return b""
        headers = {"Range": f"bytes={start}-{start + n - 1}", "Accept-Encoding": "identity",
                   "User-Agent": "v100lab-header"}
        req = urllib.request.Request(self.url, headers=headers)
        if self.auth:   # not forwarded when the server redirects to another host (a CDN)
            req.add_unredirected_header("Authorization", self.auth)
        self.requests += 1
        try:
            resp = open_url(req, self.deadline)
        except TimeoutError:
            raise GGUFError(f"no answer from {self.label} within the {self.timeout:g} s timeout", start) from None
        except urllib.error.HTTPError as exc:
            if exc.code == 416:
                raise GGUFError(f"server answered 416 (range not satisfiable) for bytes {start}-"
                                f"{start + n - 1} of {self.label}", start) from None
            if exc.code == 404:
                raise ModelNotFoundError(f"URL not found (404): {self.label}") from None
            raise GGUFError(f"server answered HTTP {exc.code} for {self.label}", start) from None
        except (urllib.error.URLError, OSError) as exc:
            reason = getattr(exc, "reason", exc)
            raise ModelNotFoundError(f"cannot fetch {self.label}: {_redacted(reason, self.url)}") from None
        except (http.client.HTTPException, ValueError) as exc:   # InvalidURL, a bad status line, ...
            raise ModelNotFoundError(f"cannot fetch {self.label}: {type(exc).__name__}") from None
        with resp:
            status = resp.status
            if status == 200:
                raise GGUFError(f"server ignores Range requests (answered 200 with the whole body) "
                                f"for {self.label}", start)
            if status != 206:
                raise GGUFError(f"server answered HTTP {status} to a Range request for {self.label}", start)
            m = _CONTENT_RANGE_RE.match(resp.headers.get("Content-Range", ""))
            if not m:
                raise GGUFError(f"206 answer without a valid Content-Range from {self.label}", start)
            first, last, total = int(m.group(1)), int(m.group(2)), m.group(3)
            if first != start or last < first or last > start + n - 1:
                raise GGUFError(f"server sent bytes {first}-{last}, asked for {start}-{start + n - 1}",
                                start)
            if total != "*":
                self.size = int(total)
            want = last - first + 1
            try:
                data = read_response(resp, want, self.deadline)
            except TimeoutError:
                raise GGUFError(f"short read from {self.label}: the {want} bytes asked for did not arrive within "
                                f"the {self.timeout:g} s timeout", start) from None
            except Exception as exc:  # http.client.IncompleteRead, a reset
                raise GGUFError(f"short read from {self.label}: {type(exc).__name__}", start) from None
        self.bytes_read += len(data)
        if len(data) != want:
            raise GGUFError(f"short read from {self.label}: got {len(data)} of {want} bytes", start + len(data))
        return data


def _split_credentials(url: str, label: str) -> tuple[str, str | None]:
    """(the URL without ``user:password@``, a Basic ``Authorization`` value or None); ModelNotFoundError
    (naming the redacted URL) when the URL cannot be parsed or has no host or a bad port."""
    try:
        parts = urlsplit(url)
        host, _port = parts.hostname, parts.port   # .port raises ValueError for a bad port
    except ValueError as exc:
        raise ModelNotFoundError(f"not a valid URL: {label} ({exc})") from None
    if not host:
        raise ModelNotFoundError(f"not a valid URL: {label} (no host)")
    if any(c.isspace() or not c.isprintable() for c in url):
        raise ModelNotFoundError(f"not a valid URL: {label} (it holds spaces or control characters)")
    if parts.username is None and parts.password is None:
        return url, None
    netloc = parts.netloc.rpartition("@")[2]
    clean = urlunsplit((parts.scheme, netloc, parts.path, parts.query, parts.fragment))
    cred = f"{unquote(parts.username or '')}:{unquote(parts.password or '')}".encode()
    return clean, "Basic " + base64.b64encode(cred).decode("ascii")


def _redacted(reason, url: str) -> str:
    """An error reason with the URL (if it repeats it) redacted."""
    text = str(reason)
    return text.replace(url, redact_url(url)) if url in text else text


# ------------------------------------------------------------------------------------------------
# the bounded buffered reader
# ------------------------------------------------------------------------------------------------

class _Reader:
    """A growing buffer over a source, starting at byte 0, with the parse position ``pos``."""

    def __init__(self, src: _Source, cap: int):
        self.src = src
        self.cap = cap
        self.buf = bytearray()
        self.pos = 0
        self.eof = False

    @property
    def limit(self) -> int:
        """How far the header can extend: the file size when known, else the cap."""
        size = self.src.size
        return self.cap if size is None else min(size, self.cap)

    def left(self) -> int:
        return self.limit - self.pos

    def check_fit(self, need: int, what: str, at: int) -> None:
        """Refuse, before allocating anything, a length or count that cannot fit: in the file's
        real size (malformed) or under the cap (too large to read)."""
        size = self.src.size
        if size is not None and need > size - self.pos:
            raise GGUFError(f"{what} needs {need} bytes but only {max(size - self.pos, 0)} are left in "
                            "the file", at)
        if need > self.cap - self.pos:
            raise GGUFError(f"header larger than the cap of {self.cap} bytes: {what} needs {need} bytes", at)

    def ensure(self, n: int, what: str) -> None:
        end = self.pos + n
        while end > len(self.buf):
            if end > self.cap and (self.src.size is None or end <= self.src.size):
                raise GGUFError(f"header larger than the cap of {self.cap} bytes while reading {what}",
                                self.pos)
            if self.eof:
                raise GGUFError(f"file ends inside the header while reading {what} "
                                f"(needs {end - len(self.buf)} more bytes)", self.pos)
            have = len(self.buf)
            target = self.src.next_total(have)
            target = min(max(target, end), self.cap)
            if self.src.size is not None:
                target = min(target, self.src.size)
            want = target - have
            data = self.src.fetch(have, want) if want > 0 else b""
            if len(data) < want or want <= 0:
                self.eof = True
            if len(data) > want:
                data = data[:want]
            self.buf += data

    # primitives ------------------------------------------------------------------------------
    def scalar(self, st: struct.Struct, what: str):
        """One fixed-size little-endian value at ``pos`` (``st``: a one-field struct), then past it."""
        self.ensure(st.size, what)
        v = st.unpack_from(self.buf, self.pos)[0]
        self.pos += st.size
        return v

    def u32(self, what: str) -> int:
        return self.scalar(_U32, what)

    def i32(self, what: str) -> int:
        return self.scalar(_I32, what)

    def u64(self, what: str) -> int:
        return self.scalar(_U64, what)

    def i64(self, what: str) -> int:
        return self.scalar(_I64, what)

    def string(self, what: str) -> str:
        at = self.pos
        n = self.u64(f"length of {what}")
        self._check_string_len(n, what, at)
        self.ensure(n, what)
        raw = self.buf[self.pos:self.pos + n]
        try:
            s = raw.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise GGUFError(f"{what} is not valid UTF-8", self.pos + exc.start) from None
        self.pos += n
        return s

    def _check_string_len(self, n: int, what: str, at: int) -> None:
        if n > MAX_STRING_BYTES:
            raise GGUFError(f"{what} claims {n} bytes (more than 1 GiB)", at)
        self.check_fit(n + (at + 8 - self.pos), f"{what} of {n} bytes", at)

    def string_array(self, count: int, what: str) -> tuple[str, ...]:
        """``count`` strings, parsed with plain bytes operations (no per-element numpy objects).

        The loop only slices; decoding is one call: the pieces are joined with NUL separators and
        decoded at once (NUL is ASCII, so the joined text is valid UTF-8 exactly when every piece
        is), then split. When a piece itself holds a NUL, or the decode fails, the pieces are
        decoded one by one (to locate the bad one)."""
        buf = self.buf
        blen = len(buf)
        pos = self.pos
        unpack = _U64.unpack_from
        pieces = []
        append = pieces.append
        first = pos
        for _ in range(count):
            if pos + 8 > blen:
                self.pos = pos
                self.ensure(8, f"length of a string in {what}")
                blen = len(buf)
            n = unpack(buf, pos)[0]
            end = pos + 8 + n
            if end > blen or n > MAX_STRING_BYTES:
                self.pos = pos
                self._check_string_len(n, f"a string in {what}", pos)
                self.pos = pos + 8
                self.ensure(n, f"a string in {what}")
                blen = len(buf)
            append(buf[pos + 8:end])
            pos = end
        self.pos = pos
        joined = b"\x00".join(pieces)
        try:
            text = joined.decode("utf-8")
        except UnicodeDecodeError:
            text = None
        if text is not None and joined.count(0) == max(count - 1, 0):
            return tuple(text.split("\x00")) if count else ()
        out = []
        at = first
        for piece in pieces:
            at += 8
            try:
                out.append(piece.decode("utf-8"))
            except UnicodeDecodeError as exc:
                raise GGUFError(f"a string in {what} is not valid UTF-8", at + exc.start) from None
            at += len(piece)
        return tuple(out)


# ------------------------------------------------------------------------------------------------
# parsing
# ------------------------------------------------------------------------------------------------

def _value_type(r: _Reader, what: str, at: int):
    t = r.u32(f"value type of {what}")
    try:
        return VT(t)
    except ValueError:
        raise GGUFError(f"unknown value type {t} for {what}", at) from None


def _read_value(r: _Reader, vtype, key: str):
    """One metadata value of type ``vtype`` (already read); returns (value, type description)."""
    if vtype == VT.STRING:
        return r.string(f"value of '{key}'"), vtype
    if vtype == VT.ARRAY:
        at = r.pos
        etype = _value_type(r, f"elements of '{key}'", at)
        if etype == VT.ARRAY:
            raise GGUFError(f"'{key}' is an array of arrays (nested arrays are not supported)", at)
        count_at = r.pos
        count = r.u64(f"element count of '{key}'")
        elem_min = 8 if etype == VT.STRING else _SCALAR[etype][1]
        r.check_fit(count * elem_min, f"'{key}' with {count} elements of {etype.name}", count_at)
        if etype == VT.STRING:
            return r.string_array(count, f"'{key}'"), (VT.ARRAY, etype)
        size = _SCALAR[etype][1] * count
        r.ensure(size, f"elements of '{key}'")
        arr = np.frombuffer(r.buf, dtype=_NP_DTYPE[etype], count=count, offset=r.pos)
        if etype == VT.BOOL:
            if count and int(arr.max()) > 1:
                bad = int(np.argmax(arr > 1))
                raise GGUFError(f"'{key}' holds a bool that is neither 0 nor 1", r.pos + bad)
            arr = arr.astype(bool)
        value = tuple(arr.tolist())   # plain Python values; tolist() is one C loop
        del arr                       # release the buffer export before the buffer grows again
        r.pos += size
        return value, (VT.ARRAY, etype)
    at = r.pos
    v = r.scalar(_SCALAR_STRUCT[vtype], f"value of '{key}'")
    if vtype == VT.BOOL:
        if v > 1:
            raise GGUFError(f"'{key}' is a bool of value {v}, neither 0 nor 1", at)
        v = bool(v)
    return v, vtype


def _parse(r: _Reader) -> GGUFHeader:
    r.ensure(4, "the magic")
    magic = bytes(r.buf[0:4])
    if magic != b"GGUF":
        raise GGUFError(f"not a GGUF file (magic {magic!r}, expected b'GGUF')", 0)
    r.pos = 4
    version = r.u32("the version")
    if version not in (2, 3):
        swapped = struct.unpack("<I", struct.pack(">I", version))[0]
        if swapped in (1, 2, 3):
            raise GGUFError(f"byte-swapped (big-endian) GGUF version {swapped} is not supported", 4)
        if version == 1:
            raise GGUFError("GGUF version 1 is not supported (llama.cpp dropped it; re-convert the model)", 4)
        raise GGUFError(f"unsupported GGUF version {version} (supported: 2, 3)", 4)
    at = r.pos
    n_tensors = r.u64("the tensor count")
    at_kv = r.pos
    n_kv = r.u64("the metadata count")
    # smallest tensor info: name length 8 + n_dims 4 + one dim 8 + type 4 + offset 8 = 32;
    # smallest key/value: key length 8 + type 4 + one byte = 13
    r.check_fit(n_tensors * 32, f"tensor count {n_tensors}", at)
    r.check_fit(n_kv * 13 + n_tensors * 32, f"metadata count {n_kv}", at_kv)

    metadata: dict[str, object] = {}
    vtypes: dict[str, object] = {}
    for _ in range(n_kv):
        at = r.pos
        key = r.string("a metadata key")
        if key in metadata:
            raise GGUFError(f"duplicate metadata key '{key}'", at)
        vat = r.pos
        vtype = _value_type(r, f"'{key}'", vat)
        value, desc = _read_value(r, vtype, key)
        metadata[key] = value
        vtypes[key] = desc

    alignment = gguf.GGUF_DEFAULT_ALIGNMENT
    if "general.alignment" in metadata:
        a = metadata["general.alignment"]
        if vtypes["general.alignment"] != VT.UINT32:
            raise GGUFError(f"general.alignment has type {_type_name(vtypes['general.alignment'])}, "
                            "expected uint32", None)
        if a == 0 or a & (a - 1):
            raise GGUFError(f"general.alignment {a} is not a non-zero power of two", None)
        alignment = a

    tensors: list[TensorInfo] = []
    names: set[str] = set()
    expected = 0
    for i in range(n_tensors):
        at = r.pos
        name = r.string(f"the name of tensor {i}")
        if len(name.encode()) >= GGML_MAX_NAME:
            raise GGUFError(f"tensor name '{name[:80]}' is too long ({len(name.encode())} bytes, "
                            f"limit {GGML_MAX_NAME - 1})", at)
        if name in names:
            raise GGUFError(f"duplicate tensor name '{name}'", at)
        names.add(name)
        dat = r.pos
        n_dims = r.u32(f"n_dims of '{name}'")
        if not 1 <= n_dims <= GGML_MAX_DIMS:
            raise GGUFError(f"tensor '{name}' has {n_dims} dimensions (allowed 1..{GGML_MAX_DIMS})", dat)
        shape = []
        for d in range(n_dims):
            dat = r.pos
            ne = r.i64(f"dimension {d} of '{name}'")
            if ne < 0:
                raise GGUFError(f"tensor '{name}' has negative dimension {ne}", dat)
            shape.append(ne)
        n_el = 1
        for ne in shape:
            n_el *= ne
        if n_el > INT64_MAX:
            raise GGUFError(f"tensor '{name}' has {n_el} elements, overflowing int64", dat)
        tat = r.pos
        t = r.i32(f"the type of '{name}'")
        try:
            qtype = gguf.GGMLQuantizationType(t)
            block, tsize = gguf.GGML_QUANT_SIZES[qtype]
        except (ValueError, KeyError):
            raise GGUFError(f"tensor '{name}' has unknown ggml type {t}", tat) from None
        if shape[0] % block:
            raise GGUFError(f"tensor '{name}': ne0 {shape[0]} is not a multiple of the {qtype.name} "
                            f"block size {block}", tat)
        n_bytes = n_el // block * tsize
        oat = r.pos
        offset = r.u64(f"the data offset of '{name}'")
        # gguf.cpp gguf_init_from_file_impl: each tensor starts where the previous one ended,
        # padded to the alignment.
        if offset % alignment:
            raise GGUFError(f"tensor '{name}' offset {offset} is not a multiple of the alignment {alignment}",
                            oat)
        if offset < expected:
            raise GGUFError(f"tensor '{name}' offset {offset} overlaps the previous tensor or is out of "
                            f"order (expected {expected})", oat)
        if offset > expected:
            raise GGUFError(f"tensor '{name}' offset {offset} leaves a gap (expected {expected})", oat)
        expected = offset + -(-n_bytes // alignment) * alignment
        m = _LAYER_RE.match(name)
        tensors.append(TensorInfo(name=name, shape=tuple(shape), type_name=qtype.name, n_bytes=n_bytes,
                                  offset=offset, layer=int(m.group(1)) if m else None))

    infos_end = r.pos
    data_offset = -(-infos_end // alignment) * alignment
    return GGUFHeader(version=version, metadata=MappingProxyType(metadata),
                      value_types=MappingProxyType(vtypes), tensors=tuple(tensors), alignment=alignment,
                      header_bytes=data_offset, data_offset=data_offset, tensor_infos_end=infos_end,
                      file_bytes=r.src.size,
                      bytes_read=r.src.bytes_read, requests=r.src.requests)


def _type_name(desc) -> str:
    if isinstance(desc, tuple):
        return f"array of {desc[1].name.lower()}"
    return desc.name.lower()


# ------------------------------------------------------------------------------------------------
# entry points
# ------------------------------------------------------------------------------------------------

def is_url(source) -> bool:
    """Whether a model or server argument is an http(s) URL rather than a path."""
    return isinstance(source, str) and source.strip().lower().startswith(("http://", "https://"))


def _open_source(source, timeout: float) -> tuple[_Source, str]:
    if hasattr(source, "read"):
        return _FileSource(source, own=False), getattr(source, "name", "<file object>")
    if is_url(source):
        src = _HTTPSource(source, timeout)
        return src, src.label
    if isinstance(source, (str, os.PathLike)):
        path = Path(os.fspath(source)).expanduser()
        if not path.exists():
            raise ModelNotFoundError(f"model file '{term_text(os.fspath(source))}' does not exist "
                                     "(an alias is resolved by v100lab.models.resolve.resolve, not by the header reader)")
        return _FileSource(_open_regular(path), own=True), str(path)
    raise ModelNotFoundError(f"not a model path, URL or file object: {source!r}")


def _open_regular(path: Path):
    """``path`` opened for reading, refusing anything but a regular file (opened non-blocking, so a
    FIFO put in its place cannot hang the open)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    except OSError as exc:
        raise ModelNotFoundError(f"cannot open model file '{term_text(path)}': {exc.strerror or exc}") from None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise ModelNotFoundError(f"model path '{term_text(path)}' is not a regular file")
        return os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise


def _check_limits(max_header_bytes, timeout) -> None:
    if isinstance(max_header_bytes, bool) or not isinstance(max_header_bytes, int) or max_header_bytes < 1:
        raise ConfigError(f"the header cap must be a positive number of bytes, got {max_header_bytes!r}")
    if (isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or not math.isfinite(timeout)
            or not 0 < timeout <= MAX_TIMEOUT_S):
        raise ConfigError(f"timeout must be a number of seconds in (0, {MAX_TIMEOUT_S:g}], got {timeout!r}")


def check_data(hdr: GGUFHeader) -> None:
    """Refuse a file whose tensor data runs past its end (a partial download or copy).

    Mirrors llama.cpp src/llama-model-loader.h ``llama_tensor_weight``: every tensor's
    ``data_offset + offset + nbytes`` must lie within the file. Accepted without data: a header-only
    file (it ends before the data section starts) and a v100lab skeleton (``general.description``
    starts with "v100lab skeleton"). Nothing is checked when the size is unknown (a stream).
    """
    size = hdr.file_bytes
    if size is None or hdr.data_complete or size <= hdr.data_offset:
        return
    desc = hdr.metadata.get("general.description")
    if isinstance(desc, str) and desc.startswith(SKELETON_MARK):
        return
    cut = next(t for t in hdr.tensors if hdr.data_offset + t.offset + t.n_bytes > size)
    start = hdr.data_offset + cut.offset
    raise GGUFError(f"truncated model file of {size} bytes: tensor '{cut.name}' needs bytes {start}-"
                    f"{start + cut.n_bytes} and the tensor data runs to byte {hdr.data_offset + hdr.data_bytes} "
                    "(a partial download or copy? llama.cpp refuses it: tensor data not within the file "
                    "bounds); the file ends", size)


def read_header(source, *, max_header_bytes: int = DEFAULT_MAX_HEADER_BYTES,
                timeout: float = 30) -> GGUFHeader:
    """Parse only the GGUF header of ``source`` (path, binary file object, http(s) URL; never an alias).

    Reads at most ``max_header_bytes`` (default 64 MiB); a header that needs more raises
    :class:`GGUFError`, and so does a file whose tensor data runs past its end (:func:`check_data`).
    ``timeout`` bounds the whole HTTP fetch, every request and byte (seconds, finite, at most an hour).
    A file object is read from its current position and left open. Messages never show a URL's password
    or query values.
    """
    _check_limits(max_header_bytes, timeout)
    src, label = _open_source(source, timeout)
    try:
        hdr = _parse(_Reader(src, max_header_bytes))
    finally:
        src.close()
    check_data(hdr)
    log.debug("read header of %s: %d bytes, %d tensors, %d bytes read in %d requests", label,
              hdr.header_bytes, len(hdr.tensors), hdr.bytes_read, hdr.requests)
    return hdr


def read_spec(source, *, max_header_bytes: int = DEFAULT_MAX_HEADER_BYTES, timeout: float = 30) -> ModelSpec:
    """The :class:`ModelSpec` of a GGUF model, from its header alone (see :func:`read_header`)."""
    return spec_from_header(read_header(source, max_header_bytes=max_header_bytes, timeout=timeout))


# ------------------------------------------------------------------------------------------------
# derivation: header → ModelSpec (shared with v100lab.gguf.skeleton)
# ------------------------------------------------------------------------------------------------

def file_type_name(value) -> str:
    """general.file_type (a ``LLAMA_FTYPE``) → "Q4_K_M", "F16", "F32", ...; "unknown" if absent."""
    if value is None or isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        return "unknown"
    try:
        ft = gguf.LlamaFileType(int(value) & ~1024)  # 1024 = LLAMA_FTYPE_GUESSED flag
    except ValueError:
        return "unknown"
    if ft == gguf.LlamaFileType.ALL_F32:
        return "F32"
    return ft.name.removeprefix("MOSTLY_")


_ABSENT = object()   # _Meta._lookup's "no such key" (None can be a default)


class _Meta:
    """Typed access to metadata with errors that name the key."""

    def __init__(self, md: Mapping[str, object], arch: str):
        self.md = md
        self.arch = arch

    def key(self, suffix: str) -> str:
        return f"{self.arch}.{suffix}"

    def get(self, suffix: str, default=None):
        return self.md.get(self.key(suffix), default)

    def _lookup(self, suffix: str, required: bool) -> tuple[str, object]:
        """(full key, value) of ``{arch}.{suffix}``; the value is ``_ABSENT`` when the key is missing
        (a GGUFError naming the key when it is ``required``)."""
        k = self.key(suffix)
        if k not in self.md:
            if required:
                raise GGUFError(f"missing metadata key '{k}'")
            return k, _ABSENT
        return k, self.md[k]

    def int(self, suffix: str, default=None, required: bool = False) -> int | None:
        k, v = self._lookup(suffix, required)
        if v is _ABSENT:
            return default
        if isinstance(v, bool) or not isinstance(v, (int, np.integer)):
            raise GGUFError(f"metadata key '{k}' is not an integer ({type(v).__name__})")
        return int(v)

    def float(self, suffix: str, default=None) -> float | None:
        k, v = self._lookup(suffix, False)
        if v is _ABSENT:
            return default
        if isinstance(v, bool) or not isinstance(v, (int, float, np.integer, np.floating)):
            raise GGUFError(f"metadata key '{k}' is not a number ({type(v).__name__})")
        return float(v)

    def int_or_array(self, suffix: str, n_layer: int, default=None, required: bool = False):
        """An int, or a per-layer array (length n_layer) → tuple; uniform arrays stay tuples."""
        k, v = self._lookup(suffix, required)
        if v is _ABSENT:
            return default
        if isinstance(v, tuple):
            if not all(isinstance(x, int) and not isinstance(x, bool) for x in v):
                raise GGUFError(f"metadata key '{k}' is an array of non-integers, expected integers")
            if len(v) != n_layer:
                raise GGUFError(f"metadata key '{k}' has {len(v)} values for {n_layer} layers")
            if v and min(v) < 0:
                raise GGUFError(f"metadata key '{k}' holds a negative value")
            return v
        return self.int(suffix, default, required)


def _first(v) -> int:
    return v[0] if isinstance(v, tuple) else v


def _largest(v) -> int:
    """A per-layer array's largest value (llama.cpp's n_ff_exp() reads layer 0; arrays are uniform in practice)."""
    return max(v, default=0) if isinstance(v, tuple) else v


# archs whose SWA layers follow llama_hparams::set_swa_pattern(n) with a fixed n in llama.cpp's
# load_hparams (the GGUF's sliding_window_pattern key is not read for them)
_FIXED_SWA_PERIOD = {"gemma2": 2, "gemma3": 6, "gemma-embedding": 6, "gemma3n": 5}
# archs that read {arch}.attention.sliding_window_pattern as a scalar period, with this default
_KEYED_SWA_PERIOD = {"cohere2": 4, "afmoe": 4, "exaone4": 4, "smallthinker": 4, "plamo3": 8}
_DEFAULT_N_SWA = {"gemma2": 4096}   # llama.cpp gemma2: n_swa = 4096 unless the key says otherwise


def swa_layers_for(arch: str, n_layer: int, n_swa: int | None, md: Mapping[str, object]) -> tuple[int, ...]:
    """Which layers use sliding-window attention, as llama.cpp decides it.

    llama.cpp src/llama-model.cpp ``load_hparams``: gemma2 calls ``hparams.set_swa_pattern(2)``,
    gemma3 ``set_swa_pattern(6)`` (only when ``sliding_window`` is present and > 0); archs such as
    gemma4 read ``{arch}.attention.sliding_window_pattern`` as a per-layer bool array
    (``get_key_or_arr``), others (cohere2, ...) as a scalar period. src/llama-hparams.cpp
    ``llama_hparams::set_swa_pattern(n_pattern, dense_first=false)``: layer il is SWA when
    ``n_pattern == 0 || il % n_pattern < n_pattern - 1``.
    """
    if not n_swa:
        return ()
    pattern_key = f"{arch}.attention.sliding_window_pattern"
    pat = md.get(pattern_key)
    n_pattern = _FIXED_SWA_PERIOD.get(arch)
    if n_pattern is None:
        if isinstance(pat, tuple) and all(isinstance(x, int) for x in pat):
            if len(pat) != n_layer:
                raise GGUFError(f"metadata key '{pattern_key}' has {len(pat)} values for {n_layer} layers")
            return tuple(i for i in range(n_layer) if bool(pat[i]))
        if isinstance(pat, (int, np.integer)) and not isinstance(pat, bool):
            n_pattern = int(pat)
        else:
            n_pattern = _KEYED_SWA_PERIOD.get(arch)
    if n_pattern is None:
        return ()
    return tuple(il for il in range(n_layer) if n_pattern == 0 or il % n_pattern < n_pattern - 1)


# llama.cpp architectures whose every layer is recurrent (src/llama-arch.cpp llm_arch_is_recurrent)
RECURRENT_ARCHS = frozenset({"mamba", "mamba2", "rwkv6", "rwkv6qwen2", "rwkv7", "arwkv7"})
# hybrid architectures whose recurrent layers are the ones with n_head_kv == 0
# (llama-model.cpp: recurrent_layer_arr[i] = n_head_kv(i) == 0)
HYBRID_KV0_ARCHS = frozenset({"jamba", "falcon-h1", "granitehybrid", "lfm2", "lfm2moe", "nemotron_h",
                              "plamo2"})
# hybrids with a full_attention_interval (default 4 in llama.cpp)
INTERVAL_ARCHS = frozenset({"qwen3next", "qwen35", "qwen35moe"})


def recurrent_layers_for(arch: str, n_layer: int, n_head_kv, full_attention_interval: int | None,
                         nextn_layers: int = 0, md: Mapping[str, object] | None = None) -> tuple[int, ...]:
    """Which layers hold recurrent state instead of a KV cache.

    llama.cpp src/models/qwen35.cpp ``load_arch_hparams`` (also qwen3next, qwen35moe): the bool array
    ``{arch}.attention.recurrent_layers`` when present, else
    ``is_recr[i] = i < n_layer - nextn_layers && (i + 1) % full_attention_interval != 0``
    (interval default 4), so with 64 layers the full-attention layers are 3, 7, ..., 63 and the MTP
    layers at the end are not recurrent.
    """
    if arch in RECURRENT_ARCHS:
        return tuple(range(n_layer))
    if arch in INTERVAL_ARCHS:
        arr = (md or {}).get(f"{arch}.attention.recurrent_layers")
        if isinstance(arr, tuple) and all(isinstance(x, int) for x in arr):
            if len(arr) != n_layer:
                raise GGUFError(f"metadata key '{arch}.attention.recurrent_layers' has {len(arr)} values "
                                f"for {n_layer} layers")
            return tuple(i for i in range(n_layer) if bool(arr[i]))
        fai = full_attention_interval or 4
        n_main = n_layer - nextn_layers
        return tuple(i for i in range(n_layer) if i < n_main and (i + 1) % fai != 0)
    if arch in HYBRID_KV0_ARCHS and isinstance(n_head_kv, tuple):
        return tuple(i for i in range(n_layer) if n_head_kv[i] == 0)
    return ()


_INTERVAL_DEFAULT = {"qwen3next": 4, "qwen35": 4, "qwen35moe": 4}

LLAMA_MAX_LAYERS = 512       # llama.cpp src/llama-hparams.h
LLAMA_MAX_EXPERTS = 1024     # llama.cpp src/llama-hparams.h
_ATTN_WEIGHTS = (".attn_q.weight", ".attn_qkv.weight", ".attn_k.weight", ".attn_q_a.weight")


def check_hparams(arch: str, n_layer: int, n_embd: int, n_head, n_head_kv, head_dim_k: int, head_dim_v: int, *,
                  explicit_heads: bool, tensors: Sequence[TensorInfo], n_expert: int, n_expert_used) -> None:
    """GGUFError (llama.cpp's reason) for hyperparameters llama.cpp refuses or crashes on.

    Mirrors llama.cpp src/llama-model.cpp ``llama_model::load_hparams`` (expert counts: its GGML_ASSERTs;
    head size ``n_embd / n_head``, 0 without heads, so attention weights' shapes cannot match) and
    ggml.c ``ggml_mul_mat`` (``ggml_can_mul_mat``: K/V heads are broadcast over the query heads, so
    ``n_head % n_head_kv == 0``). A recurrent layer (no heads, no K/V heads) is fine.
    """
    heads = n_head if isinstance(n_head, tuple) else (n_head,) * n_layer
    kv = n_head_kv if isinstance(n_head_kv, tuple) else (n_head_kv,) * n_layer
    key = f"{arch}.attention"
    has_attn = any(t.name.endswith(_ATTN_WEIGHTS) for t in tensors) if tensors else (
        explicit_heads and arch not in RECURRENT_ARCHS)
    if has_attn and not any(h > 0 for h in heads):
        raise GGUFError(f"'{key}.head_count' is 0 in every layer, but the model has attention: llama.cpp "
                        "refuses it (head size n_embd / n_head is 0, so no attention weight has its shape)")
    for il, (h, k) in enumerate(zip(heads, kv)):
        if h < 0 or k < 0:
            raise GGUFError(f"'{key}.head_count{'' if h < 0 else '_kv'}' is negative in layer {il}")
        if k and not h:
            raise GGUFError(f"layer {il} has {k} K/V heads and no query heads ('{key}.head_count' 0): "
                            "llama.cpp refuses it")
        if k > h:
            raise GGUFError(f"'{key}.head_count_kv' ({k}) is larger than '{key}.head_count' ({h}) in layer {il}: "
                            "llama.cpp cannot share K/V heads among fewer query heads (ggml_mul_mat asserts "
                            "n_head % n_head_kv == 0)")
        if k and h % k:
            raise GGUFError(f"'{key}.head_count' ({h}) is not a multiple of '{key}.head_count_kv' ({k}) in layer "
                            f"{il}: llama.cpp aborts (ggml_mul_mat asserts n_head % n_head_kv == 0)")
    if heads[0] > 0 and (head_dim_k <= 0 or head_dim_v <= 0):   # load_hparams: "if (hparams.n_head() > 0)"
        raise GGUFError(f"the attention head size is {min(head_dim_k, head_dim_v)} (embedding_length {n_embd} / "
                        f"head_count {heads[0]}, or '{key}.key_length' / 'value_length'): llama.cpp refuses it")
    used = max(n_expert_used) if isinstance(n_expert_used, tuple) else n_expert_used
    if not 0 <= n_expert <= LLAMA_MAX_EXPERTS:
        raise GGUFError(f"'{arch}.expert_count' is {n_expert}; llama.cpp loads at most {LLAMA_MAX_EXPERTS} experts")
    if used < 0 or used > n_expert or (n_expert > 0 and used == 0):
        raise GGUFError(f"'{arch}.expert_used_count' is {used} with {n_expert} experts: llama.cpp refuses it "
                        "(it must be 1 to expert_count, or 0 without experts)")



def spec_from_header(hdr: GGUFHeader) -> ModelSpec:
    """Derive the :class:`ModelSpec` from a parsed header (llama.cpp's ``llama_hparams`` rules)."""
    return spec_from_metadata(hdr.metadata, hdr.tensors, alignment=hdr.alignment,
                              header_bytes=hdr.header_bytes, data_offset=hdr.data_offset,
                              file_bytes=hdr.file_bytes)


def spec_from_metadata(md: Mapping[str, object], tensors: Sequence[TensorInfo], *, alignment: int = 32,
                       header_bytes: int = 0, data_offset: int = 0, file_bytes: int | None = None) -> ModelSpec:
    arch = md.get("general.architecture")
    if not isinstance(arch, str) or not arch:
        raise GGUFError("missing metadata key 'general.architecture'")
    m = _Meta(md, arch)
    n_layer = m.int("block_count", required=True)
    # llama-model.cpp llama_model::load_hparams: GGML_ASSERT(n_layer > 0 && n_layer <= LLAMA_MAX_LAYERS)
    if not 0 < n_layer <= LLAMA_MAX_LAYERS:
        raise GGUFError(f"'{arch}.block_count' is {n_layer}, not a plausible layer count (llama.cpp loads "
                        f"1 to {LLAMA_MAX_LAYERS} layers)")
    n_embd = m.int("embedding_length", required=True)
    if n_embd <= 0:
        raise GGUFError(f"'{arch}.embedding_length' is {n_embd}: llama.cpp refuses the model (every weight's "
                        "shape is built from it, so none would match)")
    n_ff = m.int_or_array("feed_forward_length", n_layer, default=0)
    n_head = m.int_or_array("attention.head_count", n_layer, default=0)
    # llama.cpp: n_head_kv defaults to n_head (load_hparams: "n_head_kv_arr = n_head_arr")
    n_head_kv = m.int_or_array("attention.head_count_kv", n_layer, default=n_head)
    h0 = _first(n_head) if not isinstance(n_head, tuple) or n_head else 0
    # llama.cpp load_hparams: n_embd_head_k = n_embd / n_head() unless attention.key_length is set
    default_head_dim = n_embd // h0 if h0 else 0
    head_dim_k = m.int("attention.key_length", default_head_dim)
    head_dim_v = m.int("attention.value_length", default_head_dim)
    tokens = md.get("tokenizer.ggml.tokens")
    if isinstance(tokens, tuple):
        n_vocab = len(tokens)
    else:
        n_vocab = m.int("vocab_size", 0)
        if not n_vocab:
            emb = next((t for t in tensors if t.name == "token_embd.weight"), None)
            n_vocab = emb.shape[1] if emb is not None and len(emb.shape) > 1 else 0
    n_swa = m.int("attention.sliding_window", _DEFAULT_N_SWA.get(arch)) or None
    swa = swa_layers_for(arch, n_layer, n_swa, md)
    if not swa:
        n_swa = None
    fai = m.int("full_attention_interval", _INTERVAL_DEFAULT.get(arch))
    if fai is not None and fai <= 0:
        raise GGUFError(f"'{arch}.full_attention_interval' is {fai}, must be positive")
    nextn = m.int("nextn_predict_layers", 0)
    if not 0 <= nextn < max(n_layer, 1):
        raise GGUFError(f"'{arch}.nextn_predict_layers' is {nextn}, must be below block_count {n_layer}")
    recurrent = recurrent_layers_for(arch, n_layer, n_head_kv, fai, nextn, md)
    check_hparams(arch, n_layer, n_embd, n_head, n_head_kv, head_dim_k, head_dim_v,
                  explicit_heads=m.key("attention.head_count") in md, tensors=tensors,
                  n_expert=m.int("expert_count", 0), n_expert_used=m.int_or_array("expert_used_count", n_layer, 0))
    name = md.get("general.name")
    return ModelSpec(
        architecture=arch,
        name=name if isinstance(name, str) else "",
        file_type=file_type_name(md.get("general.file_type")),
        n_layer=n_layer,
        n_embd=n_embd,
        n_ff=n_ff,
        n_head=n_head,
        n_head_kv_arr=n_head_kv,
        head_dim_k=head_dim_k,
        head_dim_v=head_dim_v,
        n_ctx_train=m.int("context_length", 0),
        n_vocab=n_vocab,
        tensors=tuple(tensors),
        rope_freq_base=m.float("rope.freq_base"),
        rope_dimension_count=m.int("rope.dimension_count"),
        sliding_window=n_swa,
        swa_layers=swa,
        recurrent_layers=recurrent,
        nextn_layers=nextn,
        kv_lora_rank=m.int("attention.kv_lora_rank"),
        key_length_mla=m.int("attention.key_length_mla"),
        value_length_mla=m.int("attention.value_length_mla"),
        q_lora_rank=m.int("attention.q_lora_rank"),
        expert_count=m.int("expert_count", 0),
        expert_used_count=m.int("expert_used_count", 0),
        n_ff_exp=_largest(m.int_or_array("expert_feed_forward_length", n_layer, default=0)),
        n_ff_shexp=m.int("expert_shared_feed_forward_length", 0),
        n_expert_shared=m.int("expert_shared_count", 0),
        n_layer_dense_lead=m.int("leading_dense_block_count", 0),
        ssm_conv_kernel=m.int("ssm.conv_kernel"),
        ssm_state_size=m.int("ssm.state_size"),
        ssm_group_count=m.int("ssm.group_count"),
        ssm_time_step_rank=m.int("ssm.time_step_rank"),
        ssm_inner_size=m.int("ssm.inner_size"),
        full_attention_interval=fai if recurrent and fai else None,
        alignment=alignment,
        header_bytes=header_bytes,
        data_offset=data_offset,
        file_bytes=file_bytes,
        metadata=md if isinstance(md, MappingProxyType) else MappingProxyType(dict(md)),
    )
