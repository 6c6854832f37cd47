"""srun --label's 'K: ' is a rank where srun started the training processes itself, and a node
where each task is a launcher (`srun --ntasks-per-node=1 torchrun ...`): there task K's lines
are its node's, written by its agent and by every local worker. Read on real captures and a
real report."""

from __future__ import annotations

from pathlib import Path

import pytest

from ddpdoctor.analysis.diagnose import diagnose_paths
from ddpdoctor.ingest.prefixes import parse_line
from ddpdoctor.ingest.srun_tasks import NodeNames, as_node_task, labels_name_nodes
from tests.conftest import REPO

REAL = REPO / "tests" / "fixtures" / "real"
CORPUS = REPO / "corpus" / "cases"


def _head(path: Path) -> bytes:
    return path.read_bytes()[: 256 * 1024]


@pytest.mark.parametrize(
    "path",
    [
        # torchtitan-style sbatch: one torchrun a node, glog lines of its agent under the label
        REAL / "fiftyninth-calm-quad" / "slurm-59001.out",
        # the same launch with two nodes' torchruns printing their OMP_NUM_THREADS banner
        REAL / "twentyninth-relay-pair" / "slurm-24.out",
        # a real report: a node's agent's 'failed (exitcode: -11)' under '0: '
        CORPUS
        / "565-native-crash-rocm-mi250-barrier-sigsegv-srun-labelled"
        / "logs"
        / "slurm-job.log",
    ],
)
def test_a_launcher_under_a_label_makes_the_tasks_nodes(path: Path) -> None:
    assert labels_name_nodes(_head(path))


def test_tasks_that_are_the_ranks_stay_ranks() -> None:
    # a real report of `srun python train.py`: the workers' own lines under their labels
    path = CORPUS / "501-exit-teardown-crash-weathergen-srun-nccl-abort-after-last-save"
    (log,) = sorted((path / "logs").iterdir())
    assert not labels_name_nodes(_head(log))


def test_a_workers_frame_through_record_is_no_launcher() -> None:
    # a worker's stack under srun passes through @record's wrapper in torch.distributed.elastic
    frame = (
        b'0:   File "<deracted for brevity>torch.mi250/python_environment/lib/python3.11/'
        b'site-packages/torch/distributed/elastic/multiprocessing/errors/__init__.py", '
        b"line 348 in wrapper\n"
    )
    assert not labels_name_nodes(frame)


def test_a_node_tasks_line_keeps_the_rank_it_names_and_loses_the_labels() -> None:
    named = as_node_task(parse_line("1: [rank3]: Traceback (most recent call last):"))
    assert (named.origin.rank, named.origin.host) == (3, "srun task 1")
    bare = as_node_task(
        parse_line("1: [titan] 2026-12-04 23:53:02,171 - root - WARNING - Shard index is stale")
    )
    assert (bare.origin.rank, bare.origin.host) == (None, "srun task 1")
    # where the task is the rank, the label stays the rank
    assert parse_line("1: Shard index is stale").origin.rank == 1


def test_a_tasks_node_is_named_by_its_nccl_line_or_srun_s_error() -> None:
    names = NodeNames()
    names.learn(parse_line("0: g2417:3391024:3391035 [0] NCCL INFO Setting affinity for GPU 0"))
    names.learn(parse_line("srun: error: node02: task 1: Exited with exit code 1"))
    assert names.renames() == {"srun task 0": "g2417", "srun task 1": "node02"}
    # two tasks said to run on one node (a line composed in srun's format to test the edge):
    # neither is renamed (their local ranks would collide)
    names.learn(parse_line("srun: error: g2417: task 2: Exited with exit code 1"))
    assert "srun task 2" not in names.renames() and "srun task 0" not in names.renames()


@pytest.mark.parametrize(
    ("folder", "ranks", "hosts"),
    [
        # node01's torchrun: 'failed (exitcode: -9) local_rank: 1': rank 1, not the label's 0
        (REAL / "fiftyninth-rss-climb", [1], ["node01"]),
        # node02's torchrun: 'exitcode: -11' for its local rank 1: global rank 3
        (REAL / "fiftyninth-null-pack", [3], ["node02"]),
        # task 0's only node is the host its NCCL line names
        (CORPUS / "565-native-crash-rocm-mi250-barrier-sigsegv-srun-labelled", [0], ["g2417"]),
    ],
)
def test_the_culprit_is_the_global_rank_on_its_named_node(
    folder: Path, ranks: list[int], hosts: list[str]
) -> None:
    culprit = diagnose_paths([str(folder)]).verdict.culprit
    assert (culprit.ranks, culprit.hosts) == (ranks, hosts)


def test_a_nodes_launcher_names_its_stopped_workers_by_its_own_summary() -> None:
    # two nodes' consoles (node0.log, node1.log): each torchrun's failure summary says
    # 'host : localhost', the node's file names it node0 / node1; the pids it SIGTERMed are
    # the ranks its own summary lists with them (12540 rank 1 on node0, 12544 rank 3 on node1)
    report = diagnose_paths([str(REAL / "eighth-vocab-skew")])
    stopped = {
        (e.source.rsplit("/", 1)[-1], e.rank)
        for f in report.findings
        if f.rule == "LCH102"
        for e in f.evidence
        if "Sending process" in e.text
    }
    assert stopped == {("node0.log", 1), ("node1.log", 3)}


def test_each_nodes_torchrun_counts_its_own_workers() -> None:
    # node01's torchrun reports local rank 1 killed and stops local rank 0; node02's stops its
    # two: two launchers of two workers each in one file, not one of five
    job = diagnose_paths([str(REAL / "fiftyninth-rss-climb")]).job
    assert (job.world_size, job.ranks_missing) == (4, [])
