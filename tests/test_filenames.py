"""What a file's path says about its writer (ingest/filenames.py): the layouts people and
launchers give per-rank logs, and names that only look like them."""

from __future__ import annotations

import pytest

from ddpdoctor.ingest.filenames import origin_from_path


@pytest.mark.parametrize(
    ("path", "rank", "local_rank", "host"),
    [
        ("logs/rank3.log", 3, None, None),
        ("logs/rank_3.txt", 3, None, None),
        ("train_rank3.log", 3, None, None),
        ("train.rank2.log", 2, None, None),  # the rank after a dot
        ("x/rank3.log.gz", 3, None, None),
        ("output-node01-rank07.log", 7, None, None),  # a host only where the name starts
        ("run.local_rank1.err", None, 1, None),
        # NeMo's exp_manager names both: the global rank is the writer's
        ("nemo_log_globalrank-3_localrank-1.txt", 3, 1, None),
        ("log_local_rank1_rank5.txt", 5, 1, None),
        # torchrun --log-dir: <run_id>/attempt_<k>/<local_rank>/stdout.log
        ("logs/none_abc/attempt_0/3/stderr.log", None, 3, None),
        # OpenMPI 4's --output-filename DIR: DIR/<job>/rank.<N>/stdout
        ("out/1/rank.3/stdout", 3, None, None),
        ("node-2/rank1.log", 1, None, "node-2"),
        ("worker-3.log", None, None, "worker-3"),
        # Azure ML: one file of prints per MPI process
        ("user_logs/std_log_process_01.txt", 1, None, None),
        # NVIDIA's multiproc.py (tacotron2, waveglow): logs/<group>_GPU_<i>.log per worker
        ("logs/2026_12_06-220129_GPU_1.log", None, 1, None),
        ("logs/group_2026_12_06-220129_GPU_3.log", None, 3, None),
    ],
)
def test_the_path_names_the_writer(
    path: str, rank: int | None, local_rank: int | None, host: str | None
) -> None:
    origin = origin_from_path(path)
    assert (origin.rank, origin.local_rank, origin.host) == (rank, local_rank, host)


@pytest.mark.parametrize(
    "path",
    [
        "ranking.log",
        "franky.rank.log",
        "debug-rank0-runs/train.log",
        "logs/3.log",
        "std_log_processor_1.txt",
        "GPU_1.log",  # a name that is the device alone says no process's
        "nvidia_GPU_1_temps.csv",
    ],
)
def test_names_that_only_look_like_a_rank(path: str) -> None:
    origin = origin_from_path(path)
    assert origin.rank is None and origin.local_rank is None
