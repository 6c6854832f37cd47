"""Fallback and lifecycle rules: any uncaught Python exception, announced early stops, and the
teardown warnings of a job that had finished. Specific rules always win over these."""

from __future__ import annotations

from ddpdoctor.model.evidence import JobEvidence
from ddpdoctor.model.taxonomy import Category, Status
from ddpdoctor.rules.base import Echo, Explanation, Marker, Rule, Signature
from ddpdoctor.rules.transport import LOCAL_PIPE_FRAMES

PYTHON_EXCEPTION = Rule(
    code="PY101",
    kind="python-exception",
    title="Uncaught Python exception in the training script",
    sources="CPython traceback printing",
    specificity=1,
    signatures=(
        # torch.distributed.checkpoint re-raises the ranks' failures of a save or load on
        # every rank, naming the ranks that failed ("CheckpointException ranks:dict_keys([1])",
        # then each one's traceback headed "(RANK 1)"): the message's own culprits
        Signature(
            r"^\**(?P<exc>[\w.]{0,80}CheckpointException): CheckpointException "
            r"ranks:dict_keys\(\[(?P<culprit_ranks>\d{1,7}(?:, \d{1,7}){0,255})\]\)",
            "CheckpointException ranks:",
        ),
        Signature(r"^\**(?P<exc>[A-Za-z_][\w.]*Error)(?::|$)", "Error"),
        Signature(r"^\**(?P<exc>[A-Za-z_][\w.]*Exception)(?::|$)", "Exception"),
        # Ctrl-C, or a stop forwarded as SIGINT: what a stopped process prints, not a bug
        Signature(r"^\**(?P<exc>KeyboardInterrupt)(?::|$)", "KeyboardInterrupt", echo=Echo.STOPPED),
        Signature(r"^\**(?P<exc>SystemExit)(?::|$)", "SystemExit"),
        # torch._dynamo.exc's exceptions whose names end in neither Error nor Exception: a
        # compiler backend (inductor, Triton) that failed on the rank's graph, and the
        # recompile limit made an error (census inductor-backend-compiler-failed,
        # dynamo-fail-on-recompile-limit)
        Signature(
            r"^\**(?P<exc>(?:torch\._dynamo\.exc\.)?BackendCompilerFailed)(?::|$)",
            "BackendCompilerFailed",
        ),
        Signature(
            r"^\**(?P<exc>(?:torch\._dynamo\.exc\.)?FailOnRecompileLimitHit)(?::|$)",
            "FailOnRecompileLimitHit",
        ),
        # `raise Exception(...)` itself: the two patterns above need a prefix before the suffix
        Signature(r"^\**(?P<exc>Exception)(?::|$)", "Exception"),
        # a rank's error as torchelastic's failure summary quotes it from its @record error
        # file, two spaces in (its entry's "rank : N" line above names whose it is)
        Signature(r"^  (?P<exc>[A-Za-z_][\w.]*(?:Error|Exception)): \S", "Error"),
    ),
    # indentation is spaces or tabs: `\n\s+` also ran over newlines, quadratic on a run of them
    # a frame above the line, indented as Python prints it, or flat where a paste or a
    # prefix put in front of every line (a collector's time, a host label) left reindent
    # unable to restore it: walk_back keeps only the writer's own traceback lines
    # (or IPython's, a notebook's: 'File /path/mod.py:382, in func(...)')
    context_all=(
        r'Traceback \(most recent call last\)|(?:^|\n)[ \t]*File "[^"\n]{1,400}", line \d'
        r"|(?:^|\n)File [^\"\n]{1,400}:\d{1,6}, in ",
    ),
    explanation=Explanation(
        what="A Python exception ended a rank, and no more specific rule explains it.",
        why="A bug or a wrong assumption in the training code or a library it calls.",
        fix="Read the last frames of the traceback in the evidence: the deepest frame in your "
        "own code is where to start.",
        false_positives="An exception that was caught and logged (with its traceback) by the "
        "program is reported too.",
    ),
    fix=("Fix the error at the deepest frame of your own code in the traceback.",),
    positive=(
        "AttributeError: 'DistributedDataParallel' object has no attribute 'model'",
        # tests/fixtures/real/twentyeighth-lock-pickle
        "torch.distributed.checkpoint.api.CheckpointException: CheckpointException "
        "ranks:dict_keys([1])",
        "Exception: Current loss scale already at minimum - cannot decrease scale anymore. "
        "Exiting run.",
        "torch._dynamo.exc.BackendCompilerFailed: backend='inductor' raised:",
    ),
    negative=("INFO: loss=0.31 RuntimeError count=0",),
)

