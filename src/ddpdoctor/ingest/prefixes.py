"""Line prefixes: recognise and strip what launchers and loggers put in front of a message
(torchrun, Slurm, pdsh/DeepSpeed, glog, NCCL, Python logging, Kubernetes timestamps, docker
compose) and keep what they say about the writer. Pure functions over one line; no I/O."""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from functools import lru_cache

from ddpdoctor.ingest.bounds import MAX_NUMBER_DIGITS, pid_number, plausible_time, rank_number
from ddpdoctor.ingest.filenames import origin_from_path
from ddpdoctor.ingest.json_lines import JsonRecord, read_json_record
from ddpdoctor.model.records import Origin

# Colours and cursor moves (CSI), then whole OSC/DCS strings (window title, hyperlinks) up to
# their terminator, else the two-byte escape alone: an OSC cut at ESC ] left its payload as text.
ANSI = re.compile(
    r"\x1b\[[0-9;?]*[ -/]*[@-~]|\x1b\][^\x07\x1b]*+(?:\x07|\x1b\\)"
    r"|\x1b[PX^_][^\x1b]*+\x1b\\|\x1b[@-_]"
)

# Kubernetes `kubectl logs --timestamps` / fluentd: RFC 3339 at the start of the line.
# Exactly one separator is consumed: the indentation of a traceback frame after it is content.
# A tab instead of the space: CloudWatch and other collectors' exports.
RFC3339 = re.compile(r"(?P<ts>\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(?:\.\d+)?(?:Z|[+-]\d\d:?\d\d))[ \t]")
# Python logging asctime and most other loggers: optional brackets, optional millis.
# Hydra's job logging glues its fields: "[2026-12-03 05:57:26,366][__main__][INFO] - msg".
# lm-evaluation-harness's datefmt "%Y-%m-%d:%H:%M:%S" puts a colon between date and time.
ISO_TIME = re.compile(
    r"\[?(?P<ts>\d{4}-\d\d-\d\d[ T:]\d\d:\d\d:\d\d(?:[,.]\d{1,9})?)(?:Z|[+-]\d\d:?\d\d)?"
    r"(?:\](?=\[[\w.-]{1,80}\]\[[A-Z]{3,8}\] - |\[(?:[Rr]ank|RANK|[Ww]orker) ?\d)"
    r"|\]?(?: ?[:|-])?[ \t])"
)
# `grep -r` (or -rn, -C) over a folder of logs: each line after the path of its file (and its
# line number): "logs/attempt_0/3/stderr.log:12:RuntimeError: ...", "slurm-88.out:..." (the
# writer is told by the path as by a file's name). Only a log's names: not Python's own
# "train.py:42: UserWarning" nor a host's "node-1: ".
GREP_PATH = re.compile(
    r"(?P<path>(?:[\w.-]{1,100}/){0,12}(?:[\w.-]{0,100}\.(?:log|txt|out|err)|std(?:out|err)))"
    r"(?::\d{1,9}[:-]|:)(?=\S)"
)


@lru_cache(maxsize=256)
def _path_origin(path: str) -> Origin:
    return origin_from_path(path)


