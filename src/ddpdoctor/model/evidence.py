"""What every rank did, as plain data: the facts that inferred causes (hypotheses) are scored
from when no line names the cause. Built in analysis from findings, job facts and a live run's
stacks; read by rules/hypotheses. No behaviour beyond small derived properties."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime

from ddpdoctor.model.findings import Evidence
from ddpdoctor.model.flight import FlightAnalysis
from ddpdoctor.model.records import Record

COLLECTIVE_FUNCTIONS = frozenset(
    [
        "all_reduce",
        "barrier",
        "broadcast",
        "all_gather",
        "all_gather_into_tensor",
        "all_gather_object",
        "reduce_scatter",
        "reduce_scatter_tensor",
        "reduce",
        "gather",
        "scatter",
        "all_to_all",
        "all_to_all_single",
        "send",
        "recv",
        "monitored_barrier",
        "broadcast_object_list",
        "gather_object",
        "scatter_object_list",
        "batch_isend_irecv",
        "_allgather_base",
        "_reduce_scatter_base",
        "all_reduce_coalesced",
    ]
)
"""torch.distributed's collective functions, as they appear in stacks and tracebacks."""


STALL_FACTOR = 20
"""A silence this many times the job's own pace of progress lines is a stall, not a slow step."""
STALL_MIN_S = 30.0
"""...and never less than this many seconds."""
PROGRESSING_FACTOR = 3
"""A last progress line within this many of the job's own intervals before a moment: the job
was still making progress then."""
PROGRESSING_MIN_S = 5.0
"""...or within this many seconds (a step, an evaluation, a save between two progress lines):
far less than anyone waits before stopping a job they think stuck."""


@dataclass(frozen=True, slots=True)
class Activity:
    """Where one rank was when `ddpdoctor run` caught the job stalled, from its stack."""

    category: str
    """collective | dataloader | lock | sleep | compute | idle | exited | unknown"""
    op: str = ""
    site: str = ""
    """file:line of the user's frame that led there."""
    source: str = ""
    """That line's code, when it could be read."""

    @property
    def in_collective(self) -> bool:
        return self.category == "collective"


PROMPTS = ("[y/N]", "[Y/n]", "[y/n]", "(y/n)", "[yes/no]", "Enter your choice")
"""How a program asks its terminal a question (input()'s "Continue? [y/N] ", wandb's "Enter
your choice:"): a distributed worker's stdin is no terminal, nobody answers."""

EVALUATION, TRAINING = "evaluation", "training"
"""The phases of a training program a waiting rank's traceback can name (WaitSite.phase)."""


@dataclass(frozen=True, slots=True)
class WaitSite:
    """Where a waiting rank waited: the collective its timeout names (watchdog fields) or the
    one its traceback was in, and the user's line that called it."""

    op: str | None = None
    site: str | None = None
    seq: int | None = None
    numel: int | None = None
    phase: str | None = None
    """EVALUATION or TRAINING: the loop its traceback was in, when a frame names one."""
    group: int | None = None
    """The index of the process group the rank was creating (new_group) when it waited."""
    caller: str | None = None
    """The user's line that called `site`'s function (the frame above it): the same helper
    reached from two places is two different calls."""

    @property
    def key(self) -> tuple[str | None, str | None, int | None]:
        return (self.op.lower() if self.op else None, self.site, self.seq)