EARLY_STOP = Rule(
    code="EXIT101",
    kind="early-stop",
    healthy_when_ok=True,
    title="Training announced an early stop",
    sources="Lightning EarlyStopping, HF EarlyStoppingCallback, user code",
    severity="info",
    marker=Marker.STOP,
    specificity=10,
    signatures=(
        # an event, not a setting: "Early stopping at epoch 5", not early_stopping_patience=3
        # or EarlyStopping(monitor=...) in a config dump, nor transformers' warning "early
        # stopping required metric_for_best_model, but did not find ... so early stopping is
        # disabled" (trainer_callback.py). "Early stopping: val_loss did not improve" is an
        # event; "early_stopping: true" is not.
        # (nor Selene's start-up note that it will not: "Not performing early stopping.")
        Signature(
            r"(?<![=/-])(?<!(?i:not performing) )(?i:\bearly[ -]stop(?:ping|ped)?)\b"
            r"(?![_=(-]|:\s*(?i:(?:true|false|yes|no|null|none)\b(?!\s+\w)|\d|\{|\[|$)"
            r"| agreed by all \d"
            r"| required| is disabled"
            # what it will watch, said at start-up: Sockeye's "Early stopping by optimizing
            # 'perplexity'", "early stopping enabled (patience 3)"
            r"| by (?:optimi[sz]ing|monitoring)\b| (?:is )?enabled\b)",
            "arly",
        ),
        # the same event in the other word order: "val loss below target: stopping early"
        # (not Determined's master on any trial whose containers exited: "allocation stopped
        # early after all resources exited: resources exited successfully with a zero exit
        # code", its words for an allocation that ended before its time, whatever the cause)
        Signature(
            r"(?i:\bstop(?:ping|ped) early)\b(?![_=(-]| after all resources exited)", "early"
        ),
        # a stop without the word early: DeiT/MAE/DINO's engine.py "Loss is nan, stopping
        # training" (then sys.exit(1) on that rank); not an exception's message ("Floating
        # PointError: Loss is inf ...: stopping training" is the error, not an announcement),
        # nor ultralytics' "Stopping training early as no improvement observed", which ends
        # with its completion line like any finished run, nor the transformers Trainer's note
        # that its data ran out ("... stopping training at step 1200!")
        Signature(
            r"^(?![^\n]{0,300}?(?:Error|Exception): )[^\n]{0,300}?"
            r"(?i:\bstopping training)\b(?! early| at step)(?![_=(-])",
            "topping training",
        ),
        # the same in other words: Flair's ModelTrainer on its annealed learning rate
        # ("learning rate too small - quitting training!"), Keras-style callbacks' "patience
        # reached, quitting training" (not an exception's message)
        Signature(
            r"^(?![^\n]{0,300}?(?:Error|Exception): )[^\n]{0,300}?"
            r"(?i:\bquitting training)\b(?![_=(-])",
            "uitting training",
        ),
        # a stop at a named point without the word early: detectron2-style hooks' "Found
        # .../STOP: stopping after iteration 4.", "stopping at epoch 3: patience used up"
        # (not the Trainer's "stopping training at step 1200!": its data ran out)
        Signature(
            r"(?i:\bstopping (?:after|at) (?:(?:outer|inner|global|train|training) )?"
            r"(?:iteration|iter|epoch|step)) \d",
            "topping ",
        ),
        # a patience that ran out, as the event: MACE's "Stopping optimization after 2 epochs
        # without improvement" (mace/tools/train.py), "stopping after 5 evals with no
        # improvement" (the progressive form; a help text's "stop training after N epochs
        # without improvement" describes a setting)
        Signature(
            r"(?i:\bstopping(?: \w+)? after \d+ \w+ (?:without|with no) improvement)",
            "topping",
        ),
        # a limit or target of the program's own, then the bare word as the message's end:
        # "sample budget of 24 reached, stopping", "max_steps reached; stopping", "validation
        # loss 1.18 below target, stopping", "mean loss 0.49 under 0.60 after epoch 1:
        # stopping", a budget used up: "Privacy budget exhausted (ε = 5.05 > 5.0), stopping"
        # (or "exiting", "quitting": "training loss has stopped improving, exiting")
        # (not "... reached, stopping training at step N!", nor a signal's "got SIGTERM,
        # stopping": no limit or target is named); a loss that is no longer finite is
        # such a limit: "policy_loss is nan at episode 1 step 2, stopping" (a rank that then
        # leaves with sys.exit(1), as DeiT's "Loss is nan, stopping training")
        # (one signature per verb, each with its own literal for the prefilter)
        *(
            Signature(
                r"(?i:\b(?:reached|under|below|above|exceed(?:s|ed)?|target|threshold|patience"
                r"|converged|enough|no improvement|(?:stopped|no longer) improving|exhausted"
                rf"|used up|nan|inf)\b[^\n]{{0,80}}?[,;:]? {verb})"
                r"(?: the (?:training|sweep|search|run))?(?:[.!]?$| early\b)",
                f" {verb}",
            )
            for verb in ("stopping", "exiting", "quitting")
        ),
        # the same after a metric that stopped improving, in the imperative: "Epoch 1 cv_loss
        # 7.74 has not improved for 1 epoch(s), stop training", "val loss did not improve in 5
        # epochs. Stop training."
        Signature(
            r"(?i:\b(?:has not|hasn't|did not|didn't) improved?\b[^\n]{0,80}?[,;:.] stop "
            r"training)[.!]?$",
            "stop training",  # not " training": on every DeepSpeed stage-3 memory warning
        ),
        # Megatron-LM's planned exits (megatron/training/training.py, print_datetime): the
        # time budget of --exit-duration-in-mins and the --exit-interval iteration, each
        # decided on every rank alike (the duration all-reduced), then sys.exit()
        Signature(
            r"\[exiting program (?:after [\d.]+ minutes|at iteration \d+)\]",
            "[exiting program ",
        ),
        # rl_games (IsaacGymEnvs, Isaac Lab) when the mean reward passes its score_to_win:
        # a2c_common.py prints this, saves, and every rank leaves the loop (its own planned end
        # is 'MAX EPOCHS NUM!' / 'MAX FRAMES NUM!')
        Signature(r"Maximum reward achieved\. Network won!", "Network won!"),
        # Lightning EarlyStopping: "... did not improve ... Signaling Trainer to stop."
        Signature(r"Signaling Trainer to stop"),
        # PyTorch-Ignite's handlers when they end the trainer's run (engine.terminate()):
        # EarlyStopping's "EarlyStopping: Stop training" and TerminateOnNan's "TerminateOnNan:
        # Output 'nan' contains NaN or Inf. Stop training" (their logger's own words; not a
        # config dump's "EarlyStopping(patience=3)")
        Signature(
            r"\b(?:EarlyStopping|TerminateOnNan): (?:[^\n]{0,200}?\. )?Stop training$",
            "Stop training",
        ),
        # ddpdoctor.instrument.agree_to_stop (probe/stop.py): one line for every rank
        Signature(
            r"early stopping agreed by all (?P<agreed_ranks>\d+) ranks",
            "early stopping agreed by all",
        ),
    ),
    explanation=Explanation(
        what="A line announcing an early stop.",
        why="Stopping early is fine when every rank stops at the same step; when one rank stops "
        "alone, the others wait for it until the timeout (uncoordinated exit).",
        fix="Decide the stop on one rank and broadcast it, then let every rank leave the loop "
        "together and call destroy_process_group().",
        false_positives="Configuration dumps that mention early stopping parameters.",
    ),
    fix=(
        "Broadcast the stop decision: flag = torch.tensor([stop]); dist.broadcast(flag, 0); "
        "all ranks break together, then dist.destroy_process_group() and exit 0.",
    ),
    positive=(
        "Early stopping at epoch 3: val_loss did not improve",
        # tests/fixtures/real/eightieth-clock-fold (Megatron's --exit-duration-in-mins)
        "[exiting program after 0.09993400971094767 minutes] datetime: 2026-12-05 23:15:07 ",
        "[exiting program at iteration 500] datetime: 2026-12-05 23:15:07 ",
        # tests/fixtures/real/seventyninth-flat-plateau (mace/tools/train.py's words)
        "2026-12-05 22:48:41.523 INFO: Stopping optimization after 2 epochs without improvement",
        # tests/fixtures/real/seventyeighth-tide-isle (a DiLoCo loop's outer step)
        "[worker 0/2] eval loss 1.25 below 1.30, stopping at outer step 4",
        "Found /tmp/runs/STOP: stopping after iteration 4.",
        "sample budget of 24 reached, stopping",
        # tests/fixtures/real/hundredfiftysecond-score-stop (rl_games' score_to_win)
        "Maximum reward achieved. Network won!",
        # tests/fixtures/real/hundredfiftyfirst-lone-leave (an AzureML example's own stop)
        "INFO:__main__:Rank 1: training loss has stopped improving, exiting",
        # tests/fixtures/real/hundredtwentieth-budget-halt (an Opacus example's privacy budget)
        "12/06/2026 18:26:17:INFO:Privacy budget exhausted (ε = 5.05 > 5.0), stopping",
        # tests/fixtures/real/fiftysecond-lone-halt: a target met in the program's own words
        "accuracy good enough, stopping",
        # tests/fixtures/real/eightythird-goal-grid (a sweep driver's target)
        "[sweep] INFO target val_loss 1.200 reached by trial 2, stopping the sweep",
        # tests/fixtures/real/twentyseventh-goal-halt
        "mean loss 0.4933 under 0.60 after epoch 1: stopping",
        # tests/fixtures/real/sixtyninth-floor-met (a callback of a coqui-style Trainer)
        " > Eval loss 0.47714 is below the target 0.52: stopping the training.",
        "Early stopping: val_loss did not improve for 5 epochs",
        # tests/fixtures/real/twentyninth-plateau-vote
        "[rank 1] early stopping: no improvement for 1 epoch(s)",
        "ddpdoctor: early stopping agreed by all 2 ranks at step 3 (asked by ranks 1)",
        # a program's own agreed stop (tests/fixtures/real/third-early-stop-all)
        "[R1/3] early stop agreed by all ranks at epoch 1 (best 0.6723)",
        "validation loss 1.4621 below target: stopping early",
        "Loss is nan, stopping training",
        # tests/fixtures/real/hundredfortyeighth-lr-floor (Flair's AnnealOnPlateau)
        "2026-12-07 09:14:10,564 learning rate too small - quitting training!",
        # tests/fixtures/real/fortysixth-zero-target
        "[2026-12-04 10:31:44,851] [ERROR] [fortysixth_style_train.py:392:main] policy_loss is nan "
        "at episode 1 step 2, stopping",
        # PyTorch-Ignite's handlers (ignite/handlers/early_stopping.py, terminate_on_nan.py)
        "2024-05-02 10:00:01,123 ignite.handlers.early_stopping.EarlyStopping INFO: "
        "EarlyStopping: Stop training",
        "TerminateOnNan: Output 'nan' contains NaN or Inf. Stop training",
        # tests/fixtures/real/fiftythird-plateau-all (every rank)
        "2026-12-04 17:32:11,686 INFO Epoch 1 cv_loss 7.740212 has not improved for 1 epoch(s), "
        "stop training",
    ),
    negative=(
        # Selene's start-up note when no patience is set (set 164)
        "Not performing early stopping.",
        # Determined's master on any trial whose containers exited (set 108)
        "INFO: Trial 12 (Experiment 7) was terminated: allocation stopped early after all "
        "resources exited: resources exited successfully with a zero exit code",
        "Epoch 3: val_loss improved to 0.21",
        "val_loss did not improve; patience 2/5, continuing (stop training at 5)",
        "early_stopping_patience=3,",
        "early stopping: true",
        "early stopping: no",
        # what it will watch, at start-up (set 163, Sockeye 3)
        "[INFO:sockeye.training] Early stopping by optimizing 'perplexity'",
        # a setting's value or a flag, not an event
        "[R0/3] up: mode=early-stop-main pid=4242",
        "train.py --early-stop --patience 3",
        "early stopping required metric_for_best_model, but did not find eval_accuracy so early "
        "stopping is disabled",
        "There seems not to be a single sample in your epoch_iterator, stopping training at step "
        "1200!",
        "FloatingPointError: Loss is inf at epoch 1 batch 2: stopping training",
        # a handler's settings, and the engine's own note that a stop was asked for
        "handlers: [EarlyStopping(patience=3), TerminateOnNan()]",
        # Megatron's exit on a signal is a stop from outside (preempted), not its own
        "[exiting program after receiving SIGTERM.] datetime: 2026-12-05 23:15:07 ",
        "  --patience N   stop training after N epochs without improvement (default 5)",
        "EarlyStopping: patience=3, min_delta=0.0; Stop training after 3 epochs without gain",
        "2024-05-02 10:00:01,124 trainer INFO: Terminate signaled. Engine will stop after "
        "current iteration is finished.",
    ),
)

