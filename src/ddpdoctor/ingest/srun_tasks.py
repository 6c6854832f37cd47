"""What srun --label's 'K: ' names in one file: a rank where srun started the training
processes itself (`srun python train.py`, SLURM_PROCID is the rank), a node where each task is
a launcher that starts that node's workers (`srun --ntasks-per-node=1 torchrun ...`, the way
torchtitan's and Megatron's multi-node scripts run). There task K's lines are its node's:
its agent's and every local worker's, and the label says nothing of which rank wrote them."""

from __future__ import annotations

import re
from collections import Counter

from ddpdoctor.ingest.prefixes import ParsedLine

HEAD_BYTES = 256 * 1024
"""How much of a file's start is read to decide: the launchers start before any worker prints
and log their start-up there (a hundred nodes' agents print about 3,000 lines)."""

LAUNCHER_UNDER_LABEL = re.compile(
    rb"(?m)^[ \t]{0,6}\d{1,5}: (?:"
    # torchrun's --tee / --role prefix of a worker's line: '0: [default1]:...'
    rb"\[default\d{1,5}\]:"
    # torchrun's agent logging (glog-style since torch 2.2, Python logging's before):
    # 'I1204 23:52:33.180000 28673 torch/distributed/run.py:747] Using nproc_per_node=2.',
    # 'WARNING:torch.distributed.run:', the elastic agent's and its worker-process API's
    # lines; not a worker's traceback frame through @record's wrapper (multiprocessing/errors)
    rb"|[^\n]{0,160}?torch[/.]distributed[/.](?:run(?:\.py:\d|:)|launcher[/.]api"
    rb"|elastic[/.]agent[/.]|elastic[/.]multiprocessing[/.]api(?:\.py:\d|:)))"
)
"""A launcher's own line under an srun label: the task is a launcher, so a node."""


def labels_name_nodes(head: bytes) -> bool:
    """Whether srun's task labels in this file name nodes: a launcher printed under one."""
    return LAUNCHER_UNDER_LABEL.search(head, 0, HEAD_BYTES) is not None


SRUN_TASK_ERROR = re.compile(r"srun: error: (?P<host>[\w.-]{1,200}): tasks? (?P<task>\d{1,5}):")
"""srun's own line on a task that ended badly names the task's node:
'srun: error: node02: task 1: Exited with exit code 1'."""


def node_task_host(task: int) -> str:
    """The name a node gets from its srun task, where the file names it no other way."""
    return f"srun task {task}"


class NodeNames:
    """Each task's node as the file names it: a line under the task's label that names its
    host (NCCL's 'host:pid:tid [dev] NCCL INFO'), else srun's error line on the task. Learned
    while a file is read; its records are renamed once it has been read."""

    __slots__ = ("named", "told")

    def __init__(self) -> None:
        self.named: dict[int, str] = {}
        self.told: dict[int, str] = {}

    def learn(self, parsed: ParsedLine) -> None:
        if parsed.task is not None:
            if parsed.origin.host:
                self.named.setdefault(parsed.task, parsed.origin.host)
        elif parsed.text.startswith("srun: error: "):
            m = SRUN_TASK_ERROR.match(parsed.text)
            if m:
                self.told.setdefault(int(m.group("task")), m.group("host"))

    def renames(self) -> dict[str, str]:
        """Each task's pseudo host to the node's name, where the file gave one."""
        names = {**self.told, **self.named}
        tasks_on = Counter(names.values())
        return {  # not where two tasks would become one node
            node_task_host(task): host for task, host in names.items() if tasks_on[host] == 1
        }


def as_node_task(parsed: ParsedLine) -> ParsedLine:
    """The line of a node's task: the label is not its writer's rank, and names its node.
    Changes the line in place: every parse is a new object, read here before anyone keeps it."""
    if parsed.task is None:
        return parsed
    if parsed.label_rank:
        parsed.origin.rank = None
        parsed.label_rank = False
    parsed.origin.host = parsed.origin.host or node_task_host(parsed.task)
    return parsed