@dataclass(slots=True)
class RankView:
    """One rank as the evidence shows it."""

    rank: int
    present: bool = False
    """It left lines of its own (or the launcher accounted for it)."""
    host: str | None = None
    failed: bool = False
    """A primary error (not an echo of another rank's failure) was seen on this rank."""
    aborted_at_exit: bool = False
    """Its only failure was the abort of its own exit (analysis.events.aborted_at_exit): it
    had left its Python code without an error (not `failed` for that alone)."""
    echoes: set[str] = field(default_factory=set)
    """Echo kinds seen on this rank (rules.base.Echo values)."""
    warned: bool = False
    """A warning finding or an error-level log line without a rule."""
    exit_code: int | None = None
    exit_signal: str | None = None
    announced_stop: bool = False
    completed: bool = False
    """Its own lines announced the end of training: it finished, it did not leave early."""
    named_absent: bool = False
    """A peer's log names this rank as never having arrived (a monitored barrier)."""
    progress_total: int | None = None
    """The M of its last "step n/M" counter."""
    last_text: str = ""
    busy_phase: str | None = None
    """Its last words announce a long phase of its own (saving, evaluating, tokenising)."""
    data_ended: str | None = None
    """Its last words (or the line before them) say its data ran out ('data part
    exhausted', 'no more batches'): a rank that then left had fewer batches."""
    ended_on_step: bool = False
    """Each of its writers' output ends on a training-progress line: nothing after its last
    step, not even a word of leaving (a process killed from outside says nothing)."""
    wait_sites: list[WaitSite] = field(default_factory=list)
    wait_kinds: set[str] = field(default_factory=set)
    """The kinds of the rules whose waits it printed (a collective's timeout, the store's
    wait for its clients): where it waited."""
    waited_on_live_peers: bool = False
    """It timed out on a transport that reports a peer process that exits as a lost
    connection at once (rules.base.Rule.peers_alive): its peers were still running."""
    spoke_after_waits: bool = False
    """Its last line in a console comes after another rank's timeout or lost peer there: it
    was still there when they gave up on it, so it did not leave first."""
    waited_after_end: bool = False
    """It waited (or lost its peer) in a collective its own code called after training had
    announced its end: still distributed work (an evaluation, a save, a barrier), not
    teardown."""
    activity: Activity | None = None
    """Where a stop signal's handler found it (its traceback's interrupted line), read as a
    stack: a lock, a sleep, or work."""
    evidence: list[Evidence] = field(default_factory=list)
    """Lines that show what this rank did last (quoted when it is blamed)."""
    sources: set[str] = field(default_factory=set)
    """The sources (files, stdin) holding lines this rank wrote."""
    exit_source: str | None = None
    """The source where a launcher's summary reported its exit (its node's console)."""

    @property
    def waiting(self) -> bool:
        """It timed out in a collective or lost a peer: alive, and left waiting."""
        return bool(self.echoes & {"waiting", "lost-peer"})

    interrupted: bool = False
    """A stop signal's handler ran on top of what it was doing (its traceback shows the
    handler): it was alive and outside any collective when the stop came."""
    interrupted_at: str | None = None
    """The user's line the handler interrupted (file:line), when the traceback shows one."""

    @property
    def terminated(self) -> bool:
        """The launcher had to SIGTERM it: it was alive (and busy) when the others failed."""
        return self.exit_signal == "SIGTERM" or self.interrupted

    @property
    def left_at_exit(self) -> bool:
        """Its only failure is the abort of its own exit, with no error, wait or lost peer of
        its own and no end of training announced: it left its Python code on its own."""
        return self.aborted_at_exit and not (self.failed or self.waiting or self.completed)

    @property
    def lost_peer_only(self) -> bool:
        """It lost a peer without timing out or failing itself: it reached the collective
        after the peer had gone (or given up waiting)."""
        return "lost-peer" in self.echoes and "waiting" not in self.echoes and not self.failed

    @property
    def quiet(self) -> bool:
        """It printed no error, no warning and no echo: it simply stopped talking."""
        own = self.echoes - {"stopped", "launcher"}  # what others did to it, not its words
        return self.present and not self.failed and not own and not self.warned


@dataclass(slots=True)
class CutTrace:
    """A writer whose output ends inside a stack trace that nothing after it ended."""

    where: Evidence
    """Its last whole Python frame (else its first line), with the writer's rank if known."""
    native: bool = False
    """A C++ backtrace (c10::Error's frames) rather than a Python traceback."""
    tail: tuple[str, ...] = ()
    """Its last few lines (frames and their code): what the process was doing."""


@dataclass(slots=True)
class Stall:
    """`ddpdoctor run` caught the job making no progress and took every rank's stack."""

    activities: dict[int, Activity]
    time: datetime | None
    source: str
    line: int
    summary: str
    groups: list[tuple[str, str]] = field(default_factory=list)
    """(who, where) for the report: ranks grouped by where they were."""
    killed: bool = False
    """`ddpdoctor run --on-hang kill` ended the job after it."""
    stopped: bool = False
    """The job was stopped after it (that kill, or a signal `run` forwarded)."""


