"""NET113 on real re-enacted reports: NCCL found no RDMA device and fell back to TCP sockets.
That is a slow job where the traffic crosses nodes or where the job named IB devices
(NCCL_IB_HCA), and nothing to report inside one node."""

from __future__ import annotations

from pathlib import Path

from ddpdoctor.analysis.diagnose import diagnose_paths

CASES = Path(__file__).resolve().parent.parent / "corpus" / "cases"


def _logs(prefix: str) -> Path:
    (case,) = CASES.glob(f"{prefix}-*")
    return case / "logs"


def _verdict(path: Path) -> tuple[str, str | None, str | None]:
    v = diagnose_paths([str(path)]).verdict
    return v.status, v.kind, v.rule


def test_two_nodes_on_sockets_without_libibverbs_are_a_slow_link() -> None:
    """Corpus 402: two nodes' NCCL start-up, libibverbs missing, 'Using network Socket'."""
    assert _verdict(_logs("402")) == ("slow", "zero3-multinode-slow", "NET113")


def test_ib_devices_asked_for_and_not_found_are_a_slow_link() -> None:
    """Corpus 147: NCCL_IB_HCA names eight mlx5 ports, 'NET/IB : No device found', sockets."""
    assert _verdict(_logs("147")) == ("slow", "zero3-multinode-slow", "NET113")


def test_one_node_without_ib_is_not_a_slow_link() -> None:
    """Corpus 1163 and 467: one node, libibverbs missing or no IB device: sockets carry no
    traffic there (its GPUs talk over P2P or shared memory)."""
    for case in ("1163", "467"):
        assert _verdict(_logs(case))[2] != "NET113", case


def test_without_the_ib_request_one_host_is_not_enough(tmp_path: Path) -> None:
    """Corpus 147 without its NCCL_IB_HCA line: nothing says IB was meant or that nodes are
    crossed, so the same fallback is no finding."""
    lines = (_logs("147") / "train.log").read_text()
    text = lines.replace("[0] NCCL INFO NCCL_IB_HCA set to", "[0] NCCL INFO X")
    assert text != lines
    (tmp_path / "train.log").write_text(text)
    assert _verdict(tmp_path)[2] != "NET113"
