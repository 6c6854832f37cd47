"""Facts that must be a message's first words ("training done", "finished 61 iters", "rank 3
finished", "Training time 0:00:12") are anchored where the program's own words start: after
the header Python's logging leaves in a line's text once its prefixes are read (level, logger,
a bracketed rank), not at the line's first character. Lines from real captures, read through
the same prefix parser as the scan."""

from __future__ import annotations

import pytest

from ddpdoctor.analysis.facts import FACT_PATTERNS
from ddpdoctor.ingest.prefixes import parse_line

ENDS = [p for p in FACT_PATTERNS if p.name in ("completed", "rank_finished")]


def _facts(raw: str) -> set[str]:
    text = parse_line(raw).text
    return {p.name for p in ENDS if p.literal in text and p.compiled.search(text)}


@pytest.mark.parametrize(
    "raw",
    [
        # tests/fixtures/real/twentyseventh-steady-pair ("%(asctime)s %(levelname)s [rank N]")
        "[default1]:2026-12-03 07:36:36,886 INFO [rank 1] training done at step 24",
        "2026-12-03 07:36:36,886 INFO [rank 1] training done at step 24",
        # DeepSpeed's log_dist keeps its own tag
        "[Rank 0] training done",
        # '%(asctime)s [%(levelname)s] %(name)s: %(message)s' (tests/fixtures/real/
        # sixtyfirst-steady-trio/logs/rank1.log): the level is read, the logger's name stays
        "2026-12-05 02:41:35,146 [INFO] recsys: Training done",
    ],
)
def test_an_end_after_a_logging_header_is_read(raw: str) -> None:
    assert "completed" in _facts(raw)


@pytest.mark.parametrize(
    "raw",
    [
        # one epoch's end, not training's, with and without a header
        "[default0]:2026-12-03 07:36:34,105 INFO [rank 0] epoch 0 training done",
        "epoch 3 training done",
        # the words inside another message
        "2026-12-03 07:36:34,105 INFO [rank 0] resumed; training done flag was False",
        # one epoch's, after a logger's name (the same rank log's line above the end)
        "2026-12-05 02:41:35,117 [INFO] recsys: epoch 2: finished after 24 batches",
        "2026-12-05 02:41:35,117 [INFO] recsys: epoch 2 training done",
        # PyTorch's RPC parameter-server example after each epoch
        "Training done for epoch 22",
    ],
)
def test_an_end_inside_a_message_is_not(raw: str) -> None:
    assert "completed" not in _facts(raw)
