"""Job facts found in the text besides failures: world size hints, per-rank exits from the
launcher, progress bars. Patterns here run in the same prefilter pass as the rules."""

from __future__ import annotations

import re
import signal
from dataclasses import dataclass

from ddpdoctor.analysis.engine import Distinct
from ddpdoctor.ingest.bounds import count_number, exit_code_number, pid_number, rank_number
from ddpdoctor.ingest.prefixes import LOG_HEADER
from ddpdoctor.ingest.self_rank import (
    DETECTRON2_ANNOUNCEMENT,
    LIGHTNING_ANNOUNCEMENT,
    TORCHVISION_ANNOUNCEMENT,
)
from ddpdoctor.model.evidence import PROMPTS
from ddpdoctor.model.findings import RankExit
from ddpdoctor.rules.launch import (
    RANK_DIED_FROM_SIGNAL,
    RANK_EXITED_WITH_CODE,
    VERTEX_REPLICA_EXIT,
)

VALUE, WRITER = Distinct.VALUE, Distinct.WRITER
MESSAGE_START = (
    "^"
    + LOG_HEADER
    + r"(?:[A-Za-z_][\w.]{0,39}: )?"
    + r"(?:\[[^\[\]\n]{1,40}\]:?\s{1,3}|(?![^|\n]{0,40}(?i:epoch))[^|\[\]\n]{1,40} \| )?"
)
"""Where a program's own words start in a line's text: after the header Python's logging
may leave before them once the line's prefixes are read ("INFO [rank 0] ", "root - INFO - ",
"INFO:__main__:", or a logger's name alone where the level was read: "recsys: "), or a
program's own tag of its writer ("[R0/3] ", "student 1/2 | ", not an epoch's "epoch 3 | ").
Facts that must be a message's first words anchor here, not at the line."""


@dataclass(frozen=True)
class FactPattern:
    name: str
    regex: str
    literal: str
    lines_before: int = 0
    """Raw lines above a hit that job building reads (the summary block around an exit code);
    most facts need none, and copying them for every hit is a measurable part of a scan."""
    distinct: Distinct | None = None
    """What job building reads of this fact, when that is all it reads: the captured values
    (a world size: the largest counts; a transport: that it was named) or the values and the
    writer (NCCL's comm lines map a host's device and pid to a rank, first one wins). The
    scan then hands on only the first line of each, without parsing the repeats: every rank
    prints the same world size and transport, at every communicator's init."""
    text_read: bool = True
    """Job building reads the fact's line (its text, time or writer's key: a launcher's exit,
    a completion, a prompt shown in the report). False: only its captures and its writer's
    origin, and the scan keeps no text, key or time for it (12,596 NCCL comm lines of 10,000
    rank files held 4.8 MiB of them in the parent)."""

    @property
    def compiled(self) -> re.Pattern[str]:
        return _compiled(self.regex)


_CACHE: dict[str, re.Pattern[str]] = {}


def _compiled(regex: str) -> re.Pattern[str]:
    if regex not in _CACHE:
        _CACHE[regex] = re.compile(regex)
    return _CACHE[regex]


NAMED_RANK = r"(?:(?<![A-Za-z])[Rr]ank[ =:]?(?P<named_rank>\d{1,5})\b[^\d\n]{1,12})?"
"""'rank 2 -> ', 'rank 2: ', 'Rank 2 has ': a rank named right before a count, no other number
between them."""


_MAX_END = (
    r"(?:params\.|cfg\.|config\.|args\.)?max_(?:epochs?|steps|iters|iterations|updates)"
    r"|[Mm]ax(?:imum)? (?:number of )?(?:epochs|steps|iterations|iters|updates)"
)
"""A loop's configured end, as it names it when it stops there."""
NOT_ONE_STEP = r"(?! (?:for |on |of )?(?:epoch|step|iter|batch|it\b))"
"""After words that end a training: not when they are one step's or epoch's ('Finished
training it 18/54 of epoch 0', 'finished training epoch 3')."""

