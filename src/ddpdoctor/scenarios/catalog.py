"""The table of scenarios: which program injects which failure, how it is launched, the
diagnosis a correct analysis must give, and how a report is checked against it. Raw torchrun
programs first, then the same failures written with Accelerate, Lightning and the transformers
Trainer. Running lives in runner.py; nothing here imports torch or a framework."""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Literal

if TYPE_CHECKING:
    from ddpdoctor.model.findings import Report

Launcher = Literal["torchrun", "launch", "python", "accelerate", "lightning"]
"""torchrun: `torchrun --standalone`; launch: the deprecated `python -m torch.distributed.launch`;
python: the program started with plain python, as users do by mistake; accelerate: `accelerate
launch --multi_gpu --num_processes N`; lightning: plain python, Lightning's own launcher starting
the other ranks as children."""

Framework = Literal["accelerate", "lightning", "transformers"]
"""The training framework a program is written with (also the module it imports)."""

PROGRAMS_DIR = Path(__file__).parent / "programs"
CAPTURED_DIR = Path(__file__).parent / "captured"
DEFAULT_SCENARIO = "data-error"


@dataclass(frozen=True, slots=True)
class Scenario:
    """One injected failure and the verdict expected for it."""

    name: str
    title: str
    program: str
    """File name under programs/ (for entrypoint-not-found, a file that does not exist)."""
    expected_kind: str | None
    """None for a healthy run: the verdict names no kind."""
    expected_category: str | None
    expected_culprits: tuple[int, ...] | None
    """Global ranks the verdict must blame; None when the logs cannot tell ranks apart (errors
    raised before torch installs its `[rankN]:` excepthook, or outside any rank)."""
    expected_status: str = "failed"
    """`ok` for the healthy runs (a clean end, an early stop every rank agreed on)."""
    framework: Framework | None = None
    """The framework the program is written with: it must be importable for a real run."""
    expected_fix: str = ""
    """Text the verdict's first fix step must contain: the fix in the framework's own terms."""
    cascade_ranks: tuple[int, ...] = ()
    """Ranks that fail only as a consequence of the root: at least one finding on them must have
    role `cascade`. (Each timeout or closed-connection finding must too, see `mismatches`.)"""
    nproc: int = 2
    launcher: Launcher = "torchrun"
    env: dict[str, str] = field(default_factory=dict)
    args: tuple[str, ...] = ()
    tee: bool = False
    """Run torchrun with `--tee 3 --log-dir`: console lines get `[default0]:` prefixes and each
    rank's stdout/stderr is also kept as a file."""
    sigterm_after_s: float | None = None
    """Send SIGTERM to the launcher this long after the start, as a scheduler does on preemption."""
    occupy_master_port: bool = False
    """Bind the master port before launching, so the rendezvous store cannot listen on it."""
    timeout_s: float = 60.0
    """Outer wall-clock limit; the scenario is killed (process group) past it."""
    gaps: dict[str, str] = field(default_factory=dict)
    """Known gaps of the analysis for this scenario: aspect ("kind", "category", "culprits",
    "cascade") -> what it gets instead. Tests mark these aspects strict xfail."""
    categories_also: tuple[str, ...] = ()
    """Other categories a run may rightly get where what it prints varies with timing: a
    SIGKILLed DataLoader worker is reported by its signal line (host memory) or only by the
    channel it broke, which names no cause."""
    kinds_also: tuple[str, ...] = ()
    """Other kinds a run may get where what it prints varies with timing and the log then
    cannot tell them apart: a rank aborted in a small collective, and the peer terminated
    before it printed where it waited, reads as a rank that left the loop."""
    notes: str = ""
    printed: tuple[str, ...] = ()
    """Texts of which the job's output holds at least one when the fault went as scripted (the
    message of the process that saw it): a run whose output lost them to a race (a rank's
    stderr cut before its exception line, under load) did not do what the scenario scripts and
    is run again."""
    needs: tuple[str, ...] = ()
    """Paths the injection uses (a device file); where one is missing the scenario cannot run."""

    @property
    def missing_needs(self) -> list[str]:
        """The paths in `needs` and the framework this machine lacks: the scenario cannot run
        here (the framework is checked without importing it)."""
        missing = [p for p in self.needs if not Path(p).exists()]
        if self.framework is not None and importlib.util.find_spec(self.framework) is None:
            missing.append(self.framework)
        return missing

    @property
    def expected_label(self) -> str:
        """The expected kind, or what a healthy run is expected to give."""
        return self.expected_kind or f"none ({self.expected_status})"

    @property
    def program_path(self) -> Path:
        return PROGRAMS_DIR / self.program

    @property
    def captured_dir(self) -> Path:
        return CAPTURED_DIR / self.name