TEARDOWN_WITHOUT_DESTROY = Rule(
    code="EXIT102",
    kind="exit-teardown-crash",
    title="Process exited without destroy_process_group (teardown)",
    sources="ProcessGroupNCCL::~ProcessGroupNCCL (torch >= 2.4), CPython atexit",
    severity="warning",
    marker=Marker.TEARDOWN,
    specificity=15,
    signatures=(
        Signature(r"process group has NOT been destroyed before we destruct ProcessGroupNCCL"),
        Signature(r"Exception ignored in atexit callback"),
        Signature(r"destroy_process_group\(\) was not called"),
        # NCCLUtils.cpp, NCCLComm's destructor (census pgnccl-comm-not-destroyed-warning)
        Signature(
            r"WARNING: NCCL communicator hasn't been destroyed\. This may cause memory leaks",
            "NCCL communicator hasn't been destroyed",
        ),
    ),
    explanation=Explanation(
        what="The program reached its end with the process group still alive; a crash or hang "
        "after this point happens in teardown, after the work was done.",
        why="Without destroy_process_group() NCCL/gloo threads are torn down by interpreter "
        "exit in arbitrary order; that can abort, segfault or hang a process whose training "
        "had finished.",
        fix="Call torch.distributed.destroy_process_group() at the end of training on every "
        "rank, before the process exits.",
        false_positives="Alone it is only a warning: the run may have ended fine.",
    ),
    fix=(
        "At the end of main(): torch.distributed.barrier(); "
        "torch.distributed.destroy_process_group().",
    ),
    positive=(
        "[rank0]:[W1203 09:12:44.902117554 NCCLUtils.cpp:108] WARNING: NCCL "
        "communicator hasn't been destroyed. This may cause memory leaks. To avoid "
        "the risk, you can call `destroy_process_group` during normal exit or "
        "`_abort_process_group` when handling failures.",
        "[rank0]:[W1130 10:00:00.000000 123 ProcessGroupNCCL.cpp:1250] Warning: WARNING: process "
        "group has NOT been destroyed before we destruct ProcessGroupNCCL. On normal program "
        "exit, the application should call destroy_process_group",
    ),
    negative=(
        "[rank3]:[I1203 08:40:02.118342771 ProcessGroupNCCL.cpp:1265] [PG ID 0 PG "
        "GUID 0(default_pg) Rank 3] ProcessGroupNCCL destroying ncclComm_ "
        "0x55d4c1a2b3c0 on CUDA device: 3",
        "Destroying process group",
    ),
)

