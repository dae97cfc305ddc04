"""Hostile and malformed GGUF headers: every one raises GGUFError (message + byte offset), fast,
with memory bounded by the file's real size. Files are built byte by byte here."""

from __future__ import annotations

import io
import struct

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from v100lab.base.errors import GGUFError
from v100lab.gguf.header import read_header, read_spec, spec_from_header

U8, I8, U16, I16, U32, I32, F32, BOOL, STR, ARR, U64, I64, F64 = range(13)
Q4_0, F16 = 2, 1


def s(text: str | bytes) -> bytes:
    b = text.encode() if isinstance(text, str) else text
    return struct.pack("<Q", len(b)) + b


def kv(key, vtype: int, payload: bytes) -> bytes:
    return s(key) + struct.pack("<I", vtype) + payload


def kv_u32(key, v):
    return kv(key, U32, struct.pack("<I", v))


def kv_str(key, v):
    return kv(key, STR, s(v))


def ti(name, shape, gtype=F16, offset=0) -> bytes:
    return (s(name) + struct.pack("<I", len(shape)) + b"".join(struct.pack("<q", d) for d in shape)
            + struct.pack("<iQ", gtype, offset))


def gguf_file(kvs=(), tensors=(), *, version=3, magic=b"GGUF", n_tensors=None, n_kv=None, tail=b"") -> bytes:
    head = magic + struct.pack("<I", version)
    head += struct.pack("<QQ", len(tensors) if n_tensors is None else n_tensors, len(kvs) if n_kv is None else n_kv)
    return head + b"".join(kvs) + b"".join(tensors) + tail


BASE_KV = [kv_str("general.architecture", "llama"), kv_u32("llama.block_count", 1),
           kv_u32("llama.embedding_length", 64), kv_u32("llama.attention.head_count", 4)]


def parse(data: bytes, **kw):
    return read_header(io.BytesIO(data), **kw)


def expect(data: bytes, match: str):
    with pytest.raises(GGUFError, match=match) as ei:
        parse(data)
    off = ei.value.offset
    assert off is None or 0 <= off <= len(data)
    assert "\n" not in str(ei.value)
    return ei.value


# ------------------------------------------------------------------------------------------------
# the fixed header
# ------------------------------------------------------------------------------------------------

def test_valid_minimal_file_parses():
    data = gguf_file(BASE_KV, [ti("blk.0.attn_q.weight", (64, 64), F16, 0)])
    hdr = parse(data)
    assert hdr.tensors[0].n_bytes == 64 * 64 * 2 and hdr.tensors[0].layer == 0
    assert hdr.data_complete is False            # a skeleton: no data
    spec = spec_from_header(hdr)
    assert spec.n_layer == 1 and spec.head_dim_k == 16


def test_wrong_magic():
    e = expect(gguf_file(BASE_KV, magic=b"GGML"), "not a GGUF file")
    assert e.offset == 0


@pytest.mark.parametrize("version", [0, 1, 4, 0xFFFFFFFF])
def test_bad_versions(version):
    e = expect(gguf_file(BASE_KV, version=version), "version")
    assert e.offset == 4


def test_byte_swapped_version():
    data = b"GGUF" + struct.pack(">I", 3) + struct.pack(">QQ", 0, 4)
    expect(data, "byte-swapped")


@pytest.mark.parametrize("field", ["n_tensors", "n_kv"])
@pytest.mark.parametrize("count", [2**64 - 1, 2**63, 2**40])
def test_counts_near_2_64(field, count):
    data = gguf_file(BASE_KV, **{field: count})
    expect(data, "count")


# ------------------------------------------------------------------------------------------------
# metadata values
# ------------------------------------------------------------------------------------------------

def test_string_longer_than_file():
    data = gguf_file([kv("general.name", STR, struct.pack("<Q", 1000) + b"abc")])
    expect(data, "left in the file")


def test_string_longer_than_1_gib():
    data = gguf_file([kv("general.name", STR, struct.pack("<Q", 2**30 + 1) + b"abc")])
    expect(data, "1 GiB")


def test_key_longer_than_file():
    data = gguf_file([struct.pack("<Q", 5000) + b"general"])
    expect(data, "left in the file")


def test_array_of_2_62_elements_in_43_bytes():
    data = gguf_file([kv("a", ARR, struct.pack("<IQ", U8, 2**62))], n_kv=1)
    assert len(data) <= 64
    expect(data, "2 ?305843009213693952|elements")


@pytest.mark.parametrize("etype", [STR, U64, F64, U8])
def test_array_count_beyond_bytes_left(etype):
    data = gguf_file([kv("a", ARR, struct.pack("<IQ", etype, 1000) + b"\0" * 16)])
    expect(data, "left in the file")


