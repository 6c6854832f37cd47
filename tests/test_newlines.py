"""Line counting gives the same answer with numpy and with bytes.count, on any range."""

from __future__ import annotations

import importlib.util

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ddpdoctor.analysis import newlines

needs_numpy = pytest.mark.skipif(
    importlib.util.find_spec("numpy") is None, reason="numpy not installed"
)


@needs_numpy
@settings(max_examples=60, deadline=None)
@given(
    st.binary(min_size=0, max_size=4000),
    st.integers(min_value=0, max_value=700),
    st.integers(min_value=0, max_value=4000),
)
def test_numpy_and_bytes_count_agree(data: bytes, repeat: int, cut: int) -> None:
    big = (data + b"\n") * repeat + data  # crosses NUMPY_MIN_BYTES for larger repeats
    start = min(cut, len(big))
    assert newlines.use_numpy()
    try:
        fast = newlines.count_newlines(big, start, len(big))
        fast_prefix = newlines.count_newlines(big, 0, start)
    finally:
        newlines._np = None
    assert fast == big.count(b"\n", start)
    assert fast_prefix == big.count(b"\n", 0, start)
    assert newlines.count_newlines(big, start, len(big)) == fast


@needs_numpy
def test_ranges_longer_than_a_block_and_shorter_ones_after_them() -> None:
    long = b"a\n" * (newlines.BLOCK_BYTES + 12_345)  # two blocks and a part
    short = b"\n" * 300_000 + b"x" * 10
    assert newlines.use_numpy()
    try:
        assert newlines.count_newlines(long, 1, len(long)) == newlines.BLOCK_BYTES + 12_345
        assert newlines.count_newlines(short, 0, len(short)) == 300_000
        assert len(newlines._out) == newlines.BLOCK_BYTES
    finally:
        newlines._np = None