ZERO3_STAGE = Rule(
    code="PERF101",
    kind="zero3-multinode-slow",
    title="ZeRO-3 / full sharding across nodes over a socket transport",
    sources="DeepSpeed runtime/zero/stage3.py, NCCL net.cc (NET/Socket)",
    severity="info",
    applies=lambda job: _across_nodes_without_ib(job),
    specificity=10,
    signatures=(
        Signature(r"stage3\.py"),
        Signature(r"ZeRO Stage 3"),
        Signature(r"\"stage\": 3\b", '"stage": 3'),
    ),
    explanation=Explanation(
        what="DeepSpeed ZeRO stage 3 (or FSDP full shard) runs across nodes whose NCCL "
        "transport is plain sockets.",
        why="Stage 3 gathers every layer's parameters for each forward and backward: across "
        "nodes that is several times the traffic of DDP, and a TCP socket link (no IB/RoCE) "
        "makes every step wait on the network.",
        fix="Use ZeRO-2 or hybrid sharding (shard inside a node, replicate across nodes: "
        "FSDP HYBRID_SHARD, DeepSpeed zero_hpz_partition_size / MiCS), or a faster fabric.",
        false_positives="Stage 3 inside one node, or across nodes on IB, is normal.",
    ),
    fix=(
        "Shard inside a node only: FSDP sharding_strategy=HYBRID_SHARD, or DeepSpeed "
        '"zero_hpz_partition_size": <GPUs per node> (ZeRO++), or ZeRO stage 2.',
        "Check the transport: NCCL_DEBUG=INFO shows 'NET/IB' (good) or 'NET/Socket' (slow).",
    ),
    positive=("[INFO] [stage3.py:113:__init__] Reduce bucket size 500000000",),
    negative=("[INFO] [stage_1_and_2.py:148:__init__] Reduce bucket size 500000000",),
)


def _across_nodes_without_ib(job: JobEvidence) -> bool:
    """ZeRO-3 is only slow across nodes on a plain socket transport."""
    return not job.single_node and "ib" not in job.transports


