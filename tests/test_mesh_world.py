"""A DeviceMesh's printed shape tells the world's size (analysis/facts.py mesh_shape), where
only rank 0 logs and torchrun's summary lists only the ranks that failed: the ranks it does not
list had exited 0."""

from __future__ import annotations

import pytest

from ddpdoctor.analysis.diagnose import diagnose_paths
from ddpdoctor.analysis.facts import FACT_PATTERNS, mesh_size
from tests.conftest import REPO

MESH = next(f for f in FACT_PATTERNS if f.name == "mesh_shape")


@pytest.mark.parametrize(
    ("line", "size"),
    [
        # sixtieth-* (torch 2.13, PyTorch's tensor_parallelism examples' rank_log)
        ("Device Mesh created: device_mesh=DeviceMesh((dp=2, tp=2), 'cpu', stride=(2, 1))", 4),
        # composed in the same repr to test the pattern's edges: other names, one dimension
        ("DeviceMesh((dp_shard=4, tp=2), 'cuda', stride=(2, 1))", 8),
        ("DeviceMesh((world=8), 'cuda', stride=(1,))", 8),
    ],
)
def test_a_meshs_shape_gives_its_size(line: str, size: int) -> None:
    m = MESH.compiled.search(line)
    assert m is not None and mesh_size(m.group("dims")) == size


@pytest.mark.parametrize(
    "line",
    [
        "init_device_mesh('cpu', (2, 2), mesh_dim_names=('dp', 'tp'))",  # the call, no shape
        "DeviceMesh has no attribute 'size'",
    ],
)
def test_other_lines_give_no_mesh(line: str) -> None:
    assert MESH.compiled.search(line) is None


def test_the_ranks_the_summary_does_not_list_had_left() -> None:
    # ranks 2 and 3 ran out of batches and exited 0; only rank 0 logs, torchrun's summary lists
    # ranks 0 and 1
    report = diagnose_paths([str(REPO / "tests" / "fixtures" / "real" / "sixtieth-short-rows")])
    assert report.job.world_size == 4
    assert report.verdict.culprit.ranks == [2, 3]
