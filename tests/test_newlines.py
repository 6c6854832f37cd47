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
def test_a_shorter_range_after_a_longer_one_reuses_the_buffer() -> None:
    long = b"a\n" * 400_000
    short = b"\n" * 300_000 + b"x" * 10
    assert newlines.use_numpy()
    try:
        assert newlines.count_newlines(long, 0, len(long)) == 400_000
        assert newlines.count_newlines(short, 0, len(short)) == 300_000
    finally:
        newlines._np = None