@dataclass(frozen=True)
class Restart:
    """Where an agent reported the failed workers of an attempt it then restarted."""

    source: str
    line: int
    time: datetime

    def precedes(self, record: Record) -> bool | None:
        """Whether the line was printed before (or as) the agent's report: by line in the
        same console (the report is the attempt's last word), else by the clock; None for
        an untimed line of another file, which cannot be placed."""
        if record.source == self.source:
            return record.line <= self.line
        return None if record.time is None else record.time <= self.time


@dataclass(slots=True)
class JobEvidence:
    """The whole job, for hypotheses."""

    ranks: dict[int, RankView] = field(default_factory=dict)
    world_size: int | None = None
    single_node: bool = True
    transports: set[str] = field(default_factory=set)
    ib_requested: bool = False
    """NCCL said the job named InfiniBand/RoCE devices to use (NCCL_IB_HCA)."""
    pg_wait_ranks: set[int] = field(default_factory=set)
    """Ranks whose address a process waited for, in vain, while the default group formed."""
    local_ifaces: list[Evidence] = field(default_factory=list)
    """NCCL's lines naming a loopback, virtual or link-local interface among those it uses."""
    timeout_ms: float | None = None
    """The collective timeout that echoes report, if any."""
    startup_seq: int | None = None
    """Sequence number of a timed-out barrier-like collective among the job's first few."""
    busy_progress: tuple[float, Evidence] | None = None
    """A progress bar that kept moving (elapsed seconds, its line) while others waited."""
    logged_errors: list[Evidence] = field(default_factory=list)
    """Each writer's last error-level line (logging's ERROR, glog's E): what the program said
    went wrong, whether or not a rule knows the words."""
    unranked_raised: list[Evidence] = field(default_factory=list)
    """The first exception line of each writer no rank is known for (StreamSummary
    .first_raised): an exception a worker printed, perhaps alone, without its traceback."""
    stopped_short: Evidence | None = None
    """The last training counter of a run that announced its end, where every writer's
    counter stood at half its total or less ('15/200'): the loop ended long before its plan."""
    unranked_phase: Evidence | None = None
    """A long phase of work announced by a writer no rank can be given, after its last
    progress line and before the first wait shown in its source: work that one rank set out
    to do alone when the others began to wait."""
    unranked_phase_counted: bool = False
    """That phase counts its own parts ('regenerating track layouts (3/8)'): the writer was
    working through it, not waiting."""
    unranked_echoes: set[str] = field(default_factory=set)
    """Echo kinds seen on lines no rank could be attributed to."""
    unranked_wait_kinds: set[str] = field(default_factory=set)
    """The kinds of the waits on lines no rank could be attributed to (RankView.wait_kinds)."""
    unranked_wait_rules: set[str] = field(default_factory=set)
    """The codes of the rules those waits matched: which wait it was (the store's request for a
    key, or its wait for its clients at the rendezvous, are both of one kind)."""
    others_mid_step: frozenset[int | None] = frozenset()
    """The writers (by rank; None for a writer no rank is known for) whose own output ends on
    a training step, a few lines at most after it: where they stopped, the job was in the
    middle of training (behaviour._ended_mid_step)."""
    unranked_stop: bool = False
    """A line no rank could be attributed to announced a stop on purpose (an early stop, a
    target reached): some rank decided to leave (RankView.announced_stop)."""
    stall: Stall | None = None
    failing_exits: dict[int, int] = field(default_factory=dict)
    """Ranks whose exit code was not 0 and who were not terminated by the launcher."""
    job_exit_code: int | None = None
    ended: bool = False
    """Something marks the end of the job: an exit code, the end of training, a summary."""
    last_step: tuple[int, int] | None = None
    """(n, total) of the last progress counter, when the log stopped inside training."""
    started_training: bool = False
    source_counters: dict[str, tuple[int, int]] = field(default_factory=dict)
    """Per source, the (done, total) of the training bar its unranked writer showed last
    (a node's console where one process draws the bar): which node ran out first."""
    killed_after_stop: frozenset[int] = frozenset()
    """Ranks whose process died of SIGKILL after the launcher had sent it a closing signal
    ("Sending process 4211 closing signal SIGTERM", then "exitcode  : -9 (pid: 4211)"): the
    launcher's own escalation once its grace period ran out, not the OOM killer."""
    ended_on_full_bar: bool = False
    """A writer's output ends on a progress bar at its total that counts no epoch (tqdm's
    "Steps: 100%|##| 10/10", the whole run's bar that diffusers and the transformers Trainer
    draw): the loop it counts finished. An epoch's bar at its total ends only that epoch."""
    ended_after_full_bar: bool = False
    """Not ended on one, but the bar drawn last in the whole log is at its total, no counter
    stopped short of its total, and no writer logged an error: an evaluation's bar, then the
    results it printed. Weaker: a hang after that bar (a save, teardown) reads the same."""
    ended_on_planned_step: bool = False
    """Every writer with progress ended on a step line at the (largest) number of steps the
    run's configuration gave, or on the validation of its last configured epoch, and no writer
    logged an error."""
    unlisted_exits: set[int] = field(default_factory=set)
    """Ranks of a one-node world that left no lines and that the launcher's failure summary
    does not list, while it lists others: torchrun lists every worker that did not exit 0,
    so these had exited 0 before the failure."""
    unlisted_speakers: set[int] = field(default_factory=set)
    """Ranks with lines of their own, no end of theirs in them, that the launcher's failure
    summary leaves out while listing others: they exited 0."""
    leaked_at_shutdown: Evidence | None = None
    """multiprocessing's resource tracker found objects processes had not released at
    shutdown (JobView.leaked_at_shutdown): some process did not end cleanly."""
    exited_cleanly: bool = False
    """torch's atexit handlers logged at interpreter exit (dynamo's traced frames, the fake
    tensor cache's statistics) and no writer logged an error: a process shut down normally
    after its work, neither killed nor hung."""
    ended_on_last_epoch: bool = False
    """Every writer whose lines count epochs last stood at the last one with its other counters
    at their totals ('Epoch: 4/4 Step: 10/10', 'Epoch: 4/4 Train steps: 10 ... val_loss'; an
    epoch named without its total, 'Epoch(train) [3][12/12]', is the last when it is the one
    number of epochs the start-up announced, 'max_epochs=3'): the training loop ran to its
    end, whatever the program printed after it."""
    ended_at_epoch_total: bool = False
    """ended_on_last_epoch with no reading of how the writer counts: every writer that counts
    epochs last stood at its total itself ('epoch 3/3', 'Epoch 2/2'), its steps done (a count
    from 0 makes '1/2' the last of two for one program and the middle of three for another)."""
    epochs_left: int | None = None
    """Whole epochs the run's plan still held after the one each writer other than
    unlisted_exits' last stood in (its last epoch line's total, else the one number of epochs
    start-up announced), the fewest of them; None where no such writer counted epochs."""
    early_in_first_epoch: bool = False
    """Every writer other than unlisted_exits that carried a fractional epoch ('epoch': 0.33)
    last stood less than halfway through the run's first epoch (there was at least one)."""
    last_epoch_lines: list[tuple[str, int]] = field(default_factory=list)
    """(source, line) of each writer's last progress line, where ended_on_last_epoch: where
    in each output the training loop was seen at its end."""
    normal_seen: bool = False
    """Messages of normal operation were read (start-up, DDP notes): healthy as far as they go."""
    ignored_exceptions: int = 0
    """Tracebacks Python printed under 'Exception ignored in: ...' and went on from (a __del__,
    a finalizer at exit: sys.unraisablehook): they end no process, and say it was running."""
    world_stated: bool = False
    """A line stated the world's size (JobView.world_stated), not only the ranks seen."""
    lost_peers_on_loopback: bool = False
    """Every lost connection to a peer names a loopback address (127.0.0.1, localhost, ::1):
    the peer was a process on the same host, and a connection on the loopback does not fail
    for network reasons: the process at its other end went away."""
    worker_lines: int = 0
    """Lines read that are not a launcher's reaction to a failure (its stop of the workers,
    its summary): what the workers themselves printed, where they share its console."""
    warnings: list[str] = field(default_factory=list)
    """Titles of the warnings read (rules of severity warning, not those the job went on
    from), in rule-code order: something was recognised even where nothing failed."""
    stalled_at_startup: bool = False
    one_device_per_process: bool = False
    """Several processes of one host all name device 0 in their NCCL lines: each sees only
    its own GPU (CUDA_VISIBLE_DEVICES set per process)."""
    """The output stops right after distributed start-up: no step, no error, no exit."""
    cut_tracebacks: list[CutTrace] = field(default_factory=list)
    """Writers whose output ends inside a stack trace whose error line is not in the logs."""
    last_words: list[Evidence] = field(default_factory=list)
    """Every writer's last line (with its rank when known), in source and line order: what
    each was doing when its output ends."""
    traced_endings: set[tuple[str, int]] = field(default_factory=set)
    """(source, line) of last words that ended a traceback shown above them."""
    trained_on_after: dict[int, set[int]] = field(default_factory=dict)
    """For each rank whose output in a console stops before another rank's training progress
    there, those other ranks: they went on with training after its last line (where a console
    gives the order: one console, lines in their order)."""
    stopped_by_run: bool = False
    """`ddpdoctor run` ended the job: its kill after a hang, or a stop signal it forwarded."""
    launched_processes: int | None = None
    """How many processes a launcher said it starts (JobView.launched_processes)."""
    flight: FlightAnalysis | None = None
    """The ranks' Flight Recorder dumps read side by side, when they were given."""
    lived_on: dict[int, list[tuple[str, int, datetime]]] = field(default_factory=dict)
    """Per rank, (source, line, time) of each of its writers' last progress lines that carry a
    time: an error it printed before such a line did not end its training."""
    data_sizes: dict[str, dict[int, int]] = field(default_factory=dict)
    """Per unit ('batches', 'samples'), how much data each rank said it has."""
    resume_points: dict[str, dict[int, int]] = field(default_factory=dict)
    """Per unit ('step', 'epoch'), where each rank said it started or resumed training."""
    skipped_ranks: set[int] = field(default_factory=set)
    """Ranks that said they skip a step or a batch."""
    size_aborts: dict[int, tuple[int, int]] = field(default_factory=dict)
    """Ranks whose collective a peer's larger message aborted (gloo's size check): (bytes
    sent, bytes its own collective expected). The rank was in another collective than that
    peer."""
    filtered_ranks: set[int] = field(default_factory=set)
    """Ranks that said they dropped part of their data."""
    filtered_unranked: bool = False
    skipped_unranked: bool = False
    """A line no rank could be given said a step or a batch was skipped."""
    """A line no rank could be given said that part of the data was dropped."""
    gpu_processes: dict[int, set[int]] = field(default_factory=dict)
    """nvidia-smi's process table: the GPUs each pid holds memory on."""
    gpu_process_rows: dict[tuple[int, int], Evidence] = field(default_factory=dict)
    """The table's row of each (pid, GPU)."""
    prompts: list[Evidence] = field(default_factory=list)
    """Questions a process asked on its terminal ('Continue? [y/N]'), with their rank when
    known: nobody answers a distributed worker."""
    extension_waits: list[Evidence] = field(default_factory=list)
    """torch's 'Using ... as PyTorch extensions root...' that no build or load followed in its
    output, with the rank when known: a process waiting on the build folder's lock."""
    announcements: dict[int, list[Evidence]] = field(default_factory=dict)
    """Each global rank's announcements of joining the group, one per process that joined as
    it (Lightning's 'GLOBAL_RANK: 1, MEMBER: 2/8', detectron2's 'Rank of current process: 1.
    World size: 8', '| distributed init (rank 1)')."""
    end_marks: list[Record] = field(default_factory=list)
    """The announcements of the end of training (not of ranks that left early)."""
    last_progress_at: datetime | None = None
    """The time of the latest timed progress line of any writer."""
    step_s: float | None = None
    """The longest gap between a writer's last two timed progress lines: the job's pace."""
    launcher_reacted_at: datetime | None = None
    """When a launcher first reacted to a failure (stopped the workers, summed up), by the
    clock: a reaction long after the job's last progress came to a job already stuck."""

    def stalled_before(self, moment: datetime | None) -> bool:
        """The job had reported progress at a steady pace, then nothing for far longer than
        that pace until this moment: it was stuck before it."""
        last, pace = self.last_progress_at, self.step_s
        if moment is None or last is None or pace is None:
            return False
        return (moment - last).total_seconds() >= max(STALL_MIN_S, STALL_FACTOR * pace)

    def progressing_at(self, moment: datetime | None) -> bool:
        """The job had reported progress at a steady pace up to this moment: its last progress
        line came a few of its intervals (or seconds) before it, at most: it was not stuck."""
        last, pace = self.last_progress_at, self.step_s
        if moment is None or last is None or pace is None:
            return False
        silence = (moment - last).total_seconds()
        return 0 <= silence <= max(PROGRESSING_MIN_S, PROGRESSING_FACTOR * pace)

    restart_ended_at: datetime | None = None
    """The launcher restarted failed workers and a later attempt announced the end of training
    at this time (no failure summary after): earlier failures belong to attempts the job
    recovered from."""
    last_restart: Restart | None = None
    """The end of the last attempt the launcher restarted, when the job failed in a later one:
    what failed before it is not how the job ended (set only when the later attempt has
    failures of its own)."""
    earlier_attempt_sources: frozenset[str] = frozenset()
    """Workers' files of attempt folders older than the newest (torchrun --log-dir), under
    the same condition."""
    reached_exit: bool = False
    """A line only a process on its way out prints (torch's warning that
    destroy_process_group() was not called before program exit): it got to its exit."""
    survived: int = 0
    """Lost-peer or timeout events printed before training announced its end in the same
    output: the job went on from them."""
    completed_at: dict[str, int] = field(default_factory=dict)
    """Per source, the first line announcing the end of training (of a rank that did not
    leave early, or of no known rank): what is after it happened after training."""

    @property
    def ended_without_a_line(self) -> bool:
        """The run printed no end of its own, but its progress, its configuration or its exit
        shows that the training loop ran to its end (analysis.decision.END_READINGS)."""
        return (
            self.ended_on_full_bar
            or self.exited_cleanly
            or self.ended_after_full_bar
            or self.ended_on_planned_step
            or self.ended_on_last_epoch
        )

    @property
    def waiting(self) -> set[int]:
        return {r for r, v in self.ranks.items() if v.waiting}

    @property
    def quiet(self) -> set[int]:
        return {r for r, v in self.ranks.items() if v.quiet}

    def waited_after_end(self, ranks: set[int]) -> bool:
        """Every one of these ranks waited (or lost its peer) in a collective its own code
        called after training announced its end (RankView.waited_after_end); true of none."""
        return all(self.ranks[r].waited_after_end for r in ranks)

    @property
    def missing(self) -> set[int]:
        return {r for r, v in self.ranks.items() if not v.present}

    @property
    def echoes(self) -> set[str]:
        seen = set(self.unranked_echoes)
        for view in self.ranks.values():
            seen |= view.echoes
        return seen

    @property
    def timed_out(self) -> bool:
        return "waiting" in self.echoes

    def lost_its_peer_only(self, rank: int) -> bool:
        """The rank's only wait was finding a peer gone (no timeout of its own) while another
        rank timed out waiting: it came to the collective after the others had given up on
        it (busy until then, or blocked)."""
        echoes = self.ranks[rank].echoes
        return (
            "lost-peer" in echoes
            and "waiting" not in echoes
            and any("waiting" in self.ranks[r].echoes for r in self.waiting if r != rank)
        )

    @property
    def peers_proven_alive(self) -> bool:
        """Every waiting rank timed out on a transport that would have reported a peer that
        exits as a lost connection, and none did: the ranks they waited for were running."""
        waiting = self.waiting
        return (
            bool(waiting)
            and "lost-peer" not in self.echoes
            and all(self.ranks[r].waited_on_live_peers for r in waiting)
        )
