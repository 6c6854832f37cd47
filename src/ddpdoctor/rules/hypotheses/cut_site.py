"""INF218-INF223, INF228, INF232: where a cut traceback stopped says what the process was
doing when it raised, and for a few places that is nearly what went wrong: selecting its GPU,
importing a module, reading a launcher's variable, waiting for a DataLoader worker, the NCCL
watchdog (a C++ backtrace), writing a checkpoint, putting a loaded checkpoint's tensors on their
device, waiting in main_process_first for the main process. Each is a guess from the place (the
exception's line is missing), worth more than "an exception" and said as one."""

from __future__ import annotations

import re
from dataclasses import dataclass

from ddpdoctor.model.taxonomy import Status
from ddpdoctor.rules.base import Explanation, Rule

FRAME = re.compile(r'^File "(?P<path>[^"]+)", line \d+, in (?P<func>\S+)')

SET_DEVICE = Rule(
    code="INF218",
    kind="device-assignment",
    title="The output ends inside torch.cuda.set_device: the rank's GPU could not be selected",
    signatures=(),
    explanation=Explanation(
        what="A cut traceback whose last frame selects the process's GPU (torch.cuda.set_device).",
        why="set_device fails when the index is not a visible GPU: more processes per node "
        "than GPUs (--nproc-per-node), CUDA_VISIBLE_DEVICES narrowed after the launch, or a "
        "global rank used where the local rank belongs.",
        fix="Give each process its local rank's GPU, with no more processes per node than "
        "visible GPUs.",
        false_positives="Another CUDA error raised during set_device (a broken driver): the "
        "missing exception line would say so.",
    ),
    fix=(
        "torch.cuda.set_device(int(os.environ['LOCAL_RANK'])), with --nproc-per-node at most "
        "the number of GPUs in CUDA_VISIBLE_DEVICES.",
    ),
)

IMPORT = Rule(
    code="INF219",
    kind="missing-module",
    title="The output ends inside an import: a module or its compiled part failed to load",
    signatures=(),
    explanation=Explanation(
        what="A cut traceback whose last frame is an import statement.",
        why="An exception raised by an import is nearly always an ImportError: a package not "
        "installed in the environment the ranks run in, or a compiled extension built for "
        "another torch/CUDA.",
        fix="Install the module in the environment every node runs (the same interpreter as "
        "the launcher's), or rebuild the extension against this torch.",
        false_positives="A module whose own top-level code raised something else while being "
        "imported.",
    ),
    fix=(
        "Run `python -c 'import <module>'` with the interpreter and environment of the job on "
        "each node; install or rebuild what fails.",
    ),
)

LAUNCHER_VARIABLE = Rule(
    code="INF220",
    kind="launcher-env-missing",
    title="The output ends where a launcher's variable (RANK, LOCAL_RANK, ...) is read",
    signatures=(),
    explanation=Explanation(
        what="A cut traceback whose last frame reads RANK, LOCAL_RANK, WORLD_SIZE, "
        "MASTER_ADDR or MASTER_PORT from the environment.",
        why="torchrun and the other launchers set these for each process; a script started "
        "with plain `python`, or by a launcher that sets other names, raises KeyError there.",
        fix="Start it with torchrun (or the launcher the script was written for), or map "
        "your launcher's variables to these names.",
        false_positives="A value that is set but malformed (ValueError on int()).",
    ),
    fix=(
        "Launch with `torchrun --nproc-per-node N script.py`, which sets RANK, LOCAL_RANK, "
        "WORLD_SIZE, MASTER_ADDR and MASTER_PORT for every process.",
    ),
)

DATALOADER_WAIT = Rule(
    code="INF221",
    kind="dataloader-worker-killed",
    title="The output ends where the DataLoader waits for a worker's batch",
    signatures=(),
    explanation=Explanation(
        what="A cut traceback that stands in the DataLoader fetching a batch from its worker "
        "processes (_try_get_data), or below it only in the queue they hand batches through "
        "(its get, the pipe, the batch's unpickling).",
        why="That frame raises when a worker died (the OOM killer, a bus error on a full "
        "/dev/shm, a crash in the dataset code) or did not answer within the DataLoader's "
        "timeout.",
        fix="Find what killed the worker: dmesg for the OOM killer, `df -h /dev/shm`; run "
        "with num_workers=0 once to see the dataset's own error.",
        false_positives="A worker that raised an ordinary exception re-raises it from another "
        "frame (_process_data), not this one.",
    ),
    fix=(
        "Check dmesg on the node for killed processes and `df -h /dev/shm`; lower num_workers "
        "or give the container more shared memory (docker --shm-size).",
        "Run once with num_workers=0: a dataset error then shows directly.",
    ),
)