# syslog and `journalctl` (and moreutils' `ts`): "Dec  3 16:45:33 " (no year), then, from the
# journal, the host and the process that wrote: "node7 python3[4242]: ". That pid is the
# service's (a launcher's, whose workers share its stdout), not the writer's: only the host
# is kept.
SYSLOG_TIME = re.compile(
    r"(?P<mon>Jan|Feb|Mar|Apr|May|Jun|Jul|Aug|Sep|Oct|Nov|Dec) {1,2}(?P<d>\d{1,2}) "
    r"(?P<hms>\d\d:\d\d:\d\d)(?:\.\d{1,6})? "
)
# ColBERT's print_message ('[%b %d, %H:%M:%S] ', colbert/utils/utils.py) and its Run().print,
# which puts the process's rank after it: '[Dec 07, 05:47:20] [1] \t\t #> Saving ...'
# (colbert/infra/run.py: print_message(f"[{self.rank}]", "\t\t", *args))
COLBERT_HEAD = re.compile(
    r"\[(?P<mon>Jan|Feb|Mar|Apr|May|Jun|Jul|Aug|Sep|Oct|Nov|Dec) (?P<d>\d\d), "
    r"(?P<hms>\d\d:\d\d:\d\d)\] (?:\[(?P<rank>\d{1,5})\] \s{0,8})?"
)
SYSLOG_SOURCE = re.compile(r"(?P<host>[\w.-]{1,63}) [\w./@:-]{1,80}\[\d{1,9}\]: ")
MONTHS = ("Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec")
# ... and the logger and level fields that follow it there: "[__main__][INFO] - ".
HYDRA_FIELDS = re.compile(r"\[[\w.-]{1,80}\]\[(?P<level>[A-Z]{3,8})\] - ")
# The transformers examples' logging format (datefmt "%m/%d/%Y %H:%M:%S"), copied by many
# training scripts: "12/02/2026 04:17:54 - WARNING - name - message".
US_TIME = re.compile(
    r"(?P<mo>\d\d)/(?P<d>\d\d)/(?P<y>\d{4}) (?P<hms>\d\d:\d\d:\d\d)(?:[,.]\d{1,6})?(?: ?[:|-])? "
)
# rich's RichHandler (rich.logging): "[12/03/26 06:30:02] INFO     message      train.py:42",
# its time column left blank when the time repeats, both columns blank under a record (a
# traceback's box, the exception line), and the caller's file:line right-aligned at the end.
RICH_LOG_HEAD = re.compile(
    r"\[(?P<mo>\d\d)/(?P<d>\d\d)/(?P<y>\d\d) (?P<hms>\d\d:\d\d:\d\d)\] "
    r"(?P<level>DEBUG|INFO|WARNING|ERROR|CRITICAL) +"
)
RICH_LOG_LEVEL = re.compile(r" {20}(?P<level>DEBUG|INFO|WARNING|ERROR|CRITICAL) +")
RICH_LOG_BODY = re.compile(
    r" {29}(?=[╭│╰]|[A-Za-z_][\w.]{0,200}(?:Error|Exception|Interrupt|Exit|Warning)\b)"
)
RICH_CALLER = re.compile(r"[\w.-]{1,80}\.py:\d{1,6}")
# torchrun: `[rank3]:`, `[default0]:`, custom role `[trainer1]:`; TORCHELASTIC prefixes.
PARLAI_RANK = re.compile(r"rank: {1,3}(?P<rank>\d{1,5}) \| ")
"""ParlAI's distributed workers put their rank before everything they print and log
(distributed_utils.override_print / logging prefix 'rank: %2d |'): 'rank:  1 | 12:00:01 CRIT |'."""
TORCHRUN = re.compile(
    r"\[(?:(?P<role>[A-Za-z_][A-Za-z_-]*?)(?P<num>\d+)\]:\s?|(?P<bare>\d+)\]:\s?(?=.))"
)
"""torchrun --tee's '[default1]:' (its role, then the local rank; an empty role under TorchX's
dist.ddp: '[1]:' before what the worker printed, not the bare '[1]:' that heads an entry of
torchelastic's failure summary), and the excepthook's '[rank1]:' (the global rank)."""
# TorchX's local schedulers (local_cwd, local_docker) put the role and replica a line came from
# in front of it: 'trainer/0 [1]:...' (replica 0, torchrun's local rank 1). A replica is one
# node of the job: its lines are that node's
TORCHX_REPLICA = re.compile(
    r"(?P<replica>[A-Za-z_][\w.-]{0,40}/\d{1,5}) (?=\[(?:[A-Za-z_][A-Za-z_-]*)?\d+\]:)"
)
# the logging format of hszhao's semseg and the research code that copied it (PointWeb, PAConv,
# Point Transformer, Stratified Transformer, Pointcept): "[%(asctime)s %(levelname)s
# %(filename)s line %(lineno)d %(process)d] %(message)s". The process id is the line's origin,
# not a prefix of its writer: a record's traceback follows it without the head
FILE_LINE_PID_HEAD = re.compile(
    r"\[(?P<ts>\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}) "
    r"(?P<level>DEBUG|INFO|WARNING|ERROR|CRITICAL) [\w.-]{1,80} line \d{1,7} (?P<pid>\d{1,10})\] ?"
)
# MosaicML Composer's and llm-foundry's logging format ("%(asctime)s: rank{global rank}
# [%(process)d][%(threadName)s]: %(levelname)s: %(name)s: %(message)s"), after its time:
# "rank1[6376][MainThread]: INFO: __main__: Building trainer..."
RANK_PID_THREAD = re.compile(
    r"rank(?P<rank>\d{1,5})\[(?P<pid>\d{1,10})\]\[[^\[\]\n]{1,60}\]: "
    r"(?P<level>DEBUG|INFO|WARNING|ERROR|CRITICAL): (?:[\w.]{1,120}: )?"
)
# glog as torch prints it: `E1130 12:00:00.123456 1234 ProcessGroupNCCL.cpp:616] `
GLOG = re.compile(
    r"(?P<level>[IWEF])(?P<md>\d{4}) (?P<hms>\d\d:\d\d:\d\d(?:\.\d+)?)\s+(?P<pid>\d+)\s+"
    r"(?P<file>[\w./<>-]+:\d+)\]\s?"
)
# older torch: `[E ProcessGroupNCCL.cpp:475] `, `[W reducer.cpp:313] `, also with glog date;
# torch >= 2.4's own (c10) logging leaves the month unpadded: `[E307 04:12:51.218331904 ...`.
GLOG_BRACKET = re.compile(
    r"\[(?P<level>[IWEF])(?:(?P<md>\d{3,4}) (?P<hms>\d\d:\d\d:\d\d(?:\.\d+)?)"
    r"(?:\s+(?P<pid>\d+))?\s+|\s)"
    r"(?P<file>[\w./<>-]+:\d+)\]\s?"
)
# NCCL debug lines: `host:pid:tid [dev] NCCL INFO ...` (kept in the text, origin taken).
NCCL = re.compile(r"(?P<host>[\w.-]+):(?P<pid>\d+):(?P<tid>\d+) \[(?P<dev>\d+)\] (?=NCCL )")
NCCL_MARK = "] NCCL "
"""What every line NCCL matches holds after its start (a cheap test before the regex, whose
unbounded host backtracks over every message's first word)."""
# pdsh / DeepSpeed multi-node with a hostfile of addresses: `10.42.7.33: `.
PDSH_ADDRESS = re.compile(r"(?P<host>\d{1,3}(?:\.\d{1,3}){3}):\s")
# Slurm `srun --label`: task id (SLURM_PROCID) then ': ', space-padded to the width of the
# largest task id (`%*d: `): spaces and digits five at most together. Not a listing's numbered
# rows indented further (DeepSpeed's pipeline partition, '     5: LMHeadPipe').
SLURM = re.compile(r"(?=[ \d]{1,5}: ) *(?P<task>\d{1,5}): ")
# MPICH's / Intel MPI's Hydra with -prepend-rank (-l): '[3] message', the MPI rank of the
# process that wrote it (a viewer's bracketed line numbers, counting up line by line, are taken
# away before: ingest/unwrap.unnumber)
# (not NCCL's device tag left at the start of a line whose 'host:pid:tid ' head a paste cut
# off: '[0] NCCL INFO ...')
HYDRA_RANK = re.compile(r"\[(?P<task>\d{1,5})\] (?=\S)(?!NCCL )")
# pdsh / DeepSpeed multi-node: `worker-1: `; a host-like token with a digit or a dash.
# (not a rank's own tag, "rank1: ", which the program prints: see RANK_MARKS)
PDSH = re.compile(
    r"(?!rank[_-]?\d{1,5}:)(?P<host>(?=[a-z0-9._-]*[0-9-])[a-z][a-z0-9._-]{0,62}):\s(?!\s*error:)"
)
# `docker compose logs` (and SageMaker local mode): `trainer-worker-1  | `, the container name
# padded, then a bar; the container is the host. Its name carries the replica number, a digit.
COMPOSE = re.compile(r"(?P<host>(?=[a-z0-9._-]{0,62}[0-9])[a-z][a-z0-9._-]{0,62}) {1,40}\| ")
# GNU parallel's --tag: the job's argument (the node it runs on: `parallel --tag ssh {} ...
# ::: node0 node1`) and a tab before each line of that job's output
PARALLEL_TAG = re.compile(
    r"(?!rank[_-]?\d{1,5}\t)(?P<host>(?=[a-z0-9._-]{0,62}[0-9])[a-z][a-z0-9._-]{0,62})\t"
)
# Determined's task logs (`det trial logs`, the web UI), after their time: the container's id
# (its first 8 hex digits), the rank the launch layer's wrapper adds to each worker's lines,
# then two bars: '[2024-03-15T16:29:06.552162Z] 5c902731 [rank=0] || INFO: ...'. The master's
# own lines have no container ('[...Z]          || INFO: Scheduling Trial 18'), the
# container's own no rank ('5c902731 || + test -f startup-hook.sh'). A container is one node
# of the trial: its lines are that node's. Only after a time, but for the rank alone (a
# paste of the messages without their times).
DETERMINED = re.compile(
    r"(?:(?P<container>[0-9a-f]{8})|\s{1,12})(?: \[rank=(?P<rank>\d{1,6})\])? \|\| ?"
    r"|\[rank=(?P<alone>\d{1,6})\] \|\| ?"
)
HEX_DIGITS = frozenset("0123456789abcdef")
# AI2 OLMo's records (olmo/util.py setup_logging), after their time, tab-separated:
# '2024-02-01 12:00:00.123\tnode7:3\tolmo.train:816\tINFO\tmessage': the host and the
# local rank, the logger and its line, the level. Its excepthook logs an uncaught exception
# as 'Uncaught RuntimeError: ...' (CRITICAL, the traceback below): the exception's own line
# starts after that word.
OLMO_RECORD = re.compile(
    r"(?P<host>[A-Za-z0-9][\w.-]{0,62}):(?P<local>\d{1,4})\t[\w.]{1,100}:\d{1,6}\t"
    r"(?P<level>DEBUG|INFO|WARNING|ERROR|CRITICAL)\t(?:Uncaught (?=[\w.]{1,100}: ))?"
)
# `kubectl logs --prefix`: `[pod/train-worker-1/pytorch] `; the pod is the host.
KUBECTL = re.compile(r"\[pod/(?P<pod>[^/\]\s]+)/[^\]\s]+\] ")
# Capture platforms: `[stderr]`, `[stdout]`.
STREAM_TAG = re.compile(r"\[(?:stderr|stdout)\]\s?")
# Job platforms put step/run ids in brackets after their timestamp: `[177/train/578 (pid 1)] `.
PLATFORM_TAG = re.compile(r"\[(?!Rank |PG |rank\d)[^\[\]]{1,80}\]\s")
# Python logging `LEVEL:logger:` or `LEVEL logger` heads (level only, message kept), the level
# padded to its field's width too ('%(asctime)s  %(levelname)5s  %(message)s': "2024-01-01
# 10:00:00,000   INFO  ...", OpenPCDet's).
PY_LEVEL = re.compile(r" {0,4}(?P<level>DEBUG|INFO|WARNING|ERROR|CRITICAL)[:\s]")
PY_LEVEL_STARTS = " DIWEC"
"""What a message PY_LEVEL matches starts with (a cheap test: most messages have no level)."""
NAMED_PY_LEVEL = re.compile(r"[\w.]{1,100} - (?P<level>DEBUG|INFO|WARNING|ERROR|CRITICAL) - ")
"""The logging cookbook's '%(asctime)s - %(name)s - %(levelname)s - %(message)s' (torchtitan's,
many repositories'): after the time, the logger's name, then the level."""
# Inside c10d messages the global rank appears as `[Rank 3]` or `[PG 0 (default_pg) Rank 3]`.
# The group name is bounded: `[^)]*` from every "[PG 1 (" of a long line was quadratic.
C10D_RANK = re.compile(r"\[(?:PG \d+ (?:\([^)]{0,200}\) )?)?Rank (?P<rank>\d+)\]")
# Programs that name their rank at the start of a line: "Rank 3 finished", "[rank 1/4] step 10".
# Python logging puts its header first: "INFO - trainer - [rank 1] ...", "[INFO] mmcv: rank 2 ...",
# "INFO [proc 4211] rank 1 | ..." (up to two bracketed fields after the level).
LOG_HEADER = (
    r"(?:(?:\[?[\w.]{1,40}\]?\s{0,16}[-:|]\s{0,16})? {0,4}\[?(?:DEBUG|INFO|WARNING|ERROR|CRITICAL)"
    r"\]?(?:\s{0,16}[-:|]\s{0,16}|\s{1,16})(?:\[?[\w.]{1,40}\]?\s{0,16}[-:|]\s{0,16})?"
    r"(?:\[[^\[\]]{1,40}\]\s{0,16}){0,2})?"
)
"""Its spaces are bounded (16, twice %(levelname)-8s's padding): unbounded, a level followed by a
megabyte of blanks took 1.5 s to refuse at the one position a `^` allows, backtracking through
every later part at each blank."""
LEADING_RANK = re.compile(
    LOG_HEADER + r"\[?(?:[Rr]ank|RANK)(?:[ =:#]|: )?(?P<rank>\d{1,5})(?:/\d{1,5})?\]?[:,|]?\s"
)
# A bracketed rank tag at the start: "[worker 1] ...", "[Worker 2/4] ...", "[R1/3] ..." (R with
# the world size only), or after a host name
# when a logging level follows: "vm [worker 1] WARNING ...". Only in brackets is "worker" a
# rank (a DataLoader names its workers by pid, in prose).
_RANK_TAG = (
    r"\[(?:(?:[Rr]ank|RANK|[Ww]orker|WORKER)(?:[ :=#]|: )?|R(?=\d{1,5}/))"
    r"(?P<rank>\d{1,5})(?:/\d{1,5})?\]\s"
)
TAGGED_RANK = re.compile(_RANK_TAG)
HOST_TAGGED_RANK = re.compile(
    r"[\w.-]{1,63} " + _RANK_TAG + r"(?=(?:DEBUG|INFO|WARNING|ERROR|CRITICAL)\b)"
)
# The same place often holds the device index instead, which is the local rank (mp.spawn's
# `gpu` argument, Lightning's "LOCAL_RANK: 1 - CUDA_VISIBLE_DEVICES"): "gpu 1 | loss ...",
# "[gpu 1] ...", "(cuda:1) ...". A separator must follow ("|", "-", a closing bracket), so a
# listing such as "GPU 0: NVIDIA A100" is not read as a writer.
LEADING_LOCAL_RANK = re.compile(
    LOG_HEADER + r"[\[(]?(?:[Gg][Pp][Uu]|cuda|local_rank|LOCAL_RANK|local rank)[ =:#]{0,2}"
    r"(?P<local>\d{1,3})(?:/\d{1,5})?(?:[\])]\s?|\s?[|-]\s)"
)
# ProcessGroupNCCL names the rank that waits for the NCCL id in brackets (census
# pgnccl-unique-id-store): "[1] is setting up NCCL communicator and retrieving ncclUniqueId ..."
NCCL_ID_WAIT = re.compile(r"\[(?P<rank>\d{1,7})\] is setting up NCCL communicator")

