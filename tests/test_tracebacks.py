"""Traceback stitching when ranks interleave line by line in one stream.

torch 2.13's excepthook prints each rank's traceback as one block, so the interleaving is made
from a real capture (tests/fixtures/real/both-fail): the two ranks' real tracebacks are merged
line by line, as a collector that reads both pipes (or srun --label) delivers them."""

from __future__ import annotations

import re
from itertools import zip_longest
from pathlib import Path
from unittest.mock import patch

from hypothesis import given, settings
from hypothesis import strategies as st

from ddpdoctor.analysis.diagnose import diagnose_paths
from ddpdoctor.analysis.scanner import _parser
from ddpdoctor.ingest import tracebacks
from ddpdoctor.ingest.prefixes import parse_line
from ddpdoctor.ingest.tracebacks import walk_back

REAL = Path(__file__).parent / "fixtures" / "real" / "both-fail" / "console.log"


def _interleaved() -> str:
    blocks: dict[str, list[str]] = {"0": [], "1": []}
    for line in REAL.read_text().splitlines():
        m = re.match(r"\[rank(\d)\]:", line)
        if m:
            blocks[m.group(1)].append(line)
    assert len(blocks["0"]) > 10 and len(blocks["1"]) > 10
    merged = [x for pair in zip_longest(blocks["0"], blocks["1"]) for x in pair if x]
    return "\n".join(merged) + "\n"


def test_real_blocks_diagnose_each_rank() -> None:
    report = diagnose_paths([str(REAL)])
    by_rule = {f.rule: f for f in report.findings}
    assert by_rule["DATA101"].ranks == [1]
    assert by_rule["PY101"].ranks == [0]


def test_interleaved_tracebacks_are_stitched_per_rank(tmp_path: Path) -> None:
    log = tmp_path / "console.log"
    log.write_text(_interleaved())
    report = diagnose_paths([str(log)])
    by_rule = {f.rule: f for f in report.findings}
    data, generic = by_rule["DATA101"], by_rule["PY101"]
    assert data.ranks == [1] and generic.ranks == [0]
    for finding, rank, frame in ((data, 1, "load_shard"), (generic, 0, "check_config")):
        context = finding.hits[0].context
        assert context[0].text.startswith("Traceback")
        assert all(c.origin.rank == rank for c in context)
        assert any(frame in c.text for c in context)
        # every other line of the stream belongs to the other rank: the lines kept are
        # exactly this rank's, in order
        lines = log.read_text().splitlines()
        for c in context:
            assert lines[c.line - 1].startswith(f"[rank{rank}]:")
    assert report.verdict.kind == "data-error"


REAL_LINES = REAL.read_bytes().splitlines()
PREFIXES = [b"", b"[rank0]:", b"[rank1]:", b"\x1b[31m[rank0]:", b"[rank\x1b[0m0]:", b"\x00[rank0]:"]
PREFIXES += [
    b"[pod/a\xff/c] ",
    b"host-1:11:12 [0] ",
    b"[rank0]:host-1:11:12 [0] ",
    b"[rank\xff]:",
    b"2024-01-01 ",
    b"0: [rank0]:",  # srun --label: the node's task id first, shared by its ranks
    b"0: [rank1]:",
    b"1: [rank0]:",
]


@settings(max_examples=200, deadline=None)
@given(
    st.lists(
        st.tuples(st.sampled_from(PREFIXES), st.sampled_from(REAL_LINES)), min_size=1, max_size=40
    ),
    st.sampled_from(PREFIXES),
)
def test_skipping_other_writers_unparsed_changes_no_stitch(
    lines: list[tuple[bytes, bytes]], last_prefix: bytes
) -> None:
    """Lines of other writers are skipped by a byte search before parsing: the stitched
    traceback must be the one a walk that parses every line finds, whatever colour codes,
    NUL bytes or undecodable bytes sit in the prefixes."""
    body = b"".join(p + re.sub(rb"^\[rank\d\]:", b"", t) + b"\n" for p, t in lines)
    chunk = body + last_prefix + b"RuntimeError: boom\n"
    start = len(body)
    parse = _parser(2026)
    key = parse(chunk[start:-1].decode("utf-8", errors="replace")).prefix
    fast = walk_back(chunk, start, key, parse)
    with patch.object(tracebacks, "_writer_needles", lambda key: ()):
        slow = walk_back(chunk, start, key, parse)
    assert [(n, p.text, p.prefix) for n, p in fast] == [(n, p.text, p.prefix) for n, p in slow]


def test_a_traceback_whose_indentation_was_trimmed_is_still_one_traceback() -> None:
    """Corpus case 352 pasted its traceback with every line's leading spaces gone: the code
    under a frame and Python 3.11's carets are still the frame's."""
    text = (
        "-- Process 0 terminated with the following error:\n"
        "Traceback (most recent call last):\n"
        'File "/w/train.py", line 9, in main\n'
        "loss.backward()\n"
        "^^^^^^^^^^^^^^^\n"
        'File "/w/train.py", line 4, in step\n'
        "store = TCPStore(host, port)\n"
        "ValueError: host not found: Name or service not known\n"
    )
    data = text.encode()
    last = data.rindex(b"ValueError")
    lines = [p.text for _, p in walk_back(data, last, "", parse_line)]
    assert lines[0].startswith("-- Process 0") and "loss.backward()" in lines
    assert lines[-1] == "store = TCPStore(host, port)"