FACT_PATTERNS: tuple[FactPattern, ...] = (
    # NCCL INFO comm ... rank 8 nranks 16 (NCCL init.cc)
    FactPattern("world_size", r"\bnranks (?P<n>\d+)", "nranks ", distinct=VALUE),
    FactPattern(
        "nccl_comm",
        # (not the "- Abort COMPLETE" / "Destroy COMPLETE" of a communicator's end: no sign
        # of a healthy job)
        r"comm 0x[0-9a-f]+ rank (?P<rank>\d+) nranks (?P<n>\d+) cudaDev (?P<dev>\d+)"
        r"(?![^\n]{0,300}(?:Abort|Destroy) COMPLETE)",
        " cudaDev ",
        distinct=WRITER,
        text_read=False,
    ),
    FactPattern("world_size", r"\bWORLD_SIZE[=:]\s*(?P<n>\d+)", "WORLD_SIZE", distinct=VALUE),
    # not a comparison that quotes it ("world_size 32 != 4 * 4 * 4": 32 is another count), nor
    # a decimal; a sentence's full stop may follow ("Starting rank=0, seed=0, world_size=2.");
    # DeepSpeed's launcher names it dist_world_size (launch.py: "dist_world_size=2"), not a
    # node's local_world_size
    FactPattern(
        "world_size",
        r"(?:\b|(?<=\bdist_))world[_ ]size\W{1,4}(?P<n>\d+)(?!\d|\.\d)"
        r"(?!\s{0,3}(?:[!=<>]=|[<>*/+-]))",
        "world",
        distinct=VALUE,
    ),
    # Accelerate's notebook_launcher (launchers.py) before it starts the processes: "Launching
    # training on 3 CUDAs." (1.x, the device type's name), "Launching training on 8 GPUs."
    # (0.x), "Launching a training on 8 TPU cores."
    # (a count of processes, not the world's size: they may print no rank, and ranks known
    # to exist but silent read as ranks that left no logs; see JobView.launched_processes)
    FactPattern(
        "launched_processes",
        r"^Launching (?:a )?training on (?P<n>\d{1,6}) (?:[A-Z]{2,5}s|TPU cores)\.$",
        "training on ",
        distinct=VALUE,
    ),
    # a program's own account of its world: "Distributed training with 2 processes",
    # "distributed run on 8 GPUs" (not "training with 4 workers": DataLoader's)
    FactPattern(
        "world_size",
        r"\b[Dd]istributed\b[^\n]{0,30}?\b(?:with|on|across|using) (?P<n>\d{1,6}) "
        r"(?:processes|ranks|GPUs)\b",
        "istributed",
        distinct=VALUE,
    ),
    # Lightning: "Initializing distributed: GLOBAL_RANK: 0, MEMBER: 1/8"
    FactPattern("world_size", r"MEMBER: \d+/(?P<n>\d+)", "MEMBER: ", distinct=VALUE),
    # a DeviceMesh as torch >= 2.6 prints it ("DeviceMesh((dp=2, tp=2), 'cpu', stride=(2, 1))"):
    # its world is the product of its dimensions (job.py)
    FactPattern(
        "mesh_shape",
        r"DeviceMesh\(\((?P<dims>[A-Za-z_]\w{0,40}=\d{1,6}(?:, [A-Za-z_]\w{0,40}=\d{1,6}){0,7})\)",
        "DeviceMesh((",
        distinct=VALUE,
    ),
    # a process announcing the global rank it joins the group as, once per process: Lightning
    # (strategies/ddp.py), detectron2's default_setup, and the init_distributed_mode of
    # torchvision's references and the research code built on it (DETR, DeiT, MAE, DINO):
    # one rank announced by two processes is two launches that took the same ranks
    FactPattern(
        "rank_announced",
        LIGHTNING_ANNOUNCEMENT,
        "GLOBAL_RANK: ",
    ),
    FactPattern(
        "rank_announced",
        DETECTRON2_ANNOUNCEMENT,
        "Rank of current process: ",
    ),
    FactPattern(
        "rank_announced",
        TORCHVISION_ANNOUNCEMENT,
        "distributed init (rank ",
    ),
    # k2/icefall-style logging names rank and world after the caller: "[trainer.py:650] (5/8) "
    FactPattern(
        "world_size",
        r"\[[\w.-]{1,80}:\d{1,6}\] \(\d{1,5}/(?P<n>\d{1,5})\) ",
        "] (",
        distinct=VALUE,
    ),
    # DeepSpeed's launcher (launcher/launch.py) on each node, before it starts the workers: the
    # global ranks of every node's local ranks, in order ("global_rank_mapping=defaultdict(<class
    # 'list'>, {'node1': [0, 1], 'node2': [2]})"), the hosts as the hostfile names them
    FactPattern(
        "rank_mapping",
        r"global_rank_mapping=defaultdict\(<class 'list'>, (?P<map>\{[^\n{}]{1,20000}\})\)",
        "global_rank_mapping=",
        distinct=VALUE,
    ),
    # torchelastic summary block (torch/distributed/elastic/multiprocessing/errors/__init__.py)
    FactPattern("summary_exit", r"^\s*exitcode\s*: (?P<code>-?\d+)", "exitcode", lines_before=5),
    FactPattern("root_cause", r"Root Cause \(first observed failure\)", "Root Cause"),
    # Open MPI's mpirun (help-orterun.txt non-zero-exit): the first process that exited
    # non-zero, "  Process name: [[27014,1],0]" (Open MPI 5 / PRRTE: "[prterun-host-1@1,0]",
    # the MPI_COMM_WORLD rank last), then "  Exit code:    1"
    FactPattern("mpi_exit", r"^\s*Exit code:\s+(?P<code>\d+)\b", "Exit code:", lines_before=2),
    # MPICH's and Intel MPI's Hydra box on a process that ended badly: "=   BAD TERMINATION OF
    # ONE OF YOUR APPLICATION PROCESSES", "=   RANK 6 PID 2447372 RUNNING AT node0009" (MPICH:
    # "=   PID 25872 RUNNING AT node01"), then "=   KILLED BY SIGNAL: 9 (Killed)" or
    # "=   EXIT CODE: 9"
    FactPattern(
        "hydra_exit",
        r"^=\s{1,8}KILLED BY SIGNAL: (?P<signum>\d{1,2})\b",
        "KILLED BY SIGNAL: ",
        lines_before=2,
    ),
    FactPattern(
        "hydra_exit", r"^=\s{1,8}EXIT CODE: (?P<code>\d{1,3})\b", "EXIT CODE: ", lines_before=2
    ),
    # Ray Train's worker table (train/_internal/backend_executor.py): "- (node_id=..., ip=A,
    # pid=N) world_rank=R, local_rank=L, node_rank=K": a worker's lines carry only its pid
    FactPattern(
        "ray_worker",
        r"\(node_id=[0-9a-f]+, ip=(?P<ip>[\d.]{7,15}|[0-9a-f:]{3,39}), pid=(?P<pid>\d+)\) "
        r"world_rank=(?P<rank>\d+), local_rank=(?P<local_rank>\d+)",
        ") world_rank=",
    ),
    # torchelastic api.py: "failed (exitcode: -9) local_rank: 3 (pid: 812917) of binary"
    FactPattern(
        "launcher_exit",
        r"failed \(exitcode: (?P<code>-?\d+)\) local_rank: (?P<local_rank>\d+)",
        "failed (exitcode: ",
    ),
    # torch.multiprocessing.spawn (spawn.py ProcessExitedException): the child's index and code
    FactPattern(
        "launcher_exit",
        r"process (?P<local_rank>\d{1,5}) terminated with exit code (?P<code>\d+)",
        "terminated with exit code",
    ),
    # ... and one that a signal ended: "process 1 terminated with signal SIGABRT"
    FactPattern(
        "launcher_exit",
        r"process (?P<local_rank>\d{1,5}) terminated with signal (?P<signal>SIG[A-Z]{2,6})",
        "terminated with signal SIG",
    ),
    # a launcher stopping the workers still alive after one failed (torchelastic api.py
    # "Sending process 27314 closing signal SIGTERM", spawn.py "Terminating process 16855 via
    # signal SIGTERM"), and spawn's report of the one that raised ("-- Process 0 terminated
    # with the following error:"): together, how many workers that launcher ran at least
    FactPattern(
        "terminated_worker",
        r"Sending process (?P<pid>\d{1,9}) closing signal SIG[A-Z]{3,6}\b",
        "closing signal SIG",
        distinct=VALUE,
    ),
    FactPattern(
        "terminated_worker",
        r"Terminating process (?P<pid>\d{1,9}) via signal SIG[A-Z]{3,6}\b",
        "Terminating process ",
        distinct=VALUE,
    ),
    FactPattern(
        "raised_worker",
        r"-- Process (?P<local_rank>\d{1,5}) terminated with the following error",
        "terminated with the following error",
        distinct=VALUE,
    ),
    # DeepSpeed's launcher (launcher/launch.py sigkill_handler): "[... '--local_rank=1', ...]
    # exits with return code = -11". The command is the one it spawned last (the loop's `cmd`),
    # whichever worker failed: its --local_rank names the failed worker only where it is 0,
    # the node's only process (job.py)
    FactPattern(
        "launcher_exit",
        r"'--local_rank=(?P<last_local_rank>\d{1,5})'(?:[^\]']|'(?!--local_rank=)){0,4000}\] "
        r"exits with return code = (?P<code>-?\d+)",
        "exits with return code = ",
    ),
    # Slurm's srun when a task (a rank, one task per rank) exits non-zero: "srun: error:
    # node12: task 3: Exited with exit code 1" (src/srun/step_launch.c; census)
    FactPattern(
        "launcher_exit",
        r"srun: error: (?P<node>[\w.-]{1,100}): task (?P<rank>\d{1,7}): "
        r"Exited with exit code (?P<code>\d{1,3})",
        "Exited with exit code ",
    ),
    # OpenMPI's mpirun when a rank died of a signal: "mpirun noticed that process rank 3 with
    # PID 4242 on node gpu-ws01 exited on signal 6 (Aborted)." (orte/errmgr; census)
    FactPattern(
        "launcher_exit",
        r"mpirun noticed that process rank (?P<rank>\d{1,7}) with PID \d{1,10} on node "
        r"\S{1,255} exited on signal (?P<signum>\d{1,2})\b",
        "mpirun noticed that process rank",
    ),
    # how the whole job ended, in the batch system's own report at its end: LSF's job report
    # ('Successfully completed.', 'Exited with exit code 130.'), Slurm's seff ('State:
    # COMPLETED (exit code 0)'), a PBS epilogue's resource table ('   Exit Status:        0',
    # NCI Gadi's; PBS adds 256 to a signal: 271 is SIGTERM)
    FactPattern("batch_exit", r"^Successfully completed\.\s*$", "Successfully completed."),
    FactPattern(
        "batch_exit", r"^Exited with exit code (?P<code>\d{1,3})\.\s*$", "Exited with exit code "
    ),
    FactPattern(
        "batch_exit",
        r"^State: [A-Z_]{4,20}(?: [^\n(]{0,40})? \(exit code (?P<code>\d{1,3})\)",
        "(exit code ",
    ),
    FactPattern(
        "batch_exit",
        r"^\s{0,8}Exit Status:\s{2,40}(?P<pbs_code>-?\d{1,3})\s*$",
        "Exit Status:",
    ),
    # Vertex AI's service on a replica (one machine, one rank) whose process failed
    FactPattern(
        "launcher_exit",
        VERTEX_REPLICA_EXIT + r"(?P<code>\d{1,3})\b",
        "exited with a non-zero status of ",
    ),
    # HPE Cray PALS' mpiexec on a rank a signal ended ('x3005c0s31b0n0...: rank 3 died from
    # signal 11 and dumped core'); its exit codes are the next pattern's ('rank 3 exited with
    # code 1')
    FactPattern(
        "launcher_exit", RANK_DIED_FROM_SIGNAL + r"(?P<signum>\d{1,2})\b", "died from signal"
    ),
    # a launcher written in Python that names the global rank of a process that ended
    # (rules/launch.py RANK_EXITED_WITH_CODE: Composer's, homegrown ones)
    FactPattern("launcher_exit", RANK_EXITED_WITH_CODE + r"(?P<code>-?\d{1,3})\b", " with "),
    # how much data a rank says it has ("80 samples, 10 batches of 8 per epoch"): ranks that
    # announce different counts in the same words have uneven inputs. A rank the line names
    # just before the count is the one it counts ("[shard] rank 2 -> 8 batches"), whoever
    # printed it
    FactPattern(
        "data_size",
        NAMED_RANK + r"\b(?P<n>\d{1,9}) (?:micro-?|mini-?)?(?P<unit>batches)\b",
        "batches",
        distinct=WRITER,
    ),
    FactPattern(
        "data_size",
        NAMED_RANK + r"\b(?P<n>\d{1,9}) (?P<unit>samples)\b",
        " samples",
        distinct=WRITER,
    ),
    # ... or as a labelled count of its epoch: "[GPU3] Epoch 0 | Batchsize: 16 | Steps: 3"
    # (PyTorch's DDP tutorial series, copied widely). Plural and with a colon: a counter of
    # where it is ("Step: 5", "step 5") is singular, and one that moves ("Steps: 10", then 20)
    # is dropped by job building (a rank that says several numbers); not a tqdm label's
    # percentage ("Steps: 100%|")
    *(
        FactPattern(
            "data_size",
            # the phase that counts them is part of the unit ("Train steps: 10 Val steps: 4")
            rf"\b(?P<unit>(?:(?:[Tt]rain|[Vv]al|[Vv]alid|[Ee]val|[Tt]est) )?{word}): "
            r"(?P<n>\d{1,9})(?![\d%.])",
            f"{word}: ",
            distinct=WRITER,
        )
        for word in ("Steps", "steps", "Batches", "batches")
    ),
    # how many epochs the run is set to train, as configs and trainers print it at start-up:
    # MMEngine's config dump "train_cfg = dict(by_epoch=True, max_epochs=12, ...)", Lightning's
    # and argparse dumps' "max_epochs=12", transformers' "Num Epochs = 3"; a config table's or
    # dump's "num_epochs  3", "total_epochs: 3", argparse's Namespace(..., epochs=3, ...)
    # (fairseq's Namespace dump: "max_epoch=6", its --max-epoch; PhysicsNeMo's examples count
    # "pseudo epochs" of a fixed sample size: "max_pseudo_epochs: 256"; Flair's ModelTrainer
    # quotes each parameter's value: ' - max_epochs: "5"')
    FactPattern(
        "max_epochs", r"\bmax_epochs?\s?[=:]\s?\"?(?P<n>\d{1,6})\b", "max_epoch", distinct=VALUE
    ),
    FactPattern(
        "max_epochs",
        r"\b(?:num|total|n|train|max_pseudo)_epochs\b(?:\s?[=:]\s?|\s{1,8})(?P<n>\d{1,6})(?![\d.])",
        "_epochs",
        distinct=VALUE,
    ),
    # ... and an argument table's words for it, capitalised and spaced as people print them
    # (thuml's Time-Series-Library: "  Train Epochs:       3        Batch Size: 32", a
    # script's "Total epochs: 2; iters: 60."); not "number of epochs", which Megatron's index
    # builder prints for the passes over the data its samples need
    FactPattern(
        "max_epochs",
        r"\b(?:[Tt]otal|[Tt]rain(?:ing)?|[Mm]ax(?:imum)?) [Ee]pochs\s{0,2}[=:]"
        r"\s{0,24}(?P<n>\d{1,6})(?![\d.])",
        "pochs",
        distinct=VALUE,
    ),
    FactPattern("max_epochs", r"[(,]\s?epochs=(?P<n>\d{1,6})[,)]", "epochs=", distinct=VALUE),
    # a dump of the arguments one per line, as key and value (SwAV's and DINO's
    # "                epochs: 3", a YAML config's "epochs: 3"): the key alone on its line,
    # plural (a progress line names the one epoch it is in: "epoch: 3")
    FactPattern(
        "max_epochs", r"^\s{0,60}epochs\s?[:=]\s?(?P<n>\d{1,6})\s*$", "epochs", distinct=VALUE
    ),
    FactPattern("max_epochs", r"\bNum Epochs = (?P<n>\d{1,6})\b", "Num Epochs = ", distinct=VALUE),
    # mmcv 1.x's runner at start: "workflow: [('train', 1)], max: 12 epochs"
    FactPattern("max_epochs", r"\], max: (?P<n>\d{1,6}) epochs\b", "], max: ", distinct=VALUE),
    # how many optimisation steps the run is set to take: transformers' Trainer banner ("Total
    # optimization steps = 54"), configs' and argparse dumps' "max_steps=1000": a bar that counts
    # to it is the training loop's own, whatever its label (the Trainer's bar has none)
    FactPattern(
        "train_steps",
        r"\bTotal optimization steps = (?P<n>[\d,]{1,12})\b",
        "Total optimization steps",
        distinct=VALUE,
    ),
    FactPattern(
        "train_steps", r"\bmax_steps\s?[=:]\s?(?P<n>\d{1,9})\b", "max_steps", distinct=VALUE
    ),
    # ... and a config dump's total in other names: arcface_torch's ": total_step      48",
    # nanotron's "train_steps: 40", Megatron's "train_iters ..... 320000"
    *(
        FactPattern(
            "train_steps",
            rf"\b{name}\b[ .]{{0,40}}[=:]?\s{{0,4}}(?P<n>\d{{1,9}})\b",
            literal,
            distinct=VALUE,
        )
        for name, literal in (
            ("total_steps?", "total_step"),
            ("(?:num_)?train_steps", "train_steps"),
            ("train_iters", "train_iters"),
            ("total_iters", "total_iters"),
        )
    ),
    # MosaicML Composer's and llm-foundry's configs, a duration in its Time notation: "3ep"
    FactPattern(
        "max_epochs",
        r"\bmax_duration\s?[=:]\s?['\"]?(?P<n>\d{1,6})ep\b",
        "max_duration",
        distinct=VALUE,
    ),
    # where a rank starts or resumes training ("resuming from .../latest.pt at step 20",
    # "no checkpoint ..., starting from step 0", "Starting training from iteration 0"): ranks
    # that start at different points have different numbers of steps left
    *(
        FactPattern(
            "resume_point",
            r"(?i:\b(?:resum\w{0,6}|start\w{0,4}|continu\w{0,5})\b[^\n]{0,120}?\b"
            rf"{prep} (?:global )?(?P<unit>{unit}) (?P<n>\d{{1,9}})\b)",
            f"{prep} {unit} ",
            distinct=WRITER,
        )
        for prep in ("from", "at")
        for unit in ("step", "iteration", "iter", "epoch")
    ),
    # a rank saying it skips a step or a batch ("skipping degenerate batch 5", "step 5: batch
    # has no labelled tokens, skipping", "loss is nan at update 7, skip this batch"): if only
    # it did, it issued fewer collectives
    FactPattern(
        "skipped_step",
        r"(?i:\bskip(?:ping|ped)?\b[^\n]{0,60}\b(?:batch|step|iteration)\b"
        r"|\b(?:batch|step|iteration)\b[^\n]{0,60}\bskipping\b)",
        "kip",
        distinct=WRITER,
    ),
    # ... or that it caught an out-of-memory error and goes on without the batch (fairseq's
    # "attempting to recover from OOM in forward/backward pass")
    FactPattern(
        "skipped_step", r"\b[Rr]ecover(?:ing)? from (?:an? )?OOM\b", "from OOM", distinct=WRITER
    ),
    # a rank saying it dropped part of its data ("dropped 48 documents longer than
    # seq_length", "Filtered 4 prompts longer than prompt_max_len=16", "removed 12 samples
    # without labels"; not "Removed 0 images ..."): filtered per rank, the ranks then hold
    # different amounts
    *(
        FactPattern(
            "data_filtered",
            rf"(?i:\b{verb}(?: out)? [1-9]\d{{0,8}} (?:[\w-]+ ){{0,3}}"
            r"(?:documents?|docs|samples?|examples?|prompts?|sequences?|utterances?|items?"
            r"|images?|rows?|records?|instances?|sentences?|clips?)\b)",
            f"{verb[1:]} ",
            distinct=WRITER,
        )
        for verb in ("dropped", "filtered", "removed", "discarded")
    ),
    # torch.utils.cpp_extension's JIT build: where its extensions live, printed before it takes
    # the build folder's lock (a FileBaton), and the build or the load that follows once it
    # has it; a process whose words stop at the first waits on a lock another process holds,
    # or that a build killed earlier left behind, for ever
    FactPattern(
        "extension_root",
        r"Using (?P<path>\S{1,400}) as PyTorch extensions root\.\.\.",
        "as PyTorch extensions root",
        distinct=WRITER,
    ),
    FactPattern(
        "extension_built",
        r"(?:Building|Loading) extension module (?P<module>[\w.-]{1,200})\.\.\.",
        "extension module ",
    ),
    # ... and NVlabs' custom_ops.get_plugin (StyleGAN2-ADA, StyleGAN3 and the repositories
    # built on them) around that build: 'Setting up PyTorch plugin "bias_act_plugin"... ', then
    # 'Done.' or 'Failed!' on the same line once it is built or loaded; the line left open (or
    # another writer's words after it) is a process still in the build or its lock
    FactPattern(
        "extension_root",
        r'Setting up PyTorch plugin "(?P<module>[\w.-]{1,200})"\.\.\.(?! ?(?:Done\.|Failed!))',
        "Setting up PyTorch plugin ",
        distinct=WRITER,
    ),
    FactPattern(
        "extension_built",
        r'Setting up PyTorch plugin "(?P<module>[\w.-]{1,200})"\.\.\. ?Done\.',
        "Setting up PyTorch plugin ",
    ),
    # a question asked on the terminal ("... will be overwritten. Continue? [y/N] ", wandb's
    # "Enter your choice:", datasets' trust_remote_code prompt): a distributed worker's stdin
    # is no terminal, nobody answers, and the process waits there for ever
    *(
        # escaped for Python and rg alike (re.escape's "\ " for a space is not valid for rg)
        FactPattern("prompt", re.escape(literal).replace("\\ ", " "), literal, distinct=WRITER)
        for literal in PROMPTS
    ),
    # nvidia-smi's process table, one row per process holding memory on a GPU: "|    0
    # 31408      C   /usr/bin/python3.6      731MiB |" (drivers with MIG columns put "N/A  N/A"
    # before the pid; a paste may cut the row after the name): which GPUs each process has a
    # context on
    FactPattern(
        "gpu_process",
        r"^\|\s{1,12}(?P<gpu>\d{1,2})\s{1,12}(?:N/A\s{1,8}N/A\s{1,8})?(?P<pid>\d{1,9})\s{1,12}"
        r"(?:C|G|C\+G)\s{1,12}\S[^|\n]{0,200}?(?:\s\d{1,7}MiB\s{0,8}\|)?\s{0,8}$",
        "|  ",
        distinct=VALUE,
    ),
    # c10d's wait for a rank's key while the default process group forms (gloo publishes each
    # rank's address under /default_pg/<n>//cpu//<device>/<rank>; a subgroup's keys carry its
    # own name after the default group's): "DistStoreError: wait timeout after 15000ms, keys:
    # /default_pg/0//cpu//0/4": rank 4's address never came
    FactPattern(
        "pg_wait_rank",
        r"wait timeout after \d{1,9}ms, keys: /default_pg/\d{1,5}//[a-z]{3,4}//\d{1,5}/"
        r"(?P<rank>\d{1,7})\b",
        "keys: /default_pg/",
        distinct=VALUE,
    ),
    # NCCL net.cc: which transport NCCL uses between nodes
    FactPattern("socket_transport", r"NET/Socket : Using", "NET/Socket : Using", distinct=VALUE),
    FactPattern("ib_transport", r"NET/IB : Using", "NET/IB : Using", distinct=VALUE),
    # ... and the interfaces NCCL's bootstrap or socket transport took, where one of them does
    # not reach other nodes: the loopback, a container's or a bridge's virtual interface, a
    # link-local address ("Bootstrap : Using [0]ens5:172.31.44.19<0> [1]veth3c1d9a2:fe80::...")
    FactPattern(
        "local_socket_iface",
        r"(?:Bootstrap|NET/Socket) : Using [^\n]{0,600}?\[\d{1,2}\](?P<ifname>lo|veth\w{0,20}"
        r"|docker\d{0,3}|br-\w{1,20}|virbr\d{0,3}|cni\d{0,3}|flannel[\w.]{0,10}|cali\w{1,20}"
        r"|[\w.-]{1,20}(?=:(?:fe80:|169\.254\.))):",
        " : Using [",
        distinct=VALUE,
    ),
    # NCCL param.cc: the job asked for InfiniBand/RoCE devices by name ("NCCL INFO NCCL_IB_HCA
    # set to mlx5_0:1,mlx5_1:1", older "set by environment to"): IB was meant to be used
    FactPattern(
        "ib_requested",
        r"NCCL_IB_HCA set (?:by environment )?to \S",
        "NCCL_IB_HCA set",
        distinct=VALUE,
    ),
    # NCCL transport.cc: a ring or channel connected over the network ("Ring 00 : 0 -> 8
    # [receive] via NET/Socket/0", "Channel 00/0 : 7[7] -> 8[0] [send] via NET/IB/0/GDRDMA").
    # Ranks on one node connect by P2P or SHM: this connection crosses nodes.
    FactPattern("net_channel", r"\[(?:send|receive)\] via NET/", "] via NET/", distinct=VALUE),
    # ... and one connected GPU to GPU inside a node ("Channel 00 : 0[1000] -> 1[21000] via
    # P2P/IPC", "Channel 00/0 : 0[0] -> 1[1] via P2P/CUMEM/read"): NCCL got as far as
    # peer-to-peer. Channel 00's line only: each rank prints one per channel (32 and more)
    FactPattern(
        "p2p_transport",
        r"Channel 00(?:/\d+)? : [^\n]{0,80}? via P2P/",
        "Channel 00",
        distinct=VALUE,
    ),
    # the end of training as frameworks announce it (Lightning, HF Trainer, scripts)
    FactPattern(
        "completed",
        r"`Trainer\.fit` stopped: `max_(?:epochs|steps)=\d+` reached",
        "` stopped: `max_",
    ),
    FactPattern(
        "completed", r"Training completed\. Do not forget to share your model", "Training completed"
    ),
    # transformers Trainer's last log line; 5.x prints the values as strings ('0.1328')
    FactPattern("completed", r"'train_runtime': '?[\d.]+", "'train_runtime'"),
    FactPattern("completed", r"Training complete", "Training complete"),
    FactPattern("completed", r"training complete", "training complete"),
    # not Ray Tune's "Training finished iteration 2 at <time>" (one iteration's report)
    FactPattern("completed", r"Training finished(?! iteration)", "Training finished"),
    # not one step's or epoch's (facebookresearch/dlrm's progress line "Finished training it
    # 18/54 of epoch 0, 41.20 ms/it, loss 0.563", "Finished training epoch 3")
    FactPattern(
        "completed",
        r"Finished training" + NOT_ONE_STEP,
        "Finished training",
    ),
    # the same words as a message's lower-case start ("finished training, best loss 0.31")
    FactPattern(
        "completed", MESSAGE_START + r"finished training" + NOT_ONE_STEP, "finished training"
    ),
    FactPattern("completed", r"training finished", "training finished"),
    # the same in a sentence: ESPnet's trainer after its epoch loop, "The training was finished
    # at 3 epochs"; "Training is done.", "training has completed", PyTorch's tensor-parallel
    # examples' "2D training successfully completed!"; not one epoch's ("training is finished
    # for epoch 3")
    *(
        FactPattern(
            "completed",
            rf"\b[Tt]raining {verb} (?:finished|completed|complete|done)\b"
            r"(?! (?:for |of |with )?(?:the |this )?(?:epoch|step|iter|batch|stage|phase))",
            f"raining {verb} ",
        )
        for verb in ("was", "is", "has been", "has", "successfully")
    ),
    # Kaldi's and ESPnet's job wrappers (utils/run.pl, queue.pl, slurm.pl) end the job's log
    # with its exit code: "# Ended (code 0) at Fri Dec  4 04:16:23 UTC 2026, elapsed time 9
    # seconds". Code 0: the job ran to its end
    FactPattern("completed", r"^# Ended \(code 0\) at ", "# Ended (code 0) at "),
    # the message's own words (after a "[Rank 0] " tag DeepSpeed's log_dist keeps), not one
    # epoch's "epoch 3 training done" nor "Training done for epoch 22" (PyTorch's RPC
    # parameter-server example, after each epoch)
    FactPattern(
        "completed",
        MESSAGE_START + r"(?:\[Rank \d+\] )?[Tt]raining done\b"
        r"(?! (?:for |of |with )?(?:the |this )?(?:epoch|step|iter|batch|stage|phase))",
        "raining done",
    ),
    # a loop that says it stops because it reached its configured end: "Terminating training
    # after reaching params.max_epochs ..." (FourCastNet's), "Stopping training after
    # reaching max_steps", "Reached max_steps (5000), stopping", "Maximum number of epochs
    # reached." (a message's own start or end: not "training will stop after reaching max_steps")
    FactPattern(
        "completed",
        MESSAGE_START + r"(?:Terminating|Stopping|Ending|Finishing) training after reaching\b",
        " training after reaching",
    ),
    FactPattern(
        "completed",
        MESSAGE_START + r"[Rr]eached (?:the )?(?:" + _MAX_END + r")\b",
        "eached ",
    ),
    FactPattern(
        "completed",
        r"\b(?:" + _MAX_END + r") (?:has been |was )?reached[.!]?\s*$",
        " reached",
    ),
    # a job runner's word that every replica exited 0: TorchX's CLI ("torchx ... INFO     Job
    # finished: SUCCEEDED", torchx/cli/cmd_run.py), SkyPilot's ("Job finished (status:
    # SUCCEEDED).")
    FactPattern("completed", r"\bJob finished:? \(?(?:status: )?SUCCEEDED\b", "Job finished"),
    # the SageMaker training toolkit after the user's script exited 0 (sagemaker_training/
    # trainer.py: "sagemaker-training-toolkit INFO     Reporting training SUCCESS")
    FactPattern("completed", r"\bReporting training SUCCESS\b", "Reporting training SUCCESS"),
    # Determined's agent and master once the trial's container exited 0 (every process in it:
    # its first process is the launch layer, which exits with the worst of its workers)
    FactPattern(
        "completed",
        r"\bresources exited successfully with a zero exit code\b",
        "resources exited successfully",
    ),
    # DeepSpeed launcher/launch.py, for each worker that exited 0
    FactPattern("completed", r"Process \d+ exits successfully\.", "exits successfully"),
    # the last line of FourCastNet's train.py and the weather models built on it (Makani,
    # ACE/fme, ClimaX-era scripts): logging.info('DONE ---- rank %d' % world_rank) after
    # trainer.train() returned
    FactPattern("completed", MESSAGE_START + r"DONE ---- rank \d{1,6}$", "DONE ---- rank "),
    # MONAI's tutorials and the segmentation scripts copied from them, after the epoch loop:
    # print(f"train completed, best_metric: {best_metric:.4f} at epoch: {best_metric_epoch}")
    FactPattern(
        "completed", MESSAGE_START + r"train completed, best_metric: ", "train completed, best_"
    ),
    # TorchBeast's monobeast/polybeast (and the IMPALA forks built on it), after its learner
    # threads joined: logging.info("Learning finished after %d steps.", step)
    FactPattern(
        "completed",
        MESSAGE_START + r"Learning finished after \d{1,15} steps\.",
        "Learning finished after ",
    ),
    # a script's own last words: a finishing verb first (the message's first word, after the
    # line's prefix), then how much it did ("finished 61 iters in 5.0s", "done: 30 steps",
    # "completed 3 epochs"); not one epoch's end ("epoch 3 done", "epoch 3 finished: 120
    # steps")
    *(
        FactPattern(
            "completed",
            MESSAGE_START + r"(?:[Ff]inished|[Cc]ompleted|[Dd]one)\b:?\s{1,3}"
            r"(?:training\s{1,3})?"
            rf"\d{{1,9}}\s{{1,3}}{unit}\b",
            f" {unit}",
        )
        for unit in ("iters", "iterations", "steps", "epochs")
    ),
    # a banner or a line that opens with the end of training ("*****End training
    # kitti_models/pointpillar(default)*****", OpenPCDet's; "End of training."): not one
    # epoch's or step's end ("End of training epoch 3")
    *(
        FactPattern(
            "completed",
            MESSAGE_START + r"[*=#>\s-]{0,40}" + words + r"\b"
            r"(?! (?:for |of )?(?:the |this )?(?:epoch|step|iter|batch|stage|phase))",
            words,
        )
        for words in ("End training", "End of training")
    ),
    # a rank's own word that it is done ("rank 0 finished, best val_loss 0.48", "Rank 3:
    # finished.", "[rank 2] done"): not one phase's end ("rank 0 finished epoch 2", "...
    # finished loading").
    # One rank saying so may have left alone: an end of training only when every rank of the
    # world says it (job.py)
    *(
        FactPattern(
            "rank_finished",
            MESSAGE_START
            + r"\[?(?:[Rr]ank|RANK) (?P<rank>\d{1,5})\]?:? (?:has )?"
            + word
            + r"(?:[,.!]|$| in \d| after \d)",
            word,
        )
        for word in ("finished", "done")
    ),
    # torch.multiprocessing.spawn's join, on the first process that ended with an error (it
    # waits on all of them and raises for the first non-zero exit it sees, passing over those
    # that exited 0): "-- Process 1 terminated with the following error:"
    FactPattern(
        "spawn_reported",
        r"-- Process (?P<rank>\d{1,7}) terminated with the following error:",
        "-- Process ",
        distinct=VALUE,
    ),
    # timm's train.py after its epoch loop (and after a Ctrl-C it swallowed):
    # "*** Best metric: 76.3 (epoch 299)"
    FactPattern(
        "completed", r"\*\*\* Best metric: \S{1,40} \(epoch \d{1,9}\)", "*** Best metric: "
    ),
    # NVIDIA DeepLearningExamples' scripts after their epoch loop: dllogger's summary, logged
    # with an empty step ("DLL 2026-12-04 22:48:49.505865 - Summary: train.loss : 0.06623"),
    # then the image-classification main.py's own "Experiment ended"
    FactPattern("completed", r"^DLL [\d-]{10} [\d:.]{8,15} - Summary: ", " - Summary: "),
    FactPattern("completed", MESSAGE_START + r"Experiment ended$", "Experiment ended"),
    # NVlabs' StyleGAN2-ADA / StyleGAN3 training_loop.py after its loop, on rank 0: a blank
    # line, then the bare word (nothing else on the line)
    FactPattern("completed", MESSAGE_START + r"Exiting\.\.\.$", "Exiting..."),
    # fairseq_cli/train.py after its epoch loop: "done training in 6318.4 seconds"
    FactPattern("completed", r"\bdone training in [\d.]{1,12} seconds", "done training in "),
    # YOLOv5 and ultralytics' trainer after its epoch loop (rank 0 only): "\n100 epochs
    # completed in 2.317 hours." (not a `finally:`: a failed run does not print it)
    FactPattern("completed", r"\b\d{1,9} epochs completed in\b", "epochs completed in"),
    # detectron2's IterationTimer.after_train (and its forks'): "Total training time: 0:12:31
    # (0:00:41 on hooks)". The trainer calls after_train in a `finally:`, after an exception
    # too: the end of the loop, an end of training only for a writer that had not failed
    # (analysis/behaviour.py)
    FactPattern(
        "loop_ended",
        r"Total training time: (?:\d{1,9} days?, )?\d{1,2}:\d\d:\d\d",
        "Total training time: ",
    ),
    # torchvision's references/*/train.py and the DETR / DeiT / MAE / ConvNeXt family after
    # their epoch loop: print("Training time {}".format(str(timedelta(seconds=...)))), rank 0
    FactPattern(
        "completed",
        MESSAGE_START + r"Training time (?:\d{1,9} days?, )?\d{1,2}:\d\d:\d\d$",
        "Training time ",
    ),
    # Lightning-AI/litgpt after fit() returned, on rank 0: pretrain's performance block
    # ("| - Training Time : 812.33 s") and finetune's "Training time: 812.33s"
    FactPattern("completed", r"^\| - Training Time : [\d.]{1,12} s$", "| - Training Time : "),
    FactPattern("completed", MESSAGE_START + r"Training time: [\d.]{1,12}s$", "Training time: "),
    # YOLOX's Trainer.after_train, called from a `finally:` around the epoch loop (so after
    # an exception too): "Training of experiment is done and the best AP is 41.25"
    FactPattern(
        "loop_ended",
        r"Training of experiment is done and the best AP is",
        "Training of experiment is done",
    ),
    # PyTorch-Ignite's idist.Parallel.run once the training function returned (rank 0's logger;
    # under its own spawn, the parent's after every process joined): "2024-01-02 10:00:00,123
    # ignite.distributed.launcher.Parallel INFO: End of run". Not an engine's "Engine run
    # finished" (an evaluator prints it after every validation)
    FactPattern(
        "completed",
        r"\bignite\.distributed\.launcher\.Parallel\b[^\n]{0,40}\bEnd of run$",
        "End of run",
    ),
    # Megatron-LM's training loop: "[after training is done] datetime: ..."
    FactPattern("completed", r"\[after training is done\]", "after training is done"),
    # dora's executor (`dora run -d`: audiocraft, demucs) once every worker it started exited 0
    FactPattern(
        "completed",
        r"^(?:Executor: )?All workers completed successfully$",
        "All workers completed successfully",
    ),
    # Spark's TorchDistributor (pyspark/ml/torch/distributor.py) once the training function or
    # script it ran returned: 'Finished local training with 2 processes' (torchrun on the
    # driver), 'Finished distributed training with 4 executor processes' (Spark tasks). A
    # function's failure raises before it; a script's failed torchrun is reported above it
    FactPattern(
        "completed",
        r"\bFinished (?:local|distributed) training with \d{1,6} (?:executor )?process",
        "Finished ",
    ),
    # Snakemake once every job of the workflow finished ("3 of 3 steps (100%) done",
    # snakemake/logging.py's progress): the training rule's command among them exited 0
    FactPattern("completed", r"\b\d{1,9} of \d{1,9} steps \(100%\) done$", "steps (100%) done"),
    # supervisord when the program it runs (the job's launcher) ended with status 0 and its
    # exitcodes count 0 as expected (supervisor/process.py): "exited: train (exit status 0;
    # expected)". Not a stop it was asked for ("stopped: train (terminated by SIGTERM)")
    FactPattern(
        "completed", r"\bexited: \S{1,200} \(exit status 0; expected\)", "exit status 0; expected"
    ),
    # docker compose when a service's container (its command: the node's launcher) ended with
    # code 0: v2's "node0-1 exited with code 0" (pkg/compose/printer.go; the container's name
    # is service-index: compose's own end-to-end test of --abort-on-container-exit expects
    # "should_fail-1 exited with code 123"), v1's "project_node0_1 exited with code 0". A failed
    # one says its code. Set 168's runs are a stand-in's output written to that format, not
    # docker's own
    FactPattern(
        "completed",
        r"(?<![\w.-])[\w.-]{0,200}[-_]\d{1,4} exited with code 0$",
        "exited with code 0",
    ),
    # torchelastic's agent when every worker of the group exited 0 (agent/server/api.py)
    FactPattern(
        "completed",
        r"\] worker group successfully finished",
        "worker group successfully finished",
    ),
    # what torch's atexit handlers log at interpreter exit when its loggers are at INFO
    # (torch/_dynamo/eval_frame.py _log_traced_frames, _dynamo/utils.py, _subclasses/
    # fake_tensor.py dump_cache_stats): the process reached a normal interpreter shutdown,
    # neither killed nor hung (after an uncaught exception too: only with no error read is it
    # a clean end)
    *(
        FactPattern("interpreter_exit", re.escape(literal), literal, distinct=VALUE)
        for literal in (
            "TorchDynamo attempted to trace the following frames: [",
            "TorchDynamo compilation metrics:",
            "FakeTensor cache stats:",
        )
    ),
    # CPython's multiprocessing resource tracker at its own shutdown (resource_tracker.py):
    # "resource_tracker: There appear to be 3 leaked semaphore objects to clean up at
    # shutdown": processes that held them ended without releasing them, killed or stopped from
    # outside (never in a healthy run of the sets' 46 fixtures that print it, nor in the
    # corpus's 4)
    FactPattern(
        "leaked_at_shutdown",
        r"There appear to be \d{1,9} leaked \w{1,20} objects to clean up at shutdown",
        "objects to clean up at shutdown",
        distinct=VALUE,
    ),
    # Ray's log deduplication (ray/_private/ray_logging.py): a line whose pattern other
    # processes printed too (numbers ignored: '[Rank 1]' and '[Rank 3]' are one pattern) is
    # shown once, from one process, with "[repeated 3x across cluster]": the other processes'
    # lines are not in the log, and a rank nobody shows may have printed all of them
    FactPattern(
        "deduplicated",
        r"\[repeated \d{1,9}x across cluster\]",
        "x across cluster]",
        distinct=VALUE,
    ),
    # messages of normal operation (census/messages.jsonl, kind benign: torch, DeepSpeed,
    # Lightning, transformers sources): logs that hold them and nothing worse were read and
    # are healthy as far as they go; logs in which nothing at all is recognised are not "OK"
    *(
        FactPattern("normal", regex, literal, distinct=VALUE)
        for regex, literal in (
            (r"did not find any unused parameters", "did not find any unused parameters"),
            (r"Reducer buckets have been rebuilt", "Reducer buckets have been rebuilt"),
            (r"using best-guess GPU \d+ to perform barrier", "using best-guess GPU "),
            # ... the same notice in torch 2.4-2.6's words
            (
                r"to perform barrier as devices used by this process are currently unknown",
                "to perform barrier as devices used by this process",
            ),
            (r"barrier\(\): using the device under current context", "using the device under"),
            # ... and torch 2.7+'s guess of the device before the first collective
            (
                r"using GPU \d+ as device used by this process is currently unknown",
                "as device used by this process is currently unknown",
            ),
            # the same advice in the words of torch 2.5-2.9 (the space before the backtick is
            # torch's own)
            (r"No device id is provided via `init_process_group` or `barrier", "No device id is "),
            (r"Setting OMP_NUM_THREADS environment variable", "Setting OMP_NUM_THREADS"),
            # OpenMMLab's setup_multi_processes sets MKL's threads the same way
            (r"Setting MKL_NUM_THREADS environment variable", "Setting MKL_NUM_THREADS"),
            # c10d's Utils.hpp when a launcher sets a variable torch 2.2 renamed to TORCH_NCCL_*
            (
                r"Environment variable \w{1,60} is deprecated; use \w{1,60} instead",
                " is deprecated; use ",
            ),
            # c10d's socket.cpp, per address of the host it cannot open (no IPv6 here): it goes
            # on with the next address
            (
                r"The (?:server|client) socket cannot be initialized (?:on|to connect to) ",
                "socket cannot be initialized ",
            ),
            (r"torch\.distributed\.launch is deprecated", "launch is deprecated"),
            (r"Rendezvous complete for workers", "Rendezvous complete for workers"),
            (r"NCCL INFO NCCL version \d", "NCCL INFO NCCL version "),
            (r"DeepSpeed info: version=", "DeepSpeed info: version="),
            (r"Initializing TorchBackend in DeepSpeed", "Initializing TorchBackend"),
            (r"\*{5} Running training \*{5}", " Running training "),
            (r"All distributed processes registered\. Starting", "All distributed processes"),
            (r"Initializing distributed: GLOBAL_RANK: ", "Initializing distributed: "),
            (r"GPU available: True", "GPU available: True"),
            # Ray's start-up (services.py): its object store falls back to /tmp
            (
                r"The object store is using /tmp instead of /dev/shm",
                "The object store is using /tmp instead of /dev/shm",
            ),
            # Lightning's SLURM environment on a node with srun, when the job was not started
            # through it (fabric/plugins/environments/slurm.py): a hint, not a failure
            (
                r"The `srun` command is available on your system but is not used",
                "is available on your system but is not used",
            ),
            # Lightning's logger connector (trainer/connectors/logger_connector/result.py),
            # once per metric logged on epoch level without sync_dist: advice on how a metric
            # is averaged, not a failure
            (
                r"It is recommended to use `self\.log\([^\n]{1,200}sync_dist=True\)` when "
                r"logging on epoch level in distributed setting",
                "when logging on epoch level in distributed setting",
            ),
            # DataParallel's gather of per-GPU scalar losses (torch/nn/parallel/_functions.py)
            (
                r"Was asked to gather along dimension 0, but all input tensors were scalars",
                "Was asked to gather along dimension 0",
            ),
            # DeepSpeed's comm/comm.py: its own backends are not implemented, so it uses
            # torch.distributed's (a warning in older releases, a debug message now)
            (
                r"\b(?:NCCL|MPI|Gloo) backend in DeepSpeed not yet implemented",
                "backend in DeepSpeed not yet implemented",
            ),
            # torch/distributed/algorithms/join.py: Join shadows the collectives of the ranks that
            # ran out of inputs
            (r"Detected uneven input skew of greater than \d", "Detected uneven input skew"),
            # DDP's constructor and _set_static_graph (torch/nn/parallel/distributed.py)
            (
                r"The `check_reduction` argument in `DistributedDataParallel`",
                "`check_reduction` argument",
            ),
            (
                r"`broadcast_buffers` is deprecated\. Use `forward_sync_buffers`",
                "`broadcast_buffers` is deprecated",
            ),
            (
                r"You've set static_graph to be True, no need to set it again",
                "no need to set it again",
            ),
            # c10d's deprecations and notes (torch/distributed/distributed_c10d.py)
            (
                r"_(?:all_gather|reduce_scatter)_base`? is a private function "
                r"and will be deprecated",
                "is a private function and will be deprecated",
            ),
            (
                r"Please specify timeout arg as a timedelta",
                "Please specify timeout arg as a timedelta",
            ),
            (
                r"For MPI backend, world_size \(\d{1,9}\) and rank \(\d{1,9}\) are ignored",
                "For MPI backend, world_size",
            ),
            (
                r"as a ProcessGroup\. This usage is deprecated since PyTorch",
                "This usage is deprecated since PyTorch",
            ),
            (
                r"Device capability of [\w.-]{1,60} unknown, assuming `cpu` and `cuda`",
                "unknown, assuming `cpu` and `cuda`",
            ),
            # FSDP1's notes (torch/distributed/fsdp)
            (r"FSDP is switching to use `NO_SHARD` instead of", "FSDP is switching to use"),
            (
                r"The `NO_SHARD` sharding strategy is deprecated",
                "The `NO_SHARD` sharding strategy is deprecated",
            ),
            (
                r"FSDP\.state_dict_type\(\) and FSDP\.set_state_dict_type\(\) are being",
                "FSDP.set_state_dict_type() are being",
            ),
            (
                r"The passed-in `module` is on CPU and will thus have FSDP's sharding",
                "is on CPU and will thus have FSDP",
            ),
            (
                r"When using ``NO_SHARD`` for ``ShardingStrategy``, full_state_dict will",
                "full_state_dict will",
            ),
            # the DataLoader, DataParallel and torch.cuda.nccl
            (
                r"pin_memory_device is deprecated, the current accelerator will be used",
                "pin_memory_device is deprecated",
            ),
            (r"There is an imbalance between your GPUs", "There is an imbalance between your GPUs"),
            (
                r"PyTorch is not compiled with NCCL support",
                "PyTorch is not compiled with NCCL support",
            ),
            # torch's deprecations printed once by healthy runs: torch.cuda.amp's old spellings,
            # activation checkpointing without use_reentrant, TypedStorage, lr_scheduler order,
            # meshgrid's indexing, read-only numpy arrays, non-full backward hooks, weight_norm
            (
                r"`torch\.cuda\.amp\.(?:GradScaler|autocast|custom_fwd|custom_bwd)"
                r"\(args\.\.\.\)` is deprecated",
                "args...)` is deprecated",
            ),
            (
                r"the use_reentrant parameter should be passed explicitly",
                "use_reentrant parameter should be passed",
            ),
            (
                r"TypedStorage is deprecated\. It will be removed in the future",
                "TypedStorage is deprecated",
            ),
            (
                r"Detected call of `lr_scheduler\.step\(\)` before `optimizer\.step\(\)`",
                "Detected call of `lr_scheduler.step()`",
            ),
            (
                r"torch\.meshgrid: in an upcoming release, it will be required to pass the "
                r"indexing argument",
                "torch.meshgrid: in an upcoming release",
            ),
            (r"The given NumPy array is not writable", "The given NumPy array is not writable"),
            (r"Using a non-full backward hook when ", "Using a non-full backward hook"),
            (
                r"`torch\.nn\.utils\.weight_norm` is deprecated in favor of",
                "weight_norm` is deprecated",
            ),
            # ... torch.compile's TF32 hint, tensor copies and scalars, scheduler.step(epoch)
            (
                r"TensorFloat32 tensor cores for float32 matrix multiplication available but "
                r"not enabled",
                "TensorFloat32 tensor cores for float32",
            ),
            (
                r"To copy construct from a tensor, it is recommended to use sourceTensor\.",
                "To copy construct from a tensor",
            ),
            (
                r"Converting a tensor with requires_grad=True to a scalar may lead to unexpected",
                "requires_grad=True to a scalar",
            ),
            (
                r"The epoch parameter in `scheduler\.step\(\)` was not necessary",
                "The epoch parameter in `scheduler.step()`",
            ),
            # Open MPI's vader BTL (btl_vader_get.c) when CMA is not permitted (a container without
            # SYS_PTRACE): ob1 falls back to copying through shared memory
            (r"Read -\d{1,3}, expected \d{1,12}, errno = \d{1,3}", "Read -1, expected "),
            # Lightning's advice (rank_zero_warn / rank_zero_info)
            (
                r"Consider setting `persistent_workers=True` in '",
                "Consider setting `persistent_workers=True`",
            ),
            (
                r"is smaller than the logging interval Trainer\(log_every_n_steps=",
                "smaller than the logging interval",
            ),
            (
                r"Using `DistributedSampler` with the dataloaders\. During `trainer\.",
                "Using `DistributedSampler` with the dataloaders",
            ),
            (r"`max_epochs` was not set\. Setting it to 1000 epochs", "`max_epochs` was not set"),
            (
                r"You defined a `validation_step` but have no `val_dataloader`",
                "but have no `val_dataloader`",
            ),
            (
                r"Found \d{1,6} module\(s\) in eval mode at the start of training",
                "module(s) in eval mode at the start of training",
            ),
            (
                r"_dataloader`'s sampler has shuffling enabled, it is strongly recommended",
                "sampler has shuffling enabled",
            ),
            (
                r"that has Tensor Cores\. To properly utilize them, you should set "
                r"`torch\.set_float32_matmul_precision",
                "that has Tensor Cores",
            ),
            (
                r"Checkpoint directory [^\n]{1,500} exists and is not empty",
                "exists and is not empty",
            ),
            (r"Tip: For seamless cloud (?:uploads|logging)", "Tip: For seamless cloud"),
            (
                r"Since DeepSpeed handles gradient clipping internally",
                "Since DeepSpeed handles gradient clipping",
            ),
            (
                r"You have specified an optimizer and/or scheduler within the DeepSpeed config",
                "optimizer and/or scheduler within the DeepSpeed config",
            ),
            (
                r"Trying to infer the `batch_size` from an ambiguous collection",
                "from an ambiguous collection",
            ),
            (r"is not supported by the model summary", "is not supported by the model summary"),
            # transformers' notes (logger.warning / warning_once)
            (
                r"(?:`use_cache=True`|Caching) is incompatible with gradient checkpointing",
                "is incompatible with gradient checkpointing",
            ),
            (r"`torch_dtype` is deprecated! Use `dtype` instead!", "`torch_dtype` is deprecated!"),
            (
                r"The tokenizer has new PAD/BOS/EOS tokens that differ from the model config",
                "has new PAD/BOS/EOS tokens",
            ),
            (
                r"`gradient_checkpointing` is deprecated and will be removed in v\d",
                "`gradient_checkpointing` is deprecated",
            ),
            (
                r"Could not estimate the number of tokens of the input, floating-point operations",
                "Could not estimate the number of tokens",
            ),
            (
                r"`loss_type=\w{1,40}` was set in the config but it is unrecognised",
                "was set in the config but it is unrecognised",
            ),
            (
                r"Trainer\.tokenizer is now deprecated\. You should use Trainer\.processing_class",
                "Trainer.tokenizer is now deprecated",
            ),
            # ... a new head for fine-tuning (not the variant 'because the shapes did not match')
            (
                r"Some weights of \w{1,100} were not initialized from the model checkpoint at "
                r"[^\n]{1,500}? and are newly initialized: \[",
                "were not initialized from the model checkpoint at",
            ),
            # accelerate's notes (accelerate/accelerator.py)
            (
                r"`log_with=[^\n`]{1,200}` was passed but no supported trackers are currently "
                r"installed",
                "no supported trackers are currently installed",
            ),
            (
                r"Deleting \d{1,6} checkpoints to make room for new checkpoint",
                "checkpoints to make room for new checkpoint",
            ),
            (
                r"Upcasted low precision parameters in [^\n]{1,300}? because mixed precision "
                r"turned on in FSDP",
                "because mixed precision turned on in FSDP",
            ),
            (
                r"FSDP upcast of low precision parameters may affect",
                "FSDP upcast of low precision parameters",
            ),
            (
                r"Gradient accumulation steps mismatch: GradientAccumulationPlugin has \d",
                "Gradient accumulation steps mismatch",
            ),
            # DeepSpeed's op-builder, config and engine notes
            (
                r"async_io: please install the [\w.-]{1,60} package with \w{1,20}",
                "async_io: please install the",
            ),
            (
                r"If libaio is already installed \(perhaps from source\)",
                "If libaio is already installed",
            ),
            (r"Config parameter \w{1,80} is deprecated", "Config parameter "),
            (
                r"You are using ZeRO with an untested optimizer, proceed with caution",
                "ZeRO with an untested optimizer",
            ),
            (
                r"BF16 gradient accumulation is not safe numerically",
                "BF16 gradient accumulation is not safe numerically",
            ),
        )
    ),
    # tqdm: " 9%|███▊   | 280000/2969526 [29:55<4:48:08, 155.57 examples/s]"
    FactPattern(
        "progress",
        r"(?P<pct>\d{1,3})%\|[^|]*\|\s*(?P<n>\d+)/(?P<total>\d+) \[(?P<elapsed>[\d:]+)<",
        "%|",
    ),
)

