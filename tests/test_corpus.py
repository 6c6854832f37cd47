"""Scoreboard on the labelled real corpus (corpus/scoreboard.py): every split is scored and
printed; the suite fails only when the training split regresses. The validation split is
measured, never tuned on, and never asserted (a rule added for a validation case moves that
case to training, in its label)."""

from __future__ import annotations

import pytest
from corpus.scoreboard import SHARED, load_cases, render, score, totals

# Measured on 2026-12-02 (training split of the repository's corpus/cases, which every clone
# has; ../shared/corpus is floored on its own, where it sits beside the checkout). Raise them
# when the tool improves; never lower them.
TRAIN_FLOORS = {
    "kind": 501,
    "category": 410,
    "culprit_with_kind": 53,
    "fix": 440,
}
"""Raised to the training split's figures at the end of session 23 (2026-12-04, 562 repo cases
with the session's 7 harvested training cases: kind 501, category 410, culprit with kind 53,
fix 440). Session 22's (555 cases): kind 497, category 407, culprit with kind 53, fix 437.
Session 21's (549 cases): kind 485, category 399, culprit with kind 53, fix 432.
Session 20's (533 cases): kind 468, category 385, culprit with kind 50, fix 418.
Session 19's (515 cases): kind 447,
category 369, culprit with kind 43, fix 393. Session 18's (476 cases): kind 414, category
343, culprit with kind 42, fix 355. Session 12's (411 cases): kind 346, category 298, culprit with kind 37, fix
300. Category went 273 -> 272 on 2026-12-02 (session 11) when a log that ends mid-training
began to name its likelier kind (a hang, category unknown): five healthy logs cut
mid-training, whose status was already wrong, had matched their label's empty category by
having none."""
TRAIN_MAX_FALSE_INFRA = 0
TRAIN_MAX_FALSE_OK = 5
"""Failed, hung or slow jobs called OK (the worst answer: the user stops looking). 5 since
2026-12-03 (session 14), when case 994 was harvested (labelled before any diagnosis): its log
ends on Megatron's '[after training is done]' and four of eight ranks' exit-time warning that
destroy_process_group() was not called, cut mid-line; the cleanup error its thread's title
names is not in the paste, and a healthy run ends the same way (as 418). 4 since
2026-12-02 (session 11): case 956's paste stops at DeepSpeed's CPU-Adam start-up, messages of
normal operation only; its exit -9 is in the thread's title, not in the log. Calling every log
of start-up messages 'unknown' instead would turn eight healthy warning-only pastes of the
training split (334-336, 339, 375, 465, 817, 876) from OK to unknown for three false OKs.
2 until
2026-12-02 evening, when YOLO's 'N epochs completed in' became an end of training: case 418's
log ends on it and a clean W&B summary, its thread says the processes never exited (nothing in
the log shows it), while four healthy runs of the fourteenth set that end the same way went
from 'unknown' to OK."""
SHARED_KIND_FLOOR = 27
"""Of the 29 cases in ../shared/corpus (all training). 28 until 2026-12-03: case 070 (one
node, a log that stops at start-up with no NCCL line) was called nccl-p2p, an infrastructure
kind, with nothing in the log to show it; it is now a hang with the peer-to-peer bisection as
the next step (nccl-p2p only where NCCL's own lines show GPUs connected peer-to-peer, as in
case 467)."""


def test_corpus_scoreboard(capsys: pytest.CaptureFixture[str]) -> None:
    cases = load_cases()
    if not cases:
        pytest.skip("no corpus present")
    scores = [score(c) for c in cases]
    with capsys.disabled():
        print("\n" + render(scores, show_misses=False))
    in_shared = [c.path.parent.resolve() == SHARED.resolve() for c in cases]
    train = [
        s for s, shared in zip(scores, in_shared, strict=True) if s.split == "train" and not shared
    ]
    t = totals(train)
    for metric, floor in TRAIN_FLOORS.items():
        assert int(t[metric]) >= floor, (metric, t[metric], floor)  # type: ignore[call-overload]
    assert t["false_infra"] == TRAIN_MAX_FALSE_INFRA
    assert int(t["false_ok"]) <= TRAIN_MAX_FALSE_OK  # type: ignore[call-overload]
    shared = [s for s, here in zip(scores, in_shared, strict=True) if here]
    if shared:
        assert sum(s.kind_ok for s in shared) >= SHARED_KIND_FLOOR
        assert not any(s.false_infra for s in shared)


def test_every_case_is_well_formed() -> None:
    kinds_required = {"id", "source_url", "kind", "kind_accept", "category", "culprit_ranks"}
    for case in load_cases():
        missing = kinds_required - set(case.label)
        assert not missing, (case.name, missing)
        assert (case.path / "logs").is_dir(), case.name
        assert case.split in ("train", "validation")


def test_the_split_is_fixed_by_thread() -> None:
    """The split depends only on the thread's address: two labels of the same thread would
    land in the same split, and a case cannot be moved to validation by editing it."""
    from corpus.scoreboard import split_of

    url = "https://github.com/pytorch/pytorch/issues/1"
    assert split_of({"source_url": url}, shared=False) == split_of(
        {"source_url": url + "#issuecomment-2"}, shared=False
    )
    assert split_of({"source_url": url, "split": "train"}, shared=False) == "train"
    assert split_of({"source_url": url}, shared=True) == "train"
    splits = [c.split for c in load_cases()]
    if splits:
        share = splits.count("validation") / len(splits)
        assert 0.2 <= share <= 0.45, share
