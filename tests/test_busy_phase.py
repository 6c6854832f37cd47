"""Last words that announce a long phase a rank does on its own (a save, an evaluation) make
it busy, not gone; a line that reports a phase's result does not. Lines from real captures
and re-enacted reports."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from ddpdoctor.analysis.diagnose import diagnose_paths
from ddpdoctor.analysis.phases import BUSY_PHASE, slow_unit_of_work
from tests.program_runs import REAL


@pytest.mark.parametrize(
    "line",
    [
        "0: saving to /data/runs/soundstream-fsq/results",  # corpus 768
        "Saving model checkpoint to /out/checkpoint-500",
        "Validation DataLoader 0:  45%|████▌     | 9/20 [00:01<00:02,  5.12it/s]",
        "Running evaluation on the test set",
        "tokenizing the shard 3 of 8",
        # tests/fixtures/real/eleventh-slow-tokenize (a Ray Train worker)
        "worker 1: token cache is stale, rebuilding it (this can take a minute)",
        # which checkpoint it is, before the noun: ParlAI's, a final save
        "saving best valid model: /tmp/run/model",
        "Saving final checkpoint to out/final.pt",
        # Megatron's dataset builder (corpus 1235): 'indices', not 'index'
        " > WARNING: could not find index map file /data/x_train_indexmap_320000mns.npy, "
        "building the indices on rank 0 ...",
    ],
)
def test_a_phase_announced(line: str) -> None:
    assert BUSY_PHASE.search(line)


@pytest.mark.parametrize(
    "line",
    [
        # tests/fixtures/real/seventh-main-stop: a result, then the rank's own stop
        "[Rank 0] validation loss 4.0672 below target, stopping",
        "epoch 3 evaluation results: accuracy 0.91",
    ],
)
def test_a_phase_reported_done(line: str) -> None:
    assert not BUSY_PHASE.search(line)


def test_a_main_process_saving_alone_is_busy_not_gone() -> None:
    """Corpus case 768: the main process said it was saving, then nothing, while rank 6 timed
    out in a broadcast: busy on its own (slow rank), not a rank that left."""
    (case,) = (Path(__file__).resolve().parent.parent / "corpus" / "cases").glob("768-*")
    v = diagnose_paths([str(case / "logs")]).verdict
    assert (v.kind, v.culprit.ranks) == ("slow-rank-timeout", [0])


@pytest.mark.parametrize(
    ("last", "before", "phase"),
    [
        # tests/fixtures/real/fortysecond-parked-prefetch, rank 1: the evaluation's last batch,
        # then its result; the rank was stuck after it, not evaluating
        ("Eval metrics/eval/Accuracy: 0.5208", "[Eval batch=2/2] Eval on eval data", None),
        # the same phase not through, then a line that is no progress: still in it
        (
            "Eval metrics/eval/Accuracy: 0.5208",
            "[Eval batch=1/2] Eval on eval data",
            "[Eval batch=1/2] Eval on eval data",
        ),
        # composed: a stop's handler after a save that counts nothing: the save is the phase
        ("received SIGTERM, exiting", "saving checkpoint to /ckpt/step_40.pt", "saving"),
    ],
)
def test_the_line_before_the_last_announces_a_phase_not_yet_through(
    last: str, before: str, phase: str | None
) -> None:
    from ddpdoctor.analysis.behaviour import _announced_phase
    from ddpdoctor.analysis.scanner import StreamSummary
    from ddpdoctor.model.records import Origin

    stream = StreamSummary("w", Origin(), last_line=9, last_text=last, prev_text=before)
    said = _announced_phase(stream)
    assert (said is None) if phase is None else (said is not None and phase in said)


def _split_per_writer(console: Path, into: Path) -> list[str]:
    """The console's lines, one file per torchrun prefix ('[default1]:' -> rank1.log) and
    the launcher's own in launcher.log: what `torchrun --tee 3 --log-dir` would have left."""
    writers: dict[str, list[str]] = {}
    for line in console.read_text(encoding="utf-8").splitlines(keepends=True):
        m = re.match(r"\[default(\d+)\]:", line)
        writers.setdefault(f"rank{m.group(1)}" if m else "launcher", []).append(line)
    paths = []
    for name, lines in sorted(writers.items(), reverse=True):
        (into / f"{name}.log").write_text("".join(lines), encoding="utf-8")
        paths.append(str(into / f"{name}.log"))
    return paths


