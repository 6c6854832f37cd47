"""What the job says of each node's local ranks (analysis/job.py learn_rank_map, resolve_rank):
DeepSpeed's global_rank_mapping, and a node that runs one rank only. The whole runs are
tests/test_hundredthird_style_runs.py's (two 'nodes' under a pdsh-like fan-out)."""

from __future__ import annotations

from ddpdoctor.analysis.facts import FACT_PATTERNS
from ddpdoctor.analysis.job import HOST_RANKS, SOLE_RANK, resolve_rank
from ddpdoctor.model.records import Origin

MAPPING = [f for f in FACT_PATTERNS if f.name == "rank_mapping"]
LINE = (
    "[2026-12-06 08:29:21,016] [INFO] [launch.py:163:main] global_rank_mapping=defaultdict(<class "
    "'list'>, {'node1': [0, 1], 'node2': [2]})"
)


def test_deepspeeds_mapping_is_read_node_by_node() -> None:
    found = [m for f in MAPPING if (m := f.compiled.search(LINE))]
    assert found and found[0]["map"] == "{'node1': [0, 1], 'node2': [2]}"
    assert HOST_RANKS.findall(found[0]["map"]) == [("node1", "0, 1"), ("node2", "2")]
    assert not any(
        f.compiled.search("WORLD INFO DICT: {'node1': [0, 1], 'node2': [0]}") for f in MAPPING
    )


def test_a_nodes_local_rank_and_a_node_of_one_rank() -> None:
    rank_map = {("node1", 0): 0, ("node1", 1): 1, ("node2", 0): 2, ("node2", SOLE_RANK): 2}
    assert resolve_rank(Origin(host="node1", local_rank=1), False, rank_map) == 1
    # a line of node2 that names no local rank: its one rank
    assert resolve_rank(Origin(host="node2"), False, rank_map) == 2
    # node1 runs two: a line that names neither is nobody's
    assert resolve_rank(Origin(host="node1"), False, rank_map) is None
    # the line's own rank wins
    assert resolve_rank(Origin(rank=0, host="node2"), False, rank_map) == 0