SCENARIOS: tuple[Scenario, ...] = (
    Scenario(
        name="data-error",
        title="rank 1 cannot open its data shard; rank 0 times out in all_reduce",
        program="data_error.py",
        expected_kind="data-error",
        expected_category="user-code",
        expected_culprits=(1,),
        cascade_ranks=(0,),
        notes="torchrun names rank 0, the victim, as the root cause: it failed first.",
    ),
    Scenario(
        name="data-error-tee",
        title="data-error run with --tee 3 --log-dir: prefixed console plus per-rank files",
        program="data_error.py",
        tee=True,
        expected_kind="data-error",
        expected_category="user-code",
        expected_culprits=(1,),
        cascade_ranks=(0,),
        notes="Console lines carry [default0]:/[default1]: (local ranks); files in ranks/.",
    ),
    Scenario(
        name="ddp-unused-parameters",
        title="a DDP parameter never used in forward: 'Expected to have finished reduction'",
        program="ddp_unused_parameters.py",
        env={"TORCH_DISTRIBUTED_DEBUG": "INFO"},
        expected_kind="ddp-unused-parameters",
        expected_category="user-code",
        expected_culprits=(0, 1),
        notes="INFO names the parameters; DETAIL segfaults DDP construction on gloo in 2.13.",
    ),
    Scenario(
        name="uncoordinated-exit",
        title="rank 1 stops early on its own and exits 0; rank 0 loses its peer",
        program="uncoordinated_exit.py",
        expected_kind="uncoordinated-exit",
        expected_category="user-code",
        expected_culprits=(1,),
        cascade_ranks=(0,),
        notes="torchrun: Root Cause rank 0; rank 1 exited 0 (<NO_OTHER_FAILURES>) or got SIGTERM.",
    ),
    Scenario(
        name="early-stop",
        title="all ranks agree to stop early, then exit via sys.exit('message') (status 1)",
        program="early_stop.py",
        expected_kind="early-stop",
        expected_category="intended-exit",
        expected_culprits=None,
    ),
    Scenario(
        name="host-oom",
        title="rank 1 is SIGKILLed mid-training, as by the OOM killer",
        program="host_oom.py",
        expected_kind="host-oom",
        expected_category="resource",
        expected_culprits=(1,),
        cascade_ranks=(0,),
    ),
    Scenario(
        name="host-oom-startup",
        title="rank 1 is SIGKILLed while loading, before it joins; rank 0 waits for it",
        program="host_oom.py",
        args=("startup",),
        expected_kind="host-oom",
        expected_category="resource",
        expected_culprits=(1,),
        cascade_ranks=(0,),
        notes="torchrun's summary names rank 0, the rank it terminated, as the root cause.",
    ),
    Scenario(
        name="collective-mismatch-detail",
        title="rank 0 all_reduce vs rank 1 broadcast, TORCH_DISTRIBUTED_DEBUG=DETAIL",
        program="collective_mismatch.py",
        args=("op",),
        env={"TORCH_DISTRIBUTED_DEBUG": "DETAIL"},
        expected_kind="collective-mismatch",
        expected_category="user-code",
        expected_culprits=(0, 1),
    ),
    Scenario(
        name="collective-mismatch-shape",
        title="all_reduce of 4096 floats on rank 0 vs 16 on rank 1 (gloo abort)",
        program="collective_mismatch.py",
        args=("shape",),
        expected_kind="collective-mismatch",
        # when torchrun ends rank 0 before its traceback shows its own all_reduce, the abort is
        # all there is (tests/fixtures/real/victim-terminated-silently)
        kinds_also=("uneven-inputs",),
        expected_category="user-code",
        expected_culprits=(1,),
        cascade_ranks=(0,),
        notes="Rank 1 dies by SIGABRT from gloo::EnforceNotMet; the text has no [rank1]: prefix.",
    ),
    Scenario(
        name="collective-mismatch-op-nodebug",
        title="rank 0 all_reduce vs rank 1 broadcast without debug: only timeouts to see",
        program="collective_mismatch.py",
        args=("op",),
        expected_kind="collective-mismatch",
        expected_category="user-code",
        expected_culprits=(0,),
        notes="No debug output: only timeouts. Their tracebacks name different collectives "
        "(all_reduce on rank 0, broadcast on rank 1), which is the mismatch; with two ranks "
        "split evenly, the main process's side is named (a guess, said with low confidence).",
    ),
    Scenario(
        name="local-rank-argument",
        title="torchrun-style script launched by torch.distributed.launch (--local-rank=N)",
        program="local_rank_argument.py",
        launcher="launch",
        expected_kind="local-rank-argument",
        expected_category="configuration",
        expected_culprits=(0, 1),
    ),
    Scenario(
        name="launcher-env-missing",
        title="a torchrun script started with plain python: KeyError: 'LOCAL_RANK'",
        program="launcher_env_missing.py",
        launcher="python",
        nproc=1,
        expected_kind="launcher-env-missing",
        expected_category="configuration",
        expected_culprits=None,
    ),
    Scenario(
        name="entrypoint-not-found",
        title="torchrun pointed at a training script that does not exist",
        program="no_such_train.py",
        expected_kind="entrypoint-not-found",
        expected_category="configuration",
        expected_culprits=None,
    ),
    Scenario(
        name="dataloader-worker-killed",
        title="rank 1's DataLoader worker dies from SIGBUS (as with a full /dev/shm)",
        program="dataloader_worker_killed.py",
        expected_kind="dataloader-worker-killed",
        expected_category="environment",
        categories_also=("unknown",),  # when only the broken channel is printed (DL103)
        expected_culprits=(1,),
        cascade_ranks=(0,),
        notes="The worker's bus-error message is followed by a NUL byte.",
    ),
    Scenario(
        name="ddp-model-mismatch",
        title="rank 1 of 3 builds a wider layer; DDP's shape check fails",
        program="ddp_model_mismatch.py",
        nproc=3,
        expected_kind="ddp-model-mismatch",
        expected_category="user-code",
        expected_culprits=(1,),
        cascade_ranks=(0,),
    ),
    Scenario(
        name="ddp-mark-ready-twice",
        title="shared block under reentrant checkpointing with find_unused_parameters=True",
        program="ddp_mark_ready_twice.py",
        expected_kind="ddp-mark-ready-twice",
        expected_category="user-code",
        expected_culprits=(0, 1),
    ),
    Scenario(
        name="slow-rank-timeout",
        title="rank 0 preprocesses for 6 s while rank 1 waits in a barrier (3 s timeout)",
        program="slow_rank_timeout.py",
        expected_kind="slow-rank-timeout",
        expected_category="configuration",
        expected_culprits=(0,),
        cascade_ranks=(1,),
    ),
    Scenario(
        name="uneven-inputs",
        title="rank 1 has 6 batches, rank 0 has 8; rank 1 waits in the final barrier",
        program="uneven_inputs.py",
        expected_kind="uneven-inputs",
        expected_category="user-code",
        expected_culprits=(1,),
        cascade_ranks=(0,),
    ),
    Scenario(
        name="process-group-not-initialized",
        title="dist.get_rank() called before init_process_group",
        program="process_group_not_initialized.py",
        expected_kind="process-group-not-initialized",
        expected_category="user-code",
        expected_culprits=None,
        notes="No [rankN]: prefix: torch installs its excepthook in init_process_group.",
    ),
    Scenario(
        name="weights-only-load",
        title="torch.load of a checkpoint holding a custom dataclass (weights_only default)",
        program="weights_only_load.py",
        expected_kind="weights-only-load",
        expected_category="user-code",
        expected_culprits=(0, 1),
    ),
    Scenario(
        name="missing-module",
        title="the script imports apex, which is not installed",
        program="missing_module.py",
        expected_kind="missing-module",
        expected_category="environment",
        expected_culprits=(0, 1),
    ),
    Scenario(
        name="socket-interface",
        title="GLOO_SOCKET_IFNAME names an interface that does not exist",
        program="barrier_only.py",
        env={"GLOO_SOCKET_IFNAME": "eth9"},
        expected_kind="nccl-socket-interface",
        expected_category="configuration",
        expected_culprits=None,
    ),
    Scenario(
        name="rendezvous-port-in-use",
        title="torchrun's master port is already taken by another process",
        program="barrier_only.py",
        occupy_master_port=True,
        expected_kind="rendezvous-failure",
        expected_category="configuration",
        expected_culprits=None,
    ),
)