def test_nested_arrays():
    data = gguf_file([kv("a", ARR, struct.pack("<IQ", ARR, 1) + struct.pack("<IQ", U8, 1) + b"\1")])
    expect(data, "nested")


@pytest.mark.parametrize("vtype", [13, 99, 2**32 - 1])
def test_unknown_value_type(vtype):
    expect(gguf_file([kv("a", vtype, b"\0" * 8)]), "unknown value type")


def test_unknown_array_element_type():
    expect(gguf_file([kv("a", ARR, struct.pack("<IQ", 77, 1) + b"\0" * 8)]), "unknown value type")


def test_bool_not_0_or_1():
    expect(gguf_file([kv("flag", BOOL, b"\x02")]), "neither 0 nor 1")
    expect(gguf_file([kv("flags", ARR, struct.pack("<IQ", BOOL, 3) + b"\x00\x01\x05")]), "neither 0 nor 1")


@pytest.mark.parametrize("where", ["key", "value", "array"])
def test_invalid_utf8(where):
    bad = b"ab\xff\xfe"
    if where == "key":
        data = gguf_file([s(bad) + struct.pack("<I", U8) + b"\0"])
    elif where == "value":
        data = gguf_file([kv("general.name", STR, s(bad))])
    else:
        data = gguf_file([kv("tokens", ARR, struct.pack("<IQ", STR, 3) + s("ok") + s(bad) + s("x"))])
    expect(data, "UTF-8")


def test_utf8_split_across_array_strings():
    # each piece invalid alone, the concatenation valid: must still be refused
    euro = "€".encode()
    data = gguf_file([kv("tokens", ARR, struct.pack("<IQ", STR, 2) + s(euro[:1]) + s(euro[1:]))])
    expect(data, "UTF-8")


def test_strings_with_nul_and_non_ascii_round_trip():
    vals = ["a\0b", "€uro", "", "Ġthe", "\n"]
    data = gguf_file([kv("tokens", ARR, struct.pack("<IQ", STR, len(vals)) + b"".join(s(v) for v in vals))])
    assert parse(data).metadata["tokens"] == tuple(vals)


def test_duplicate_keys():
    expect(gguf_file([kv_u32("a", 1), kv_u32("a", 2)]), "duplicate metadata key")


@pytest.mark.parametrize("payload, match", [
    (kv_u32("general.alignment", 0), "power of two"),
    (kv_u32("general.alignment", 48), "power of two"),
    (kv("general.alignment", U64, struct.pack("<Q", 32)), "expected uint32"),
    (kv_str("general.alignment", "32"), "expected uint32"),
])
def test_bad_alignment(payload, match):
    expect(gguf_file([payload]), match)


# ------------------------------------------------------------------------------------------------
# tensor infos
# ------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("n_dims", [0, 5, 2**32 - 1])
def test_bad_n_dims(n_dims):
    t = s("w") + struct.pack("<I", n_dims) + struct.pack("<q", 32) * 4 + struct.pack("<iQ", F16, 0)
    expect(gguf_file(BASE_KV, [t]), "dimensions")


def test_negative_dimension():
    expect(gguf_file(BASE_KV, [ti("w", (32, -1))]), "negative")


def test_overflowing_dimensions():
    expect(gguf_file(BASE_KV, [ti("w", (2**40, 2**40))]), "overflowing")


@pytest.mark.parametrize("gtype", [4, 5, 31, 1000, -1])
def test_unknown_ggml_type(gtype):
    expect(gguf_file(BASE_KV, [ti("w", (32, 2), gtype)]), "unknown ggml type")


def test_ne0_not_multiple_of_block():
    expect(gguf_file(BASE_KV, [ti("w", (33, 2), Q4_0)]), "block size")


def test_duplicate_tensor_names():
    expect(gguf_file(BASE_KV, [ti("w", (32,), F16, 0), ti("w", (32,), F16, 64)]), "duplicate tensor name")


def test_tensor_name_too_long():
    expect(gguf_file(BASE_KV, [ti("x" * 64, (32,))]), "too long")


@pytest.mark.parametrize("offsets, match", [
    ((1,), "alignment"),                  # misaligned
    ((0, 0), "overlaps"),                 # overlapping
    ((64, 0), "gap|overlaps"),            # out of order (first leaves a gap)
    ((0, 96), "gap"),                     # hole between tensors
])
def test_bad_offsets(offsets, match):
    tensors = [ti(f"t{i}", (32,), F16, off) for i, off in enumerate(offsets)]   # 64 bytes each
    expect(gguf_file(BASE_KV, tensors), match)


