"""The rank of a CUDA out-of-memory error no writer names, from the GPU it names: on one node
each process of a DDP job allocates on cuda:local_rank, so 'GPU 1' is rank 1's. Real reports
(corpus, training split)."""

from __future__ import annotations

from ddpdoctor.analysis.diagnose import diagnose_paths
from ddpdoctor.model.findings import Verdict
from tests.conftest import REPO

CASES = REPO / "corpus" / "cases"


def _verdict(number: str) -> Verdict:
    (case,) = CASES.glob(f"{number}-*")
    return diagnose_paths([str(case / "logs")]).verdict


def test_the_gpu_an_oom_names_is_the_ranks_own() -> None:
    """663 (fairseq's own spawn, 'CUDA out of memory ... (GPU 1; 10.92 GiB total capacity'):
    rank 1, saying how it knows."""
    verdict = _verdict("663")
    assert (verdict.kind, verdict.culprit.ranks) == ("cuda-oom", [1])
    assert any("index of the GPU" in b for b in verdict.basis)


def test_gpu_0_names_no_rank() -> None:
    """201 ('(GPU 0; ...)'): rank 0's own GPU, or the only one a process sees: no rank."""
    verdict = _verdict("201")
    assert (verdict.kind, verdict.culprit.ranks) == ("cuda-oom", [])


def test_a_checkpoints_device_is_not_the_ranks() -> None:
    """251: a checkpoint saved from cuda:1 restored on a one-GPU machine ('Attempting to
    deserialize object on CUDA device 1'): the device is the checkpoint's, no rank 1 exists."""
    verdict = _verdict("251")
    assert (verdict.kind, verdict.culprit.ranks) == ("checkpoint-load-device", [])


def test_not_across_nodes() -> None:
    """498: srun's failed-task lines name two nodes (gpunode-a, gpunode-b): 'GPU 2' is a local
    index there, no global rank."""
    verdict = _verdict("498")
    assert (verdict.kind, verdict.culprit.ranks) == ("cuda-oom", [])