WATCHDOG = Rule(
    code="INF222",
    kind="nccl-timeout",
    title="The output ends in the NCCL watchdog's backtrace: a collective timed out or failed",
    signatures=(),
    explanation=Explanation(
        what="A cut C++ backtrace raised from ProcessGroupNCCL's watchdog thread "
        "(ncclCommWatchdog), the error line before it missing.",
        why="The watchdog raises when a collective ran past the process group's timeout or "
        "failed asynchronously; the exception ends the process (SIGABRT). A rank that is "
        "busy elsewhere (saving, evaluating alone) or gone makes the others wait that long.",
        fix="Find what the slowest rank was doing at that time; if it was legitimately busy "
        "(saving a full checkpoint), raise the timeout or make that work collective.",
        false_positives="An NCCL error (a network fault) caught by the watchdog ends the "
        "same way: the missing line above the frames says which.",
    ),
    fix=(
        "Read the other ranks' last lines at that time: a rank still saving or evaluating "
        "alone is the cause; init_process_group(timeout=timedelta(minutes=...)) if that work "
        "is legitimately long.",
    ),
)

CHECKPOINT_SAVE = Rule(
    code="INF223",
    kind="disk-full",
    title="The output ends inside a large write (a checkpoint, a dataset's cache): writing failed",
    signatures=(),
    explanation=Explanation(
        what="A cut traceback whose last frame writes a checkpoint (torch.save, a framework's "
        "save_checkpoint or checkpoint engine) or a dataset's cache file (Hugging Face "
        "datasets' Arrow writer, under map() or save_to_disk()).",
        why="A checkpoint, and a tokenised dataset's cache, are the largest writes most jobs "
        "make: a full disk, a quota or a failing network filesystem fails there first, long "
        "after the job started fine.",
        fix="Check the space, quota and permissions of the folder written on that node (the "
        "checkpoint folder; datasets' cache, ~/.cache/huggingface/datasets or HF_DATASETS_CACHE); "
        "free space or write elsewhere, keep fewer checkpoints.",
        false_positives="An object that cannot be pickled, a rank that ran out of memory "
        "gathering a full state dict, or a dataset value Arrow cannot convert: the missing "
        "exception line would say so.",
    ),
    fix=(
        "Run `df -h <dir>` and `quota -s` on the node for the folder written (checkpoints, or "
        "HF_DATASETS_CACHE for a dataset's cache); free space or point it to a filesystem with "
        "room (save_total_limit to keep fewer checkpoints).",
    ),
)

MAIN_PROCESS_FIRST = Rule(
    code="INF228",
    kind="slow-rank-timeout",
    title="The output ends inside main_process_first: the ranks waited for the main process",
    signatures=(),
    explanation=Explanation(
        what="A cut traceback that passes through transformers' or accelerate's "
        "main_process_first (the barrier that lets the main process tokenise or download "
        "first while the other ranks wait).",
        why="The other ranks wait in that barrier until the main process finishes its work; "
        "work longer than the process group timeout (30 minutes by default) makes their "
        "barrier time out while the main process is still busy.",
        fix="Prepare the dataset once before the distributed run (or cache it), or raise the "
        "timeout (TrainingArguments(ddp_timeout=...), init_process_group(timeout=...)).",
        false_positives="Another error raised inside the block (the main process's own "
        "failure while tokenising): its missing line would say so.",
    ),
    fix=(
        "Tokenise and cache the dataset in a separate single-process step, then train from "
        "the cache; or raise the timeout (HF: --ddp_timeout 7200).",
    ),
)

CHECKPOINT_RESTORE = Rule(
    code="INF232",
    kind="checkpoint-load-device",
    title="The output ends where torch.load puts a checkpoint's tensors on their device",
    signatures=(),
    explanation=Explanation(
        what="A cut traceback whose last frame is torch.load restoring a tensor's storage "
        "onto the device it was saved from (persistent_load, restore_location, "
        "_cuda_deserialize, validate_cuda_device).",
        why="Without map_location, torch.load puts every tensor back on the GPU it was saved "
        "from: every rank loads onto cuda:0 (out of memory there, or busy), or onto a GPU "
        "index this machine or this process does not have, or onto CUDA where none is "
        "available. The file was already read: it is the device placement that fails.",
        fix="Load with map_location: the rank's own device "
        "(torch.load(path, map_location=f'cuda:{local_rank}')) or 'cpu', then move the model.",
        false_positives="A checkpoint whose bytes are corrupt fails in the same frames: the "
        "missing exception line would say so.",
    ),
    fix=(
        "torch.load(path, map_location='cpu') (or f'cuda:{local_rank}') on every rank, then "
        "load_state_dict and move the model to the rank's device.",
    ),
)