# c10d's store-based barrier at init names the rank that waits (distributed_c10d.py
# _store_based_barrier): "Waiting in store based barrier to initialize process group for rank: 3"
STORE_BARRIER_RANK = re.compile(
    r"Waiting in store based barrier to initialize process group for rank: (?P<rank>\d{1,7})"
)

# torch.multiprocessing.spawn re-raises a child's error in the parent under this header; the
# traceback that follows is that process's (spawn.py ProcessRaisedException). mp.spawn's index
# is the rank in nearly every program (fn(rank, ...) on one node).
BAR_THEN_TEXT = re.compile(
    r"^[^|\n]{0,200}\d{1,3}%\|[^|\n]{0,400}\| ?\d{1,12}/\d{1,12} \[[^\]\n]{0,300}\](?=\S)"
)
"""A tqdm bar's redraw ('Steps:  44%|####  | 7/16 [00:00<00:00, 22.7it/s, loss=1.07]') with
text right after its closing bracket: tqdm ends a redraw without a newline, so the next line
any writer prints (a log record, the launcher's SIGTERM notice) starts there."""
BAR_REDRAW = re.compile(r"\d{1,3}%\|")
"""A progress bar's redraw (tqdm's 'NN%|')."""
SPAWN_PROCESS = re.compile(r"-- Process (?P<rank>\d{1,7}) terminated with the following error:")

# Structured (JSON) log lines that carry the writer's rank as a field: {"rank": 2, "step": 10}.
# A structured (JSON) log line's own fields, as python-json-logger, structlog and k8s
# containers' loggers write them: its time, level and the pod or host that wrote it.
JSON_TIME = re.compile(
    r'"(?:ts|time|timestamp|@timestamp|asctime)"\s?:\s?"'
    r'(?P<ts>\d{4}-\d\d-\d\d[T ]\d\d:\d\d:\d\d(?:[.,]\d{1,9})?(?:Z|[+-]\d\d:?\d\d)?)"'
)
JSON_LEVEL = re.compile(r'"(?:level|levelname|severity)"\s?:\s?"(?P<level>[A-Za-z]{1,10})"')
JSON_HOST = re.compile(r'"(?:pod|pod_name|hostname|host|node)"\s?:\s?"(?P<host>[\w.-]{1,63})"')
JSON_FIELDS_WITHIN = 400
"""Where a JSON line's header fields are looked for (loggers put them first)."""
JSON_LEVELS = {"warn": "warning", "err": "error", "crit": "critical"}
JSON_RANK = re.compile(r'\{[^{}]{0,200}?"(?:global_)?rank"\s?:\s?(?P<rank>\d{1,5})[,}\s]')

LEVEL_NAMES = {"I": "info", "W": "warning", "E": "error", "F": "fatal"}
GLOG_LEVELS = frozenset(LEVEL_NAMES)
MAX_TEXT = 4000


@dataclass(slots=True)
class ParsedLine:
    text: str
    origin: Origin = field(default_factory=Origin)
    time: datetime | None = None
    level: str | None = None
    prefix: str = ""
    """The stripped prefix that names the writer; lines of one writer share it."""
    rank_from_text: bool = False
    """The rank came from the message ("rank 3 ..."), not from a launcher prefix."""
    fields: str = ""
    """A JSON record's fields beside its message ('step: 5  loss: 3.9'): its progress."""
    trace: tuple[str, ...] = ()
    """A JSON record's logged traceback above its exception line: the line's context."""
    task: int | None = None
    """srun --label's task: the writer's rank where nothing else named one (`label_rank`),
    unless the file's tasks are nodes (ingest/srun_tasks)."""
    label_rank: bool = False
    bar_line: str | None = None
    """The progress bar's last redraw this line was printed onto (tqdm ends a redraw without a
    newline), with the line's outer prefixes: the bar's writer's own line of progress."""


def _parse_iso(ts: str) -> datetime | None:
    ts = ts.replace(",", ".").replace("Z", "+00:00")
    if "T" not in ts:
        ts = ts[:10] + "T" + ts[11:]  # a space, or lm-eval's colon
    try:
        value = datetime.fromisoformat(ts)
    except ValueError:
        return None
    return plausible_time(value)


def _us_time(m: re.Match[str]) -> datetime | None:
    """Month first, as the examples' format writes it; day first when the month cannot be."""
    month, day = int(m.group("mo")), int(m.group("d"))
    if month > 12:
        month, day = day, month
    hms = m.group("hms")
    try:
        value = datetime(int(m.group("y")), month, day, int(hms[0:2]), int(hms[3:5]), int(hms[6:8]))
    except ValueError:
        return None
    return plausible_time(value)


def _without_caller(message: str) -> str:
    """A RichHandler record without the padding and the caller's file:line it right-aligns
    (split on the last run of spaces: a regex anchored at the end would try every space)."""
    message = message.rstrip()
    head, gap, tail = message.rpartition("  ")
    if gap and RICH_CALLER.fullmatch(tail):
        return head.rstrip()
    return message


def _syslog_time(m: re.Match[str], year: int) -> datetime | None:
    """syslog's "Mon DD HH:MM:SS": the year is the log's (as glog's)."""
    hms = m.group("hms")
    try:
        value = datetime(
            year,
            MONTHS.index(m.group("mon")) + 1,
            int(m.group("d")),
            int(hms[0:2]),
            int(hms[3:5]),
            int(hms[6:8]),
        )
    except ValueError:
        return None
    return plausible_time(value)


def _rich_time(m: re.Match[str]) -> datetime | None:
    """RichHandler's default "[%x %X]" in the C locale: month/day/two-digit year."""
    hms = m.group("hms")
    try:
        value = datetime(
            2000 + int(m.group("y")),
            int(m.group("mo")),
            int(m.group("d")),
            int(hms[0:2]),
            int(hms[3:5]),
            int(hms[6:8]),
        )
    except ValueError:
        return None
    return plausible_time(value)


def _glog_time(md: str, hms: str, year: int) -> datetime | None:
    """glog's MMDD and HH:MM:SS.ffffff(fff), parsed by hand: strptime is 10x slower. torch's
    own logging (c10, torch >= 2.4: '[E307 04:12:51.218331904 ProcessGroupNCCL.cpp:616]')
    does not pad the month: MDD."""
    try:
        frac = hms[9:15] if len(hms) > 8 else ""
        return datetime(
            year,
            int(md[:-2]),
            int(md[-2:]),
            int(hms[0:2]),
            int(hms[3:5]),
            int(hms[6:8]),
            int(frac.ljust(6, "0")) if frac else 0,
            tzinfo=UTC,
        )
    except ValueError:
        return None


TERMINAL_ECHO = re.compile(r"(?:\^[C\\])+")
"""What a terminal echoes when a key sends a stop signal ('^C': SIGINT, '^\\': SIGQUIT),
left at the start of the next line the program prints in a recorded or copied terminal:
'^CW1207 19:56:18.420000 11277 torch/distributed/elastic/agent/server/api.py:753] Received 2
death signal' is torchrun's glog line, with its time."""