SUMMARY_RANK = re.compile(r"^\s*rank\s*: (?P<rank>\d+) \(local_rank: (?P<local>\d+)\)")
SUMMARY_HOST = re.compile(r"^\s*host\s*: (?P<host>\S+)")


SHELL_SIGNALS = frozenset({1, 2, 6, 7, 9, 11, 15})
"""Signals whose 128+N exit code (a shell's, or Python's after a handled SIGTERM) is read as
death by that signal: 137 is SIGKILL, 143 SIGTERM."""


def signal_code(name: str | None) -> int | None:
    """signal_name's inverse for a launcher's signal name: the exit code torchelastic would
    print (SIGABRT -> -6)."""
    if not name:
        return None
    try:
        return -int(signal.Signals[name])
    except KeyError:
        return None


def signal_number_code(number: str | None) -> int | None:
    """The exit code torchelastic would print for a signal a launcher names by number
    (mpirun's 'exited on signal 6' -> -6)."""
    if not number or not number.isdigit() or not 0 < int(number) < 65:
        return None
    return -int(number)


WRAPPED_SIGNALS = frozenset({6, 7, 9, 11, 15})
"""Signals whose 256-N exit code is read as death by that signal: a wrapper process that
passes its child's negative return code on to sys.exit() or exit() (Determined's launch
layer: `sys.exit(proc.wait())`) exits with it modulo 256, so a SIGKILLed child makes it exit
247 and a SIGSEGV 245. Not 255 or 254: a program's own exit(-1) or exit(-2) gives those."""