SCENARIOS += (
    Scenario(
        name="preempted",
        title="the scheduler sends SIGTERM to torchrun in the middle of healthy training",
        program="long_training.py",
        sigterm_after_s=8.0,
        expected_kind="preempted",
        expected_category="intended-exit",
        expected_culprits=None,
    ),
    Scenario(
        name="disk-full-checkpoint",
        title="rank 0 saves a checkpoint onto a full disk (/dev/full); rank 1 loses its peer",
        program="checkpoint_disk_full.py",
        expected_kind="disk-full",
        expected_category="resource",
        expected_culprits=(0,),
        cascade_ranks=(1,),
        needs=("/dev/full",),
        notes="torch.save(path) reports the failed write only as 'unexpected pos N vs M'.",
    ),
    Scenario(
        name="native-crash",
        title="rank 1 dies of SIGSEGV in native code (no Python traceback)",
        program="native_crash.py",
        expected_kind="native-crash",
        expected_category="unknown",
        expected_culprits=(1,),
        cascade_ranks=(0,),
    ),
)

# --------------------------------------------------------------------------- frameworks
# The same failures as users meet them through a framework: each program is one training script
# written with the framework's own idioms; its first argument picks the injected fault.
OFFLINE = {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
"""Nothing is downloaded at run time: the models are built from a config."""


PROGRAMS: dict[Framework, tuple[str, str, Launcher]] = {
    "accelerate": ("accelerate", "accelerate_train.py", "accelerate"),
    "lightning": ("lightning", "lightning_train.py", "lightning"),
    "transformers": ("hf-trainer", "hf_trainer_train.py", "torchrun"),
}
"""Framework -> (scenario name prefix, program, how its users launch it)."""


def _framework(
    framework: Framework,
    fault: str,
    title: str,
    kind: str | None,
    category: str | None,
    culprits: tuple[int, ...] | None,
    *,
    cascade: tuple[int, ...] = (),
    status: str = "failed",
    fix: str = "",
    launcher: Launcher | None = None,
    env: dict[str, str] | None = None,
    gaps: dict[str, str] | None = None,
    notes: str = "",
    categories_also: tuple[str, ...] = (),
    printed: tuple[str, ...] = (),
) -> Scenario:
    """One fault of one framework's program (its first argument names the fault)."""
    prefix, program, usual = PROGRAMS[framework]
    return Scenario(
        name=f"{prefix}-{fault}",
        title=title,
        program=program,
        args=(fault,),
        framework=framework,
        launcher=launcher or usual,
        env={**OFFLINE, **(env or {})},
        expected_status=status,
        expected_kind=kind,
        expected_category=category,
        expected_culprits=culprits,
        expected_fix=fix,
        cascade_ranks=cascade,
        timeout_s=90.0,
        gaps=gaps or {},
        notes=notes,
        categories_also=categories_also,
        printed=printed,
    )


OK = "ok"
FRAMEWORK_SCENARIOS: tuple[Scenario, ...] = (
    _framework(
        "accelerate",
        "healthy",
        "Accelerate: two epochs with evaluation; only accelerate launch's usual warnings",
        None,
        None,
        (),
        status=OK,
    ),
    _framework(
        "accelerate",
        "loss-main-only",
        "Accelerate: the auxiliary loss is added on the main process only",
        "ddp-unused-parameters",
        "user-code",
        (1,),
        fix="DistributedDataParallelKwargs(find_unused_parameters=True)",
        cascade=(0,),
        notes="Rank 1's auxiliary head gets no gradient; the reducer says so on rank 1.",
    ),
    _framework(
        "accelerate",
        "gather-in-branch",
        "Accelerate: gather_for_metrics inside `if accelerator.is_main_process`",
        "collective-mismatch",
        "user-code",
        (0,),
        fix="outside `if accelerator.is_main_process:`",
        cascade=(1,),
        notes="Both ranks time out (5 s): rank 0 in the metric's all_gather, rank 1 in the "
        "next epoch's gradient all_reduce.",
    ),
    _framework(
        "accelerate",
        "eval-exception",
        "Accelerate: rank 1's evaluation shard has no labels; its metric divides by zero",
        "python-exception",
        "user-code",
        (1,),
        cascade=(0,),
    ),
    _framework(
        "accelerate",
        "worker-killed",
        "Accelerate: rank 1's DataLoader worker is SIGKILLed (as by the OOM killer)",
        "dataloader-worker-killed",
        "resource",  # a SIGKILL is host memory; a bus error would be /dev/shm (environment)
        (1,),
        cascade=(0,),
        categories_also=("unknown",),  # when only the broken channel is printed (DL103)
        # rank 1's report of its worker, or the channel the worker broke (DL103); under load
        # rank 1's stderr was seen cut before either (1 run in 16 two at a time: fixtures
        # accelerate-worker-killed-cut-in-queue, -lost-stderr)
        printed=("DataLoader worker (pid", "ConnectionResetError: [Errno 104]"),
    ),
    _framework(
        "accelerate",
        "sigkill",
        "Accelerate: rank 1 is SIGKILLed at step 3 (as by the OOM killer)",
        "host-oom",
        "resource",
        (1,),
        cascade=(0,),
    ),
    _framework(
        "accelerate",
        "checkpoint-missing",
        "Accelerate: load_state from node-local disks; the weights were saved on node 0 only",
        "data-error",
        "user-code",
        (1,),
        fix="ProjectConfiguration(save_on_each_node=True)",
        cascade=(0,),
        notes="save_state writes the weights on the main process only (save_on_each_node=False);"
        " node 1's folder holds its RNG state and no model file.",
    ),
    _framework(
        "lightning",
        "healthy",
        "Lightning: three epochs under Lightning's own launcher; only its usual warnings",
        None,
        None,
        (),
        status=OK,
    ),
    _framework(
        "lightning",
        "early-stop",
        "Lightning: EarlyStopping(monitor='val_loss') stops training on every rank, exit 0",
        # nothing failed: a healthy run (the taxonomy's early stop is one the platform saw as
        # a failure only because of how it exited); the verdict says it stopped early
        None,
        None,
        (),
        status=OK,
    ),
    _framework(
        "lightning",
        "unused-parameters",
        "Lightning: an auxiliary head left out of the loss (DDPStrategy's default)",
        "ddp-unused-parameters",
        "user-code",
        (0, 1),
        fix="DDPStrategy(find_unused_parameters=True)",
    ),
    _framework(
        "lightning",
        "sync-dist-in-branch",
        "Lightning under torchrun: self.log(sync_dist=True) under `if trainer.is_global_zero`",
        "collective-mismatch",
        "user-code",
        (0,),
        fix="self.log(..., sync_dist=True) on every rank",
        cascade=(1,),
        launcher="torchrun",
        env={"DDP_TIMEOUT_S": "6"},
        notes="Rank 0 waits in the metric's all_reduce, rank 1 in Lightning's next barrier.",
    ),
    _framework(
        "lightning",
        "eval-exception",
        "Lightning: validation_step raises on rank 1",
        "python-exception",
        "user-code",
        (1,),
        cascade=(0,),
    ),
    _framework(
        "lightning",
        "checkpoint-missing",
        "Lightning: fit(ckpt_path=...) on node-local disks; ModelCheckpoint saved on rank 0 only",
        "data-error",
        "user-code",
        (1,),
        fix="fit(ckpt_path=...) a path every node reads",
        cascade=(0,),
    ),
    _framework(
        "transformers",
        "healthy",
        "transformers Trainer: a short run with evaluation; only the usual warnings",
        None,
        None,
        (),
        status=OK,
    ),
    _framework(
        "transformers",
        "unused-parameters",
        "transformers Trainer: GPT2DoubleHeadsModel on LM only, ddp_find_unused_parameters=False",
        "ddp-unused-parameters",
        "user-code",
        (0, 1),
        fix="TrainingArguments(ddp_find_unused_parameters=True)",
    ),
    _framework(
        "transformers",
        "evaluate-main-only",
        "transformers Trainer: trainer.evaluate() under `if trainer.is_world_process_zero()`",
        "collective-mismatch",
        "user-code",
        (0,),
        fix="trainer.evaluate() / trainer.predict() on every process",
        notes="Rank 1 finished and exited 0; rank 0's gather in evaluate() loses its peer.",
    ),
    _framework(
        "transformers",
        "eval-exception",
        "transformers Trainer: an evaluation example of the wrong length lands on rank 1",
        "python-exception",
        "user-code",
        (1,),
        cascade=(0,),
    ),
    _framework(
        "transformers",
        "sigkill",
        "transformers Trainer: a callback SIGKILLs rank 1 at step 3 (as the OOM killer would)",
        "host-oom",
        "resource",
        (1,),
        cascade=(0,),
    ),
    _framework(
        "transformers",
        "checkpoint-missing",
        "transformers Trainer: resume_from_checkpoint=True with output_dir on node-local disks",
        "data-error",
        "user-code",
        (1,),
        fix="TrainingArguments(save_on_each_node=True)",
        cascade=(0,),
        notes="The Trainer saves on the main process only: node 1's checkpoint-4 holds its RNG "
        "state and no model.",
    ),
)
SCENARIOS += FRAMEWORK_SCENARIOS

BY_NAME: dict[str, Scenario] = {s.name: s for s in SCENARIOS}


def get(name: str) -> Scenario:
    """The scenario called `name`; KeyError lists the known names."""
    try:
        return BY_NAME[name]
    except KeyError:
        known = ", ".join(sorted(BY_NAME))
        raise KeyError(f"unknown scenario {name!r}; known: {known}") from None


ASPECTS = ("status", "kind", "category", "culprits", "cascade", "fix")
"""What is checked of a diagnosis, each on its own so that a known gap hides nothing else."""
SECONDARY_KINDS = frozenset({"nccl-timeout", "nccl-network"})
"""Kinds of the timeout and closed-connection errors: cascades in every scenario that expects
another kind."""


def _culprits_shown(scenario: Scenario, report: Report) -> tuple[int, ...] | None:
    """The expected culprits whose own failure the logs show. Where every rank fails on its
    own (an argument every rank's parser rejects), the launcher may stop a rank before it
    prints (a loaded machine starts them seconds apart): a rank with no finding of the
    expected kind cannot be named, and is not asked for."""
    want = scenario.expected_culprits
    if want is None or len(want) < 2:
        return want
    shown = {r for f in report.findings if f.kind == scenario.expected_kind for r in f.ranks}
    kept = tuple(r for r in want if r in shown)
    return kept or want


def mismatches(scenario: Scenario, report: Report) -> dict[str, str]:
    """Aspect -> how the report differs from what the scenario expects; empty when it agrees."""
    v = report.verdict
    out: dict[str, str] = {}
    if v.status != scenario.expected_status:
        out["status"] = f"status {v.status!r}, expected {scenario.expected_status!r}"
    if v.kind != scenario.expected_kind and v.kind not in scenario.kinds_also:
        out["kind"] = f"kind {v.kind!r} (rule {v.rule}), expected {scenario.expected_kind!r}"
    if v.category != scenario.expected_category and v.category not in scenario.categories_also:
        out["category"] = f"category {v.category!r}, expected {scenario.expected_category!r}"
    want = _culprits_shown(scenario, report)
    if want is not None and sorted(v.culprit.ranks) != sorted(want):
        out["culprits"] = f"culprit ranks {sorted(v.culprit.ranks)}, expected {list(want)}"
    wrong = [
        f"{f.rule} ({f.kind}) on ranks {f.ranks} is {f.role!s}"
        for f in report.findings
        if f.kind in SECONDARY_KINDS
        and f.role != "cascade"
        and scenario.expected_kind not in SECONDARY_KINDS  # unless a timeout is all there is
    ]
    if scenario.cascade_ranks and not any(
        f.role == "cascade" and set(f.ranks) & set(scenario.cascade_ranks) for f in report.findings
    ):
        wrong.append(f"no cascade finding on ranks {list(scenario.cascade_ranks)}")
    if wrong:
        out["cascade"] = "; ".join(wrong)
    if scenario.expected_fix and not (v.fix and scenario.expected_fix in v.fix[0]):
        first = v.fix[0] if v.fix else "none"
        out["fix"] = f"first fix step {first!r}, expected one with {scenario.expected_fix!r}"
    return out