def clean(raw: str) -> str:
    """Remove colour codes, NUL bytes and a terminal's echo of a signal key; cap the length."""
    if "\x1b" in raw:
        raw = ANSI.sub("", raw)
    if raw[:1] == "^" and (echo := TERMINAL_ECHO.match(raw)):
        raw = raw[echo.end() :]
    raw = raw.rstrip("\r\n")
    raw = raw.replace("\x00", "")
    return raw[:MAX_TEXT]


# OpenMPI's mpirun --tag-output: "[1,3]<stderr>:" is job 1, rank 3 (MPI_COMM_WORLD rank);
# horovodrun's own launcher (gloo) tags "[3]<stderr>:" with the rank alone; SageMaker's MPI
# jobs (smdistributed, the training toolkit's mpirun) name the rank and the instance:
# "[1,mpirank:3,algo-2]<stdout>:".
OPENMPI = re.compile(
    r"\[(?:\d+,)?(?:mpirank:)?(?P<rank>\d{1,7})(?:,(?P<host>[\w.-]{1,63}))?\]"
    r"<(?:stdout|stderr|stddiag)>: ?"
)

# Ray's log monitor on the driver's console: "(RayTrainWorker pid=4242, ip=10.0.0.7) ",
# "(WorkerDict pid=88) ", "(pid=91) " for a task, "(raylet) " / "(raylet, ip=...) " for its
# own daemons (python/ray/_private/worker.py print_worker_logs). The pid names the process,
# never its rank.
RAY = re.compile(
    r"\((?:(?P<name>[A-Za-z_][\w.:-]{0,80}?) )?pid=(?P<pid>\d{1,9})"
    r"(?:, ip=(?P<ip>[\d.]{7,15}|[0-9a-f:]{3,39}))?\) "
    r"|\((?P<daemon>raylet|gcs_server|autoscaler|monitor|dashboard_agent)"
    r"(?:, ip=(?P<dip>[\d.]{7,15}))?\) "
)

# SkyPilot's per-node prefix on the job's console (`sky launch --num-nodes N`, `sky logs`):
# "(head, rank=0, pid=15079, ip=10.0.0.11) ", "(worker1, rank=1, pid=15089, ip=10.0.0.12) ".
# Its rank is the NODE's (SKYPILOT_NODE_RANK) and its pid the node's run script: neither is a
# worker's; the node (its address, else its name) is the writer's host, and what follows is
# the workers' own output, prefixes and all ("[rank2]: Traceback ...").
SKYPILOT = re.compile(
    r"\((?P<node>head|worker\d{1,5}), rank=\d{1,5}, pid=\d{1,9}"
    r"(?:, ip=(?P<ip>[\d.]{7,15}|[0-9a-f:]{3,39}))?\) "
)

# FedML's logger (fedml/core/mlops/mlops_runtime_log.py) opens every line with the process's
# role and id, then an RFC 2822-like time, its level and its caller: "[FedML-Server(0)
# @device-id-0] [Sat, 27 Aug 2022 23:23:51] [INFO] [fedavg_api.py:85:train] ". In its MPI and
# torch.distributed simulations the id is the process's rank (the server 0, client k rank k);
# a cross-silo client's own processes add "@replica-rank-N" and share the client's id, which
# is then no rank.
FEDML = re.compile(
    r"\[FedML-(?:Server|Client)\((?P<rank>\d{1,6})\)(?: @device-id-[\w.-]{1,40})?"
    r"(?P<replica> @replica-rank-\d{1,6})?\] "
    r"(?:\[(?:Mon|Tue|Wed|Thu|Fri|Sat|Sun), (?P<ts>\d\d [A-Z][a-z]{2} \d{4} \d\d:\d\d:\d\d)\] )?"
)


def _fedml_time(ts: str | None) -> datetime | None:
    if ts is None:
        return None
    try:
        return plausible_time(datetime.strptime(ts, "%d %b %Y %H:%M:%S"))
    except ValueError:  # a month's name in another locale
        return None


# A logger's name in brackets before its timestamp, as torchtitan's logger writes every line:
# "[titan] 2025-09-02 16:40:17,305 - root - INFO - step: 10 ..."
LOGGER_TAG = re.compile(r"\[[A-Za-z][\w.-]{0,30}\] (?=\d{4}-\d\d-\d\d[ T]\d\d:\d\d)")

# A logger's name, its level's letter, the time and the caller in one bracket, as NeMo's
# logger writes every line: "[NeMo W 2023-04-11 16:22:07 exp_manager:423] message".
NAMED_LEVEL_TIME = re.compile(
    r"\[[A-Za-z][\w.-]{0,20} (?P<level>[DIWEC]) "
    r"(?P<ts>\d{4}-\d\d-\d\d \d\d:\d\d:\d\d(?:[,.]\d{1,6})?)(?: [\w.<>-]{1,80}:\d{1,6})?\] "
)
NAMED_LEVELS = {"D": "debug", "I": "info", "W": "warning", "E": "error", "C": "critical"}

# The headers of training frameworks' own loggers, each read as a level and a time so that the
# message starts where the program's words do:
LEVELS = r"(?P<level>DEBUG|INFO|WARNING|WARN|ERROR|CRITICAL)"
HMS = r"\d\d:\d\d:\d\d(?:[,.]\d{1,6})?"
# transformers' examples and LLaMA-Factory: "[INFO|trainer.py:2128] 2024-05-01 10:00:00,123 >> "
# and "[INFO|2024-12-01 10:00:00] llamafactory.train.tuner:42 >> "; ms-swift: "[INFO:swift] "
BRACKET_LEVEL = re.compile(
    r"\[" + LEVELS + r"(?:\|[\w.-]{1,80}:\d{1,6}\] (?P<ts>\d{4}-\d\d-\d\d " + HMS + r") >> "
    r"|\|(?P<ts2>\d{4}-\d\d-\d\d " + HMS + r")\] [\w.-]{1,120}(?::\d{1,6})? >> "
    r"|:[\w.-]{1,40}\] )"
)
# TorchBeast's (and its IMPALA forks') format, "[%(levelname)s:%(process)d %(module)s:%(lineno)d
# %(asctime)s] ": "[INFO:348 monobeast:442 2026-12-06 03:26:33,893] Learning finished ..."
PID_MODULE_TIME = re.compile(
    r"\["
    + LEVELS
    + r":(?P<pid>\d{1,9}) [\w.-]{1,80}:\d{1,6} (?P<ts>\d{4}-\d\d-\d\d "
    + HMS
    + r")\] "
)
# DeepSpeed's logger after its time: "[INFO] [logging.py:96:log_dist] "
BRACKET_LEVEL_CALLER = re.compile(r"\[" + LEVELS + r"\] \[[\w.-]{1,80}:\d{1,6}:\w{1,80}\] ")
# detectron2 (no year): "[05/01 10:00:00 d2.engine.train_loop]: ", its file format
# "[05/01 10:00:00] d2.engine.hooks INFO: "
D2_HEAD = re.compile(
    r"\[(?P<mo>\d\d)/(?P<d>\d\d) (?P<hms>" + HMS + r")"
    r"(?: [\w.-]{1,120}\]: |\] [\w.-]{1,120} " + LEVELS + r": )"
)
# PySlowFast's logging (slowfast/utils/logging.py, datefmt "%m/%d %H:%M:%S", no year; its
# forks: MViT, TimeSformer, ...): "[12/04 14:18:26][INFO] train_net.py:  818: "
SLOWFAST_HEAD = re.compile(
    r"\[(?P<mo>\d\d)/(?P<d>\d\d) (?P<hms>" + HMS + r")\]\[" + LEVELS + r"\] "
    r"[\w.-]{1,120}\.py: {0,5}\d{1,6}: "
)
# Hydra's job logging format ('[%(asctime)s][%(name)s][%(levelname)s] - %(message)s') with the
# month and day alone (datefmt "%m-%d %H:%M:%S", dora's and flashy's: audiocraft, demucs):
# "[12-06 05:51:34][flashy.solver][INFO] - "; its fields are HYDRA_FIELDS
SHORT_DATE_FIELDS = re.compile(
    r"\[(?P<mo>\d\d)-(?P<d>\d\d) (?P<hms>" + HMS + r")\](?=\[[\w.-]{1,80}\]\[" + LEVELS + r"\] - )"
)
# OpenMMLab's mmengine (no year): "05/01 10:00:00 - mmengine - INFO - "
MM_HEAD = re.compile(
    r"(?P<mo>\d\d)/(?P<d>\d\d) (?P<hms>" + HMS + r") - [\w.-]{1,80} - " + LEVELS + r" - "
)
# loguru's default after its time: "INFO     | __main__:main:42 - "
LOGURU_HEAD = re.compile(
    r"(?P<level>TRACE|DEBUG|INFO|SUCCESS|WARNING|ERROR|CRITICAL) *\| "
    r"[\w.<>-]{1,120}:[\w.<>-]{1,120}:\d{1,6} - "
)