def signal_name(exit_code: int) -> str | None:
    """The signal an exit code stands for: negative as launchers report it (-9 -> SIGKILL),
    128+N as shells and handlers do (143 -> SIGTERM), or 256-N as a wrapper that exits with
    its child's negative return code does (247 -> SIGKILL)."""
    if exit_code > 128 and exit_code - 128 in SHELL_SIGNALS:
        return signal.Signals(exit_code - 128).name
    if 240 < exit_code < 256 and 256 - exit_code in WRAPPED_SIGNALS:
        return signal.Signals(256 - exit_code).name
    if exit_code >= 0:
        return None
    try:
        return signal.Signals(-exit_code).name
    except ValueError:
        return f"signal {-exit_code}"


MPI_PROCESS = re.compile(
    r"\bProcess name: {0,8}\[(?:\[\d{1,10},\d{1,10}\]|[^\],\s]{1,100}@\d{1,10}),(?P<rank>\d{1,7})\]"
)


def mesh_size(dims: str) -> int | None:
    """The number of ranks of a DeviceMesh's shape 'dp=2, tp=2' (None when it is no count)."""
    size = 1
    for dim in dims.split(", "):
        n = count_number(dim.rpartition("=")[2], 1_000_000)
        if not n:
            return None
        size *= n
    return size if size <= 1_000_000 else None


