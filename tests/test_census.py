"""The census of upstream messages against the knowledge base: every message of a failure kind
is recognised by its rule the way the scanner confirms a line, no benign or context message is
claimed by an error rule, every entry is well formed, and the coverage page is current.
Known misses are strict xfails: fixing one makes its test fail until the census says so."""

from __future__ import annotations

import pytest
from census.coverage import (
    CENSUS,
    PAGE,
    CensusError,
    Message,
    claimants,
    coverage_markdown,
    load,
    pattern_regex,
    problems,
    verdict,
    winners,
)

from ddpdoctor.analysis.facts import FACT_PATTERNS, FactPattern
from ddpdoctor.model.taxonomy import KINDS
from ddpdoctor.rules.registry import all_rules
from tests.conftest import diagnose_json

MESSAGES = load()
RULES = {r.code: r for r in all_rules()}


def _params(messages: list[Message]) -> list[object]:
    return [
        pytest.param(
            m,
            id=m.id,
            marks=[pytest.mark.xfail(strict=True, reason=m.gap)] if m.gap else [],
        )
        for m in messages
    ]


def test_census_holds_at_least_400_messages_with_unique_ids() -> None:
    assert len(MESSAGES) >= 400
    ids = [m.id for m in MESSAGES]
    assert len(ids) == len(set(ids)), [i for i in ids if ids.count(i) > 1]


def test_every_entry_is_well_formed() -> None:
    bad = {f"{m.id} (line {m.line})": p for m in MESSAGES if (p := problems(m, RULES))}
    assert not bad, bad


@pytest.mark.parametrize("msg", _params([m for m in MESSAGES if m.kind in KINDS]))
def test_failure_message_is_recognised_by_its_rule(msg: Message) -> None:
    ok, got = verdict(msg)
    assert ok, f"{msg.example!r}: expected {msg.rule or msg.kind}, the diagnosis keeps {got}"


@pytest.mark.parametrize("msg", _params([m for m in MESSAGES if m.kind not in KINDS]))
def test_benign_and_context_messages_are_not_claimed_by_an_error_rule(msg: Message) -> None:
    ok, got = verdict(msg)
    assert ok, f"{msg.example!r} ({msg.kind}): {got}"


def test_every_kind_with_messages_is_mapped() -> None:
    """A kind whose rules have signatures prints messages of its own: the census holds at
    least one of them, recognised by a rule (not a known gap)."""
    printed = {r.kind for r in all_rules() if r.signatures}
    mapped = {m.kind for m in MESSAGES if m.kind in KINDS and not m.gap and verdict(m)[0]}
    assert printed - mapped == set()
    in_census = {m.kind for m in MESSAGES if m.kind in KINDS}
    assert in_census - mapped == set(), "kinds whose every message is a gap"


def test_known_gaps_say_why() -> None:
    for m in MESSAGES:
        if m.gap is not None:
            assert len(m.gap) >= 20, f"{m.id}: say which rule misses it and why"


def test_coverage_page_is_current() -> None:
    assert PAGE.is_file(), "run `make census`"
    assert PAGE.read_text(encoding="utf-8") == coverage_markdown(MESSAGES), (
        "docs/census.md is stale: run `make census`"
    )


# --- the checker itself, so that a census that passes means something -------------------


def _msg(**fields: object) -> Message:
    base: dict[str, object] = {
        "id": "x",
        "pattern": "CUDA out of memory. Tried to allocate {size}",
        "example": "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB",
        "source": "torch 2.5 c10/cuda/CUDACachingAllocator.cpp",
        "versions": "torch>=2.5,<=2.13",
        "kind": "cuda-oom",
        "rule": "CUDA101",
        "notes": "n",
    }
    base.update(fields)
    return Message(**base)  # type: ignore[arg-type]