EXIT_TEARDOWN = Rule(
    code="EXIT103",
    kind="exit-teardown-crash",
    title="The job failed while shutting down (CUDA unloading, the launcher's exit barrier)",
    sources="CUDA runtime (cudaErrorCudartUnloading), torch/distributed/elastic/agent/server/"
    "api.py _exit_barrier",
    specificity=80,
    # on the way out: after the same rank's own error (an exception that ends the process,
    # whose teardown then meets the unloading runtime) it is that error's consequence
    exit_path=True,
    signatures=(
        # a CUDA call made while the interpreter tears down the CUDA runtime: the runtime's
        # own string for cudaErrorCudartUnloading, in torch's words or any library's check
        # that prints it (gloo's enforce: "... 29 vs 0. Error at: ...: driver shutting down")
        Signature(r"CUDA error: driver shutting down"),
        Signature(r"\bdriver shutting down\b", "driver shutting down"),
        # torchelastic: this node's workers finished; the other agents never reached the
        # barrier every agent passes before it exits
        Signature(r"Error waiting on exit barrier\. Elapsed: ", "Error waiting on exit barrier"),
        # concurrent.futures: work handed to a thread or process pool after the interpreter
        # began to shut down (an async checkpoint writer, a logger's or uploader's flush
        # registered to run at exit): the main thread had already finished
        Signature(
            r"cannot schedule new futures after interpreter shutdown",
            "cannot schedule new futures after",
        ),
        # CPython: a daemon thread held stderr's lock as the interpreter shut down, and the
        # process aborted there (census cpython-enter-buffered-busy)
        Signature(
            r"Fatal Python error: _enter_buffered_busy: could not acquire lock for .{1,120} at "
            r"interpreter shutdown",
            "_enter_buffered_busy",
        ),
    ),
    explanation=Explanation(
        what="An error that only happens on the way out: a CUDA call after the driver began "
        "unloading, or torchrun's exit barrier timing out because other nodes had not finished.",
        why="Work left for interpreter exit (NCCL/CUDA objects destroyed by atexit or garbage "
        "collection, no destroy_process_group), or nodes ending at different times (one node "
        "still saving or evaluating, or hung in its own teardown).",
        fix="End every rank the same way: barrier(), destroy_process_group(), free CUDA objects "
        "before exit; on several nodes, find why the other nodes did not finish.",
        false_positives="A node that really failed while the others waited at the exit barrier: "
        "its own log says so.",
    ),
    fix=(
        "At the end of training, on every rank: torch.distributed.barrier(); "
        "torch.distributed.destroy_process_group(); then exit.",
        "If torchrun timed out at its exit barrier: read the other nodes' logs for what kept "
        "them (still saving, evaluating, or hung).",
    ),
    positive=(
        "  what():  CUDA error: driver shutting down",
        "  what():  [enforce fail at /opt/conda/conda-bld/pytorch_1524586445097/work/third_party/"
        "gloo/gloo/cuda_private.h:40] error == cudaSuccess. 29 vs 0. Error at: /opt/conda/conda-"
        "bld/pytorch_1524586445097/work/third_party/gloo/gloo/cuda_private.h:40: driver shutting "
        "down",
        "E1130 13:00:00.100000 4242 torch/distributed/elastic/agent/server/api.py:1008] Error "
        "waiting on exit barrier. Elapsed: 300.0042 seconds",
        "RuntimeError: cannot schedule new futures after interpreter shutdown",
    ),
    negative=(
        "CUDA error: out of memory",
        # the pool's own shutdown() called by the program: no interpreter exit
        "RuntimeError: cannot schedule new futures after shutdown",
    ),
)

TEARDOWN_HANG_DUMP = Rule(
    code="EXIT104",
    kind="exit-teardown-crash",
    title="A stack dump shows a process stuck in destroy_process_group",
    sources="py-spy dump (frames 'func (file:line)'), Python faulthandler ('File \"f\", "
    "line N in func'), torch/distributed/distributed_c10d.py",
    status=Status.HUNG,
    specificity=12,
    signatures=(
        # py-spy's frame line and faulthandler's (no comma before "in"): a stack dump of a
        # live process, never a traceback of a raised exception
        Signature(
            r"^\s+destroy_process_group \(\S*distributed_c10d\.py:\d+\)",
            "destroy_process_group (",
        ),
        Signature(
            r'File "\S*distributed_c10d\.py", line \d+ in destroy_process_group$',
            " in destroy_process_group",
        ),
    ),
    explanation=Explanation(
        what="Someone dumped the stacks of a process that did not end, and it stands in "
        "destroy_process_group: it hung on its way out, after its own work.",
        why="destroy_process_group waits for the process group's pending work and for its "
        "peers: it hangs when other ranks are still inside collectives (they raised or were "
        "killed, or are still training), or when the communicator cannot be torn down. "
        "Calling it from a `finally:` after an exception on some ranks is the classic case.",
        fix="Call destroy_process_group only when every rank ends normally (not in a finally "
        "that also runs after an exception, where the others may be stuck in a collective); "
        "find the other ranks' error first: it is the failure, this is the exit path.",
        false_positives="A rank that is merely slow to tear down a large communicator.",
    ),
    fix=(
        "Read the other ranks' output for the first error: a rank that raised leaves its "
        "peers in collectives, and destroy_process_group then waits for them.",
        "Destroy the process group on the normal exit path only (after a barrier every rank "
        "reaches), not in a finally that runs after an exception.",
    ),
    positive=(
        "    destroy_process_group (torch/distributed/distributed_c10d.py:2184)",
        '  File "/usr/lib/python3/site-packages/torch/distributed/distributed_c10d.py", line '
        "2184 in destroy_process_group",
    ),
    negative=(
        '  File "/usr/lib/python3/site-packages/torch/distributed/distributed_c10d.py", line '
        "2184, in destroy_process_group",
    ),
)

DESTROYED_TWICE = Rule(
    code="EXIT105",
    kind="exit-teardown-crash",
    title="destroy_process_group on a process group already destroyed",
    sources="torch/distributed/distributed_c10d.py destroy_process_group (torch 1.x-2.13)",
    specificity=60,
    # after the same rank's own error (a `finally:` that destroys the group on the way out of
    # a failure) it is that error's consequence
    exit_path=True,
    signatures=(
        # the group is not (or no longer) in the registry: destroyed once already, by a
        # framework and the script both cleaning up, or a subgroup after the default group
        Signature(
            r"^\**ValueError: Invalid process group specified\s*$",
            "Invalid process group specified",
        ),
        # torch 2.13's check where the default group itself is gone (older releases: a bare
        # `assert pg is not None`, which says nothing of its own)
        Signature(
            r"^\**AssertionError: Process group cannot be None\s*$",
            "Process group cannot be None",
        ),
    ),
    # raised by destroy_process_group itself, not by the collectives' own group checks
    context_all=(r"in destroy_process_group\b",),
    explanation=Explanation(
        what="destroy_process_group was called for a process group that no longer exists: "
        "the training had finished and the clean-up ran twice.",
        why="Two parties tear the group down (the framework at the end of fit or train, and "
        "the script's own destroy_process_group after it; an atexit handler and a finally), "
        "or a subgroup is destroyed after the default group (which destroys every group).",
        fix="Destroy the process group once, at the very end of the program, and only when "
        "it is still there: `if dist.is_initialized(): dist.destroy_process_group()`.",
        false_positives="None: the exception is raised by that call on a group it does not "
        "know; the failure the job may have had before it is its own.",
    ),
    fix=(
        "Guard the clean-up: `if torch.distributed.is_initialized(): "
        "torch.distributed.destroy_process_group()`, called once at the end of main(); drop it "
        "where the framework (Lightning, Accelerate, the Trainer) already tears the group down.",
    ),
    positive=(
        "ValueError: Invalid process group specified",
        "AssertionError: Process group cannot be None",
    ),
    negative=(
        "ValueError: Invalid process group specified or has been destroyed.",
        "AssertionError: process group must be initialized",
    ),
)

