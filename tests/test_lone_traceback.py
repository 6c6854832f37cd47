"""A worker traceback no prefix names, where every other rank printed its own under torch's
'[rankN]: ' (the excepthook init_process_group installs), is the one rank's without its own:
the rank whose hook the program replaced (SpeechBrain's on the main process) or that failed
before the group formed. Read on real captures, with the lookalikes it must leave alone."""

from __future__ import annotations

from ddpdoctor.analysis.diagnose import diagnose_paths
from tests.conftest import REPO

REAL = REPO / "tests" / "fixtures" / "real"


def _ranks_of(folder: str, text: str) -> set[int | None]:
    report = diagnose_paths([str(REAL / folder)])
    return {e.rank for f in report.findings for e in f.evidence if text in e.text}


def test_the_main_process_s_traceback_through_its_own_hook_is_rank_0_s() -> None:
    # SpeechBrain's excepthook prints rank 0's OSError as 'speechbrain.core - ERROR -
    # Exception:' and its whole stack, unprefixed; ranks 1 and 2 print theirs as [rank1]: and
    # [rank2]:; all three read the half-written checkpoint
    assert _ranks_of("sixtysecond-torn-ckpt", "OSError: [Errno 22] Invalid argument") == {0, 1, 2}
    verdict = diagnose_paths([str(REAL / "sixtysecond-torn-ckpt")]).verdict
    assert verdict.culprit.ranks == [0, 1, 2]


def test_a_traceback_logged_where_it_was_caught_is_not_the_silent_rank_s() -> None:
    # detectron2's trainer logs 'Exception during training:' with the stack from train() and
    # re-raises: rank 0 prints it twice; rank 1 was SIGKILLed and printed nothing
    found = _ranks_of("thirteenth-grow-kill", "Connection closed by peer")
    assert 1 not in found


def test_a_wrappers_traceback_after_the_agents_report_is_no_workers() -> None:
    # the CLI that ran torchrun raises CalledProcessError once torchrun has failed
    found = _ranks_of("fiftyfourth-lone-halt", "subprocess.CalledProcessError")
    assert found == {None}


def test_a_rank_a_signal_ended_printed_none_so_the_other_one_is_the_writer() -> None:
    # rank 2 aborted in gloo's size check (SIGABRT, no Python traceback), rank 1 printed its
    # lost peer as [rank1]:, rank 0 its reset connection through SpeechBrain's hook, unprefixed
    assert _ranks_of("sixtysecond-dry-shard", "Connection reset by peer") == {0}
    assert _ranks_of("sixtysecond-dry-shard", "Connection closed by peer") == {1}
    verdict = diagnose_paths([str(REAL / "sixtysecond-dry-shard")]).verdict
    assert (verdict.kind, verdict.culprit.ranks) == ("uneven-inputs", [2])