def test_checker_accepts_a_right_entry_and_rejects_wrong_ones() -> None:
    assert problems(_msg(), RULES) == []
    assert verdict(_msg())[0]
    # the rule recognises it, but a more specific rule of another kind wins the line
    wrong = _msg(
        example="RuntimeError: CUDA out of memory. Tried to allocate 2.00 MiB",
        context=('  File "/x/torch/serialization.py", line 1, in load',),
    )
    assert not verdict(wrong)[0]
    assert [r.code for r in winners(wrong)] == ["CUDA102"]
    assert problems(_msg(rule="DDP101"), RULES) == [
        "rule DDP101 is of kind ddp-unused-parameters, not cuda-oom"
    ]
    assert "the example does not follow the pattern" in problems(
        _msg(example="CUDA error: out of memory"), RULES
    )
    assert problems(_msg(versions="torch 2.5"), RULES)
    assert problems(_msg(rule=None), RULES) == [
        "a failure message without a rule must say why (gap)"
    ]


def test_checker_flags_a_benign_line_that_an_error_rule_claims() -> None:
    benign = _msg(kind="benign", rule=None)
    ok, got = verdict(benign)
    assert not ok and "CUDA101" in got
    assert verdict(_msg(kind="benign", rule=None, example="NCCL INFO Init COMPLETE"))[0]


def test_context_conditions_use_the_lines_before_the_example() -> None:
    line = "ValueError: bad value"
    bare = _msg(kind="python-exception", rule="PY101", example=line, pattern="ValueError: {}")
    assert not claimants(bare)
    tb = _msg(
        kind="python-exception",
        rule="PY101",
        example=line,
        pattern="ValueError: {}",
        context=("Traceback (most recent call last):", '  File "train.py", line 3, in <module>'),
    )
    assert [r.code for r in claimants(tb)] == ["PY101"]


def test_pattern_placeholders_follow_the_sources() -> None:
    assert pattern_regex("failed (exitcode: %s) local_rank: %s").search(
        "failed (exitcode: -9) local_rank: 3 (pid: 1)"
    )
    assert pattern_regex("Detected %lu oom_kill event%s in %s.").search(
        "Detected 1 oom_kill event in StepId=7.0."
    )
    assert pattern_regex("{{literal}} {x}").search("{literal} y")
    assert not pattern_regex("100%% done").search("100 done")


def test_a_malformed_census_line_is_a_clear_error(tmp_path) -> None:  # type: ignore[no-untyped-def]
    bad = tmp_path / "m.jsonl"
    bad.write_text('{"id": "a"}\n')
    with pytest.raises(CensusError, match=r"m.jsonl:1: missing"):
        load(bad)
    bad.write_text("not json\n")
    with pytest.raises(CensusError, match=r"m.jsonl:1: not JSON"):
        load(bad)
    assert CENSUS.is_file()


# --- the verdict on c10's whole CUDA error block ------------------------------------------

# c10/cuda/CUDAException.cpp (torch >= 2.1) appends these lines to every "CUDA error: ..."
C10_CUDA_ERROR_TAIL = (
    "CUDA kernel errors might be asynchronously reported at some other API call, so the "
    "stacktrace below might be incorrect.",
    "For debugging consider passing CUDA_LAUNCH_BLOCKING=1",
    "Compile with `TORCH_USE_CUDA_DSA` to enable device-side assertions.",
)


@pytest.mark.parametrize(
    ("error", "kind"),
    [
        ("out of memory", "cuda-oom"),
        ("an illegal memory access was encountered", "native-crash"),
        ("device-side assert triggered", "device-side-assert"),
    ],
)
def test_the_lines_c10_appends_to_every_cuda_error_do_not_change_its_kind(
    error: str, kind: str, tmp_path
) -> None:  # type: ignore[no-untyped-def]
    """The TORCH_USE_CUDA_DSA hint once made every CUDA error read as a device-side assert."""
    log = tmp_path / "rank0.log"
    log.write_text(
        "\n".join(
            (
                "Traceback (most recent call last):",
                '  File "/work/train.py", line 12, in <module>',
                "    loss.backward()",
                f"RuntimeError: CUDA error: {error}",
                *C10_CUDA_ERROR_TAIL,
                "",
            )
        )
    )
    assert diagnose_json(log)["verdict"]["kind"] == kind


