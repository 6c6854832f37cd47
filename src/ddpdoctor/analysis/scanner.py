"""Scanning one source: prefilter chunks with the multi-pattern engine, confirm candidates with
Python `re`, and turn confirmed lines into Hits with origin, time and stitched traceback. Only
lines with a candidate (and a bounded head and tail, for job facts) are parsed in Python."""

from __future__ import annotations

import dataclasses
import re
from collections import deque
from collections.abc import Callable, Iterable, MutableSequence, Sequence
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from functools import lru_cache

from ddpdoctor.analysis.engine import (
    Distinct,
    Matcher,
    Pattern,
    Seen,
    build_matcher,
    plain_line,
    suffix_safe,
)
from ddpdoctor.analysis.facts import FACT_PATTERNS, FactPattern, elapsed_seconds
from ddpdoctor.analysis.newlines import count_newlines
from ddpdoctor.analysis.phases import counted_phase, phase_of_work
from ddpdoctor.ingest.bounds import (
    MAX_NUMBER_DIGITS,
    count_number,
    rank_number,
    safe_capture,
    time_from_epoch,
)
from ddpdoctor.ingest.elastic_error import ErrorFileChunks, is_error_file
from ddpdoctor.ingest.filenames import origin_from_path
from ddpdoctor.ingest.prefixes import MAX_TEXT, ParsedLine, parse_line, rank_before
from ddpdoctor.ingest.self_rank import own_rank
from ddpdoctor.ingest.sources import ChunkStream, Input
from ddpdoctor.ingest.srun_tasks import HEAD_BYTES, NodeNames, as_node_task, labels_name_nodes
from ddpdoctor.ingest.tracebacks import (
    IPYTHON_ARROW,
    IPYTHON_FRAME_HEAD,
    UNRAISABLE,
    carried_on,
    is_traceback_line,
    walk_back,
)
from ddpdoctor.ingest.unwrap import original_line
from ddpdoctor.model.findings import Hit
from ddpdoctor.model.records import Origin, Record, SourceInfo
from ddpdoctor.model.transfer import by_fields
from ddpdoctor.rules.base import Rule, Signature

_Parse = Callable[[str], ParsedLine]
HEAD_TAIL_BYTES = 256 * 1024
MIN_SAMPLE_BYTES = 2 * 1024
SAMPLE_BUDGET_BYTES = 2 * 1024 * 1024
"""Head and tail are parsed line by line in Python (~50 us a line): a few files get 256 KB
each, thousands of rank files share a budget so that sampling never dominates the scan."""


MANY_FILES = 64
"""From this many inputs on, files are taken to be one writer each (per-rank logs): their tail
says who wrote them and how they ended, and the head is not sampled."""