LAUNCHER_WAIT = Rule(
    code="INF236",
    kind="hang",
    title="The output ends in the launcher waiting for its workers: they were still running",
    signatures=(),
    status=Status.HUNG,
    explanation=Explanation(
        what="A cut traceback of the launcher itself, whose last frames wait for its worker "
        "processes to end (torch.distributed.launch's process.wait(), the elastic agent's "
        "monitoring sleep, torch.multiprocessing.spawn's join).",
        why="A launcher prints its own traceback when it is stopped (Ctrl-C, a scheduler's "
        "signal) while it waits: its workers had not ended by then. After the last step "
        "of training that is a job that did not exit (a hang in teardown: "
        "destroy_process_group, a logger's upload, a worker process left behind); during "
        "training, workers that were stuck or still busy.",
        fix="Find where the workers were: their own logs' last lines, or their stacks "
        "(`py-spy dump --pid <worker pid>`, or run the job under `ddpdoctor run`, which dumps "
        "them when progress stops).",
        false_positives="A launcher stopped on purpose while healthy workers still ran.",
    ),
    fix=(
        "Look at the workers, not the launcher: the last lines each rank printed, or `py-spy "
        "dump --pid <pid>` of each worker while it is stuck; if training had finished, make "
        "every rank leave together (a barrier, then destroy_process_group()) and close the "
        "loggers it started.",
    ),
)

RULES = (
    SET_DEVICE,
    IMPORT,
    LAUNCHER_VARIABLE,
    DATALOADER_WAIT,
    WATCHDOG,
    CHECKPOINT_SAVE,
    MAIN_PROCESS_FIRST,
    CHECKPOINT_RESTORE,
    LAUNCHER_WAIT,
)

WATCHDOG_FRAME = re.compile(r"ncclCommWatchdog|watchdogHandler")


def native_site_rule(where: str, tail: tuple[str, ...]) -> Rule | None:
    """A C++ backtrace raised from the NCCL watchdog: its header names the function."""
    return WATCHDOG if any(WATCHDOG_FRAME.search(t) for t in (where, *tail)) else None


IMPORT_STATEMENT = re.compile(r"^(?:from\s+[\w.]+\s+)?import\s+[\w.]")
SAVE_CALL = re.compile(r"\btorch\.save\(|\bsave_checkpoint\(|\bcheckpoint_engine\.save\(")
SAVE_FUNCS = frozenset(("save", "_save", "_open_zipfile_writer", "_with_file_like"))
RESTORE_FUNCS = frozenset(
    (
        "persistent_load",
        "load_tensor",
        "restore_location",
        "default_restore_location",
        "_cuda_deserialize",
        "validate_cuda_device",
    )
)
"""torch/serialization.py's frames that put a loaded storage on its device (torch 0.4-2.x)."""
LAUNCHER_ENV = re.compile(
    r"environ\s*\[\s*['\"](?:RANK|LOCAL_RANK|WORLD_SIZE|MASTER_ADDR|MASTER_PORT)['\"]\s*\]"
)


@dataclass(frozen=True, slots=True)
class Site:
    """The last whole frame of a cut traceback and the code line printed under it."""

    path: str
    func: str
    code: str


def last_site(tail: tuple[str, ...]) -> Site | None:
    """The last whole frame and its code ('' when the paste ends right after the frame)."""
    for i in range(len(tail) - 1, -1, -1):
        m = FRAME.match(tail[i])
        if m:
            code = tail[i + 1] if i + 1 < len(tail) and not tail[i + 1].startswith("File ") else ""
            return Site(m["path"], m["func"], code)
    return None


LAUNCHERS = re.compile(
    r"torch/distributed/(?:launch|run)\.py$|torch/distributed/elastic/agent/server/api\.py$"
    r"|torch/multiprocessing/spawn\.py$"
)
"""The launchers' own modules: torch.distributed.launch and torchrun, the elastic agent that
monitors the workers, torch.multiprocessing.spawn (mp.spawn's join)."""
WORKER_SIDE = frozenset(("_wrap",))
"""Launcher-module frames that run inside a worker: spawn.py's _wrap calls the worker's
function (under a fork start method a worker's own traceback passes through it)."""
WAIT_FUNCS = frozenset(
    ("wait", "_wait", "_try_wait", "waitpid", "join", "sleep", "select", "poll", "_monitor_workers")
)