HYDRA_PROCESS = re.compile(
    r"^=\s{1,8}(?:RANK (?P<rank>\d{1,7}) )?PID (?P<pid>\d{1,10}) RUNNING AT (?P<host>[\w.-]{1,255})"
)
"""The Hydra box's line naming the process (its rank where Intel MPI prints one)."""


def parse_hydra_exit(
    before: list[str], captures: dict[str, str]
) -> tuple[int | None, int | None, str | None, RankExit]:
    """A Hydra box: (rank, pid, host, exit) of the process it names; the exit of a signal as
    launchers report it (-9)."""
    code = signal_number_code(captures.get("signum")) or exit_code_number(captures.get("code"))
    for text in reversed(before[-2:]):
        m = HYDRA_PROCESS.match(text)
        if m:
            pid = pid_number(m.group("pid"))
            signal = signal_name(code) if code else None
            exit_ = RankExit(code=code, signal=signal, host=m.group("host"), pid=pid)
            return rank_number(m.group("rank")), pid, m.group("host"), exit_
    return None, None, None, RankExit(code=code)


def parse_mpi_exit(before: list[str], line: str) -> tuple[int | None, RankExit]:
    """mpirun's "the first process to do so was" block: the rank its process name ends with
    and its exit code; no rank when the line above is not mpirun's process name."""
    m = re.search(r"Exit code:\s+(\d+)", line)
    code = exit_code_number(m.group(1)) if m else None
    for text in reversed(before[-2:]):
        mp = MPI_PROCESS.search(text)
        if mp:
            return rank_number(mp.group("rank")), RankExit(code=code)
    return None, RankExit(code=code)