def sample_bytes_for(n_inputs: int) -> int:
    return max(MIN_SAMPLE_BYTES, min(HEAD_TAIL_BYTES, SAMPLE_BUDGET_BYTES // max(1, n_inputs)))


ERROR_LEVELS = frozenset(("error", "fatal", "critical"))
RECENT_LINES = 6
"""A writer's last lines of its own kept with their raw text, timed (StreamSummary.recent) and
untimed (StreamSummary.bare) apart."""
RANKED_RECENT_LINES = 3
RANKED_RECENT_CHARS = 200
"""A ranked writer's last timed lines of its own since its last progress line (work it
announced after it stopped training), kept fewer and shorter: 10,000 rank files hold 20,000
writers (their time and the head of their words are what behaviour reads), and one line
alone is not kept (RECENT_MIN)."""
ERROR_TEXT_CHARS = 200
"""What a writer's last error-level line keeps of its words."""
PHASE_CHARS = 300
"""What a pending phase keeps of its line: its words, not a dump that follows them."""
RECENT_MIN = 2
"""Lines of its own a writer printed inside the others' wait to count as busy there: one may
be the last of what it did before it entered the collective too."""
CLOCK = re.compile(r"\d:\d\d:\d\d")
"""A time of day in a line: the cheap test for a line that may carry its time."""
CLOCK_WITHIN = 100
"""Where a record's time stands: in front of its message, behind a few prefixes."""
# A Python exception line, as a traceback ends ("RuntimeError: ...", "tensorflow.errors_impl.
# UnknownError: ..."): a writer that printed one is not quiet, even when no rule knows it.
# Warnings ("UserWarning: ...") are not exceptions raised.
RAISED = re.compile(r"[A-Za-z_][\w.]{0,200}(?:Error|Exception)(?::\s|:?$)")
EXCEPTION_HEAD = re.compile(r"^\**[A-Za-z_][\w.]{0,200}(?:Error|Exception):")
"""An exception line with a message (possibly wrapped by rich or a terminal onto the next
lines)."""
LAUNCHER_RAISED = re.compile(
    r"ChildFailedError|SignalException|ProcessRaisedException|ProcessExitedException"
    r"|CalledProcessError"
)
"""The exceptions launchers raise about their workers (torchrun, mp.spawn, accelerate's and
DeepSpeed's subprocess calls): a report of a worker's failure, not the worker's own."""
WRAP_LINES = 3
MAX_WRAPPED_TEXT = 4000
MAX_WRAPPED_READS = 200
GENERIC_SPECIFICITY = 5
"""Rules at or below this prior are catch-alls (events.GENERIC_SPECIFICITY)."""
MAX_HITS_PER_PATTERN = 2000
"""After this many confirmed hits of one signature in one source, further lines of it are not
looked at (the engine stops reporting the pattern for the source): memory stays bounded and a
log that repeats one warning every step costs nothing past it."""
MAX_FACTS_PER_PATTERN = 10_000
"""The same for job facts (a world size, an exit in a launcher's summary), whose repeats are
mostly dropped as they come (see FactPattern.distinct): bounds a hostile log's thousands of
different values."""


PARSED_KEPT = 16
"""Candidate lines a source keeps parsed for the walks back from the next ones (see
_Source.parsed_at): a walk from a warning mostly stops one or two lines up."""


MAX_SHARED_KEYS = 256
"""Values of one fact read by value that a scan passes on to the next scans of its process
(see Scanner.scan); a hostile log's thousands are not copied into every later scan (fewer
values passed on only leave more lines to confirm, and merging drops their facts)."""


ANSI_BYTES = re.compile(
    rb"\x1b\[[0-9;?]*[ -/]*[@-~]|\x1b\][^\x07\x1b\n]*+(?:\x07|\x1b\\)"
    rb"|\x1b[PX^_][^\x1b\n]*+\x1b\\|\x1b[@-_]"
)
"""prefixes.ANSI over a chunk's bytes, never across a line end: a coloured logger's codes
('\x1b[31m[rank 1] done\x1b[0m') stood between the bytes a pattern reads (the end of the
line after 'done', a level before a message) and the engine never handed such lines on. They
hold no newline, so lines keep their numbers."""

CR_LF = re.compile(rb"\r+\n")
"""A line end written on Windows, also twice through a text-mode file ('\\r\\r\\n')."""
CRLF_LOOK = 8
"""Line ends looked at to tell a file written with Windows line ends."""


def windows_line_ends(chunk: bytes) -> bool:
    """The source's first chunk ends some of its first lines with '\\r\\n': a file written (or
    pasted) on Windows, whose every chunk is then read with '\\n' line ends. Decided once: a
    search for '\\r\\n' in every chunk cost 23 us per 27 KB rank file (two bytes are no
    memchr), and progress bars fill chunks with '\\r' of their own."""
    if b"\r" not in chunk:
        return False
    end = -1
    for _ in range(CRLF_LOOK):
        end = chunk.find(b"\n", end + 1)
        if end < 0:
            return False
        if end and chunk[end - 1] == 0x0D:
            return True
    return False


PASTE_MARKUP = re.compile(
    r" {0,3}(?:(?:`{3,12}|~{3,12})[\w+.#-]{0,30}"
    r"|(?:</?(?:details|summary|pre|code)\b[^>\n]{0,80}>){1,4}(?:[^<\n]{0,200}</summary>)?)"
    r"[ \t\r]{0,8}$"
)
"""A Markdown code fence ('```', '```python', '~~~') or the HTML an issue folds a log in
('<details>', '<summary>Full log</summary>', '</details>', '<pre>'): a paste copied with them
kept its last line as every writer's last words. Every run is bounded: with `+` over the tags
and an unbounded blank run before the end a megabyte line of tags and blanks took 12 s
(tests/test_linear_time.py)."""

NBSP_BYTES = b"\xc2\xa0"
"""A no-break space (UTF-8): a log copied from a web page indents with them."""

TYPOGRAPHIC_QUOTES = re.compile(b"\xe2\x80[\x98\x99\x9c\x9d]")
"""Curly quotes (UTF-8 ‘ ’ “ ”): a log that went through a word processor, a chat or a mail
before it was pasted ("terminate called after throwing an instance of ‘c10::CUDAError’");
programs print straight ones, which the patterns spell."""

STRAIGHT_QUOTE = {b"\x98": b"'", b"\x99": b"'", b"\x9c": b'"', b"\x9d": b'"'}
"""The straight quote of each curly one, by its last byte."""

QUOTE_BLANK = " \t\r>"
"""What an empty line of a log pasted as a Markdown quote is made of."""


@by_fields
@dataclass(slots=True)
class FactHit:
    name: str
    captures: dict[str, str]
    record: Record
    before: list[str]


@by_fields
@dataclass(frozen=True, slots=True)
class Planned:
    """A writer's training counter where it stood last: `done` of `total`, on `line`."""

    done: int
    total: int
    line: int
    text: str


PLANNED_CHARS = 300
"""What a planned counter keeps of its line (a bar redrawn in place keeps its last state)."""


@by_fields
@dataclass(slots=True)
class StreamSummary:
    """What the sampled head and tail say about one writer in one source."""

    key: str
    origin: Origin
    source: str = ""
    """The source (as displayed) this writer's lines were read from."""
    lines_seen: int = 0
    first_line: int = 0
    last_line: int = 0
    last_text: str = ""
    prev_text: str = ""
    """The line before its last: what it was doing when its last words were a handler's (a
    stop signal's 'dumped', 'terminating')."""
    progress_lines: int = 0
    last_progress_line: int = 0
    after_progress: tuple[str, ...] = ()
    """Of its first few lines after its last progress line (of all its lines, if none was
    progress), those that may say its data ran out: what it said when it stopped stepping
    ('Ran out of data; last step was 17.' before 'Training completed')."""
    since_progress: int = 0
    """Its lines since its last progress line, counted up to AFTER_PROGRESS_LINES."""
    last_init_line: int = 0
    init_sampled: int = 0
    """How many lines with text its source's samples had read when they met that line."""
    lines_after_init: int = 0
    """Lines with text of its source (any writer's) the samples read after its last start-up
    line: how near the end of its source start-up stood, blank lines not counted (a
    double-spaced paste put one after each line)."""
    error_lines: int = 0
    """Lines logged at error level (glog E/F, logging ERROR): this writer is not quiet."""
    last_error_line: int = 0
    """The last of them: a restart after it leaves the writer's new attempt quiet."""
    last_error_text: str = ""
    """The words of that line (an error the program logged that no rule may know)."""
    first_raised: tuple[int, str] | None = None
    """(line, words) of the first exception line a writer no rank is known for printed, other
    than a launcher's own (LAUNCHER_RAISED): a program's excepthook may print that line alone,
    with no traceback ('OLMoConfigurationError: ... already exists')."""
    progress_total: int | None = None
    """The M of the last "step n/M" counter: ranks with different M have uneven inputs."""
    progress_done: int | None = None
    """The n of that counter: where the writer was when its output ends."""
    last_progress_time: datetime | None = None
    """The time its last progress line carries, if any: a writer that went on training after
    an error lived on from it."""
    step_s: float | None = None
    """Seconds between its last two timed progress lines: how often it reported progress."""
    progress_moved: bool = False
    """Its counters moved between those two lines ('1/6' then '2/6'): not a heartbeat thread
    repeating the step a blocked main thread is at ('heartbeat step=5', again and again)."""
    last_progress_text: str = ""
    """The writer's last progress line (for the report's timeline)."""
    recent: tuple[tuple[int, str], ...] = ()
    """For a writer no rank is known for (a node's console, the lines no prefix names), the
    raw text of its last few lines that are neither progress nor errors and show a time of
    day: work of its own it announced while others waited (behaviour's wait window parses
    their times, only where ranks waited). Ranked writers' last words say it already, and
    rank files (10,000 of them) pay nothing."""
    bare: tuple[tuple[int, str], ...] = ()
    """The same as `recent` for its last few lines that show no time: a plain print's count of
    work ('rebuilding (3/10)'), which only its place in the file dates."""
    planned: Planned | None = None
    """For a writer no rank is known for (the main process's bar), its training counter with
    the largest total, where it stood last: the steps it planned and reached."""
    pending_phase: tuple[int, str] | None = None
    """For a writer no rank is known for, its first line since its last progress line that
    announced a long phase of work (phases.phase_of_work: 'building the index ...', or one
    that counts its parts: phases.counted_phase): what it set out to do and never reported
    done by a step (its later lines of the phase, printed while or after the others waited,
    do not move it). A rank's own words say it already (behaviour reads a ranked writer's
    last lines); one set out on far above its last lines (the phase's parameters printed
    after it) is still under way."""
    phase_cleared: bool = False
    """A training step of this writer ended a phase (or found none) in what was scanned: a
    later range's pending phase then replaces an earlier range's; without one, the earlier
    range's phase is still the one set out on (merging)."""
    year: int = 1970
    """The year its source's times without one are read in (the file's)."""
    last_epoch: tuple[int, int | None, bool] | None = None
    """The writer's last line that counts epochs ('Epoch: 4/4 Step: 10/10', 'Epoch 3/3: 100%|
    50/50', MMEngine's 'Epoch(train) [3][12/12]'): (its epoch, the epoch's total when the line
    says it, whether every other counter of the line stands at its total). None: no line
    counted epochs."""
    first_epoch: int | None = None
    """The epoch its first line that counts epochs names: 0 for a loop that counts from 0
    (`for epoch in range(epochs)`), whose last epoch is one less than the epochs announced."""
    epoch_share: float | None = None
    """The fractional epoch of its last line that carried one, a Trainer-style log dict
    ("{'loss': 2.31, ..., 'epoch': 0.33}", a progress line or not): how far through the run's
    epochs it stood, to the part of an epoch. None: no such line."""
    open_traceback_line: int = 0
    """Where the writer's last traceback began, while no exception line has closed it yet (0:
    none open). Open at the end of its output: the output was cut inside a traceback."""
    open_traceback_text: str = ""
    """That traceback's last whole frame line ('File "...", line N, in f'), else its first line
    (for a C++ backtrace, its 'Exception raised from' line or first frame)."""
    open_traceback_at: int = 0
    """The line of open_traceback_text."""
    open_traceback_time: datetime | None = None
    """The time the open traceback's first line shows, if any: when the error was raised."""
    open_traceback_tail: tuple[str, ...] = ()
    """The open traceback's last few lines (frames and their code): what it was doing."""
    closed_traceback_line: int = 0
    """The line that last ended an open trace (a Python traceback's exception line): an
    exception line there has its traceback above it."""
    open_trace_native: bool = False
    """The open trace is a C++ backtrace (c10::Error's frames), not a Python traceback: the
    process died in native code, or printed an error whose message came before it."""
    open_trace_carried_on: bool = False
    """The open Python traceback is one Python printed and went on from (ingest.tracebacks.
    carried_on of the line above it: 'Exception ignored in: ...' over an unraisable exception
    in a __del__ or a finalizer, '--- Logging error ---'): it ends nothing, neither cut nor
    whole, and its exception line is no error of the program's."""
    ignored_traces: int = 0
    """How many of them were under 'Exception ignored in: ...' (an exception nothing could
    catch, that Python ignored; logging's own error says a record could not be written, which
    is no sign of health)."""
    open_trace_indent: int = 0
    """The open Python traceback's header was indented by this many blanks (a log handler
    that aligns a record's further lines under its message column: fairseq2's, rich's
    logging without its box); 0: not indented. A line indented no further ends it."""


# Training progress (steps, epochs, loss) and distributed start-up, as seen in head and tail.
# Each opens with a look-ahead for the characters its alternatives can start with: Python `re`
# then skips other positions in C (3.6 -> 2.3 us a line on the benchmark's tails). Runs are
# bounded (a percentage has at most 3 digits): `\d+%` from every digit of a long number, or
# `\s*...\s*` over a long run of blanks, was quadratic.
# (kimg: thousands of images shown, StyleGAN's unit of training: "tick 6     kimg 0.4"; round:
# federated learning's communication round, "Communication round : 3"; the training loss as
# a variable's name, "train_loss = 1.27" (not val_loss: a summary's "best val_loss 1.11" at
# the end is no step))
_PROGRESS_WORD = (
    r"(?:\b(?:step|iter(?:ation)?|epoch|loss|batch|eta|kimg|round)|(?<=train_)loss)"
    r"\b\s{0,8}[:=\[]?\s{0,8}\d"
)
_PROGRESS_BAR = r"\d{1,3}%\||\d\s?(?:it/s|s/it)\b"
"""A progress bar: tqdm's 'NN%|', or an iteration rate ('2.6it/s', '1.3 s/it') that bars
without tqdm's frame print too (rich, ultralytics' '96% ━━━ 55/57 2.6it/s')."""
PROGRESS_LINE = re.compile(rf"(?i)(?=[seilbkr\d])(?:{_PROGRESS_WORD}|{_PROGRESS_BAR})")
PROGRESS_WORDS = ("step", "iter", "epoch", "loss", "batch", "eta", "kimg", "round")
"""What _PROGRESS_WORD's match begins with (iteration with iter), in lower case."""
PROGRESS_WORD_AT = re.compile(_PROGRESS_WORD)
SLURM_STEP_NOTICE = re.compile(r"\*\*\* (?:STEP|JOB) \d[\d.]{0,30} ON ")
"""slurmstepd's notice of a job or step it ended ('*** STEP 4242.0 ON node01 CANCELLED AT ...'):
its STEP is a job step's id, not training progress."""
PROGRESS_BAR = re.compile(_PROGRESS_BAR)
EPOCH_COUNTER = re.compile(
    r"(?i)(?<!\{)\bepoch\b(?:\((?:train|val|test)\))?[\s:=\[]{0,3}(?P<n>\d{1,6})"
    r"(?:\s{0,2}/\s{0,2}(?P<total>\d{1,6}))?(?![\d.])"
)
"""An epoch counter: 'Epoch: 4/4', 'Epoch [3/3]', 'epoch 2/10', MMEngine's 'Epoch(train) [3]',
Composer's console logger '[epoch=3][batch=24/24]:'. Not a format field of a config dump:
ModelCheckpoint's filename '{epoch:06}' is no epoch 6."""
EPOCH_SHARE = re.compile(r"""['"]epoch['"]: ?(?P<share>\d{1,5}\.\d{1,6})(?![\d.])""")
"""The fractional epoch of a Hugging Face Trainer-style log dict ('epoch': 0.33, its steps
over the steps of an epoch): where in the run's epochs the writer stood."""
EPOCH_THEN_ITER = re.compile(
    r"Train(?:ing)?: \[(?P<n>\d{1,6})/(?P<total>\d{1,6})\]\[(?P<i>\d{1,9})/(?P<itotal>\d{1,9})\]"
)
"""The epoch, then the iteration, each over its total, without the word 'epoch': Pointcept's
(and PointTransformerV2's) 'Train: [3/3][8/8] Data 0.002 (0.005) Batch ...'."""
ANY_COUNTER = re.compile(r"(?<![\d./])(?P<n>\d{1,9})\s{0,2}/\s{0,2}(?P<total>\d{1,9})(?![\d./])")
"""Any 'n/total' on a progress line (steps, batches, a bar's count): not a date or a path."""
PROGRESS_COUNTER = re.compile(
    r"(?i)(?=[sibe])\b(?:(?:step|iter(?:ation)?|batch|it)\b\D{0,3}?"
    r"|epoch\b[\s:=\[]{0,3}\d{1,6}(?: \| |\]\[ {0,6}))(?P<n>\d+)\s*/\s*(?P<total>\d+)"
)
"""A count of steps in a total: after the word for them ('step 5/8', 'Batch 2/4'), or right
after the epoch it is in, where the word is left out (pytorch/examples' ProgressMeter
'Epoch: [0][ 10/391]', flashy's 'Train | Epoch 1 | 2/4'). Not the epoch's own count ('Epoch
3/10')."""
OTHER_PHASE_BAR = re.compile(r"(?i)eval|valid|test|predict|infer|load|writ|sav|download|map")
"""A counter's label of another phase than training (its total is not the loop's)."""
TRACEBACK_HEADER = "Traceback (most recent call last):"
NATIVE_HEADER = "Exception raised from "
"""c10::Error's backtrace: 'Exception raised from f at file:line (most recent call first):'."""
TRACEBACK_BODY = re.compile(r"\s|\^|~")
"""A traceback's frames and source lines are indented (3.11's markers too); the exception line
that ends it is not."""
WHOLE_FRAME = re.compile(r'\s{1,8}File "[^"]{1,4096}", line \d')
NATIVE_FRAME = re.compile(r"frame #\d{1,4}: ")
NATIVE_WRAPPED = re.compile(r"[^\n]{0,4096}?\(0x[0-9a-fA-F]{1,16} in ")
"""The rest of a native frame that a terminal or a paste wrapped: '... (0x7fa1 in lib.so)'."""
INIT_LINE = re.compile(
    # torch.distributed's own loggers, except the launcher's process handling (stops, exits)
    r"Initializing distributed|init_process_group"
    r"|torch\.dis(?!tributed\.elastic\.multiproc)"
    # (a communicator's "comm 0x... - Abort COMPLETE" / "Destroy COMPLETE" is its end)
    r"|NCCL INFO (?:Bootstrap|NET/|comm (?![^\n]{0,300}(?:Abort|Destroy) COMPLETE))"
    r"|Global seed set|GLOBAL_RANK|MASTER_ADDR|distributed_backend|store.based.barrier"
    r"|NCCL INFO (?:Channel|Connected all|Trees|Ring)|via P2P|P2P/IPC|P2P/CUMEM|Init COMPLETE"
)
INIT_ADVICE = re.compile(r"\b(?:in|with) `?init_process_group|init_process_group\(\) to ")
"""Advice that names the call, no start-up of its own: "You can specify device_id in
init_process_group()", a wrapped line's rest "init_process_group() to force use of a
particular device". (Searched only where INIT_LINE matched: a look-behind inside INIT_LINE
made it ten times slower on every line.)"""
PY_WARNING = re.compile(r"(?<=\w)Warning: ")
"""A Python warning. One that names start-up ("specify `device_id` in `init_process_group`")
is advice about a call, printed once by rank 0 whether the job then trains or hangs: the
barrier's warning comes before the first step of healthy runs as much as of hung ones (every
paste of it alone in the corpus is a healthy run's), so neither it nor a warning-level line
of the C++ side (ProcessGroupNCCL's "using GPU 0 to perform barrier") is start-up a log can
be said to stop in."""


@by_fields
@dataclass(slots=True)
class SourceScan:
    info: SourceInfo
    hits: list[Hit] = field(default_factory=list)
    facts: list[FactHit] = field(default_factory=list)
    streams: dict[str, StreamSummary] = field(default_factory=dict)


MAX_HITS_ACROSS_FILES = 2000
"""With MANY_FILES inputs or more (one writer each), a rule's hits past this many over all
files, in input order, are not kept, except the first of each file: every rank keeps what it
said (its timeout, its warning), and 10,000 rank files repeating three warnings keep about
16,000 hits instead of 290,000."""


class HitBudget:
    """What the scans before this one kept, so that it need not confirm hits that would be
    dropped: merging keeps the first MAX_HITS_PER_PATTERN hits of a rule in a split file, and
    with many files the first MAX_HITS_ACROSS_FILES over all of them (see parallel.trim).

    `shared` is an array shared with the worker processes: n_rules numbers of hits kept by
    the files already trimmed (written by the parent), then n_rules per range of a split
    file (written by the range's scan after each chunk). The numbers only grow, so a scan that
    reads them early keeps more than is needed, never less: the result does not depend on
    which scan ran first (on a 1 GiB log repeating three warnings, six of eight ranges no
    longer confirm 6,000 hits each that merging threw away)."""

    def __init__(
        self,
        shared: MutableSequence[int],
        n_rules: int,
        slot: int | None = None,
        earlier: Sequence[int] = (),
        across_files: bool = False,
    ) -> None:
        self.shared = shared
        self.n_rules = n_rules
        self.slot = slot
        """This range's numbers (a split file), or None."""
        self.earlier = earlier
        """The slots of the ranges before this one in the same file."""
        self.across_files = across_files

    def before(self, rule: int) -> tuple[int, int]:
        """Hits of the rule kept by the earlier ranges of this file, and by earlier files."""
        shared, n = self.shared, self.n_rules
        parts = sum(shared[(1 + j) * n + rule] for j in self.earlier)
        return parts, shared[rule] if self.across_files else 0

    def publish(self, rule: int, kept: int) -> None:
        if self.slot is not None:
            self.shared[(1 + self.slot) * self.n_rules + rule] = kept

    def over(self, kept: int, parts: int, files: int) -> bool:
        """Whether a next hit, after `kept` in this scan, would be dropped."""
        if self.earlier and kept + parts >= MAX_HITS_PER_PATTERN:
            return True
        return self.across_files and kept > 0 and kept + files >= MAX_HITS_ACROSS_FILES


@dataclass(slots=True)
class _Progress:
    """The progress bar that ran longest so far (the first of equals): the only one job
    building keeps, so the others are dropped as they come. It carries the redraw before it
    of a bar with the same total (captures 'before_n', 'before_elapsed'): a last redraw one
    count on, after a long gap, is a bar that stood still (behaviour._stood_still)."""

    fact: FactHit | None = None
    elapsed_s: float = -1.0
    last: dict[str, tuple[str, str]] = field(default_factory=dict)
    """A bar's total -> its latest redraw's (count, elapsed)."""

    def offer(self, fact: FactHit) -> None:
        captures = fact.captures
        elapsed = elapsed_seconds(captures.get("elapsed", ""))
        total = captures.get("total", "")
        if self.fact is None or (elapsed is not None and elapsed > self.elapsed_s):
            self.fact = fact
            self.elapsed_s = elapsed if elapsed is not None else self.elapsed_s
            before = self.last.get(total)
            if before is not None:
                captures["before_n"], captures["before_elapsed"] = before
        self.last[total] = (captures.get("n", ""), captures.get("elapsed", ""))


@dataclass(frozen=True)
class _Target:
    rule: Rule | None
    signature: Signature | None
    fact: FactPattern | None
    rule_index: int = -1


class _TaskLabels:
    """Whether this source's srun labels name nodes (ingest/srun_tasks), decided from the
    head of the input the first time a line with a label is read (files without labels never
    pay for the look), and the names the file gives those nodes."""

    __slots__ = ("head", "names", "nodes")

    def __init__(self) -> None:
        self.head = b""
        self.nodes: bool | None = None
        self.names = NodeNames()

    def own(self, parsed: ParsedLine) -> ParsedLine:
        if parsed.task is None:
            if self.nodes:
                self.names.learn(parsed)
            return parsed
        if self.nodes is None:
            self.nodes = labels_name_nodes(self.head)
        if not self.nodes:
            return parsed
        self.names.learn(parsed)
        return as_node_task(parsed)


def _file_head(item: Input) -> bytes:
    """The start of the input a later range of it belongs to (a split plain file, stdin)."""
    if item.start == 0 or item.head or item.spool is not None or item.path == "-":
        return item.head
    try:
        with open(item.path, "rb") as f:
            return f.read(HEAD_BYTES)
    except OSError:
        return b""


@dataclass(slots=True)
class _Source:
    """What the scan of one source carries from chunk to chunk."""

    result: SourceScan
    display: str
    file_origin: Origin
    parse: _Parse
    rule_kept: list[int]
    """Hits kept per rule (by index), for the budget."""
    budget: HitBudget | None = None
    seen: Seen = field(default_factory=Seen)
    kept: dict[int, int] = field(default_factory=dict)
    """Facts kept per pattern (a rule's hits are counted per rule: rule_kept)."""
    progress: _Progress = field(default_factory=lambda: _Progress())
    earlier: dict[int, tuple[int, int]] = field(default_factory=dict)
    """Per rule, the budget's hits of earlier ranges and files, read once per chunk."""
    touched: set[int] = field(default_factory=set)
    """Rules with new hits since the budget was last told."""
    year: int = 1970
    """The year `parse` reads times without one in."""
    wrapped_reads: int = 0
    """Exception messages read again joined with their next lines (at most MAX_WRAPPED_READS:
    each is a pass of every rule over the message)."""
    labels: _TaskLabels = field(default_factory=_TaskLabels)
    sampled: int = 0
    """Lines with text the head and tail samples read (see StreamSummary.lines_after_init)."""
    parsed_at: dict[int, ParsedLine] = field(default_factory=dict)
    """The current chunk's last candidate lines parsed, by where they start: a walk back from a
    later candidate that reaches one takes it as it is (PARSED_KEPT of them)."""


class Scanner:
    """Compiled once for a rule set; scans any number of sources."""

    def __init__(self, rules: Iterable[Rule], engine: str = "auto") -> None:
        self.rules = {r.code: r for r in rules}
        self._targets: list[_Target] = []
        patterns: list[Pattern] = []
        self._rule_pids: list[list[int]] = []
        for index, rule in enumerate(self.rules.values()):
            self._rule_pids.append([])
            for sig in rule.signatures:
                self._rule_pids[index].append(len(self._targets))
                self._targets.append(_Target(rule, sig, None, index))
                patterns.append(Pattern(_unanchored(sig.regex), sig.required_literal))
        for fact in FACT_PATTERNS:
            self._targets.append(_Target(None, None, fact))
            # a progress bar redraws every step: the latest few per chunk are enough
            sampled = fact.name == "progress"
            patterns.append(Pattern(_unanchored(fact.regex), fact.literal, sampled, fact.distinct))
        self._value_pids = frozenset(
            pid
            for pid, t in enumerate(self._targets)
            if t.fact is not None and t.fact.distinct == Distinct.VALUE
        )
        self._suffix_safe = [
            suffix_safe(t.signature.regex if t.signature else t.fact.regex if t.fact else "")
            for t in self._targets
        ]
        """Per pattern: a plain line it does not match cannot hold a match in its message (see
        _confirm), so such a line is not parsed for it."""
        self.rule_index = {code: n for n, code in enumerate(self.rules)}
        self.matcher: Matcher = build_matcher(patterns, prefer=engine)

    @property
    def n_rules(self) -> int:
        return len(self.rules)

    def scan(
        self,
        item: Input,
        sample_bytes: int = HEAD_TAIL_BYTES,
        sample_head: bool = True,
        budget: HitBudget | None = None,
        shared_keys: dict[int, set[object]] | None = None,
    ) -> SourceScan:
        """`budget`: what the scans before this one kept (see HitBudget). `shared_keys`: the
        values of facts read by value only (FactPattern.distinct) already handed on by this
        process, shared by the scans of one diagnosis: merging keeps the first of each value
        over all files, in input order, and this process saw the earlier ones first."""
        stream: ChunkStream | ErrorFileChunks = (
            ErrorFileChunks(item.path, item.display)
            if "error.json" in item.path and is_error_file(item.path)  # pathlib costs 20 us
            else ChunkStream(item, join_wrapped=sample_head)  # not among many rank files
        )
        result = SourceScan(info=stream.info)
        file_origin = origin_from_path(item.named or item.path) if item.path != "-" else Origin()
        year = datetime.now(UTC).year
        labels = _TaskLabels()
        labels.head = _file_head(item)
        src = _Source(
            result,
            item.display,
            file_origin,
            _parser(year, labels),
            [0] * self.n_rules,
            budget,
            labels=labels,
            year=year,
        )
        if shared_keys is not None:
            self._take_keys(src.seen, shared_keys)
        capped = src.seen.capped
        line_base = 0
        order = 0
        # no head for a later part of a split file, or when sampling tails only
        # (a section of a paste is a whole source: its head and tail are sampled)
        whole = item.named is not None
        head_left = sample_bytes if (item.start == 0 or whole) and sample_head else 0
        last_chunk = prev_chunk = b""
        head_through = 0
        crlf: bool | None = None
        for chunk in stream:
            if b"\x1b" in chunk:  # colour codes out first: the patterns run on the bytes
                chunk = ANSI_BYTES.sub(b"", chunk)
            if crlf is None:
                crlf = windows_line_ends(chunk)
            if crlf:  # Windows line ends (a log pasted from Windows): the patterns end a
                # line at '\n', so 'NotImplementedError\r' matched no `$`
                chunk = CR_LF.sub(b"\n", chunk)
            if b"\xa0" in chunk and NBSP_BYTES in chunk:  # (one byte first: a memchr)
                # no-break spaces as a web page's indentation: spaces, as the program wrote
                # them (a traceback's frames are told by their indentation)
                chunk = chunk.replace(NBSP_BYTES, b" ")
            if b"\xe2" in chunk and b"\x80" in chunk and b"\xe2\x80" in chunk:  # the lead
                # bytes of every curly quote, each alone first: one byte is a memchr, the two
                # together are searched at 1 GB/s (26 us per 27 KB rank file, 1 ms per MB of
                # a log with tqdm's block characters, whose UTF-8 starts with \xe2 too)
                chunk = TYPOGRAPHIC_QUOTES.sub(lambda m: STRAIGHT_QUOTE[m[0][2:]], chunk)
            if line_base == 0 and order == 0:
                if not labels.head:
                    labels.head = chunk[:HEAD_BYTES]
                # (a rank file's name says it; thousands of files are one writer each, and
                # their names tell which: no search)
                if file_origin.rank is None and sample_head:
                    own = item.own_rank if item.own_rank is not None else own_rank(labels.head)
                    if own is not None:
                        file_origin = src.file_origin = replace(file_origin, rank=own)
            if line_base == 0 and order == 0 and is_own_output(chunk[:600]):
                result.info.status = "skipped"
                result.info.reason = "a ddpdoctor report, not a log"
                result.info.lines = 0
                return result
            if stream.mtime is not None and line_base == 0:
                modified = time_from_epoch(stream.mtime)
                year = modified.year if modified is not None else year
                src.parse, src.year = _parser(year, labels), year
            if head_left > 0:
                head = chunk[:head_left]
                self._sample(result, head, line_base, file_origin, item.display, src)
                head_left -= len(head)
                # the lines the head covered, blank ones too (a line it cut counts as read)
                head_through = line_base + head.count(b"\n") + (not head.endswith(b"\n"))
            src.parsed_at.clear()  # (by where they start in the chunk before)
            before = 0  # newlines before `prev` in this chunk: one pass numbers hits and lines
            prev = 0
            for start, end, pids in self.matcher.candidate_lines(chunk, src.seen):
                order += 1
                if capped and capped.issuperset(pids):
                    continue  # located before its patterns reached their caps in this chunk
                before += count_newlines(chunk, prev, start)
                prev = start
                self._confirm(src, chunk, start, end, pids, line_base + before + 1, order)
            prev_chunk, last_chunk = last_chunk, chunk
            line_base += before + count_newlines(chunk, prev, len(chunk))
            result.info.lines = line_base
            self._tell_budget(src)
        if src.progress.fact is not None:
            result.facts.append(src.progress.fact)
        if shared_keys is not None:
            self._give_keys(src.seen, shared_keys)
        if last_chunk and line_base > 0 and (item.end is None or whole):
            tail = _tail(prev_chunk, last_chunk, sample_bytes)
            tail_start = max(0, len(tail) - sample_bytes)
            tail_start = tail.find(b"\n", tail_start - 1) + 1 if tail_start else 0
            # (the writers' lines seen left out blank lines and a paste's markup: the tail read
            # the file's last lines a second time, its last line became its line before too)
            head_lines = head_through
            first_tail_line = line_base - tail.count(b"\n", tail_start)
            if first_tail_line >= head_lines:
                for summary in result.streams.values():  # the unread middle may have ended it
                    summary.open_traceback_line = summary.open_traceback_at = 0
                    summary.open_traceback_tail = ()
                    summary.open_trace_indent = 0
                self._sample(
                    result,
                    tail[tail_start:],
                    first_tail_line,
                    file_origin,
                    item.display,
                    src,
                )
            elif first_tail_line < head_lines < line_base:
                skip = head_lines - first_tail_line
                pos = tail_start
                for _ in range(skip):
                    pos = tail.find(b"\n", pos) + 1
                self._sample(result, tail[pos:], head_lines, file_origin, item.display, src)
        for summary in result.streams.values():
            if summary.last_init_line:
                summary.lines_after_init = src.sampled - summary.init_sampled
        if labels.nodes:
            _rename_hosts(result, labels.names.renames())
        merges = getattr(stream, "merges", ())
        if merges:
            _renumber(result, lambda line: original_line(line, merges))
            result.info.lines += len(merges)
        if item.first_line:  # a section of a paste: numbered as the paste's lines
            _renumber(result, lambda line: line + item.first_line)
        return result

    def _take_keys(self, seen: Seen, shared: dict[int, set[object]]) -> None:
        """Start from the values this process handed on in earlier scans (see `scan`): the
        engine then drops their lines before any parsing, as merging would drop their facts
        (a world size and a transport on each of 10,000 rank files)."""
        for pid, known in shared.items():  # only patterns read by value (see _give_keys)
            seen.keys[pid] = set(known)

    def _give_keys(self, seen: Seen, shared: dict[int, set[object]]) -> None:
        """Hand this scan's values on to the next scans. The engine notes a value as it hands
        its line on; only a pattern that reached its cap here may have values noted whose
        lines were never confirmed, so its values are not passed on."""
        by_value = self._value_pids
        for pid, keys in seen.keys.items():
            if pid in by_value and keys and pid not in seen.capped and len(keys) <= MAX_SHARED_KEYS:
                shared[pid] = keys

    def _tell_budget(self, src: _Source) -> None:
        """After a chunk: publish this range's counts, forget the earlier ranges' (they grow)."""
        budget = src.budget
        if budget is None:
            return
        for rule in src.touched:
            budget.publish(rule, src.rule_kept[rule])
        src.touched.clear()
        src.earlier.clear()

    def _over_budget(self, src: _Source, rule: int) -> bool:
        """True when merging would drop this scan's next hit of the rule (see HitBudget); its
        patterns are then no longer looked for in the source."""
        budget = src.budget
        if budget is None or not (budget.earlier or budget.across_files):
            return False
        kept = src.rule_kept[rule]
        if budget.across_files and kept == 0:
            return False  # a file's first hit of a rule is always kept
        earlier = src.earlier.get(rule)
        if earlier is None:
            earlier = src.earlier[rule] = budget.before(rule)
        if not budget.over(kept, *earlier):
            return False
        src.seen.capped.update(self._rule_pids[rule])
        return True

    def _confirm(
        self,
        src: _Source,
        chunk: bytes,
        start: int,
        end: int,
        pids: list[int],
        line_no: int,
        order: int,
    ) -> None:
        capped = src.seen.capped
        raw = chunk[start:end].decode("utf-8", errors="replace")
        parsed: ParsedLine | None = None
        plain: bool | None = None
        source_shown: bool | None = None
        context: list[tuple[int, ParsedLine]] | None = None
        rules_done: set[str] = set()
        hit_of: dict[str, Hit] = {}
        result, display, file_origin = src.result, src.display, src.file_origin
        for pid in pids:
            if pid in capped:
                continue
            target = self._targets[pid]
            if target.rule_index >= 0 and self._over_budget(src, target.rule_index):
                continue
            sig = target.signature
            if (
                sig is not None
                and sig.after_head is not None
                and _head_above(chunk, start, sig.after_head, sig.head_within)
            ):
                # a later line of a message whose first line was read: told from the bytes
                # above, before any parsing (DDP's 'bucket_view.sizes() = ...' under each
                # 'Grad strides do not match' warning never counts toward a cap, and every one
                # of them was parsed: 38,508 lines in a range of the 20% benchmark log)
                continue
            regex = sig.compiled if sig else None
            if regex is None and target.fact is not None:
                regex = target.fact.compiled
            if regex is None:
                continue
            if parsed is None:
                # a candidate the prefilter let through but the regex does not match (the
                # literal alone was searched, or a prefilter's superset): on a plain line, whose
                # message is a suffix of it, a suffix-safe regex that finds nothing in the line
                # finds nothing in the message either, and the line needs no parsing (about a
                # third of the confirmations of 10,000 rank files at 20% candidates)
                if self._suffix_safe[pid]:
                    if plain is None:
                        plain = plain_line(chunk[start:end])
                    if plain and regex.search(raw) is None:
                        continue
                parsed = src.parse(raw)
                kept = src.parsed_at
                if len(kept) >= PARSED_KEPT:
                    del kept[next(iter(kept))]
                kept[start] = parsed
            m = regex.search(parsed.text) or regex.search(raw)
            if m is None:
                continue
            record = _record(parsed, display, line_no, file_origin)
            if parsed.rank_from_text and parsed.origin.rank is not None and m.string is parsed.text:
                near = rank_before(parsed.text, m.start())
                if near is not None:
                    record.origin.rank = near
            captures = _captures(m)
            if target.fact is not None:
                if not target.fact.text_read:  # read by captures and writer only
                    record.text, record.stream_key, record.time = "", "", None
                before = [
                    src.parse(line).text
                    for line in _raw_lines_before(chunk, start, target.fact.lines_before)
                ]
                fact = FactHit(target.fact.name, captures, record, before)
                if target.fact.name == "progress":
                    src.progress.offer(fact)
                    continue
                result.facts.append(fact)
                _count(src.kept, pid, MAX_FACTS_PER_PATTERN, capped)
                continue
            rule = target.rule
            if rule is None:
                continue
            if source_shown is None:
                source_shown = _ipython_source_line(chunk, start, end)
            if source_shown:
                continue  # code IPython quotes around a frame of its traceback, not a message
            if rule.code in rules_done:  # another signature of it on this line: what it
                # names too (a specific one whose literal sits after a generic one's)
                if rule.code in hit_of:
                    for key, value in captures.items():
                        hit_of[rule.code].captures.setdefault(key, value)
                continue
            if context is None:
                context = _logged_trace(parsed) or walk_back(
                    chunk, start, parsed.prefix, src.parse, src.parsed_at
                )
            ctx_records = [_record(p, display, line_no - back, file_origin) for back, p in context]
            ctx_text = (  # (most hits have no lines above them: no join)
                "\n".join(p.text for _, p in context) + "\n" + parsed.text
                if context
                else "\n" + parsed.text
            )
            if not rule.context_ok(ctx_text):
                continue
            if record.time is None:
                record.time = next((c.time for c in reversed(ctx_records) if c.time), None)
            if record.origin.rank is None:  # e.g. logger.exception's header names the rank
                record.origin.rank = next(
                    (c.origin.rank for c in reversed(ctx_records) if c.origin.rank is not None),
                    None,
                )
            rules_done.add(rule.code)
            src.rule_kept[target.rule_index] += 1
            if src.rule_kept[target.rule_index] >= MAX_HITS_PER_PATTERN:
                # the cap is the rule's, over all its signatures, as merging a split file's
                # ranges applies it: the same hits whole or split
                capped.update(self._rule_pids[target.rule_index])
            src.touched.add(target.rule_index)
            suggests = target.signature is not None and target.signature.suggests
            echo = rule.echo_of(target.signature)
            handled = bool(context) and carried_on([p.text for _, p in context])
            # any signature of the rule may say so, not only the one the scan matched first
            hosts = rule.store_host_patterns
            store_host = bool(hosts) and any(p.search(parsed.text) for p in hosts)
            hit_of[rule.code] = Hit(
                rule.code,
                record,
                captures,
                ctx_records,
                order,
                suggests,
                echo,
                handled,
                store_host,
            )
            result.hits.append(hit_of[rule.code])
            if rule.specificity <= GENERIC_SPECIFICITY and EXCEPTION_HEAD.match(parsed.text):
                self._confirm_wrapped(
                    src, chunk, end, parsed, record, ctx_records, order, handled, rules_done
                )

    def _confirm_wrapped(
        self,
        src: _Source,
        chunk: bytes,
        end: int,
        parsed: ParsedLine,
        record: Record,
        ctx_records: list[Record],
        order: int,
        handled: bool,
        rules_done: set[str],
    ) -> None:
        """An exception line only the catch-all read, whose message goes on in the next
        lines (rich's traceback and narrow terminals wrap a long message, even right after
        'RuntimeError: '): the message is read again joined with the same writer's next lines
        that carry no header of their own, by every specific rule, and a rule that reads it
        there claims the exception's line."""
        if src.wrapped_reads >= MAX_WRAPPED_READS:
            return
        pieces: list[str] = []
        pos = end + 1
        for _ in range(WRAP_LINES):
            if pos >= len(chunk):
                break
            nl = chunk.find(b"\n", pos)
            stop = len(chunk) if nl < 0 else nl
            nxt = src.parse(chunk[pos : min(stop, pos + 4096)].decode("utf-8", errors="replace"))
            pos = stop + 1
            if nxt.prefix != parsed.prefix or not nxt.text.strip():
                break
            if nxt.time is not None or nxt.level is not None or is_traceback_line(nxt.text):
                break  # a record of its own, or the next traceback's lines
            pieces.append(nxt.text.strip())
        if not pieces:
            return
        src.wrapped_reads += 1
        head = parsed.text.rstrip()
        joined = head + " " + " ".join(pieces)
        done = set(rules_done)  # what read the line alone keeps it
        for target in self._targets:
            rule, signature = target.rule, target.signature
            if rule is None or signature is None or rule.code in done:
                continue
            if rule.specificity <= GENERIC_SPECIFICITY:
                continue
            m = signature.compiled.search(joined)
            # what the rule reads must begin in the exception's own line and run on past it
            # (a message of its own on the next line is read there, as itself)
            if m is None or not m.start() < len(head) < m.end() or not rule.context_ok(joined):
                continue
            done.add(rule.code)
            wrapped = replace(record, text=joined[:MAX_WRAPPED_TEXT])
            src.result.hits.append(
                Hit(
                    rule.code,
                    wrapped,
                    _captures(m),
                    ctx_records,
                    order,
                    signature.suggests,
                    rule.echo_of(signature),
                    handled,
                    False,
                )
            )

    def _sample(
        self,
        result: SourceScan,
        data: bytes,
        line_base: int,
        file_origin: Origin,
        display: str,
        src: _Source,
    ) -> None:
        """Parse every line of a bounded head or tail to learn the writers and their last words."""
        parse, labels = src.parse, src.labels
        text = data.decode("utf-8", errors="replace")
        streams = result.streams
        progress: dict[str, list[str]] = {}
        progress_at: dict[str, list[int]] = {}  # the line of each of those
        last_raw: dict[str, str] = {}
        prev_raw: dict[str, str] = {}
        # one further back: a step's line and its save's share one time, and the pace is the
        # gap to the step before
        prev2_raw: dict[str, str] = {}
        recent: dict[str, deque[tuple[int, str]]] = {}
        bare: dict[str, deque[tuple[int, str]]] = {}
        trace_head: dict[str, tuple[int, str]] = {}  # where each writer's last trace began
        for offset, raw in enumerate(text.split("\n")):
            if not raw or raw.isspace() or not raw.strip(QUOTE_BLANK):
                continue  # an empty line, also inside a Markdown quote ('> ')
            if raw[:1] in "`~ <" and PASTE_MARKUP.match(raw):
                continue  # the Markdown or HTML a log was pasted in: nobody's words
            parsed = parse_line(raw, with_time=False)  # writers and last words, not times
            src.sampled += 1
            pieces = [(parsed, raw)]
            if parsed.bar_line is not None:  # a line printed onto a bar's last redraw: the
                # bar's progress first, then the line
                bar = parsed.bar_line
                pieces.insert(0, (parse_line(bar, with_time=False), bar))
            for parsed, raw in pieces:
                if parsed.task is not None or labels.nodes:
                    parsed = labels.own(parsed)
                if not parsed.text.strip() and not parsed.fields:
                    continue  # an empty line behind a prefix or colour codes: no words of anyone
                said = parsed.origin
                key = parsed.prefix
                if parsed.rank_from_text or not key:  # the program names its rank in the text
                    rank = said.rank if said.rank is not None else file_origin.rank
                    if rank is not None:
                        key += f" rank {rank}"
                    elif said.local_rank is not None:  # the program names its device
                        key += f" local {said.local_rank}"
                line_no = line_base + offset + 1
                summary = streams.get(key)
                if summary is None:
                    origin = said.merged_with(file_origin)
                    summary = StreamSummary(key, origin, display, first_line=line_no)
                    streams[key] = summary
                elif summary.origin.rank is None and said.rank is not None:
                    summary.origin = said.merged_with(file_origin)
                summary.lines_seen += 1
                summary.last_line = line_no
                message = parsed.text
                summary.prev_text = summary.last_text
                summary.last_text = message
                if "epoch" in message and (share := EPOCH_SHARE.search(message)):
                    summary.epoch_share = float(share["share"])  # a log dict, not always progress
                erred = parsed.level in ERROR_LEVELS or RAISED.match(message) is not None
                if erred and not (summary.open_traceback_line and summary.open_trace_carried_on):
                    summary.error_lines += 1  # an error logged, or an exception it printed
                    summary.last_error_line = line_no
                    summary.last_error_text = message[:ERROR_TEXT_CHARS]
                    if (
                        summary.first_raised is None
                        and summary.origin.rank is None
                        and EXCEPTION_HEAD.match(message)
                        and not LAUNCHER_RAISED.search(message)
                    ):
                        summary.first_raised = (line_no, message[:ERROR_TEXT_CHARS])
                # a JSON record's fields are progress when they report a loss ('step: 5  loss:
                # 3.9'); a step number alone rides on every record ('training finished', step 8)
                told = f"{message} | {parsed.fields}" if "loss" in parsed.fields else message
                on_progress = progress_line(told)
                if not on_progress and not erred and raw[:1] not in " \t":
                    # (not a traceback's frame, nor a summary's field)
                    timed = CLOCK.search(raw, 0, CLOCK_WITHIN) is not None
                    if summary.origin.rank is None:
                        # (a traceback's head is no line of work: see StreamSummary.bare)
                        if timed or not is_traceback_line(message):
                            kept = recent if timed else bare
                            mine = kept.get(key)
                            if mine is None:
                                mine = kept[key] = deque(maxlen=RECENT_LINES)
                            mine.append((line_no, raw))
                        if summary.pending_phase is None and (
                            phase_of_work(message) or counted_phase(message)
                        ):
                            # the first since its last step: the phase it set out on (its
                            # later lines, after the others' wait, do not move it)
                            summary.pending_phase = (line_no, message[:PHASE_CHARS])
                    elif timed:
                        mine = recent.get(key)
                        if mine is None:
                            mine = recent[key] = deque(maxlen=RANKED_RECENT_LINES)
                        mine.append((line_no, raw[:RANKED_RECENT_CHARS]))
                if on_progress:
                    summary.after_progress, summary.since_progress = (), 0
                    if summary.origin.rank is None and counted_phase(message):
                        # progress, but of a phase of work it counts the parts of
                        if summary.pending_phase is None:
                            summary.pending_phase = (line_no, message[:PHASE_CHARS])
                    elif summary.origin.rank is None and phase_of_work(message):
                        # a step's own save or evaluation ('Saving model ... at iteration 100'):
                        # the phase it set out on after that step, the latest such line
                        summary.pending_phase = (line_no, message[:PHASE_CHARS])
                    else:
                        summary.pending_phase = None
                        summary.phase_cleared = True
                    if summary.origin.rank is not None:
                        recent.pop(key, None)  # a ranked writer's work since its last step
                elif summary.since_progress < AFTER_PROGRESS_LINES:
                    summary.since_progress += 1
                    if _may_say_data_ended(message):
                        summary.after_progress = (*summary.after_progress, message[:300])
                if on_progress:
                    summary.progress_lines += 1
                    summary.last_progress_line = line_no
                    summary.last_progress_text = told
                    epoch = _epoch_state(told)
                    if epoch is not None:
                        known = summary.last_epoch
                        if epoch[1] is None and known and known[0] == epoch[0] and known[1]:
                            # the same epoch named again without its total ('Epoch 4: saving'
                            # after 'Epoch: 4/4 ... Train steps: 10'): the total still holds
                            epoch = (epoch[0], known[1], epoch[2] and known[2])
                        summary.last_epoch = epoch
                        if summary.first_epoch is None:
                            summary.first_epoch = epoch[0]
                    if key in last_raw:
                        if key in prev_raw:
                            prev2_raw[key] = prev_raw[key]
                        prev_raw[key] = last_raw[key]
                    last_raw[key] = raw
                    progress.setdefault(key, []).append(told)
                    progress_at.setdefault(key, []).append(line_no)
                if (  # (the cheap tests first, each regex only where its words are)
                    parsed.level != "warning"
                    and not message[:1].isspace()  # a wrapped message's rest, a frame
                    and INIT_LINE.search(message)
                    and not ("Warning: " in message and PY_WARNING.search(message))
                    and not ("init_process_group" in message and INIT_ADVICE.search(message))
                ):
                    summary.last_init_line = line_no
                    summary.init_sampled = src.sampled
                _follow_traceback(summary, message, line_no)
                if summary.open_traceback_line == line_no:
                    trace_head[key] = (line_no, raw)
        for key, lines in recent.items():
            if len(lines) < RECENT_MIN and streams[key].origin.rank is not None:
                continue  # one line since its last step says no work of its own
            streams[key].recent = tuple(lines)
            streams[key].year = src.year
        for key, lines in bare.items():
            streams[key].bare = tuple(lines)
        for key, (line_no, raw) in trace_head.items():  # still open at the end: its time
            if streams[key].open_traceback_line == line_no:
                streams[key].open_traceback_time = parse(raw).time
        for key, raw in last_raw.items():  # the time of each writer's last progress line only
            newest = parse(raw)
            streams[key].last_progress_time = last = newest.time
            if last is None and not labels.nodes:
                continue  # no pace without it (and reading a line again teaches labels nothing)
            earlier = parse(prev_raw[key]) if key in prev_raw else None
            if earlier and last and earlier.time and earlier.time >= last and key in prev2_raw:
                earlier = parse(prev2_raw[key])
            before = earlier.time if earlier is not None else None
            if earlier is not None and last is not None and before is not None and last > before:
                streams[key].step_s = (last - before).total_seconds()
                streams[key].progress_moved = _counts(newest.text) != _counts(earlier.text)
        for key, messages in progress.items():  # the last counter counts: search from the end
            writer = streams[key].origin.rank
            for at in range(len(messages) - 1, -1, -1):
                counter = "/" in messages[at] and _own_counter(messages[at], writer)
                if counter and OTHER_PHASE_BAR.search(messages[at], 0, counter.start()):
                    continue  # a validation's count: the loop's total is training's
                if counter:
                    if not _counts_up_to(counter, messages[max(0, at - 8) : at], writer):
                        break  # 'Batch 2/8' then 2/9: an epoch and a batch, not n of a total
                    streams[key].progress_total = count_number(counter.group("total"))
                    streams[key].progress_done = count_number(counter.group("n"))
                    break
            if writer is None:
                streams[key].planned = _planned(messages, progress_at[key])


BAR_COUNT = re.compile(r"\d{1,3}%\|[^|]{0,80}\|\s{0,4}(?P<n>\d{1,12})/(?P<total>\d{1,12})\b")
"""A tqdm-like bar's count: '  7%|▋         | 15/200 [00:02<00:30, 6.08it/s]'."""


DATA_PREP_BAR = re.compile(
    r"(?i)tokeniz|preprocess|filter|caching|packing|prepar|convert|extract|examples/s\b|ba/s\b"
)
"""A bar of the data's preparation (datasets' map over examples, a tokenizer's pass)."""


def _planned(messages: list[str], lines: list[int]) -> Planned | None:
    """Of a writer's progress lines, the counter with the largest total, a training one (not
    labelled as another phase's), where it stood last: the steps the run planned and how far
    it got (an evaluation's small bar may come after the loop's)."""
    best: Planned | None = None
    for message, line in zip(messages, lines, strict=True):
        counter = BAR_COUNT.search(message) or ("/" in message and _own_counter(message, None))
        if not counter or OTHER_PHASE_BAR.search(message, 0, counter.start()):
            continue
        if DATA_PREP_BAR.search(message):
            continue  # the data's preparation counts its examples, not the training's steps
        done = count_number(counter.group("n"))
        total = count_number(counter.group("total"))
        if done is not None and total and (best is None or total >= best.total):
            best = Planned(done, total, line, message[-PLANNED_CHARS:])
    return best


STEP_COUNT = re.compile(
    # (opened by the characters its alternatives start with: `re` then skips other places in C)
    r"(?i)(?=[sibekr\d])(?:\b(?:step|iter(?:ation)?|batch|epoch|it|kimg|round)\b\D{0,3}?"
    r"(?P<after>\d{1,12})|" + ANY_COUNTER.pattern + ")"
)


def _counts(text: str) -> list[str]:
    """The numbers a progress line counts its work by: after a word for steps, or before a
    total."""
    return [m["after"] or m["n"] for m in STEP_COUNT.finditer(text)]


def _logged_trace(parsed: ParsedLine) -> list[tuple[int, ParsedLine]]:
    """A JSON record's own traceback (logger.exception's exc_info) as the lines above its
    exception line, on the record's line: its context, as a printed traceback's would be."""
    return [
        (0, ParsedLine(t, parsed.origin, parsed.time, parsed.level, parsed.prefix))
        for t in parsed.trace
    ]


def _epoch_state(message: str) -> tuple[int, int | None, bool] | None:
    """For a progress line that counts epochs (its last carriage-return segment: a console's
    bar redrawn in place): its epoch, the epoch's total when the line says it, and whether
    every other counter of the line stands at its total; None for a line that counts none."""
    segment = message.rsplit("\r", 1)[-1]
    # the regex only where the word is (no other letter folds into those of 'epoch'): a
    # case-blind search at every position of every progress line of 10,000 tails
    epoch = EPOCH_COUNTER.search(segment) if "epoch" in segment.lower() else None
    if epoch is None:
        if segment.startswith("Train") and (both := EPOCH_THEN_ITER.match(segment)):
            return int(both["n"]), int(both["total"]), both["i"] == both["itotal"]
        return None
    rest = segment[: epoch.start()] + " " + segment[epoch.end() :]
    done = all(m["n"] == m["total"] for m in ANY_COUNTER.finditer(rest))
    total = int(epoch["total"]) if epoch["total"] else None
    return int(epoch["n"]), total, done


def epoch_total(state: tuple[int, int | None, bool], max_epochs: set[int]) -> int | None:
    """The epochs a writer's last epoch line counts to: its own total, else the one number
    of epochs the run's start-up announced."""
    total = state[1]
    if total is None and len(max_epochs) == 1:
        total = next(iter(max_epochs))
    return total


def epochs_after(
    state: tuple[int, int | None, bool], max_epochs: set[int], first_epoch: int | None = None
) -> int | None:
    """Whole epochs the run's plan holds after the one a writer's last epoch line stands in:
    by the line's own total, else by the one number of epochs the run's start-up announced;
    counted from 0 when the writer's first epoch line named epoch 0 ('epochs 3' ends at 'epoch
    2', and so does '2/3'). None: no total known. Negative: past it."""
    n = state[0]
    total = epoch_total(state, max_epochs)
    if total is None:
        return None
    # a writer that named epoch 0 counts from 0: of 4 epochs the last is '3/4' (coqui's
    # Trainer prints ' > EPOCH: 0/4' ... ' > EPOCH: 3/4'); one whose total is its last epoch's
    # number ('Epoch 2/2' of AllenNLP's three: 'Epoch %d/%d', epoch, num_epochs - 1) stands
    # at it, which a count of epochs from 0 never reaches
    if n == total:
        return 0
    return total - n - (1 if first_epoch == 0 else 0)


def last_epoch_done(
    state: tuple[int, int | None, bool], max_epochs: set[int], first_epoch: int | None = None
) -> bool:
    """The writer's last epoch line stands at the run's last epoch (epochs_after), its steps
    done."""
    return state[2] and epochs_after(state, max_epochs, first_epoch) == 0


COUNTER_RANK = re.compile(r"[Rr]ank[ =:]?(?P<rank>\d{1,5})[\]:,|]?\s{0,3}$")
"""A rank named right before a counter ('rank 0 step 5/8'): whose counter it is."""


def _counts_up_to(counter: re.Match[str], before: list[str], writer: int | None) -> bool:
    """Whether a counter 'n/total' counts n up to a total: False when the writer's progress
    lines just before it hold the same n over two or more other, smaller totals (WeNet's
    'Batch 2/4', 'Batch 2/6', 'Batch 2/8': its epoch, then the batch it is at). A total stays
    while n moves; a bar's own total changes only with a new bar, whose n starts again (a
    validation bar between training lines is one other total)."""
    n, total = counter.group("n"), int(counter.group("total"))
    earlier = {
        int(c.group("total"))
        for message in before
        if "/" in message and (c := _own_counter(message, writer)) and c.group("n") == n
    }
    return any(t > total for t in earlier) or len({t for t in earlier if t < total}) < 2


def _own_counter(message: str, writer: int | None) -> re.Match[str] | None:
    """The line's first progress counter of its own writer: where ranks' prints interleave
    inside one console line ('rank 1: epoch done, waiting for the othersrank 0 step 5/8'), a
    counter another rank is named right before is that rank's."""
    for m in PROGRESS_COUNTER.finditer(message):
        named = COUNTER_RANK.search(message, max(0, m.start() - 16), m.start())
        if writer is None or named is None or rank_number(named.group("rank")) == writer:
            return m
    return None


def progress_line(message: str) -> bool:
    """Whether PROGRESS_LINE.search(message) finds a match, at half its cost on the benchmark's
    tails: on ASCII text, where case folding only maps letters, its word alternative can only
    match where the lower-cased text holds one of its words, and only there is it tried (a
    long warning that says 'step' once was searched at each of its hundreds of letters s, e,
    i, l and b). Other text is searched as it is: (?i) also folds letters such as U+017F (long
    s) and U+0130 into 's' and 'i'."""
    if not message.isascii():
        return PROGRESS_LINE.search(message) is not None and not _slurm_notice(message)
    if ("%|" in message or "it/s" in message or "s/it" in message) and PROGRESS_BAR.search(message):
        return True
    lower = message.lower()
    for word in PROGRESS_WORDS:
        at = lower.find(word)
        while at >= 0:
            if PROGRESS_WORD_AT.match(lower, at):
                return not _slurm_notice(message)  # tested only where a word matched
            at = lower.find(word, at + 1)
    return False


def _slurm_notice(message: str) -> bool:
    return "*** " in message and SLURM_STEP_NOTICE.search(message) is not None


def _follow_traceback(summary: StreamSummary, message: str, line_no: int) -> None:
    """Track whether the writer is inside a stack trace that no line after it has ended: a
    Python traceback (its exception line ends it) or a C++ backtrace of frames (any other line
    ends it). A frame opens one too: pastes often start below the header. A prefix with
    nothing after it ('[rank0]: ') changes nothing."""
    if not summary.open_traceback_line and not (
        message[:1] in TRACE_OPENERS or message[:1].isspace()
    ):
        return  # nothing open, and no line that opens one (the cheap test for most lines)
    if not message or message.isspace():
        return
    if message.startswith(TRACEBACK_HEADER) or (
        WHOLE_FRAME.match(message) and not summary.open_traceback_line
    ):
        _open_trace(summary, line_no, message, native=False)
    elif (
        message[:1].isspace()
        and not summary.open_traceback_line
        and message.lstrip().startswith(TRACEBACK_HEADER)
    ):
        _open_trace(summary, line_no, message, native=False)
        summary.open_trace_indent = len(message) - len(message.lstrip())
    elif message.startswith(NATIVE_HEADER) or (
        NATIVE_FRAME.match(message) and not summary.open_traceback_line
    ):
        _open_trace(summary, line_no, message, native=True)
    elif summary.open_traceback_line:
        indent = summary.open_trace_indent
        inside: bool
        if summary.open_trace_native:
            inside = bool(NATIVE_FRAME.match(message) or NATIVE_WRAPPED.match(message))
        elif indent:  # its frames indented further, its exception line no further
            inside = message[: indent + 1].isspace()
        else:
            inside = TRACEBACK_BODY.match(message) is not None
        if not inside or (summary.open_trace_native and OUTERMOST_FRAME.search(message)):
            # ... or the bottom of the native stack, the process's entry point ('frame #47:
            # _start + 0x21'): the backtrace is whole, whatever follows
            summary.closed_traceback_line = line_no
            summary.open_traceback_line = summary.open_traceback_at = 0
            summary.open_traceback_text = ""
            summary.open_traceback_tail = ()
            summary.open_trace_indent = 0
            return
        summary.open_traceback_tail = (
            *summary.open_traceback_tail[-(TRACE_TAIL - 1) :],
            message.strip()[:200],
        )
        frame = WHOLE_FRAME.match(message[indent:]) if indent else WHOLE_FRAME.match(message)
        if not summary.open_trace_native and frame:
            summary.open_traceback_at, summary.open_traceback_text = line_no, message.strip()[:300]


OUTERMOST_FRAME = re.compile(r"^frame #\d{1,4}: _start \+ 0x[0-9a-f]+ \(")
"""The last frame c10's backtrace prints: the executable's entry point, below main."""
TRACE_OPENERS = frozenset((TRACEBACK_HEADER[0], NATIVE_HEADER[0], "f"))
"""First characters of the lines that open a trace, but for WHOLE_FRAME's blank: the
headers, and NATIVE_FRAME's 'frame #'."""
AFTER_PROGRESS_LINES = 4
"""Lines looked at of what a writer said after its last progress line (see StreamSummary)."""
DATA_ENDED = re.compile(
    r"(?i)\b(?:data(?:set)?|shard|part|split|input|iterator|loader|stream|samples|batches)\b"
    r"[^\n]{0,30}?\b(?:exhausted|ran out|(?:is |are )?empty|depleted|consumed)\b"
    r"|\bran out of (?:data|batches|samples|input|tokens)\b"
    r"|\bno more (?:data|batches|samples|input)\b"
    r"|\bend of (?:the )?(?:data|dataset|shard|data ?loader|iterator)\b"
    # the transformers Trainer, when its iterator ends before max_steps (census hf-no-sample)
    r"|\bnot (?:to be )?a single sample in your epoch_iterator\b"
)
"""A writer's words that its own data ran out."""
DATA_ENDED_WORDS = (
    "exhausted",
    "ran out",
    "empty",
    "depleted",
    "consumed",
    "no more",
    "end of",
    "single sample",
)
"""A lower-cased piece of every alternative of DATA_ENDED: ASCII text holding none of them
cannot match it. Only lines holding one are
kept after a writer's last step: 10,000 rank files kept 44,195 of them (5.4 MB of text) for
the four lines each."""


def _may_say_data_ended(text: str) -> bool:
    if not text.isascii():
        return True  # (?i) folds some letters into ASCII ones: left to the regex
    lower = text.lower()
    for word in DATA_ENDED_WORDS:  # noqa: SIM110 (a generator in any() cost twice this)
        if word in lower:
            return True
    return False


TRACE_TAIL = 10
"""Lines of an open traceback kept: its last frames with their code (three to five), enough to
see whose code waited in the last of them (a launcher's own frame above subprocess's wait)."""


def _open_trace(summary: StreamSummary, line_no: int, message: str, native: bool) -> None:
    summary.open_trace_indent = 0
    # (the header Python prints over it: 'Exception ignored in: ...', '--- Logging error ---')
    above = summary.prev_text.lstrip()
    summary.open_trace_carried_on = not native and carried_on([above])
    summary.ignored_traces += summary.open_trace_carried_on and above.startswith(UNRAISABLE)
    summary.open_traceback_line = summary.open_traceback_at = line_no
    summary.open_traceback_text = message.strip()[:300]
    summary.open_traceback_tail = (message.strip()[:200],)
    summary.open_trace_native = native


def _count(kept: dict[int, int], pid: int, cap: int, capped: set[int]) -> None:
    n = kept[pid] = kept.get(pid, 0) + 1
    if n >= cap:
        capped.add(pid)


OWN_OUTPUT = re.compile(
    rb'^\s*\{\s*"schema": "ddpdoctor\.|ddpdoctor verdict|"schema": "ddpdoctor\.'
)


def is_own_output(head: bytes) -> bool:
    """Reports ddpdoctor wrote (JSON, text) quote log lines; reading them again as logs would
    count every error twice, e.g. when diagnosing a `ddpdoctor run` folder."""
    head = head[:600]
    # every form names the schema or the verdict: the regex, slow to fail, only where it might
    return b"ddpdoctor" in head and OWN_OUTPUT.search(head) is not None


def _unanchored(regex: str) -> str:
    """Lines carry prefixes the prefilter cannot strip, so `^` (meant for the message after the
    prefix) is dropped for the prefilter; Python `re` applies it to the stripped message. And
    they may end in blanks that cleaning strips from the message (a terminal's copy pads each
    line to its width), so each `$` allows them before the line's end."""
    regex = regex[1:] if regex.startswith("^") else regex
    return _padded_ends(regex) if "$" in regex else regex


def _padded_ends(regex: str) -> str:
    r"""Every `$` of the regex outside a character class and not escaped, as the end of a line
    after blanks, or the end of a JSON string (a record's message, which may end in an escaped
    newline: docker's json-file driver keeps each line's). Not the blanks where what comes
    before it already takes them (`\s*`, `.*`: a second run of blanks after it would make a
    long run of them quadratic for a backtracking engine)."""
    out: list[str] = []
    escaped = False
    class_from = -1  # where the character class the walk is in began
    for i, char in enumerate(regex):
        if escaped:
            escaped = False
        elif char == "\\":
            escaped = True
        elif class_from >= 0:
            opening = regex[class_from + 1 : i] in ("", "^")  # a ']' there is a member
            class_from = class_from if char != "]" or opening else -1
        elif char == "[":
            class_from = i
        elif char == "$":
            blanks = "" if regex[:i].endswith(TAKES_BLANKS) else r"[ \t\r]*"
            out.append(blanks + r'(?:$|(?:\\[nrt])*")')
            continue
        out.append(char)
    return "".join(out)


TAKES_BLANKS = (r"\s*", r"\s+", ".*", ".+", r"\s*?", r"\s+?")
"""Ends of a regex before its `$` that take a run of blanks already."""


@lru_cache(maxsize=8)
def _parser(year: int, labels: _TaskLabels | None = None) -> _Parse:
    labels = labels or _TaskLabels()

    def parse(raw: str) -> ParsedLine:
        parsed = parse_line(raw, year)
        return parsed if parsed.task is None and not labels.nodes else labels.own(parsed)

    return parse


STREAM_LINES = tuple(
    f.name for f in dataclasses.fields(StreamSummary) if f.name.endswith(("_line", "_at"))
)
"""The line numbers a writer's summary holds."""


def _renumber(result: SourceScan, renumbered: Callable[[int], int]) -> None:
    """The file's own line numbers for a source whose hard-wrapped lines were joined
    (ingest/unwrap) or that is a section of a paste (ingest/sections): evidence quotes the
    line a person finds in the file."""
    done: set[int] = set()

    def fix(record: Record) -> None:
        if id(record) not in done:
            done.add(id(record))
            record.line = renumbered(record.line)

    for hit in result.hits:
        fix(hit.record)
        for earlier in hit.context:
            fix(earlier)
    for fact in result.facts:
        fix(fact.record)
    for summary in result.streams.values():
        for name in STREAM_LINES:
            value = getattr(summary, name)
            if value > 0:
                setattr(summary, name, renumbered(value))
        summary.recent = tuple((renumbered(line), raw) for line, raw in summary.recent)
        summary.bare = tuple((renumbered(line), raw) for line, raw in summary.bare)


def _rename_hosts(result: SourceScan, renames: dict[str, str]) -> None:
    """Nodes named after their srun task given the names the file gave them later (a node's
    NCCL line, srun's error line on the task): one node has one name whichever line said it."""
    if not renames:
        return
    origins = [s.origin for s in result.streams.values()] + [f.record.origin for f in result.facts]
    for hit in result.hits:
        origins.append(hit.record.origin)
        origins.extend(r.origin for r in hit.context)
    for origin in origins:
        if origin.host in renames:
            origin.host = renames[origin.host]


def _tail(prev_chunk: bytes, last_chunk: bytes, sample_bytes: int) -> bytes:
    """The end of the input to sample its tail from: the last chunk, with the end of the one
    before it when the last is shorter than the sample, starting at a line (chunks end at a
    newline). The sample is then the input's last lines whatever its size modulo the chunk
    size, and a range of stdin (ingest/spool) samples what one reader would."""
    need = sample_bytes - len(last_chunk)
    if need <= 0 or not prev_chunk:
        return last_chunk
    if need >= len(prev_chunk):
        return prev_chunk + last_chunk
    before = prev_chunk[-need - 1 :]
    return before[before.find(b"\n") + 1 :] + last_chunk


def _record(parsed: ParsedLine, display: str, line_no: int, file_origin: Origin) -> Record:
    return Record(
        source=display,
        line=line_no,
        text=parsed.text,
        origin=parsed.origin.merged_with(file_origin),  # (a new Origin: the record's own)
        time=parsed.time,
        level=parsed.level,
        stream_key=f"{display}|{parsed.prefix}",
    )


def _captures(m: re.Match[str]) -> dict[str, str]:
    """What a match captured, made safe where hits and facts are born: no capture longer than a
    line's text (a `.+` on an 8 MB line), none that is a number no real log prints (a rank or
    timeout of thousands of digits breaks int(), a huge one overflows time arithmetic). Short
    captures, nearly all of them, pass without a look."""
    if not m.re.groupindex:
        return {}
    out: dict[str, str] = {}
    for name, value in m.groupdict().items():
        if value is None:
            continue
        if len(value) > MAX_NUMBER_DIGITS:
            value = value[:MAX_TEXT]
            if not safe_capture(value):
                continue
        out[name] = value
    return out


IPYTHON_SOURCE = re.compile(
    rb"(?:" + IPYTHON_ARROW.encode() + rb"| {2,12}\d{1,6} )[^\n]{0,4096}?\S"
)
"""A source line IPython's traceback quotes around a frame, behind its gutter: the line number,
right-aligned, or '---> ' before the frame's own line."""
IPYTHON_FRAME = re.compile(rb"^" + IPYTHON_FRAME_HEAD.encode(), re.M)
"""IPython's header of a frame: 'File /path/mod.py:245, in func(args)', 'Cell In[7], line 3'."""
IPYTHON_WINDOW = 16
"""Lines above a gutter line within which its frame's header stands (IPython quotes a few lines
on each side of the frame's line)."""


def _ipython_source_line(chunk: bytes, start: int, end: int) -> bool:
    """Whether the raw line is a line of code IPython's traceback quotes (its gutter, and a
    frame's header within the lines above): a library's source quoted there ('if "Cannot
    re-initialize CUDA in forked subprocess" in e.args[0]:') is no message of the job's."""
    first = chunk[start : start + 1]
    if first not in (b" ", b"-") or IPYTHON_SOURCE.match(chunk, start, end) is None:
        return False
    return (
        IPYTHON_FRAME.search(chunk, _lines_above(chunk, start, IPYTHON_WINDOW), start) is not None
    )


def _head_above(chunk: bytes, start: int, head: str, lines: int) -> bool:
    """Whether one of the `lines` raw lines above `start` holds `head` (see
    Signature.after_head)."""
    return chunk.find(head.encode("utf-8"), _lines_above(chunk, start, lines), start) >= 0


def _lines_above(chunk: bytes, start: int, lines: int) -> int:
    """Where the `lines` raw lines above `start` begin (at the newline before them)."""
    floor = start - 1
    for _ in range(lines):
        if floor <= 0:
            break
        floor = chunk.rfind(b"\n", 0, floor)
        if floor < 0:
            floor = 0
            break
    return max(0, floor)


def _raw_lines_before(chunk: bytes, start: int, count: int) -> list[str]:
    out: list[str] = []
    end = start - 1
    while end > 0 and len(out) < count:
        s = chunk.rfind(b"\n", 0, end) + 1
        out.append(chunk[s : min(end, s + MAX_TEXT)].decode("utf-8", errors="replace"))
        end = s - 1
    out.reverse()
    return out