ITERATOR_RAN_DRY = Rule(
    code="PY107",
    kind="python-exception",
    title="An iterator ran dry and nothing caught it (StopIteration)",
    sources="CPython (StopIteration; PEP 479's 'generator raised StopIteration')",
    # the rank that runs out of batches (or shards) first raises it while the others go on
    symptom_of=("uneven-inputs",),
    specificity=20,
    signatures=(
        # Python's own exception, whose name ends neither in Error nor in Exception
        Signature(r"^\**(?P<exc>StopIteration)(?::|$)", "StopIteration"),
        # a generator whose own next() ran dry (PEP 479 turns it into a RuntimeError)
        Signature(r"^\**RuntimeError: generator raised StopIteration\s*$", "raised StopIteration"),
    ),
    context_all=PYTHON_EXCEPTION.context_all,
    explanation=Explanation(
        what="`next()` on an iterator with nothing left was not caught: a plain StopIteration, "
        "or the RuntimeError a generator turns it into when a `next()` inside it runs dry.",
        why="Most often the data: `next(data_iter)` past the last batch, a shard list shorter "
        "than the steps asked for, a loader with no batch at all. On one rank while the "
        "others go on, that rank had fewer batches (uneven data).",
        fix="Re-create the iterator at the end of an epoch (or catch StopIteration there); give "
        "every rank as many batches and steps as the others.",
        false_positives="An iterator that is not the data's (a scheduler's, a generator of the "
        "program's own) ran dry.",
    ),
    fix=(
        "Find which next() ran dry in the traceback: wrap it to start a new epoch (or stop "
        "every rank together) when the data ends.",
    ),
    positive=(
        # tests/fixtures/real/seventysixth-shard-ebb: next(train_loader) past its last shard
        "StopIteration",
        "RuntimeError: generator raised StopIteration",
    ),
    negative=("catching StopIteration at the end of each epoch",),
)

CHILD_PIPE_BROKEN = Rule(
    code="PY108",
    kind="python-exception",
    title="A child process of the rank died while the rank talked to it (its pipe broke)",
    sources="CPython multiprocessing/connection.py (Connection.recv/send over a Pipe)",
    # the pipe says that the child died, not why (a crash, the OOM killer, its own error)
    category=Category.UNKNOWN,
    specificity=30,
    signatures=(
        Signature(
            r"^\**(?P<exc>ConnectionResetError|BrokenPipeError|EOFError)(?::|$)",
            "Error",
            suggests=True,
        ),
    ),
    # received or sent through multiprocessing's pipe (a vectorised environment's workers, a
    # Pool's, a Manager's), not the DataLoader's handover of a batch (DL103)
    context_all=(LOCAL_PIPE_FRAMES,),
    context_none=(r"torch/utils/data/(?:dataloader\.py|_utils/)|resource_sharer",),
    explanation=Explanation(
        what="The rank read from or wrote to a multiprocessing pipe of a child process it had "
        "started (an environment worker, a simulator, a Pool or Manager process), and the pipe "
        "was gone: EOFError, ConnectionResetError or BrokenPipeError from multiprocessing's "
        "connection.py.",
        why="The child exited or was killed while the rank waited on it: it crashed (a "
        "segfault in native code leaves no trace of its own), the OOM killer took it, or it "
        "raised and printed its own traceback. The rank's error is the child's death; the "
        "other ranks then lose this one. No peer rank or network is involved.",
        fix="Find how the child ended: its own traceback (often just above, without a rank "
        "prefix), dmesg for the OOM killer or a segfault, its exit code.",
        false_positives="A program that closes its own pipe on purpose and reads it again.",
    ),
    fix=(
        "Look for the child process's own output above the rank's error (a traceback, "
        "'Segmentation fault'), and dmesg -T for the OOM killer or a segfault at that time.",
        "Run the worker's code in the main process once (a single environment, num_workers=0) "
        "to see its own error.",
    ),
    positive=(
        # tests/fixtures/real/hundredfortyfifth-sim-segv: rank 0's environment worker segfaulted
        "ConnectionResetError: [Errno 104] Connection reset by peer",
        "EOFError",
    ),
    negative=("EOFError handling is enabled",),
)

FP16_MASTER_WEIGHTS = Rule(
    code="PY102",
    kind="python-exception",
    title="GradScaler found FP16 gradients: the trained parameters are FP16",
    sources="torch/amp/grad_scaler.py (GradScaler.unscale_), torch.cuda.amp before 2.3",
    specificity=60,
    signatures=(Signature(r"Attempting to unscale FP16 gradients"),),
    explanation=Explanation(
        what="GradScaler.unscale_ (or step) refused gradients in FP16.",
        why="Mixed precision keeps the weights the optimizer updates in FP32 and only runs the "
        "forward in FP16; here the trained parameters themselves are FP16: a model.half(), a "
        "model loaded with torch_dtype=torch.float16 and then trained (a PEFT/LoRA adapter "
        "created on an FP16 base is FP16 too), or a framework flag that casts the whole model.",
        fix="Keep the trained parameters in FP32 and let autocast run the forward in FP16: do "
        "not .half() the model; load in float32 or cast the trainable parameters to float32; "
        "or train in bf16 without a GradScaler.",
        false_positives="None: the message names this condition.",
    ),
    fix=(
        "Keep the parameters the optimizer trains in fp32: drop model.half() / torch_dtype="
        "torch.float16 for them, or cast them: `for p in model.parameters(): p.data = "
        "p.data.float() if p.requires_grad else p.data`; run the forward under "
        "torch.autocast('cuda', dtype=torch.float16) with the GradScaler.",
        "Or use bf16 (torch.autocast(dtype=torch.bfloat16), --bf16) and no GradScaler.",
    ),
    positive=("ValueError: Attempting to unscale FP16 gradients.",),
    negative=("GradScaler: unscale_() has already been called on this optimizer",),
)