def _launcher_waiting(site: Site, tail: tuple[str, ...]) -> bool:
    """The last frame waits (process.wait, os.waitpid, a join, the agent's sleep) inside a
    launcher's own frames: the launcher was waiting for workers that had not ended."""
    waits = site.func in WAIT_FUNCS or re.search(r"\b(?:wait|waitpid|join|sleep)\(", site.code)
    if not waits:
        return False
    return any(
        (m := FRAME.match(line))
        and m["func"] not in WORKER_SIDE
        and LAUNCHERS.search(m["path"].replace("\\", "/"))
        for line in tail
    )


QUEUE_PLUMBING = re.compile(
    r"/multiprocessing/(?:queues|connection|reduction|resource_sharer|synchronize)\.py$"
    r"|torch/multiprocessing/reductions\.py$"
)
"""The queue a DataLoader's workers hand their batches through, below its _try_get_data: the
get, the pipe's poll and recv, the unpickling of the batch's shared tensors."""


def _waiting_for_a_batch(tail: tuple[str, ...]) -> bool:
    """The cut traceback stands in the DataLoader's _try_get_data, or below it only in the
    queue its workers hand batches through (a cut during the queue's get or the batch's
    unpickling): the main process was waiting for a worker's batch."""
    frames = [m for line in tail if (m := FRAME.match(line))]
    for index, frame in enumerate(frames):
        path = frame["path"].replace("\\", "/")
        if frame["func"] == "_try_get_data" and "torch/utils/data" in path:
            deeper = frames[index + 1 :]
            return all(QUEUE_PLUMBING.search(f["path"].replace("\\", "/")) for f in deeper)
    return False


def site_rule(tail: tuple[str, ...]) -> Rule | None:
    """The place's rule, if the last frame (or the code that called into it) is one of them."""
    site = last_site(tail)
    if site is None:
        return None
    if _launcher_waiting(site, tail):
        return LAUNCHER_WAIT
    if site.func == "set_device" or "_cuda_setDevice" in site.code:
        return SET_DEVICE
    if IMPORT_STATEMENT.match(site.code):
        return IMPORT
    in_os = site.func == "__getitem__" and re.search(r"(?:^|[</ ])os(?:\.py|>)$", site.path)
    if LAUNCHER_ENV.search(site.code) or (in_os and any(LAUNCHER_ENV.search(t) for t in tail)):
        return LAUNCHER_VARIABLE
    if _waiting_for_a_batch(tail):
        return DATALOADER_WAIT
    if any("main_process_first" in t for t in tail):
        return MAIN_PROCESS_FIRST
    if _restoring(site, tail):
        return CHECKPOINT_RESTORE
    in_torch_save = site.func in SAVE_FUNCS and site.path.endswith("serialization.py")
    if in_torch_save or SAVE_CALL.search(site.code) or _writing_cache(site, tail):
        return CHECKPOINT_SAVE
    return None


CACHE_WRITER_FUNCS = frozenset(("write", "write_batch", "write_table", "write_examples_on_file"))


def _writing_cache(site: Site, tail: tuple[str, ...]) -> bool:
    """Hugging Face datasets' Arrow writer writing rows to its cache file: its own frame last,
    or pyarrow's file writer (ipc.pxi, a compiled frame) called from it."""
    path = site.path.replace("\\", "/")
    if path.endswith("datasets/arrow_writer.py"):
        return site.func in CACHE_WRITER_FUNCS
    if not path.startswith("pyarrow/"):
        return False
    for line in tail:
        m = FRAME.match(line)
        if m and m["path"].replace("\\", "/").endswith("datasets/arrow_writer.py"):
            return m["func"] in CACHE_WRITER_FUNCS
    return False


def _restoring(site: Site, tail: tuple[str, ...]) -> bool:
    """The last frame is torch's own code (serialization.py, or _utils.py where a storage is
    moved to its GPU) under one of torch.load's restore frames."""
    path = site.path.replace("\\", "/")
    if not path.endswith(("torch/serialization.py", "torch/_utils.py")):
        return False
    for line in tail:
        m = FRAME.match(line)
        if m and m["path"].endswith("serialization.py") and m["func"] in RESTORE_FUNCS:
            return True
    return False
