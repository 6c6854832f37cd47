"""GPU peer-to-peer between processes that each see only their own GPU fails by
configuration (CUDA_VISIBLE_DEVICES set per process: Ray workers, one container per GPU), not
by the hardware: when every process of a node names device 0 in its NCCL lines, a P2P failure
is not blamed on the infrastructure. Real re-enacted reports (corpus/cases)."""

from __future__ import annotations

from ddpdoctor.analysis.diagnose import diagnose_paths
from tests.conftest import REPO

CASES = REPO / "corpus" / "cases"


def _verdict(case: str) -> tuple[str | None, str | None]:
    logs = next(CASES.glob(f"{case}-*")) / "logs"
    v = diagnose_paths([str(logs)]).verdict
    return v.kind, v.category


def test_p2p_between_workers_that_each_see_device_0_is_configuration() -> None:
    """RaySGD: both workers print [0]; cudaIpcOpenMemHandle fails with 217."""
    assert _verdict("900") == ("nccl-p2p", "configuration")


def test_p2p_failure_without_devices_named_stays_infrastructure() -> None:
    """EasyR1 on Ray, NCCL_P2P_DISABLE not reaching the workers: no NCCL line names the
    workers' devices, so nothing says they were split, and the P2P failure stands."""
    assert _verdict("901") == ("nccl-p2p", "infrastructure")