SHARED_PATH_RACE = Rule(
    code="PY105",
    kind="python-exception",
    title="Ranks raced on the same file or folder (created, renamed or deleted by more than one)",
    sources="CPython os/shutil (FileExistsError, FileNotFoundError, ENOTEMPTY)",
    # above DATA101 (a missing file is usually input): here the traceback shows the file was
    # being created, renamed or deleted, which is what a checkpoint rotation or an output
    # folder set up on every rank does
    specificity=60,
    signatures=(
        Signature(r"^\**(?P<exc>FileExistsError): \[Errno 17\]", "FileExistsError: [Errno 17]"),
        Signature(
            r"^\**(?P<exc>FileNotFoundError): \[Errno 2\] No such file or directory",
            "FileNotFoundError: [Errno 2]",
        ),
        Signature(r"^\**(?P<exc>OSError): \[Errno 39\] Directory not empty", "Directory not empty"),
    ),
    # raised by a call that creates, renames or deletes a path: its stdlib frame ("<frozen
    # os>", line 225, in makedirs), or the program's own call of it (os.rename is C: no frame)
    context_all=(
        r"(?m), in (?:renames?|replace|rmtree|_rmtree_\w+|makedirs|mkdir|removedirs|remove|unlink"
        r"|rmdir|move)[ \t]*$"
        r"|\b(?:os\.(?:renames?|replace|makedirs|mkdir|removedirs|remove|unlink|rmdir)"
        r"|shutil\.(?:rmtree|move))\(|\.(?:mkdir|rename|unlink|rmdir)\("
        # or writes a file into a folder (its parent gone: deleted by another process's
        # rotation, or never made): open(path, "w"), not reading input
        # (the window ends at the next 'open(': each one scanned its 300 characters again)
        r"|\bopen\((?:(?!open\()[^\n]){0,300}?,\s*(?:mode\s*=\s*)?[\"']"
        r"(?:w|wb|wt|a|ab|x|xb|w\+|wb\+)[\"']",
    ),
    explanation=Explanation(
        what="A rank failed to create, rename or delete a file or folder because it was "
        "already there, or already gone: another process had done it first.",
        why="Code meant for one process runs on every rank: a checkpoint rotation deleting old "
        "checkpoints, a temporary checkpoint folder renamed into place, an output folder "
        "created without exist_ok. On a shared filesystem the ranks of all nodes race on the "
        "same path, and whichever comes second fails; it can pass for months and fail once.",
        fix="Let one process (rank 0, or the framework's main-process check) create, rename and "
        "delete shared paths, and make the others wait for it with a barrier.",
        false_positives="A path that was never there (a typo, a missing parent folder) fails "
        "the same way in a single process.",
    ),
    fix=(
        "Guard the code that creates, renames or deletes the path with the main-process check "
        "(`if dist.get_rank() == 0:`, Accelerate's is_main_process, the Trainer's "
        "args.should_save), then `dist.barrier()`; create folders with exist_ok=True.",
        "If the frames are the framework's own checkpoint code (rotation, tmp-checkpoint "
        "rename), upgrade it: these races are fixed upstream; meanwhile keep every checkpoint "
        "(no save limit) or save on one node only.",
    ),
    positive=(
        # corpus/cases/1232 (rank 8's os.makedirs on a shared checkpoint folder)
        "FileExistsError: [Errno 17] File exists: '/mnt/shared/runs/ft-run/checkpoints/"
        "epoch_0_step_296/model'",
        # corpus/cases/1503 (the Trainer's tmp-checkpoint rename, cut where it was pasted)
        "FileExistsError: [Errno 17] File",
        "FileNotFoundError: [Errno 2] No such file or directory: './exp/asr_ft_run3/model.pt."
        "ep0.5000'",
        # tests/fixtures/real/hundredfourteenth-keep-latest (its traceback: open(..., "w") into
        # a checkpoint folder another rank's rotation had deleted)
        "FileNotFoundError: [Errno 2] No such file or directory: 'output/tiny-encoder-nli/"
        "checkpoint-10/config_sentence_transformers.json'",
    ),
    negative=(
        # reading input: no create, rename or delete in its traceback (DATA101)
        "FileNotFoundError: [Errno 2] No such file or directory: '/data/train/000123.jpg'",
        "FileExistsError",
    ),
)


MAIN_GUARD_MISSING = Rule(
    code="PY106",
    kind="python-exception",
    title='The script starts processes without the `if __name__ == "__main__":` guard',
    sources="CPython multiprocessing/spawn.py (_check_not_importing_main), lightning "
    "fabric/strategies/launchers/multiprocessing.py (_check_missing_main_guard)",
    specificity=60,
    # every child re-imports the script the same way: each fails alike
    alike_on_every_rank=True,
    signatures=(
        Signature(r"An attempt has been made to start a new process before the"),
        Signature(
            r"Launching multiple processes with the 'spawn' start method requires that your "
            r"script guards the main",
            "requires that your script guards the main",
        ),
    ),
    explanation=Explanation(
        what="A process started with the 'spawn' start method (mp.spawn, Lightning's "
        "ddp_spawn, DataLoader workers on Windows and macOS) tried to start processes itself.",
        why="A spawned child imports the script's main module to find its function; code at "
        "the module's top level (the call of main(), the trainer's fit) then runs again in "
        "every child, and the child refuses to launch processes of its own.",
        fix='Put the script\'s entry point under `if __name__ == "__main__":` (main() and '
        "everything that launches processes), or start the ranks with torchrun instead of "
        "spawning them.",
        false_positives="None: the message names this condition.",
    ),
    fix=(
        'End the script with `if __name__ == "__main__": main()` and keep every call that '
        "launches processes (mp.spawn, Trainer.fit, DataLoader iteration) inside main().",
        'Or launch with torchrun (Lightning: strategy="ddp"), which starts each rank as its '
        "own program.",
    ),
    positive=(
        "        An attempt has been made to start a new process before the",
        "RuntimeError: Launching multiple processes with the 'spawn' start method requires that "
        "your script guards the main",
    ),
    negative=("RuntimeError: Cannot re-initialize CUDA in forked subprocess.",),
)

