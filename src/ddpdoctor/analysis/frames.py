"""Python traceback frames around a hit: which frames are the user's own code (not installed
libraries), the place a person should look first."""

from __future__ import annotations

import re

from ddpdoctor.model.evidence import EVALUATION, TRAINING
from ddpdoctor.model.findings import Hit

FRAME = re.compile(r'File "(?P<path>[^"]+)", line (?P<line>\d+), in (?P<func>\S+)')
LIBRARY_PATH = re.compile(r"site-packages|dist-packages|/lib/python\d|<frozen|/torch/|/bin/")


def user_frame(hits: list[Hit]) -> str | None:
    """The deepest traceback frame outside installed libraries: where the user should look."""
    for hit in hits:
        for record in reversed(hit.context):
            m = FRAME.search(record.text)
            if m and not LIBRARY_PATH.search(m.group("path")):
                return f"{m.group('path')}:{m.group('line')} in {m.group('func')}"
    return None


# A resume: torch.load called from a function of the program that loads or restores a
# checkpoint ('load_checkpoint', 'load_train_checkpoint', 'resume_from', 'restore_ckpt'):
# every rank of a data-parallel job reads the same file there (not a shard of its own data).
# The program's own function only: a library's may read a shard per rank (DeepSpeed's
# load_checkpoint reads each rank's own ZeRO optimizer states).
CHECKPOINT_NAME = re.compile(r"(?i)checkpoint|ckpt|resume|restore")
TORCH_LOAD = re.compile(r'torch/serialization\.py", line \d+, in load$')


def in_checkpoint_load(hit: Hit) -> bool:
    """The hit's traceback passes through torch.load, called from the program's own function
    that loads or restores a checkpoint."""
    frames = [m for r in hit.context if (m := FRAME.search(r.text)) is not None]
    loads = any(TORCH_LOAD.search(r.text) for r in hit.context)
    return loads and any(
        CHECKPOINT_NAME.search(m["func"]) and not LIBRARY_PATH.search(m["path"]) for m in frames
    )


# The backward pass: every rank of a data-parallel job runs it each step (DDP's gradient
# all-reduce is issued from inside it), so a rank that raised there was following the program.
IN_BACKWARD = re.compile(r"run_backward|_execution_engine|in backward$|\.backward\(")


def in_backward(hit: Hit) -> bool:
    """The hit's traceback passes through the autograd backward pass."""
    return any(IN_BACKWARD.search(r.text) for r in hit.context)


def in_ddp_forward(hit: Hit) -> bool:
    """The hit's traceback passes through DDP's forward (its buffer broadcast, its pre-forward
    bucket rebuild) or FSDP's pre-forward (the all-gather of the parameters it shards): like
    the backward pass, every rank runs it each training step."""
    return any(
        (m := FRAME.search(r.text)) is not None and _step_forward(m["path"], m["func"])
        for r in hit.context
    )


def _step_forward(path: str, func: str) -> bool:
    return DDP_FORWARD.search(path) is not None or (
        func in FSDP_FORWARD_FUNCS and FSDP_PATH.search(path) is not None
    )


# Which part of a training program a frame belongs to: the evaluation loop (a validation
# step, an evaluate() function, a framework's evaluation loop) or a training step (the
# backward pass, DDP's forward hooks, a train step). Names in torch itself say neither.
# (accelerate's gather_for_metrics gathers an evaluation's predictions: the loop that calls it
# may be named anything, accelerate's own examples call it inside training_function)
EVALUATION_NAME = re.compile(
    r"(?i)valid|evaluat|(?:^|_)eval(?:$|_)|(?:^|_)test_step|predict|_for_metrics$"
    r"|(?:^|_)(?:calc|compute)_metrics?$"
)
TRAINING_NAME = re.compile(r"(?i)(?:^|_)train")
DDP_FORWARD = re.compile(r"torch/nn/parallel/distributed\.py$")
MODULE_CALL = re.compile(r"torch/nn/modules/module\.py$")
FSDP_PATH = re.compile(r"torch/distributed/(?:_composable/)?fsdp/")
FSDP_FORWARD_FUNCS = frozenset(
    {"_pre_forward", "pre_forward", "_pre_forward_unshard", "_root_pre_forward"}
)
"""FSDP1's and FSDP2's hooks before a module's forward, which all-gather its parameters (not
their unshard for a state dict or summon_full_params, which also runs outside any step)."""


def phase(hit: Hit) -> str | None:
    """The phase of the program the hit's traceback was in, by the innermost frame that names
    one: a collective reached from an evaluation loop, or from a training step. A collective
    inside a model's forward (a module's call: ring attention, tensor parallelism, DDP's own)
    that no frame names otherwise is a step of the model, as DDP's forward is."""
    in_model = False
    for record in reversed(hit.context):
        m = FRAME.search(record.text)
        if m is None:
            continue
        path, func = m["path"], m["func"]
        if IN_BACKWARD.search(record.text) or _step_forward(path, func):
            return TRAINING
        if "/torch/" in path:
            in_model = in_model or MODULE_CALL.search(path) is not None
            continue
        if EVALUATION_NAME.search(func):
            return EVALUATION
        if TRAINING_NAME.search(func):
            return TRAINING
    return TRAINING if in_model else None


# A code line that blocks without working: a sleep, or waiting on a lock (a deadlock when the
# holder cannot finish). `ddpdoctor run`'s stacks and a signal handler's traceback read alike.
SLEEP_CALL = re.compile(r"\bsleep\(")
LOCK_CALL = re.compile(r"\.acquire\(|\block\b|\bLock\(", re.IGNORECASE)


def interrupted_line(hit: Hit) -> tuple[str, str] | None:
    """(file:line, code) of the program's own frame a signal handler interrupted, when the
    hit's traceback shows a handler on top of one (a framework's wrapper of the handler is
    not the program; the code is the line printed under the frame)."""
    cut = handler_start(hit)
    if cut is None:
        return None
    for index in range(cut - 1, -1, -1):
        m = FRAME.search(hit.context[index].text)
        if m is None or LIBRARY_PATH.search(m["path"]):
            continue
        code = hit.context[index + 1].text.strip() if index + 1 < cut else ""
        return f"{m['path'].rsplit('/', 1)[-1]}:{m['line']}", code
    return None


# A Python signal handler entered on top of the frame it interrupted: Lightning's SIGTERM
# notifier (signal_connector.py _sigterm_notifier_fn, which even broadcasts), a program's own
# `def handle_sigterm(signum, frame)`. What follows it in a traceback is the handler's work.
SIGNAL_HANDLER = re.compile(
    r"in (?:_?\w*sig(?:nal|term|int|usr\d?)\w*(?:handler|notifier|_fn)\w*|_?handle_sig\w*)$",
    re.IGNORECASE,
)


def handler_start(hit: Hit) -> int | None:
    """Index in the hit's context of the first frame of a signal handler, if one interrupted
    the program there (the frames before it are where the rank was when the signal came)."""
    for index, record in enumerate(hit.context):
        m = FRAME.search(record.text)
        if m and SIGNAL_HANDLER.search(record.text[: m.end()]):
            return index
    return None
