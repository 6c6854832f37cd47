"""A root raised inside torch.load under the program's own checkpoint loading
(analysis/frames.in_checkpoint_load): every rank of a data-parallel job reads that same file, so
where the launcher showed one rank's error the others had met it too (decision.py). The first
chain of names is a real traceback's (tests/fixtures/real/sixtyeighth-torn-pyth); the frame
lines are written the way CPython prints them."""

from __future__ import annotations

import pytest

from ddpdoctor.analysis.diagnose import diagnose_paths
from ddpdoctor.analysis.frames import in_checkpoint_load
from ddpdoctor.model.findings import Hit
from ddpdoctor.model.records import Record
from tests.conftest import REPO

TORCH_LOAD = (
    '  File "/repo/.venv/lib/python3.11/site-packages/torch/serialization.py", line 1568, in load'
)


def _hit(*funcs: str, through_load: bool = True) -> Hit:
    frames = [
        f'  File "/repo/tools/run_net.py", line {10 + i}, in {f}' for i, f in enumerate(funcs)
    ]
    if through_load:
        frames.append(TORCH_LOAD)
    context = [Record("console.log", i + 1, text) for i, text in enumerate(frames)]
    error = Record("console.log", len(frames) + 1, "OSError: [Errno 22] Invalid argument")
    return Hit("DATA104", error, {}, context)


@pytest.mark.parametrize(
    "funcs",
    [
        ("run", "train", "load_train_checkpoint", "load_checkpoint"),  # SlowFast's resume
        ("main", "resume_from"),
        ("main", "Trainer.restore_ckpt"),
    ],
)
def test_torch_load_under_a_checkpoint_loader_is_a_resume(funcs: tuple[str, ...]) -> None:
    assert in_checkpoint_load(_hit(*funcs))


def test_a_shard_of_data_loaded_with_torch_load_is_not() -> None:
    # each rank reads its own shard: a missing one is that rank's own failure
    assert not in_checkpoint_load(_hit("main", "train", "load_shard"))


def test_a_checkpoint_function_that_does_not_reach_torch_load_is_not() -> None:
    assert not in_checkpoint_load(_hit("main", "save_checkpoint", through_load=False))


def test_the_processes_spawn_stopped_during_the_resume_are_named() -> None:
    # mp.spawn showed process 1's OSError in torch.load of the cut checkpoint and SIGTERMed
    # process 0, which auto-resumes from the same file
    report = diagnose_paths([str(REPO / "tests" / "fixtures" / "real" / "sixtyeighth-torn-pyth")])
    assert report.verdict.kind == "data-error"
    assert report.verdict.culprit.ranks == [0, 1]


def test_a_line_printed_before_the_load_does_not_keep_a_rank_out() -> None:
    # a real run of tests/programs/spawn_resume_train.py under `ddpdoctor run`: rank 0 said
    # 'resuming from ckpt.pt', then mp.spawn showed process 1's weights-only rejection of the
    # same file and SIGTERMed process 0, which was loading it
    report = diagnose_paths([str(REPO / "tests" / "fixtures" / "real" / "spawn-resume-said")])
    assert report.verdict.kind == "weights-only-load"
    assert report.verdict.culprit.ranks == [0, 1]