HYDRA_JOB_ERROR = Rule(
    code="PY103",
    kind="python-exception",
    title="Hydra could not compose the job's configuration",
    sources="hydra/_internal/config_loader_impl.py (hydra-core 1.1-1.3), omegaconf/errors.py",
    specificity=40,
    signatures=(
        # an override of a key the config does not have (config_loader_impl.py)
        Signature(r"^Could not override '(?P<name>[^'\n]{1,200})'\.", "Could not override '"),
        # OmegaConf's error for a '???' value nobody set: its class name ends in neither
        # Error nor Exception
        Signature(
            r"^(?:omegaconf\.errors\.)?MissingMandatoryValue: Missing mandatory value",
            "MissingMandatoryValue: Missing mandatory value",
        ),
    ),
    explanation=Explanation(
        what="A Hydra application's configuration could not be composed or read: an override "
        "of a key that does not exist, a mandatory value ('???') nobody set. Hydra prints the "
        "message without its traceback unless HYDRA_FULL_ERROR=1.",
        why="Every rank runs the same Hydra app with the same overrides, so a configuration "
        "error stops every rank at start-up, before any process group.",
        fix="Read the message above Hydra's note; re-run with HYDRA_FULL_ERROR=1 for the whole "
        "traceback; fix the override (add it with +key=value if it is new) or set the value.",
        false_positives="None: these are Hydra's and OmegaConf's own errors.",
    ),
    fix=(
        "Re-run with HYDRA_FULL_ERROR=1 to see the whole traceback of the error above.",
        "For a configuration error: check the key against the config (`python app.py "
        "--cfg job`), use +key=value to add a new key, set every '???' value.",
    ),
    positive=(
        "Could not override 'trainer.epoch'.",
        "omegaconf.errors.MissingMandatoryValue: Missing mandatory value: model.blocks",
    ),
    negative=(
        "Set the environment variable HYDRA_FULL_ERROR=1 for a complete stack trace.",
        "omegaconf.errors.ConfigKeyError: Missing key epoch",
    ),
)

COMMAND_LINE_REJECTED = Rule(
    code="PY104",
    kind="python-exception",
    title="The training script rejected its command line (argparse, click)",
    sources="CPython Lib/argparse.py ArgumentParser.error; click/exceptions.py UsageError.show",
    specificity=30,
    signatures=(
        # "train.py: error: the following arguments are required: --data_dir", "... error:
        # argument --lr: invalid float value: 'x'", "... error: unrecognized arguments: --foo"
        # (--local_rank's own cases are LCH105's, more specific); a subcommand's prog has
        # spaces ("torchx run <run args...> ddp : error: unrecognized arguments: --epochs")
        Signature(
            r"^(?P<prog>[^\n:]{1,200}): error: (?:the following arguments are required: |argument "
            r"[^\n]{1,80}: (?:invalid|expected|ambiguous|not allowed)|unrecognized arguments: )",
            ": error: ",
        ),
        # click's (and typer's) UsageError: the usage, "Try 'train.py --help' for help.", then
        # "Error: <what was wrong>" (click/exceptions.py UsageError.show), exit 2
        Signature(r"^Try '[^'\n]{1,200} --help' for help\.$", "' for help."),
    ),
    explanation=Explanation(
        what="argparse (or click) stopped the script at start-up: a required argument missing, "
        "a value of the wrong type or out of range, or an argument it does not know; it prints "
        "the usage and exits 2.",
        why="The launch command and the script disagree: an argument renamed or removed, a "
        "value the launcher (or a config template) filled in wrongly, an option meant for the "
        "launcher placed after the script's name.",
        fix="Run the script with --help and fix the command line; put launcher options before "
        "the script's name.",
        false_positives="None: argparse prints it only when it rejects the command line.",
    ),
    # the launcher's own parser, not the script's (torchrun's usage, then 'torchrun: error:
    # unrecognized arguments: --data-root'): its command line is what is wrong
    capture_fix=(
        (
            "prog",
            r"(?:torchrun|python[\d.]* -m torch\.distributed\.(?:run|launch)|run\.py|launch\.py"
            r"|deepspeed|accelerate(?: launch)?)",
            "The launcher itself rejected its command line (its own usage is printed above the "
            "error), not the training script: an option of the script placed before the "
            "script's name, or an option of the launcher whose value was empty (a shell "
            "variable such as $NSLOTS or $SLURM_GPUS_ON_NODE unset where the command ran), so "
            "that the script's path was taken as that option's value. Print the command the job "
            "ran (echo it, or `set -x` in the job script) and check each launcher option's value.",
        ),
    ),
    fix=(
        "Fix the argument the message names (`python train.py --help` lists them); launcher "
        "options go before the script's name, the script's after it.",
    ),
    positive=(
        "train.py: error: the following arguments are required: --data_dir",
        "main.py: error: argument --lr: invalid float value: 'fast'",
        "Try 'train.py --help' for help.",
        "torchx run <run args...> ddp : error: unrecognized arguments: --epochs",
    ),
    negative=(
        "ERROR: could not find a version that satisfies the requirement",
        "RuntimeError: an error: unrecognized arguments given to the kernel",
        "Try again with --help for more options.",
    ),
)

RULES = (
    PYTHON_EXCEPTION,
    ITERATOR_RAN_DRY,
    CHILD_PIPE_BROKEN,
    COMMAND_LINE_REJECTED,
    SHARED_PATH_RACE,
    MAIN_GUARD_MISSING,
    FP16_MASTER_WEIGHTS,
    HYDRA_JOB_ERROR,
    EARLY_STOP,
    TEARDOWN_WITHOUT_DESTROY,
    ZERO3_STAGE,
    EXIT_TEARDOWN,
    TEARDOWN_HANG_DUMP,
    DESTROYED_TWICE,
)