HOOK_RAISE = Path(__file__).parent / "fixtures" / "real" / "thirtyninth-hook-raise" / "console.log"


def test_another_process_log_record_inside_a_traceback_is_stepped_over() -> None:
    """A real console of three unprefixed ranks (tests/test_thirtyninth_style_runs.py
    hook-raise): rank 0's 'INFO:recipes...:Exported the final model' landed between two frames
    of another rank's atexit traceback; the walk up still reaches Python's 'Exception ignored
    in atexit callback' line, which says the error was printed and ignored."""
    data = HOOK_RAISE.read_bytes()
    first = data.index(b"FileNotFoundError")
    lines = [p.text for _, p in walk_back(data, first, "", parse_line)]
    assert lines[0].startswith("Exception ignored in atexit callback"), lines[:2]
    assert not any(line.startswith("INFO:") for line in lines)
    assert tracebacks.carried_on(lines)


def test_a_log_record_right_above_an_error_line_is_not_stepped_over() -> None:
    """Composed from that console's lines: a bare error line right under a log record has no
    frames of its own to be between, so the walk stops at the record and does not reach up into
    an earlier, finished traceback (what the step over may skip is bounded to records between
    the frames already found)."""
    text = (
        "Traceback (most recent call last):\n"
        '  File "/repo/train.py", line 47, in flush_metrics\n'
        '    (OUT / "logs").write_text("done")\n'
        "KeyError: 'acc'\n"
        "INFO:recipes.full_finetune:Final evaluation: loss 2.2899, acc 0.0000\n"
        "FileNotFoundError: [Errno 2] No such file or directory: '/tmp/x/logs'\n"
    )
    data = text.encode()
    assert walk_back(data, data.rindex(b"FileNotFound"), "", parse_line) == []


def test_code_ipython_quotes_around_a_frame_is_no_message() -> None:
    """IPython's traceback (a notebook's cell output) quotes a few source lines around each
    frame behind a gutter of line numbers; a library's code quoted there (accelerate's check
    for the words of CUDA's fork error) is not the job's message, a line outside it is."""
    from ddpdoctor.analysis.scanner import _ipython_source_line

    cell = (
        b"Cell In[3], line 53, in notebook_launcher(function, args)\n"
        b"     52             start_processes(launcher, args=args)\n"
        b"---> 53         except ProcessRaisedException as e:\n"
        b'     54             if "Cannot re-initialize CUDA in forked subprocess" in e.args[0]:\n'
        b"RuntimeError: Cannot re-initialize CUDA in forked subprocess\n"
    )
    lines = cell.split(b"\n")
    starts = [sum(len(x) + 1 for x in lines[:i]) for i in range(len(lines))]
    shown = [
        _ipython_source_line(cell, s, s + len(line)) for s, line in zip(starts, lines, strict=True)
    ]
    assert shown[:5] == [False, True, True, True, False]
    # a line numbered like a gutter with no frame header above it is left alone
    alone = b"     54 Cannot re-initialize CUDA in forked subprocess\n"
    assert not _ipython_source_line(alone, 0, len(alone) - 1)


def test_ipythons_own_traceback_is_walked_to_its_head() -> None:
    """IPython's (a notebook cell's) traceback: its head ('KeyboardInterrupt   Traceback (most
    recent call last)'), frames as 'File /path/mod.py:382, in f(...)' and 'Cell In[7], line 3',
    the quoted code behind a gutter ('---> 382 ...'). The exception's line walks back through
    all of it to the head (tests/fixtures/real/hundredsixtysecond-stop-press, shortened), and
    the traceback is a Python exception's (the Ctrl-C a person gave)."""
    text = (
        "Epoch 1 | step 60/80 | loss 0.6677\n"
        "---------------------------------------------------------------------------\n"
        "KeyboardInterrupt                         Traceback (most recent call last)\n"
        "Cell In[7], line 3\n"
        "      1 distributor = TorchDistributor(num_processes=2, local_mode=True)\n"
        "----> 3 distributor.run(train_fn, cfg)\n"
        "\n"
        "File /opt/venv/lib/python3.11/site-packages/pyspark/context.py:382, in "
        "SparkContext._do_init.<locals>.signal_handler(signal, frame)\n"
        "    380 def signal_handler(signal: Any, frame: Any) -> NoReturn:\n"
        "    381     self.cancelAllJobs()\n"
        "--> 382     raise KeyboardInterrupt()\n"
        "\n"
        "KeyboardInterrupt: \n"
    )
    data = text.encode()
    walked = [
        line.text
        for _, line in walk_back(data, data.rindex(b"KeyboardInterrupt: "), "", parse_line)
    ]
    assert walked[0].startswith("KeyboardInterrupt ") and "Traceback (most recent" in walked[0]
    assert "Cell In[7], line 3" in walked and "--> 382     raise KeyboardInterrupt()" in walked
    assert not any(w.startswith("Epoch 1") for w in walked)
