"""The guard that keeps `make test` from running the job tests on both workers at once."""

from __future__ import annotations

import pytest

from tests.conftest import loadgroup_broken


@pytest.mark.parametrize(
    ("pytest_version", "xdist_version"),
    [("9.2.0", "3.8.0"), ("9.3.1", "3.7.0"), ("10.0", "3.8.2")],
)
def test_pairs_that_group_nothing_are_refused(pytest_version: str, xdist_version: str) -> None:
    assert loadgroup_broken(pytest_version, xdist_version)


@pytest.mark.parametrize(
    ("pytest_version", "xdist_version"),
    [("9.1.1", "3.8.0"), ("8.4.2", "3.5.0"), ("9.2.0", "3.9.0"), ("9.2.0rc1", "4.0")],
)
def test_pairs_that_group_are_allowed(pytest_version: str, xdist_version: str) -> None:
    assert not loadgroup_broken(pytest_version, xdist_version)