NORMAL = [f for f in FACT_PATTERNS if f.name == "normal"]
# the torch <= 1.13 wording of the barrier note (census: the current one), as a real job
# printed it (corpus case 375, a public report)
OLD_BARRIER_NOTE = (
    "[W ProcessGroupNCCL.cpp:1569] Rank 0 using best-guess GPU 0 to perform barrier as devices "
    "used by this process are currently unknown. This can potentially cause a hang if this rank "
    "to GPU mapping is incorrect.Specify device_ids in barrier() to force use of a particular "
    "device."
)


@pytest.mark.parametrize("fact", NORMAL, ids=[f.literal.strip() for f in NORMAL])
def test_each_message_of_normal_operation_is_a_benign_census_message(fact: FactPattern) -> None:
    """A log of these alone is OK (little confidence); each pattern stands for a message the
    census keeps as benign (its source and versions), not for a line of a labelled case."""
    benign = [m.example for m in MESSAGES if m.kind == "benign"] + [OLD_BARRIER_NOTE]
    assert any(fact.compiled.search(example) for example in benign), fact.regex
    claimed = [m.id for m in MESSAGES if m.kind in KINDS and fact.compiled.search(m.example)]
    assert claimed == [], f"a failure message reads as normal operation: {claimed}"


@pytest.mark.parametrize(
    ("line", "category", "step"),
    [
        # NICs of two link types paired across ranks: which HCAs NCCL is given, configuration
        (
            "gpu-n3:2291:2384 [3] connect.cc:987 NCCL WARN NET/IB : Attempted to connect "
            "incompatible devices: [0]mlx5_0:1/IB and [0]mlx5_4:1/RoCE. Try selecting NICs of "
            "only one link type using NCCL_IB_HCA",
            "configuration",
            "NCCL_IB_HCA",
        ),
        # a port that went down: the fabric's own fault
        (
            "gpu-n3:2291:2384 [3] common.cc:179 NCCL WARN NET/IB : mlx5_0:1 Got non-fatal async "
            "event: port error(10)",
            "infrastructure",
            None,
        ),
        # a verbs call that could not pin memory (ENOMEM): the locked-memory limit, the
        # environment's, not the fabric (census nccl-warn-ibv-create-cq)
        (
            "gpu-n3:2291:2384 [3] misc/ibvwrap.cc:42 NCCL WARN Call to ibv_create_cq failed with "
            "error Cannot allocate memory",
            "environment",
            "ulimit -l",
        ),
        # an ibv_reg_mr failure of another errno says nothing about the limit: as before
        (
            "gpu-n3:2291:2384 [3] misc/ibvwrap.cc:278 NCCL WARN Call to ibv_reg_mr_iova2 failed "
            "with error Bad address",
            "infrastructure",
            None,
        ),
    ],
)
def test_an_ib_line_of_configuration_is_not_blamed_on_the_fabric(
    tmp_path,
    line: str,
    category: str,
    step: str | None,  # type: ignore[no-untyped-def]
) -> None:
    """NET102 (census nccl-warn-ib-incompatible-devices, nccl-warn-ib-nonfatal-event): one
    rule for NCCL's IB transport, whose lines prove a fabric fault unless they say the NICs
    given to NCCL do not match."""
    log = tmp_path / "rank3.log"
    log.write_text(line + "\n", encoding="utf-8")
    verdict = diagnose_json(log)["verdict"]
    assert (verdict["rule"], verdict["kind"], verdict["category"]) == (
        "NET102",
        "nccl-network",
        category,
    )
    if step is not None:
        assert step in verdict["fix"][0]