def parse_summary_entry(before: list[str], line: str) -> tuple[int | None, RankExit]:
    """One entry of torchrun's ChildFailedError summary: rank, host and exit of a worker."""
    rank: int | None = None
    exit_ = RankExit(code=None)
    m = re.search(r"exitcode\s*: (-?\d+)", line)
    if m:
        exit_.code = exit_code_number(m.group(1))
    pid = re.search(r"\(pid: (\d+)\)", line)
    if pid:
        exit_.pid = pid_number(pid.group(1))
    for text in reversed(before[-4:]):
        mr = SUMMARY_RANK.match(text)
        if mr and rank is None:
            rank, exit_.local_rank = rank_number(mr.group("rank")), rank_number(mr.group("local"))
        mh = SUMMARY_HOST.match(text)
        if mh and exit_.host is None:
            exit_.host = mh.group("host")
    if exit_.code is not None:
        exit_.signal = signal_name(exit_.code)
    return rank, exit_


MAX_ELAPSED_PART = 10**6
"""tqdm prints hours unbounded (`1234:05:06`), minutes and seconds below 60; a part beyond this
is not a time (and a sum of huge parts would overflow a float)."""


def elapsed_seconds(text: str) -> float | None:
    """'29:55' or '1:02:03' as seconds; None for anything else."""
    parts = text.split(":")
    if not 1 <= len(parts) <= 3:
        return None
    total = 0
    for part in parts:
        if not (part.isascii() and part.isdigit()) or len(part) > 7:
            return None
        value = int(part)
        if value > MAX_ELAPSED_PART:
            return None
        total = total * 60 + value
    return float(total)
