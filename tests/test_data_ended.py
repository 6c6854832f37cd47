"""A rank that leaves the loop while the others go on, whose last words say its data ran out,
had fewer batches (uneven inputs), not a stop of its own (an uncoordinated exit). Its words:
behaviour.DATA_ENDED; the whole pipeline on the twenty-eighth set's short-part, a real run."""

from __future__ import annotations

import pytest

from ddpdoctor.analysis.behaviour import DATA_ENDED
from ddpdoctor.analysis.diagnose import diagnose_paths
from tests.conftest import REPO


@pytest.mark.parametrize(
    "text",
    [
        "data part exhausted",  # tests/fixtures/real/twentyeighth-short-part (its JSON msg)
        "rank 1: ran out of batches at step 6",
        "no more data in shard 3, leaving the loop",
        "train iterator exhausted after 120 steps",
        # the transformers Trainer's, in its two wordings (census hf-no-sample)
        "There seems not to be a single sample in your epoch_iterator, stopping training at "
        "step 1200!",
        "There seems to be not a single sample in your epoch_iterator, stopping training at "
        "step 0!",
    ],
)
def test_words_that_the_data_ran_out(text: str) -> None:
    assert DATA_ENDED.search(text)


@pytest.mark.parametrize(
    "text",
    [
        "training finished",
        "dataset ready: 4096 samples",
        "checkpoint saved, patience exhausted",  # a stop of its own, not its data
        "GPU memory exhausted",
    ],
)
def test_other_words_are_not(text: str) -> None:
    assert not DATA_ENDED.search(text)


def test_a_rank_whose_data_part_ran_out_had_fewer_batches() -> None:
    """Rank 1's data file was cut to 6 batches: it logs 'data part exhausted' and 'training
    finished' and exits 0; ranks 0 and 2 lose it in step 7's FSDP all-gather."""
    v = diagnose_paths([str(REPO / "tests/fixtures/real/twentyeighth-short-part")]).verdict
    assert (v.kind, v.culprit.ranks) == ("uneven-inputs", [1])


def test_half_the_world_saying_its_data_ended_before_the_log_stops() -> None:
    """Corpus case 997 (a re-enacted thread): ranks 4-7 of 8 log 'Reaches end of dataloader.'
    and start validation, ranks 0-3 never do, and nothing follows: a hang of uneven inputs."""
    case = next((REPO / "corpus/cases").glob("997-*"))
    v = diagnose_paths([str(case / "logs")]).verdict
    assert (v.status, v.kind, v.culprit.ranks) == ("hung", "uneven-inputs", [4, 5, 6, 7])
