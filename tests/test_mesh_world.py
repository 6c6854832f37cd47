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


WORLD = [f for f in FACT_PATTERNS if f.name == "world_size" and f.literal == "world"]


@pytest.mark.parametrize(
    ("line", "size"),
    [
        # DiT's print on every rank (tests/fixtures/real/ninetyeighth-*): a sentence's full stop
        ("Starting rank=1, seed=1, world_size=2.", 2),
        ("world size: 8", 8),
        # a decimal or a comparison quoting it is no world's size
        ("world_size 2.5", None),
        ("world_size 32 != 4 * 4 * 4", None),
    ],
)
def test_a_world_size_named_in_words(line: str, size: int | None) -> None:
    found = [m.group("n") for f in WORLD if (m := f.compiled.search(line))]
    assert found == ([str(size)] if size else [])
