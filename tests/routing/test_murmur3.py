"""murmur3 x86_32 and the group hash against spec/vectors/murmur3.json, for both implementations."""
from __future__ import annotations

import pytest
from hypothesis import given, strategies as st

from tests.routing._vectors import both_implementations, load
from tests.twins import twin_fixture

bloom = twin_fixture("pymq.routing._bloom_py", "pymq.routing._bloom_c")
VECTORS = load("murmur3.json")


@pytest.mark.parametrize("v", VECTORS["vectors"], ids=lambda v: f"{v['input_hex'][:16]}-{v['seed']:x}")
def test_vector(bloom, v):
    assert bloom.murmur3_32(bytes.fromhex(v["input_hex"]), v["seed"]) == v["hash"]


def test_published_vectors_are_present():
    published = [v for v in VECTORS["vectors"] if v["source"] == "published"]
    assert len(published) >= 20
    assert {len(bytes.fromhex(v["input_hex"])) for v in VECTORS["vectors"]} >= {0, 1, 2, 3, 4, 5, 6, 7}


def test_smhasher_verification(bloom):
    h = bloom.murmur3_32
    key = bytes(range(256))
    joined = b"".join(h(key[:i], 256 - i).to_bytes(4, "little") for i in range(256))
    assert h(joined, 0) == VECTORS["verification"]["expected"]


@pytest.mark.parametrize("v", [v for v in VECTORS["vectors"] if "input_text" in v], ids=lambda v: v["input_hex"][:16])
def test_str_is_hashed_as_utf8(bloom, v):
    assert bloom.murmur3_32(v["input_text"], v["seed"]) == v["hash"]
    if v["seed"] == 0:
        assert bloom.group_hash(v["input_text"]) == v["hash"]


def test_bytes_like_inputs_agree(bloom):
    expected = bloom.murmur3_32(b"orders.eu", 7)
    assert bloom.murmur3_32(bytearray(b"orders.eu"), 7) == expected
    assert bloom.murmur3_32(memoryview(b"orders.eu"), 7) == expected


def test_seed_is_taken_mod_2_32(bloom):
    assert bloom.murmur3_32(b"abc", 2**32 + 5) == bloom.murmur3_32(b"abc", 5)
    assert bloom.murmur3_32(b"abc", -1) == bloom.murmur3_32(b"abc", 0xFFFFFFFF)


def test_rejects_non_text_keys(bloom):
    with pytest.raises(TypeError):
        bloom.murmur3_32(12345)
    with pytest.raises(TypeError):
        bloom.group_hash(None)


def test_lone_surrogate_cannot_be_hashed(bloom):
    with pytest.raises(UnicodeEncodeError):
        bloom.group_hash("bad\ud800")


@given(st.binary(max_size=64), st.integers(min_value=0, max_value=2**32 - 1))
def test_compiled_agrees_with_twin(data, seed):
    py, c = both_implementations()
    assert c.murmur3_32(data, seed) == py.murmur3_32(data, seed)


@given(st.text(max_size=40))
def test_compiled_agrees_with_twin_on_text(text):
    py, c = both_implementations()
    assert c.group_hash(text) == py.group_hash(text) == py.murmur3_32(text.encode("utf-8"), 0)
    assert c.hash_pair(text) == py.hash_pair(text)
