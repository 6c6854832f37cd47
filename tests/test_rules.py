"""The knowledge base itself: every rule is well formed, its own examples fire (or not), its
signatures compile in both engines, and the generated docs are in sync."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from ddpdoctor.analysis.engine import HyperscanMatcher, LiteralMatcher, Pattern, hyperscan_available
from ddpdoctor.model.taxonomy import KINDS
from ddpdoctor.rules.docs import index_markdown, rule_markdown
from ddpdoctor.rules.registry import all_rules, find_rules

REPO = Path(__file__).resolve().parents[1]
RULES = all_rules()
SIGNED = [r for r in RULES if r.signatures]


def test_codes_are_unique_and_well_formed() -> None:
    codes = [r.code for r in RULES]
    assert len(codes) == len(set(codes))
    assert all(re.fullmatch(r"[A-Z]{2,5}\d{3}", c) for c in codes)


def test_every_taxonomy_kind_has_a_rule() -> None:
    covered = {r.kind for r in RULES}
    missing = KINDS - covered
    assert not missing, f"kinds without a rule: {sorted(missing)}"


@pytest.mark.parametrize("rule", SIGNED, ids=lambda r: r.code)
def test_rule_has_docs_examples_and_fix(rule) -> None:  # type: ignore[no-untyped-def]
    assert rule.title and rule.explanation.what and rule.explanation.why and rule.explanation.fix
    assert rule.fix, "a fix the user can paste"
    assert rule.positive, "at least one positive example from a real log"
    assert rule.negative, "at least one near-miss negative example"
    assert rule.sources, "where upstream prints the message"


@pytest.mark.parametrize("rule", SIGNED, ids=lambda r: r.code)
def test_positive_examples_fire_and_negatives_do_not(rule) -> None:  # type: ignore[no-untyped-def]
    for line in rule.positive:
        assert rule.match(line), f"{rule.code} should match: {line}"
    for line in rule.negative:
        assert not (rule.match(line) and rule.context_ok(line)), (
            f"{rule.code} must not match: {line}"
        )


@pytest.mark.parametrize("rule", SIGNED, ids=lambda r: r.code)
def test_each_signature_has_a_required_literal_that_its_matches_contain(rule) -> None:  # type: ignore[no-untyped-def]
    for sig in rule.signatures:
        lit = sig.required_literal
        # the prefilter searches its UTF-8 bytes ('已杀死' is nine)
        assert len(lit.encode()) >= 4, f"{rule.code}: literal {lit!r} of {sig.regex!r} is too short"
        for line in rule.positive:
            m = sig.compiled.search(line)
            if m:
                assert lit in line, f"{rule.code}: {lit!r} not in a line {sig.regex!r} matches"


def _patterns() -> list[Pattern]:
    return [
        Pattern(s.regex.removeprefix("^"), s.required_literal) for r in SIGNED for s in r.signatures
    ]


def test_all_signatures_compile_in_the_stdlib_engine() -> None:
    LiteralMatcher(_patterns())
    for r in SIGNED:
        for s in r.signatures:
            re.compile(s.regex)


@pytest.mark.skipif(not hyperscan_available(), reason="hyperscan not installed")
def test_all_signatures_compile_in_hyperscan() -> None:
    HyperscanMatcher(_patterns())


def test_generated_docs_are_in_sync() -> None:
    docs = REPO / "docs" / "rules"
    for rule in RULES:
        page = docs / f"{rule.code}.md"
        assert page.is_file(), f"missing {page}: run `make docs`"
        assert page.read_text() == rule_markdown(rule), f"{page} is stale: run `make docs`"
    assert (docs / "README.md").read_text() == index_markdown(RULES)


@pytest.mark.parametrize(
    ("query", "code"),
    [
        ("DDP101", "DDP101"),
        ("ddp-unused-parameters", "DDP101"),
        ("Expected to have finished reduction", "DDP101"),
        ("RuntimeError: CUDA out of memory. Tried to allocate 20.00 MiB", "CUDA101"),
    ],
)
def test_find_rules(query: str, code: str) -> None:
    assert find_rules(query)[0].code == code


def test_dunder_names_survive_the_markdown_of_explain() -> None:
    """`explain` renders a rule's page as Markdown: a bare "__getitem__" would turn bold and
    lose its underscores; inside a code span it is left as written."""
    from rich.console import Console
    from rich.markdown import Markdown

    from ddpdoctor.rules.data import SAMPLE_FETCH
    from ddpdoctor.rules.docs import _prose, rule_markdown

    assert _prose("in `a.__init__` and __getitem__") == "in `a.__init__` and \\_\\_getitem\\_\\_"
    console = Console(width=200, record=True)
    console.print(Markdown(rule_markdown(SAMPLE_FETCH)))
    assert "dataset's __getitem__" in console.export_text()


def test_a_captured_value_can_call_for_its_own_step() -> None:
    """LCH108: a port already in use calls for its own first step (find the holder); a
    rendezvous host that does not resolve does not get it. A step for a capture no signature
    declares is refused."""
    from ddpdoctor.rules.base import Rule, RuleDefinitionError
    from ddpdoctor.rules.launch import RENDEZVOUS_FAILURE

    taken = RENDEZVOUS_FAILURE.fix_for_captures(
        [
            "torch.distributed.DistNetworkError: The server socket has failed to listen on any "
            "local network address. port: 29500, useIpv6: 0, code: -98, name: EADDRINUSE, "
            "message: address already in use"
        ]
    )
    assert len(taken) == 1 and "ss -ltnp" in taken[0]
    assert RENDEZVOUS_FAILURE.fix_for_captures(["socket.gaierror: Name or service not known"]) == []
    with pytest.raises(RuleDefinitionError):
        Rule(
            code="X1",
            kind="hang",
            title="t",
            signatures=(),
            explanation=RENDEZVOUS_FAILURE.explanation,
            fix=(),
            capture_fix=(("no_such_capture", "1", "s"),),
        )


def test_a_job_whose_terminal_closed_is_told_to_detach_it() -> None:
    """Corpus case 341 (accelerate under torchrun, SignalException ... got signal: 1)."""
    from ddpdoctor.analysis.diagnose import diagnose_paths

    case = next((REPO / "corpus" / "cases").glob("341-*"))
    verdict = diagnose_paths([str(case / "logs")]).verdict
    assert (verdict.kind, verdict.category, verdict.rule) == (
        "preempted",
        "configuration",
        "LCH120",
    )
    assert "tmux" in verdict.fix[0] and "terminal" in verdict.summary.split(".")[0]


def test_a_bus_error_is_told_to_look_at_the_containers_shared_memory() -> None:
    """LCH104's SIGBUS step (capture_fix on signal 7): corpus case 1266, a worker ended by
    SIGBUS (-7) when an in-memory checkpoint filled a 64 MB /dev/shm; a SIGSEGV (-11, case
    1365) is not told about shared memory."""
    from ddpdoctor.analysis.diagnose import diagnose_paths

    cases = REPO / "corpus" / "cases"
    bus = diagnose_paths([str(next(cases.glob("1266-*")) / "logs")]).verdict
    assert bus.rule == "LCH104" and "/dev/shm" in bus.fix[0], bus.fix
    segv = diagnose_paths([str(next(cases.glob("1365-*")) / "logs")]).verdict
    assert segv.rule == "LCH104" and not any("SIGBUS" in step for step in segv.fix)


def test_a_gpu_too_new_for_the_wheel_is_told_which_cuda_it_needs() -> None:
    """CUDA105: torch's capability check names the architecture; the step names the first
    CUDA release that compiles for it. Without an architecture, no such step."""
    from ddpdoctor.rules.cuda import CUDA_LIBRARY_MISMATCH as CUDA_MISMATCH

    line = (
        "NVIDIA GeForce RTX 3090 with CUDA capability sm_86 is not compatible with the current "
        "PyTorch installation."
    )
    m = CUDA_MISMATCH.match(line)
    assert m is not None and m.group("arch") == "sm_86"
    (step,) = CUDA_MISMATCH.fix_for_captures([line])
    assert "CUDA 11.1" in step
    assert "12.8" in CUDA_MISMATCH.fix_for_captures([line.replace("sm_86", "sm_120")])[0]
    assert CUDA_MISMATCH.fix_for_captures(["no kernel image is available for execution"]) == []


def test_a_port_in_use_is_told_to_find_its_holder() -> None:
    """LCH108 on a real run (twentieth port-busy: rank 0's TCPStore cannot bind, EADDRINUSE):
    the scan matched the line as a DistNetworkError, the step comes from the EADDRINUSE
    signature all the same."""
    from ddpdoctor.analysis.diagnose import diagnose_paths

    verdict = diagnose_paths([str(REPO / "tests/fixtures/real/twentieth-port-busy")]).verdict
    assert verdict.rule == "LCH108" and "already taken" in verdict.fix[0]
    timeout = diagnose_paths([str(REPO / "tests/fixtures/real/twentythird-world-four")]).verdict
    assert not any("already taken" in step for step in timeout.fix)


def test_a_message_s_later_line_is_read_alone_only(tmp_path: Path) -> None:
    """Signature.after_head: the grad-strides warning's bucket-view line (and the reducer
    error's last line) is a hit where a paste was cut above the message's first line, and no
    second hit under it. Lines of corpus case 886 and the reducer.cpp warning."""
    from ddpdoctor.analysis.scanner import Scanner
    from ddpdoctor.ingest.sources import Input
    from ddpdoctor.rules.registry import all_rules

    scanner = Scanner([r for r in all_rules() if r.signatures])
    tail = (
        "bucket_view.sizes() = [1024, 1, 3, 3, 3], strides() = [27, 27, 9, 3, 1] (Triggered "
        "internally at /opt/conda/torch/csrc/distributed/c10d/reducer.cpp:312.)"
    )
    whole = [
        "[W reducer.cpp:1400] Warning: Grad strides do not match bucket view strides. This may "
        "indicate grad was not created according to the gradient layout contract, or that the "
        "param's strides changed since DDP was constructed.  This is not an error, but may impair "
        "performance.",
        "grad.sizes() = [1024, 1, 3, 3, 3], strides() = [27, 1, 9, 3, 1]",
        tail,
    ]
    for name, lines, want in (("whole", whole, 1), ("cut", whole[1:], 1), ("alone", [tail], 1)):
        log = tmp_path / f"{name}.log"
        log.write_text("\n".join(lines) + "\n")
        hits = [h for h in scanner.scan(Input(str(log), str(log))).hits if h.rule == "DDP103"]
        assert len(hits) == want, (name, [h.record.text[:40] for h in hits])