STATS_CRAWL = REAL / "eightyfourth-stats-crawl" / "console.log"
"""Rank 1 recomputes normalisation statistics ('... (pass k/8)', one line every 4 s, timed)
while rank 0 times out in the next collective; the timeout's length is nowhere in the logs."""


def test_a_rank_file_whose_timed_lines_went_on_while_the_others_waited_is_busy(
    tmp_path: Path,
) -> None:
    """Per-rank files share no order with rank 0's (untimed) timeout: the times of rank 1's
    lines after rank 0's last step, before the launcher's reaction, say it was working."""
    report = diagnose_paths(_split_per_writer(STATS_CRAWL, tmp_path))
    v = report.verdict
    assert (v.kind, v.culprit.ranks) == ("slow-rank-timeout", [1])
    assert any("(pass 5/8)" in e.text for e in v.evidence if e.rank == 1)


def test_one_timed_line_after_its_last_step_is_no_work_of_its_own(tmp_path: Path) -> None:
    """The same files with rank 1's work cut to its first line: one line may be the last of
    what it did before it stopped, so nothing says it was busy (a hang, rank 1 silent)."""
    paths = _split_per_writer(STATS_CRAWL, tmp_path)
    rank1 = tmp_path / "rank1.log"
    lines = rank1.read_text(encoding="utf-8").splitlines(keepends=True)
    rank1.write_text("".join(lines[:1]), encoding="utf-8")
    v = diagnose_paths(paths).verdict
    assert (v.kind, v.culprit.ranks) == ("hang", [1])


@pytest.mark.parametrize(
    ("line", "counted"),
    [
        # tests/fixtures/real/seventyseventh-track-crawl and eightyfirst-sage-crawl (the parsed
        # text keeps the level word), corpus 986 (sglang's checkpoint loader)
        ("regenerating track layouts for 4 envs (1/8)", True),
        ("INFO teacher | calibrating temperature: batch 3/8 (T=2.00)", True),
        ("Loading safetensors checkpoint shards: 0% Completed | 0/4 [00:00<?, ?it/s]", True),
        # the loop's own counters, and counts of processes (corpus 884: Lightning's start-up)
        ("Training 3/100", False),
        ("running step 5/50", False),
        ("Initializing distributed: GLOBAL_RANK: 3, MEMBER: 4/4", False),
        ("starting worker 2/4", False),
        ("epoch 3/10 loss 0.31", False),
    ],
)
def test_a_phase_that_counts_its_own_parts(line: str, counted: bool) -> None:
    from ddpdoctor.analysis.phases import counted_phase

    assert counted_phase(line) is counted


@pytest.mark.parametrize(
    ("mode", "rank"), [("seventyseventh-track-crawl", 1), ("eightyfirst-sage-crawl", 2)]
)
def test_a_silent_rank_whose_unprefixed_lines_count_the_parts_of_its_work_is_busy(
    mode: str, rank: int
) -> None:
    """The busy rank prints without a rank prefix ('regenerating track layouts for 4 envs
    (k/8)', 'teacher | calibrating temperature: batch k/8') until the others time out; the
    launcher then stops it alive. Counted parts show work under way: a slow rank, not one
    blocked silently (INF211)."""
    v = diagnose_paths([str(REAL / mode)]).verdict
    assert (v.kind, v.rule, v.culprit.ranks) == ("slow-rank-timeout", "INF201", [rank])


@pytest.mark.parametrize(
    ("line", "slow"),
    [
        # tests/fixtures/real/hundredsixtysecond-drip-read, rank 1's last words
        ("rank 1: read part-00001.npy (2560 rows, 12.0s)", True),
        ("building the feature cache took 45.2 s", True),
        ("rank 0: read part-00000.npy (2560 rows, 0.0s)", False),
        ("epoch 3 took 2.5s", False),
        ("Timed out waiting 15000ms for recv operation to complete", False),
        ("saved checkpoint (12 files)", False),
    ],
)
def test_a_slow_piece_of_work_reported(line: str, slow: bool) -> None:
    """A last line that reports a piece of the rank's own work of ten seconds or more: the rank
    was slow at that work (busy), not blocked."""
    assert slow_unit_of_work(line) is slow