# ------------------------------------------------------------------------------------------------
# derivation (spec) on odd but parseable metadata
# ------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("kvs, match", [
    ([kv_u32("llama.block_count", 1)], "general.architecture"),
    ([kv_str("general.architecture", "llama")], "block_count"),
    ([kv_str("general.architecture", "llama"), kv_str("llama.block_count", "30"),
      kv_u32("llama.embedding_length", 8)], "not an integer"),
    ([kv_str("general.architecture", "llama"), kv_u32("llama.block_count", 2**32 - 1),
      kv_u32("llama.embedding_length", 8)], "plausible"),
    ([kv_str("general.architecture", "llama"), kv_u32("llama.block_count", 3),
      kv_u32("llama.embedding_length", 8),
      kv("llama.attention.head_count_kv", ARR, struct.pack("<IQ", U32, 2) + struct.pack("<II", 1, 1))],
     "2 values for 3 layers"),
])
def test_spec_errors(kvs, match):
    with pytest.raises(GGUFError, match=match):
        read_spec(io.BytesIO(gguf_file(kvs)))


def test_per_layer_head_count_kv():
    kvs = [kv_str("general.architecture", "llama"), kv_u32("llama.block_count", 3),
           kv_u32("llama.embedding_length", 64), kv_u32("llama.attention.head_count", 4),
           kv("llama.attention.head_count_kv", ARR, struct.pack("<IQ", U32, 3) + struct.pack("<III", 4, 2, 0))]
    spec = read_spec(io.BytesIO(gguf_file(kvs)))
    assert spec.n_head_kv_arr == (4, 2, 0)
    assert [spec.n_embd_k_gqa(i) for i in range(3)] == [64, 32, 0]
    assert not spec.has_kv(2)


# ------------------------------------------------------------------------------------------------
# truncation at every byte, and fuzzing
# ------------------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def small_valid() -> bytes:
    kvs = BASE_KV + [kv("tokenizer.ggml.tokens", ARR, struct.pack("<IQ", STR, 3) + s("a") + s("€") + s("c")),
                     kv("tokenizer.ggml.scores", ARR, struct.pack("<IQ", F32, 3) + struct.pack("<3f", 0, 1, 2)),
                     kv("flag", BOOL, b"\1"), kv_u32("general.alignment", 64)]
    tensors = [ti("token_embd.weight", (64, 3), F16, 0), ti("blk.0.attn_q.weight", (64, 64), Q4_0, 384),
               ti("output_norm.weight", (64,), 0, 384 + 2304)]
    return gguf_file(kvs, tensors)


def test_cut_at_every_byte(small_valid):
    full = parse(small_valid)
    assert full.tensor_infos_end == len(small_valid)
    for cut in range(len(small_valid)):
        with pytest.raises(GGUFError) as ei:
            parse(small_valid[:cut])
        assert ei.value.offset is not None and ei.value.offset <= cut


def test_cap_is_enforced_without_size(small_valid):
    # a stream of unknown size is bounded by the cap
    class Stream(io.RawIOBase):
        def __init__(self):
            self.b = io.BytesIO(small_valid)

        def readable(self):
            return True

        def readinto(self, buf):
            c = self.b.read(len(buf))
            buf[: len(c)] = c
            return len(c)

    with pytest.raises(GGUFError, match="cap"):
        read_header(io.BufferedReader(Stream()), max_header_bytes=100)


@settings(max_examples=1500, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture,
                                                                    HealthCheck.too_slow])
@given(data=st.data())
def test_fuzz_mutations(small_valid, data):
    """Random byte flips, insertions and cuts: a GGUFError or a valid result, never anything else."""
    buf = bytearray(small_valid)
    for _ in range(data.draw(st.integers(1, 6))):
        kind = data.draw(st.sampled_from(["flip", "set64", "insert", "cut"]))
        pos = data.draw(st.integers(0, max(len(buf) - 1, 0)))
        if kind == "flip" and buf:
            buf[pos] ^= 1 << data.draw(st.integers(0, 7))
        elif kind == "set64":
            v = data.draw(st.sampled_from([0, 1, 2**31, 2**32 - 1, 2**62, 2**63, 2**64 - 1]))
            buf[pos:pos + 8] = struct.pack("<Q", v)
        elif kind == "insert":
            buf[pos:pos] = data.draw(st.binary(min_size=1, max_size=8))
        else:
            del buf[pos:]
    try:
        hdr = parse(bytes(buf))
    except GGUFError:
        return
    try:
        spec_from_header(hdr)
    except GGUFError:
        pass