def _short_time(m: re.Match[str], year: int) -> datetime | None:
    """A month/day and a time without the year (detectron2, mmengine): the log's year."""
    hms = m.group("hms")
    try:
        value = datetime(
            year, int(m.group("mo")), int(m.group("d")), int(hms[0:2]), int(hms[3:5]), int(hms[6:8])
        )
    except ValueError:
        return None
    return plausible_time(value)


def _level_of(m: re.Match[str]) -> str | None:
    level = m.group("level")
    if level is None:
        return None
    return SHORT_LEVELS.get(level, level.lower())


SHORT_LEVELS = {
    "WARN": "warning",
    "SUCCESS": "info",
    "TRACE": "debug",
    "CRIT": "critical",
    "ERRO": "error",
}
"""Level names as loggers shorten them (ParlAI's '%(levelname).4s': 'CRIT', 'ERRO', 'WARN')."""


# Python logging with only the time of day (datefmt "%H:%M:%S"), then the level: "12:00:01 INFO
# message", "[12:00:01] WARNING - message", "12:00:01,123 | ERROR | message". The day is not in
# the line, so only the level is kept (a time without its date would misorder lines around
# midnight and beside dated sources); a level must follow, so a message's own clock is left.
TIME_OF_DAY_LEVEL = re.compile(
    r"\[?"
    + HMS
    + r"\]? {1,3}(?:[-|:] {1,3})?(?P<level>DEBUG|INFO|WARNING|WARN|ERROR|CRITICAL|CRIT|ERRO)"
    + r"\b\]?:? {0,8}(?:[-|:] {1,3})?"
    # ... or the time alone before a bar, as ParlAI logs its info lines ('%(asctime)s |')
    + r"|"
    + HMS
    + r" \| "
)

# A log pasted into a Markdown quote: "> [rank0]: Traceback ...", "> > nested".
QUOTE = re.compile(r">+ ?")
# ... or indented, or behind a report's bar ("        | [rank0]: FileNotFoundError: ..."): a
# launcher's tag stands at the start of the line it writes, so what comes before it is the
# quoting of whoever pasted or re-printed it.
QUOTED_TAG = re.compile(r"[ \t]{1,40}(?:\|[ \t]{0,4})?(?=\[[A-Za-z_][A-Za-z_-]{0,20}\d{1,5}\]:)")

# A logging level, then the date and time, then the caller's file:line, right-aligned in a
# fixed width (LeRobot's init_logging: f"{level} {dt} {fnameline[-15:]:>15} {message}"):
# "INFO 2026-12-06 19:05:56 s/train.py:1042 End of training".
LEVEL_TIME_CALLER = re.compile(
    r"(?P<level>DEBUG|INFO|WARNING|ERROR|CRITICAL) (?P<ts>\d{4}-\d\d-\d\d \d\d:\d\d:\d\d"
    r"(?:[,.]\d{1,6})?) {1,16}(?:[\w./-]{1,60}:\d{1,6} )?"
)

# gcloud's stream of a Vertex AI / AI Platform job's logs (`gcloud ai custom-jobs stream-logs`):
# the entry's severity, its time, the replica's task name, then the line, tab-separated:
# "ERROR\t2026-12-07 12:35:52 +0000\tworkerpool1-0\tINFO:root:rank 1 of 4". The severity is
# the stream's (stderr is ERROR, whatever a line says), not a level: not taken.
GCLOUD_STREAM = re.compile(
    r"(?:DEFAULT|DEBUG|INFO|NOTICE|WARNING|ERROR|CRITICAL|ALERT|EMERGENCY)\t"
    r"(?P<ts>\d{4}-\d\d-\d\d \d\d:\d\d:\d\d) [+-]\d{4}\t(?P<host>[\w.-]{1,63})\t"
)

# k2/icefall/lhotse-style logging ('%(levelname)s [%(filename)s:%(lineno)d] (%(rank)s/%(world)s)
# %(message)s'): "INFO [trainer.py:650] (5/8) Reaches end of dataloader."
CALLER_RANK = re.compile(
    r"(?:DEBUG|INFO|WARNING|ERROR|CRITICAL) \[[\w.-]{1,80}:\d{1,6}\] \((?P<rank>\d{1,5})/\d{1,5}\) "
)

# Python logging's default format ('%(levelname)s:%(name)s:%(message)s') with a logger per
# rank, named for it: "INFO:train.r2:early stopping", "WARNING:rank3:slow", "ERROR:worker1:".
LOGGER_NAME_RANK = re.compile(
    r"(?:DEBUG|INFO|WARNING|ERROR|CRITICAL):(?:[\w-]{1,40}\.){0,4}(?:rank|r|worker)[_-]?"
    r"(?P<rank>\d{1,5}):"
)

RANK_MARKS: tuple[tuple[str, int, Callable[[str], re.Match[str] | None], bool], ...] = (
    # (text the mark needs within the line's first N characters (0: anywhere), the mark,
    # whether a logging level follows it); a plain `in` test first keeps the hot path cheap
    ("-- Process ", 11, SPAWN_PROCESS.match, False),
    ("] (", 120, CALLER_RANK.match, False),
    ("store based barrier", 0, STORE_BARRIER_RANK.search, False),
    ("is setting up NCCL", 0, NCCL_ID_WAIT.search, False),
    ("[", 80, lambda t: TAGGED_RANK.match(t) or HOST_TAGGED_RANK.match(t), True),
    ("ank", 0, lambda t: C10D_RANK.search(t) or LEADING_RANK.match(t) or _json_rank(t), False),
    ("ANK", 0, LEADING_RANK.match, False),  # "[RANK 0]"
    (":", 9, LOGGER_NAME_RANK.match, False),
)
"""Where a line's text names the rank that wrote it, in the order they are tried: mp.spawn's
process header, c10d's store barrier and NCCL-id wait, a bracketed tag, the words a program
prints first, a JSON field. A launcher prefix, when there is one, has said it already."""


def _inside_record(record_line: ParsedLine, inner: ParsedLine, record: JsonRecord) -> ParsedLine:
    """The line a JSON record printed, parsed as a line of text, completed with what the
    record and the prefixes before it said (time, level, host, rank)."""
    outer = record_line.origin
    inner.origin = inner.origin.merged_with(outer)
    if inner.origin.rank is None and record.rank is not None:
        inner.origin.rank, inner.rank_from_text = record.rank, True
    if inner.origin.local_rank is None and record.local_rank is not None:
        inner.origin.local_rank = record.local_rank
    inner.time = inner.time or record_line.time
    inner.level = inner.level or record_line.level
    inner.prefix = " ".join(p for p in (record_line.prefix, inner.prefix) if p)
    return inner


def _json_fields(message: str, out: ParsedLine, with_time: bool) -> None:
    """A JSON log line's time, level and host, where its prefix gave none."""
    head = message[:JSON_FIELDS_WITHIN]
    if with_time and out.time is None and (m := JSON_TIME.search(head)):
        out.time = _parse_iso(m.group("ts"))
    if out.level is None and (m := JSON_LEVEL.search(head)):
        level = m.group("level").lower()
        out.level = JSON_LEVELS.get(level, level)
    if out.origin.host is None and (m := JSON_HOST.search(head)):
        out.origin.host = m.group("host")


def _whole_json(message: str, raw: str) -> str:
    """The JSON object a line's message starts, whole: a line cut to MAX_TEXT (a record with a
    long escaped traceback) is taken again from the raw line, from its first '{"'."""
    if len(message) < MAX_TEXT - 1 or len(raw) <= MAX_TEXT:
        return message
    start = raw.find('{"')
    return raw[start:].rstrip("\r\n") if start >= 0 else message


def _json_rank(text: str) -> re.Match[str] | None:
    return JSON_RANK.match(text) if text[:1] == "{" else None


_DEVICE_WORDS = re.compile(r"gpu|cuda|local.rank", re.IGNORECASE)
_LOCAL_RANK_LOWER = re.compile(r"local.rank")
DEVICE_WORDS_WITHIN = 160


def _may_name_device(message: str) -> bool:
    """A cheap test before LEADING_LOCAL_RANK: the words it needs are near the start. It runs
    on nearly every line of a log without a rank prefix (84% of the corpus' parses), where the
    case-blind search took 2-4 us a line, half a parse: ASCII text is lower-cased and searched
    for the words as they are (0.2-0.5 us; on ASCII, case folding only maps letters). Other
    text is searched case-blind as before: (?i) also folds U+212A (Kelvin sign) into 'k'."""
    head = message[:DEVICE_WORDS_WITHIN]
    if head.isascii():
        lower = head.lower()
        return (
            "gpu" in lower
            or "cuda" in lower
            or ("local" in lower and _LOCAL_RANK_LOWER.search(lower) is not None)
        )
    return _DEVICE_WORDS.search(message, 0, DEVICE_WORDS_WITHIN) is not None


TEXT_RANK = re.compile(r"(?<![A-Za-z])[Rr]ank[ =:]?(?P<rank>\d{1,5})\b")


def rank_before(text: str, pos: int) -> int | None:
    """The rank named last before `pos`: when ranks' prints interleave inside one line
    ("...loss 0.8rank 1: early stopping"), the words nearest a match belong to that rank."""
    last = None
    for m in TEXT_RANK.finditer(text, 0, pos):
        last = rank_number(m.group("rank"))
    return last


MESSAGE_LETTERS = frozenset("abcdefghijklmnopqstuvwxyzABGHJKLMNOPQRUVXYZ")
"""ASCII letters that start a line's message after a prefix, where no format can match but
NCCL's (parse_line's shortcut): not 'r' (Composer's 'rank1[', ParlAI's 'rank: '), nor the
first letters of levels (LEVEL_TIME_CALLER, glog, loguru: C D E F I S T W). A lower-case
letter is a host only at the start of a line (pdsh, compose, TorchX, a grep path), and one
of a-f a Determined container only after a time with '||' near."""


SMALL_NUMBERS = {str(n): n for n in range(4096)}
"""rank_number of the ranks and devices nearly every line names, without its checks."""


_Tag = tuple[bool, int | None, str]
"""torchrun's tag read: whether it names the global rank (else the local one), its number, its
prefix part."""


def _torchrun_told(m: re.Match[str]) -> _Tag:
    role, num, bare = m.group("role", "num", "bare")
    digits = num or bare
    number = SMALL_NUMBERS.get(digits)
    if number is None:
        number = rank_number(digits)
    return role is not None and role.lower() == "rank", number, m.group(0).strip()


def _take_torchrun(m: re.Match[str], origin: Origin, prefix_parts: list[str]) -> None:
    _take_tag(_torchrun_told(m), origin, prefix_parts)


def _take_tag(tag: _Tag, origin: Origin, prefix_parts: list[str]) -> None:
    if tag[0]:
        origin.rank = tag[1]
    else:
        origin.local_rank = tag[1]
    prefix_parts.append(tag[2])


@lru_cache(maxsize=4096)
def _torchrun_tag(tag: str) -> _Tag | None:
    """TORCHRUN at the start of `tag`, read once per process rather than once per line: the
    same '[rank3]:' opens every line of a rank file. At a '[r' (parse_line's shortcut) only
    TORCHRUN's first alternative can match, and no part of it before its ']:' holds a ']':
    on a line it matches what it matches on the line's start up to its first ']' and the
    character after (`tag`), but for the one blank its `\\s?` may take after it."""
    m = TORCHRUN.match(tag)
    return _torchrun_told(m) if m is not None else None


_Head = tuple[str, int | None, int | None, str, int]
"""NCCL's head read: its host, pid, device (the local rank), prefix part, and length."""


def _nccl_told(m: re.Match[str]) -> _Head:
    host, pid, dev = m.group("host", "pid", "dev")
    device = SMALL_NUMBERS.get(dev)
    if device is None:
        device = rank_number(dev)
    return host, pid_number(pid), device, f"{host}:{pid}", m.end() - m.start()


def _take_nccl(m: re.Match[str], origin: Origin, prefix_parts: list[str]) -> int:
    """Takes NCCL's head into the line's origin and prefix; its length."""
    return _take_head(_nccl_told(m), origin, prefix_parts)


def _take_head(head: _Head, origin: Origin, prefix_parts: list[str]) -> int:
    host, pid, device, part, length = head
    origin.host = origin.host or host
    origin.pid = pid
    if origin.local_rank is None:
        origin.local_rank = device
    prefix_parts.append(part)
    return length


@lru_cache(maxsize=4096)
def _nccl_head(head: str) -> _Head | None:
    """NCCL at the start of `head` (a line's start up to its first '] NCCL ', and that ']
    '), read once per process rather than once per line: a rank file's NCCL lines share a few
    heads. No part of NCCL's match but its last holds a ']', so a match ends at the first
    '] NCCL ' after its start, and reads nothing past it but the 'NCCL ' it looks for."""
    m = NCCL.match(head + "NCCL ")
    return _nccl_told(m) if m is not None else None


def _take_glog(m: re.Match[str], out: ParsedLine, with_time: bool, year: int) -> None:
    out.level = LEVEL_NAMES.get(m.group("level"))
    if with_time and m.group("md"):
        out.time = out.time or _glog_time(m.group("md"), m.group("hms"), year)
    pid = m.group("pid")
    if pid:
        out.origin.pid = _pid(pid) if len(pid) <= MAX_NUMBER_DIGITS else None


@lru_cache(maxsize=1024)
def _pid(digits: str) -> int | None:
    """pid_number of a short number: a writer's pid is on each of its glog lines. (Longer
    ones, all refused by pid_number, are not kept.)"""
    return pid_number(digits)


def parse_line(raw: str, year: int = 1970, with_time: bool = True, depth: int = 0) -> ParsedLine:
    """Strip every known prefix from the front of a line, repeatedly (they nest).
    `with_time=False` leaves `time` unset: parsing it is a third of the cost, and a caller
    that only learns who wrote a line does not need it."""
    text = clean(raw)
    origin = Origin()
    out = ParsedLine(text, origin)
    prefix_parts: list[str] = []
    pos = 0
    platform_tags = 0
    line_start = 0  # where the line starts: after a Markdown quote's '> ' when pasted in one
    slurm_task: int | None = None  # srun --label's task: the rank, unless the line says another
    collected_at = -1  # where a log collector's stamp of the line ends (see SLURM below)
    platform_ok = False  # job platforms put their tags right after an ISO timestamp
    rich_record = False  # RichHandler's columns: its caller's file:line ends the line
    end = len(text)
    for _ in range(8):
        if pos >= end:
            break
        # each format starts with known characters: try only the ones that can match there
        c = text[pos]
        if c == ">" and pos == 0:
            pos = line_start = QUOTE.match(text, pos).end()  # type: ignore[union-attr]
            continue
        if c in " \t" and pos == 0 and (quoted := QUOTED_TAG.match(text)):
            pos = line_start = quoted.end()
            continue
        bracket, digit = c == "[", c.isdigit()
        nxt = text[pos + 1] if pos + 1 < end else ""
        m = None
        if c in "DIWECNA" and pos == line_start and (gs := GCLOUD_STREAM.match(text, pos)):
            if with_time:
                out.time = out.time or _parse_iso(gs.group("ts"))
            origin.host = origin.host or gs.group("host")
            prefix_parts.append(gs.group("host"))
            pos = gs.end()
            continue
        # Shortcuts for the commonest places, each taken only where no format tried before
        # it in the chain below can match (the chain then gives the same result, slower):
        # torchrun's '[rank3]:' at a '[r' that opens no Determined '[rank=' tag...
        if bracket and nxt == "r" and not text.startswith("[rank=", pos):
            close = text.find("]", pos) + 2  # (after the ':' that must follow it)
            tag = _torchrun_tag(text[pos:close]) if close > 1 else None
            if tag is not None:
                _take_tag(tag, origin, prefix_parts)
                pos = close + 1 if close < end and text[close].isspace() else close
                continue
        # ... and the message itself, after a prefix: a letter no format but NCCL's (and
        # after a time, OLMo's and Determined's, which need a tab or '||' near) starts with
        if (
            c in MESSAGE_LETTERS
            and prefix_parts
            and pos != line_start
            and pos != collected_at
            and (
                not platform_ok
                or (text.find("\t", pos, pos + 66) <= 0 and text.find("||", pos, pos + 40) <= 0)
            )
        ):
            mark = text.find(NCCL_MARK, pos) + 2
            nccl = _nccl_head(text[pos:mark]) if mark > 1 else None
            if nccl is not None:
                pos += _take_head(nccl, origin, prefix_parts)
            break
        # ... and glog's header after a prefix ('[rank3]:W0612 10:00:00.48 4242 f.cpp:42] '),
        # a level's letter and a digit: the formats before GLOG in the chain need another
        # letter after a level's first, the line's start, a time before them, or a bracket
        if (
            c in GLOG_LEVELS
            and nxt.isdigit()
            and not platform_ok
            and pos != line_start
            and pos != collected_at
            and (m := GLOG.match(text, pos))
        ):
            _take_glog(m, out, with_time, year)
            pos = m.end()
            continue
        # ... and DeepSpeed's '[WARNING] [stage3.py:2117:step] ' after its time: the formats
        # before BRACKET_LEVEL_CALLER in the chain that may start at a '[' and a level's
        # letter need a digit, a ':' or '|', or a date where its level is followed by '] ['
        if (
            bracket
            and platform_ok
            and nxt in "DIWEC"
            and (m := BRACKET_LEVEL_CALLER.match(text, pos))
        ):
            out.level = _level_of(m)
            pos = m.end()
            continue
        if c in "DIWEC" and (lt := LEVEL_TIME_CALLER.match(text, pos)):
            if with_time:
                out.time = out.time or _parse_iso(lt.group("ts"))
            out.level = lt.group("level").lower()
            pos = lt.end()
            continue
        if digit:
            # (each format tried only where the character it needs after its first digits
            # stands: 2024-, 12/, 12:)
            sep = text[pos + 2 : pos + 3]
            m = (
                RFC3339.match(text, pos) or ISO_TIME.match(text, pos)
                if text[pos + 4 : pos + 5] == "-"
                else None
            )
            if m is None and sep == "/" and (mm := MM_HEAD.match(text, pos)):
                if with_time:
                    out.time = out.time or _short_time(mm, year)
                out.level = _level_of(mm)
                platform_ok = True
                pos = mm.end()
                continue
            if m is None and sep == "/" and (us := US_TIME.match(text, pos)):
                if with_time:
                    out.time = out.time or _us_time(us)
                platform_ok = True
                pos = us.end()
                continue
            if m is None and sep == ":" and (tod := TIME_OF_DAY_LEVEL.match(text, pos)):
                out.level = _level_of(tod)
                pos = tod.end()
                continue
        elif bracket and nxt and nxt in "ADFJMNOS" and (colbert := COLBERT_HEAD.match(text, pos)):
            if with_time:
                out.time = out.time or _syslog_time(colbert, year)
            if colbert.group("rank") is not None:
                origin.rank = rank_number(colbert.group("rank"))
                prefix_parts.append(f"[{colbert.group('rank')}]")
            pos = colbert.end()
            continue
        elif bracket and nxt.isdigit():
            sep = text[pos + 3 : pos + 4]  # (as above, after the bracket: [2024-, [12/, [12:)
            dated = text[pos + 5 : pos + 6] == "-"
            if dated and (head := FILE_LINE_PID_HEAD.match(text, pos)) is not None:
                if with_time:
                    out.time = out.time or _parse_iso(head.group("ts"))
                out.level = head.group("level").lower()
                origin.pid = origin.pid or pid_number(head.group("pid"))
                pos = head.end()
                continue
            rich = RICH_LOG_HEAD.match(text, pos) if sep == "/" else None
            if rich:
                if with_time:
                    out.time = out.time or _rich_time(rich)
                out.level = rich.group("level").lower()
                rich_record = True
                pos = rich.end()
                continue
            d2 = (
                (D2_HEAD.match(text, pos) or SLOWFAST_HEAD.match(text, pos))
                if sep == "/"
                else SHORT_DATE_FIELDS.match(text, pos)
                if sep == "-"
                else None
            )
            if d2:
                if with_time:
                    out.time = out.time or _short_time(d2, year)
                out.level = _level_of(d2) or out.level
                platform_ok = True
                pos = d2.end()
                continue
            tod = TIME_OF_DAY_LEVEL.match(text, pos) if sep == ":" else None
            if tod:
                out.level = _level_of(tod)
                pos = tod.end()
                continue
            mpi = OPENMPI.match(text, pos) if text.find("]<", pos) >= 0 else None
            if mpi:
                origin.rank = int(mpi.group("rank"))
                origin.host = origin.host or mpi.group("host")
                prefix_parts.append(mpi.group(0).strip())
                pos = mpi.end()
                continue
            m = ISO_TIME.match(text, pos) if dated else None
        if m:
            if with_time:
                out.time = out.time or _parse_iso(m.group("ts"))
            platform_ok = True
            stamped = pos == line_start and m.re is RFC3339
            pos = m.end()
            if text.find("]: ", pos) >= 0 and (source := SYSLOG_SOURCE.match(text, pos)):
                # (journalctl -o short-iso)
                origin.host = origin.host or source.group("host")
                pos = source.end()
            if stamped:
                collected_at = pos
            continue
        if c in "ADFJMNOS" and pos == line_start and (syslog := SYSLOG_TIME.match(text, pos)):
            if with_time:
                out.time = out.time or _syslog_time(syslog, year)
            platform_ok = True
            pos = syslog.end()
            if source := SYSLOG_SOURCE.match(text, pos):
                origin.host = origin.host or source.group("host")
                pos = source.end()
            collected_at = pos  # journald's header, or moreutils' `ts` time alone
            continue
        if c == " " and nxt == " ":
            rich = RICH_LOG_LEVEL.match(text, pos)
            if rich:
                out.level = rich.group("level").lower()
                rich_record = True
                pos = rich.end()
                continue
            rich = RICH_LOG_BODY.match(text, pos)
            if rich:
                rich_record = True  # padded to the console's width
                pos = rich.end()
                continue
        m = (
            OLMO_RECORD.match(text, pos)
            if platform_ok and c.isalnum() and text.find("\t", pos, pos + 66) > 0
            else None
        )
        if m:
            origin.host = origin.host or m.group("host")
            origin.local_rank = rank_number(m.group("local"))
            out.level = m.group("level").lower()
            prefix_parts.append(f"{m.group('host')}:{m.group('local')}")
            pos = m.end()
            continue
        m = (
            DETERMINED.match(text, pos)
            if (
                (
                    platform_ok
                    and (
                        (c == " " and nxt == " ")
                        or (c in HEX_DIGITS and text[pos + 8 : pos + 9] == " ")
                    )
                )
                or (bracket and text.startswith("[rank=", pos))
            )
            and text.find("||", pos, pos + 40) > 0
            else None
        )
        if m:
            rank = m.group("rank") or m.group("alone")
            if rank is not None:
                origin.rank = rank_number(rank)
            origin.host = origin.host or m.group("container")
            prefix_parts.append(m.group(0).rstrip(" |") or "||")
            pos = m.end()
            continue
        m = RANK_PID_THREAD.match(text, pos) if c == "r" else None
        if m:
            origin.rank = rank_number(m.group("rank"))
            origin.pid = pid_number(m.group("pid"))
            out.level = m.group("level").lower()
            prefix_parts.append(f"rank{m.group('rank')}[{m.group('pid')}]")
            pos = m.end()
            continue
        m = (
            TORCHX_REPLICA.match(text, pos)
            if pos in (line_start, collected_at)  # (a collector's time may come first)
            and c.isalpha()
            and text.find("/", pos, pos + 42) > 0
            else None
        )
        if m:
            origin.host = origin.host or m.group("replica")
            prefix_parts.append(m.group("replica"))
            pos = m.end()
            continue
        m = KUBECTL.match(text, pos) if bracket and nxt == "p" else None
        if m:
            origin.host = origin.host or m.group("pod")
            prefix_parts.append(m.group(0).strip())
            pos = m.end()
            continue
        m = PARLAI_RANK.match(text, pos) if c == "r" and nxt == "a" else None
        if m:
            origin.rank = rank_number(m.group("rank"))
            prefix_parts.append(m.group(0).strip())
            pos = m.end()
            continue
        m = TORCHRUN.match(text, pos) if bracket and text.find("]:", pos) >= 0 else None
        if m:
            _take_torchrun(m, origin, prefix_parts)
            pos = m.end()
            continue
        m = FEDML.match(text, pos) if bracket and nxt == "F" else None
        if m:
            if m.group("replica") is None:
                origin.rank = rank_number(m.group("rank"))
            if with_time:
                out.time = out.time or _fedml_time(m.group("ts"))
            platform_ok = True
            prefix_parts.append(m.group(0)[: m.group(0).index("]") + 1])
            pos = m.end()
            continue
        m = LOGGER_TAG.match(text, pos) if bracket and nxt.isalpha() else None
        if m:
            pos = m.end()
            continue
        m = PID_MODULE_TIME.match(text, pos) if bracket and nxt in "DIWEC" else None
        if m:
            out.level = _level_of(m)
            origin.pid = pid_number(m.group("pid"))
            if with_time:
                out.time = out.time or _parse_iso(m.group("ts"))
            platform_ok = True
            pos = m.end()
            continue
        m = BRACKET_LEVEL.match(text, pos) if bracket and nxt in "DIWEC" else None
        if m:
            out.level = _level_of(m)
            ts = m.group("ts") or m.group("ts2")
            if with_time and ts:
                out.time = out.time or _parse_iso(ts)
            platform_ok = True
            pos = m.end()
            continue
        m = LOGURU_HEAD.match(text, pos) if platform_ok and c in "TDISWEC" else None
        if m:
            out.level = _level_of(m)
            pos = m.end()
            continue
        m = BRACKET_LEVEL_CALLER.match(text, pos) if bracket and platform_ok else None
        if m:
            out.level = _level_of(m)
            pos = m.end()
            continue
        m = NAMED_LEVEL_TIME.match(text, pos) if bracket and nxt.isalpha() else None
        if m:
            out.level = NAMED_LEVELS[m.group("level")]
            if with_time:
                out.time = out.time or _parse_iso(m.group("ts"))
            platform_ok = True
            pos = m.end()
            continue
        m = HYDRA_FIELDS.match(text, pos) if bracket and platform_ok else None
        if m:
            out.level = LEVEL_NAMES.get(m.group("level")[0], out.level)
            pos = m.end()
            continue
        m = (
            GLOG.match(text, pos)
            if c in GLOG_LEVELS
            else GLOG_BRACKET.match(text, pos)
            if bracket and nxt in GLOG_LEVELS
            else None
        )
        if m:
            _take_glog(m, out, with_time, year)
            pos = m.end()
            continue
        m = (
            NCCL.match(text, pos)
            if (c.isalnum() or c in "._-") and text.find(NCCL_MARK, pos) >= 0
            else None
        )
        if m:
            _take_nccl(m, origin, prefix_parts)
            pos = m.end()
            break
        m = SKYPILOT.match(text, pos) if c == "(" and nxt in "hw" else None
        if m:
            origin.host = origin.host or m.group("ip") or m.group("node")
            prefix_parts.append(m.group(0).strip())
            pos = m.end()
            continue
        m = RAY.match(text, pos) if c == "(" else None
        if m:
            if m.group("pid"):
                origin.pid = pid_number(m.group("pid"))
            origin.host = origin.host or m.group("ip") or m.group("dip")
            prefix_parts.append(m.group(0).strip())
            pos = m.end()
            continue
        m = STREAM_TAG.match(text, pos) if bracket and nxt == "s" else None
        if m:
            if pos in (line_start, collected_at):
                collected_at = m.end()  # a collector's stream tag: srun's label may follow
            pos = m.end()
            continue
        # not a rank's own tag ("[rank 1/3] ", "[worker 2] "): that names the writer
        m = (
            PLATFORM_TAG.match(text, pos)
            if bracket and platform_ok and not TAGGED_RANK.match(text, pos)
            else None
        )
        if m and platform_ok and len(prefix_parts) == platform_tags:
            platform_tags += 1
            prefix_parts.append(m.group(0).strip())
            pos = m.end()
            continue
        m = PDSH_ADDRESS.match(text, pos) if pos == line_start and digit else None
        if m:
            origin.host = m.group("host")
            prefix_parts.append(m.group(0).strip())
            pos = m.end()
            continue
        m = (
            GREP_PATH.match(text, pos)
            if pos == line_start and not prefix_parts and (c.isalpha() or c in "._/")
            else None
        )
        if m:
            told = _path_origin(m.group("path"))
            origin.rank = told.rank if origin.rank is None else origin.rank
            origin.local_rank = told.local_rank if origin.local_rank is None else origin.local_rank
            origin.host = origin.host or told.host
            prefix_parts.append(m.group("path") + ":")
            pos = line_start = m.end()
            continue
        # srun --label's task at the start of the line, or right after what a log collector
        # put before it (collected_at: Kubernetes' or CloudWatch's RFC 3339 time, journald's
        # header, moreutils' `ts` time, a '[stderr] ' tag)
        m = (
            SLURM.match(text, pos)
            if pos in (line_start, collected_at) and (digit or c == " ")
            else None
        )
        if m:
            slurm_task = out.task = rank_number(m.group("task"))
            prefix_parts.append(m.group(0).strip())
            pos = m.end()
            continue
        m = (
            HYDRA_RANK.match(text, pos)
            if c == "[" and pos == line_start and not prefix_parts
            else None
        )
        if m:
            slurm_task = out.task = rank_number(m.group("task"))
            prefix_parts.append(m.group(0).strip())
            pos = m.end()
            continue
        m = (
            (PDSH.match(text, pos) or COMPOSE.match(text, pos) or PARALLEL_TAG.match(text, pos))
            if c.islower() and not prefix_parts
            else None
        )
        if m:
            origin.host = m.group("host")
            prefix_parts.append(m.group(0).strip())
            pos = m.end()
            continue
        break
    message = text[pos:]
    if rich_record:
        message = _without_caller(message)
    if message[:1] == "{":
        host_before = origin.host
        _json_fields(message, out, with_time)
        record = read_json_record(_whole_json(message, raw))
        if record is not None:
            origin.host = origin.host or record.host
            if host_before is None and origin.host:
                # the source the record names (its host, pod, replica) is its writer: records
                # of many machines interleave in one export (as written in the record: every
                # part of a writer's key is a piece of its raw lines, tracebacks.walk_back)
                prefix_parts.append(origin.host)
        if record is not None and record.printed and depth == 0:
            # one printed line per record: the line's own prefixes ('[rank24]: ', a logger's
            # time and level) are read as a text line's, under what the record said
            out.prefix = " ".join(prefix_parts)
            return _inside_record(out, parse_line(record.text, year, with_time, depth=1), record)
        if record is not None:
            message, out.fields, out.trace = record.text, record.fields, record.trace
            if origin.rank is None and record.rank is not None:
                origin.rank, out.rank_from_text = record.rank, True
            if origin.local_rank is None and record.local_rank is not None:
                origin.local_rank = record.local_rank
    if "\r" in message:  # a progress bar redrawn in place: keep its last state
        parts = [p for p in message.split("\r") if p.strip()]
        message = parts[-1] if parts else ""
        glued = BAR_THEN_TEXT.match(message)
        if glued:  # another writer's line printed right after the bar's last redraw: read
            # it as the line (its own prefixes, level, rank) after the outer prefixes. Not
            # without a carriage return: there the bar is the line's one state of progress
            # (a paste that lost its \r), kept as such
            inner = parse_line(text[:pos] + message[glued.end() :], year, with_time)
            inner.bar_line = text[:pos] + message[: glued.end()]
            return inner
        if len(parts) > 1 and BAR_REDRAW.search(parts[-2]) and not BAR_REDRAW.search(message):
            # a line printed after the bar's last redraw was wiped ('\r', blanks, '\r': tqdm's
            # close, or a handler that clears the bar before each record): its own line, with
            # its own prefixes, time and level
            inner = parse_line(text[:pos] + message, year, with_time)
            inner.bar_line = text[:pos] + parts[-2]
            return inner
    if out.level is None:
        m = PY_LEVEL.match(message) if message[:1] in PY_LEVEL_STARTS else None
        if m and m.start("level") > 0 and not platform_ok:
            m = None  # a level padded to its width stands only behind a time
        if m is None and message.find(" - ", 0, 110) >= 0:
            m = NAMED_PY_LEVEL.match(message)
        if m:
            out.level = m.group("level").lower()
    if origin.rank is None:
        for needle, within, find, level_follows in RANK_MARKS:
            if needle not in (message[:within] if within else message):
                continue
            m = find(message)
            if m is None or (rank := rank_number(m.group("rank"))) is None:
                continue
            origin.rank = rank
            out.rank_from_text = slurm_task is None
            if level_follows and out.level is None and (lv := PY_LEVEL.match(message, m.end())):
                out.level = lv.group("level").lower()
            break
    if slurm_task is not None and origin.rank is None and origin.local_rank is None:
        origin.rank, out.label_rank = slurm_task, True
    if origin.rank is None and origin.local_rank is None and _may_name_device(message):
        m = LEADING_LOCAL_RANK.match(message)
        if m and (local := rank_number(m.group("local"))) is not None:
            origin.local_rank = local
            out.rank_from_text = True
    if message[:1] in RICH_BOX_CHARS:
        message = rich_traceback_line(message)
    # the blanks that end a message go: a terminal's copy pads each line to its width
    # ('StopIteration' then 100 spaces is the exception line all the same); a line of blanks
    # alone stays as it was (inside a traceback, a blank line of its indentation)
    out.text = (message.rstrip() or message) if message[-1:].isspace() else message
    out.prefix = " ".join(prefix_parts)
    return out


RICH_BOX_CHARS = frozenset("│╭╰")
"""The first character of the lines of rich's boxed traceback (rich.traceback.install,
RichHandler(rich_tracebacks=True), Typer)."""
RICH_FRAME = re.compile(r"^(?P<path>\S{1,4000}?):(?P<line>\d{1,9}) in (?P<func>\S{1,400})$")


def rich_traceback_line(message: str) -> str:
    """rich's boxed traceback read as Python's own: its title is the traceback's head, a
    frame's "/path/train.py:42 in main" is 'File "/path/train.py", line 42, in main', the
    code shown under it an indented line, the box's bottom border nothing (the exception
    line below the box is printed as Python prints it)."""
    if message[0] == "╭":
        return TRACEBACK_HEAD_TEXT if "Traceback (most recent call last)" in message else message
    if message[0] == "╰":
        return "" if message.rstrip().endswith("╯") else message
    inner = message[1:].rstrip()
    if not inner.endswith("│"):
        return message
    inner = inner[:-1].strip()
    m = RICH_FRAME.match(inner)
    if m:
        return f'  File "{m["path"]}", line {m["line"]}, in {m["func"]}'
    return "    " + inner if inner else "  "


TRACEBACK_HEAD_TEXT = "Traceback (most recent call last):"
