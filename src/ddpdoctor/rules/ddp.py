"""DistributedDataParallel reducer and construction errors (torch/csrc/distributed/c10d/reducer.cpp,
torch/nn/parallel/distributed.py)."""

from __future__ import annotations

from ddpdoctor.rules.base import Echo, Explanation, Rule, Signature

DDP_UNUSED_PARAMETERS = Rule(
    code="DDP101",
    kind="ddp-unused-parameters",
    title="DDP reducer did not get gradients for some parameters",
    sources="reducer.cpp Reducer::ensure_prior_reduction_finished(), Megatron-LM "
    "param_and_grad_buffer.py",
    signatures=(
        # the same reducer under static_graph=True (reducer.cpp): a parameter used in one
        # iteration and not in another (census reducer-static-graph-changed)
        Signature(
            r"Your training graph has changed in this iteration",
            "training graph has changed in this iteration",
        ),
        Signature(r"Expected to have finished reduction in the prior iteration"),
        # Lightning's wording of the same reducer error
        Signature(r"parameters that were not used in producing the loss"),
        Signature(
            r"Parameters which did not receive grad for rank (?P<rank>\d+): (?P<params>.+)",
            "Parameters which did not receive grad",
        ),
        Signature(
            r"Parameter indices which did not receive grad for rank (?P<rank>\d+): (?P<indices>.+)",
            "Parameter indices which did not receive grad",
        ),
        # Megatron-LM's own DDP (megatron/core/distributed/param_and_grad_buffer.py,
        # finish_grad_sync with overlap_grad_reduce): a bucket whose reduction was never
        # launched because some of its parameters got no gradient on this rank
        Signature(
            r"Communication call has not been issued for this bucket \((?P<count_a>\d+)/"
            r"(?P<count_b>\d+) params have grad available\)",
            "Communication call has not been issued for this bucket",
        ),
        # the message's last line (printed when the debug level names no parameter), which a
        # paste cut above it keeps alone; no other message of reducer.cpp has it
        Signature(
            r"TORCH_DISTRIBUTED_DEBUG to either INFO or DETAIL to print out information about "
            r"which particular parameters did not receive gradient",
            "which particular parameters did not receive gradient",
            after_head="Expected to have finished reduction",
            head_within=8,
        ),
    ),
    explanation=Explanation(
        what="A DDP iteration started before the previous one had reduced the gradients of "
        "every parameter.",
        why="Some parameters took no part in computing the loss on this rank: a branch of "
        "forward() that was skipped, a head that is only used on some steps, a loss computed "
        "only on some ranks (e.g. a batch filtered to nothing), or outputs of forward() that DDP "
        "cannot see. DDP waits for their gradients forever.",
        fix="Make every trainable parameter take part in the loss on every rank, freeze the "
        "unused ones (requires_grad=False), or pass find_unused_parameters=True to "
        "DistributedDataParallel. Set TORCH_DISTRIBUTED_DEBUG=INFO to have the parameter names "
        "printed (DETAIL adds more, but crashes DDP on gloo in torch 2.13).",
        false_positives="None known: the message is only printed by the DDP reducer.",
    ),
    fix=(
        "Run once with TORCH_DISTRIBUTED_DEBUG=INFO to print the names of the unused parameters, "
        "or call ddpdoctor.instrument.report_unused_parameters(model) after loss.backward().",
        "Freeze parameters that are not used (param.requires_grad_(False)) or make them take "
        "part in the loss on every rank and step.",
        "Or wrap with DistributedDataParallel(model, find_unused_parameters=True) (slower).",
    ),
    framework_fix=(
        (
            "lightning",
            "Lightning: make every parameter take part in training_step's loss or freeze it, or "
            "Trainer(strategy=DDPStrategy(find_unused_parameters=True)) (the string "
            "strategy='ddp_find_unused_parameters_true' does the same; slower).",
        ),
        (
            "accelerate",
            "Accelerate: make the parameters take part in the loss on every process, or "
            "Accelerator(kwargs_handlers=[DistributedDataParallelKwargs("
            "find_unused_parameters=True)]) (slower).",
        ),
        (
            "transformers",
            "transformers Trainer: TrainingArguments(ddp_find_unused_parameters=True) (its "
            "default for a PreTrainedModel without gradient checkpointing), or drop the module "
            "that takes no part in the loss.",
        ),
    ),
    references=("https://pytorch.org/docs/stable/notes/ddp.html",),
    positive=(
        "RuntimeError: Your training graph has changed in this iteration, e.g., one parameter is "
        "unused in first iteration, but then got used in the second iteration. this is not "
        "compatible with static_graph set to True.",
        "RuntimeError: Expected to have finished reduction in the prior iteration before "
        "starting a new one. This error indicates that your module has parameters that were "
        "not used in producing loss.",
        "Parameter indices which did not receive grad for rank 0: 1",
        # tests/fixtures/real/eightieth-idle-expert (Megatron's DDP, overlap_grad_reduce)
        "[rank1]: AssertionError: Communication call has not been issued for this bucket (2/6 "
        "params have grad available)",
        "[rank0]:  In addition, you can set the environment variable TORCH_DISTRIBUTED_DEBUG to "
        "either INFO or DETAIL to print out information about which particular parameters did "
        "not receive gradient on this rank as part of this error",
    ),
    negative=(
        "[W reducer.cpp:1346] Warning: find_unused_parameters=True was specified in DDP "
        "constructor, but did not find any unused parameters in the forward pass.",
    ),
)

DDP_MARK_READY_TWICE = Rule(
    code="DDP102",
    kind="ddp-mark-ready-twice",
    title="DDP saw a parameter's gradient twice in one iteration",
    sources="reducer.cpp Reducer::mark_variable_ready()",
    signatures=(
        Signature(r"Expected to mark a variable ready only once"),
        Signature(
            r"Parameter at index (?P<index>\d+)(?: with name (?P<params>\S+))? has been marked "
            r"as ready twice",
            "has been marked as ready twice",
        ),
    ),
    explanation=Explanation(
        what="An autograd hook fired twice for the same parameter within one backward pass.",
        why="Reentrant activation checkpointing (torch.utils.checkpoint with use_reentrant=True) "
        "wraps the same layers more than once, a parameter is shared and used in several "
        "concurrent forward/backward passes, or a parameter is used outside forward().",
        fix="Use torch.utils.checkpoint.checkpoint(..., use_reentrant=False); or call "
        "model._set_static_graph() (static_graph=True) when the graph does not change; "
        "do not reuse parameters across concurrent passes.",
        false_positives="None known.",
    ),
    fix=(
        "Pass use_reentrant=False to torch.utils.checkpoint.checkpoint (or "
        "gradient_checkpointing_enable(gradient_checkpointing_kwargs={'use_reentrant': False})).",
        "If the graph is the same every step: DistributedDataParallel(model, static_graph=True).",
    ),
    references=("https://pytorch.org/docs/stable/checkpoint.html",),
    positive=(
        "RuntimeError: Expected to mark a variable ready only once. This error is caused by "
        "one of the following reasons: 1) Use of a module parameter outside the `forward` "
        "function.",
    ),
    negative=(
        "RuntimeError: Expected to have finished reduction in the prior iteration before "
        "starting a new one.",
    ),
)

DDP_GRAD_STRIDES = Rule(
    code="DDP103",
    kind="ddp-grad-strides",
    title="Gradient strides do not match DDP bucket views (performance)",
    sources="reducer.cpp copy_grad_to_bucket / mark_variable_ready_dense",
    severity="warning",
    signatures=(
        Signature(r"Grad strides do not match bucket view strides"),
        # the warning's last line, which a paste cut above it keeps alone (reducer.cpp prints
        # the two layouts under its first line; no other message has a bucket view's)
        Signature(
            r"^bucket_view\.sizes\(\) = \[[\d, ]{0,200}\], strides\(\) = \[[\d, ]{0,200}\]",
            "bucket_view.sizes() = ",
            after_head="Grad strides do not match bucket view strides",
        ),
    ),
    explanation=Explanation(
        what="DDP copies a gradient whose memory layout differs from its bucket view.",
        why="A parameter is not contiguous or changed layout after DDP was built (channels_last, "
        "a transposed weight, a view). Each step pays an extra copy.",
        fix="Make parameters contiguous (or convert the model to channels_last) before wrapping "
        "it in DDP; pass gradient_as_bucket_view=True. For 1x1 convolutions the warning is "
        "often spurious.",
        false_positives="1x1 kernels: strides differ only nominally and nothing is lost.",
    ),
    fix=(
        "Convert the model's memory format (model.to(memory_format=...)) before "
        "DistributedDataParallel(...), not after.",
        "Make transposed or viewed parameters .contiguous() before wrapping.",
    ),
    positive=(
        "[W reducer.cpp:313] Warning: Grad strides do not match bucket view strides. This may "
        "indicate grad was not created according to the gradient layout contract",
        "bucket_view.sizes() = [1024, 1024, 1, 1], strides() = [1024, 1, 1, 1]",
        "bucket_view.sizes() = [1024, 1, 3, 3, 3], strides() = [27, 27, 9, 3, 1] (Triggered "
        "internally at /opt/conda/conda-bld/pytorch_1659484803030/work/torch/csrc/distributed/"
        "c10d/reducer.cpp:312.)",
    ),
    negative=(
        "grad.sizes() = [1024, 1024, 1, 1], strides() = [1024, 1, 1024, 1024]",
        "weight.sizes() = [1024, 1024], strides() = [1024, 1]",
    ),
)

DDP_PARAMETERS_WITHOUT_GRAD = Rule(
    code="DDP107",
    kind="ddp-unused-parameters",
    title="Parameters got no gradient on a rank (named by ddpdoctor.instrument)",
    sources="ddpdoctor.instrument.report_unused_parameters (probe/unused.py)",
    severity="warning",
    specificity=60,
    explains=("collective-mismatch",),
    signatures=(
        Signature(
            r"ddpdoctor: parameters without gradient on rank (?P<rank>\d+)"
            r"(?: \(step (?P<step>\d+)\))?: (?P<params>.+)",
            "ddpdoctor: parameters without gradient",
        ),
    ),
    explanation=Explanation(
        what="After a backward pass, these trainable parameters of the rank had no gradient.",
        why="They took no part in the loss on that rank and step: a branch skipped on some "
        "ranks, a head used only for some batches. With DDP's default "
        "find_unused_parameters=False the reducer then waits for them: the next step fails "
        "('Expected to have finished reduction'), and when only some ranks skip them the "
        "ranks' gradient buckets differ, which gloo reports as a collective mismatch and NCCL "
        "as a hang.",
        fix="Use the parameters in the loss on every rank and step (multiply an unused branch by "
        "zero), freeze them (requires_grad_(False)), or pass find_unused_parameters=True.",
        false_positives="None known: with find_unused_parameters=True DDP fills these "
        "gradients itself (the average over the ranks that used them) and the line is not "
        "printed.",
    ),
    fix=(
        "Make the named parameters take part in the loss on every rank and step, or freeze them.",
        "Or wrap with DistributedDataParallel(model, find_unused_parameters=True) (slower).",
    ),
    positive=(
        "ddpdoctor: parameters without gradient on rank 1 (step 0): aux_head.weight, aux_head.bias",
    ),
    negative=("Parameters which did not receive grad for rank 1: aux_head.weight",),
)

DDP_MODEL_MISMATCH = Rule(
    code="DDP104",
    kind="ddp-model-mismatch",
    title="Ranks built different models",
    sources="torch/csrc/distributed/c10d/comm.cpp _verify_params_across_processes",
    signatures=(
        Signature(
            r"DDP expects same model across all ranks, but Rank (?P<rank_a>\d+) has "
            r"(?P<count_a>\d+) params, while rank (?P<culprit_rank>\d+) has inconsistent "
            r"(?P<count_b>\d+) params",
            "DDP expects same model across all ranks",
        ),
        # older torch and shape mismatches: "params[0] in this process with sizes [4, 8]
        # appears not to match sizes of the same param in process 0."
        Signature(r"appears not to match (?:sizes|strides) of the same param in process 0"),
    ),
    explanation=Explanation(
        what="DDP compared parameter counts or shapes across ranks at construction and they differ.",
        why="A rank-dependent code path built or froze the model differently (e.g. only rank 0 "
        "loads a checkpoint that changes the head, requires_grad differs, a config differs per "
        "node).",
        fix="Build the same model on every rank before wrapping; load checkpoints on all ranks "
        "(or broadcast); freeze parameters identically.",
        false_positives="None known.",
    ),
    fix=(
        "Print sum(p.numel() for p in model.parameters() if p.requires_grad) on every rank "
        "before DistributedDataParallel(...) and remove the rank-dependent difference.",
    ),
    positive=(
        "RuntimeError: DDP expects same model across all ranks, but Rank 3 has 2247 params, "
        "while rank 0 has inconsistent 0 params.",
    ),
    negative=("Expected to have finished reduction in the prior iteration",),
)

PROCESS_GROUP_NOT_INITIALIZED = Rule(
    code="DDP105",
    kind="process-group-not-initialized",
    title="torch.distributed used before init_process_group",
    sources="torch/distributed/distributed_c10d.py _get_default_group",
    signatures=(
        Signature(r"Default process group has not been initialized"),
        Signature(r"Default process group is not initialized"),
    ),
    explanation=Explanation(
        what="A distributed call (DDP, SyncBatchNorm, a collective) ran with no default group.",
        why="init_process_group() was never called in this process: a single-process run of a "
        "DDP script, a code path that skips init, or a subprocess that did not inherit it.",
        fix="Call torch.distributed.init_process_group(backend) first (launch with torchrun), "
        "or skip DDP/SyncBatchNorm when not distributed (torch.distributed.is_initialized()).",
        false_positives="None known.",
    ),
    fix=(
        "Launch with torchrun and call torch.distributed.init_process_group() before building "
        "DistributedDataParallel.",
        "For single-process runs, guard DDP with `if torch.distributed.is_initialized():`.",
    ),
    positive=(
        "RuntimeError: Default process group has not been initialized, please make sure to "
        "call init_process_group.",
    ),
    negative=("Initializing distributed: GLOBAL_RANK: 0, MEMBER: 1/2",),
)

UNEVEN_INPUTS = Rule(
    code="DDP106",
    kind="uneven-inputs",
    title="Ranks ran out of data at different steps",
    sources="torch/distributed/algorithms/join.py, DDP join()",
    signatures=(
        # join.py Join._get_num_nonjoined_procs with throw_on_early_termination: raised on
        # the ranks that still had inputs, once a peer ran out (that peer raises 'Rank N
        # exhausted all inputs.'): they waited for it, they did not run out
        Signature(r"Detected at least one rank that exhausted inputs", echo=Echo.WAITING),
        Signature(r"rank (?P<rank>\d+) .{0,40}exhausted (?:its )?inputs", "exhausted"),
        # torch/distributed/algorithms/join.py Join._notify_procs_to_terminate: the rank that
        # ran out first
        Signature(r"Rank (?P<rank>\d+) exhausted all inputs", " exhausted all inputs"),
    ),
    explanation=Explanation(
        what="One rank finished its batches while the others still ran collectives.",
        why="The dataset is split unevenly (an IterableDataset without per-rank sharding, "
        "drop_last=False, filtering per rank), so one rank leaves the loop early and the "
        "others wait for it in the next collective until the timeout.",
        fix="Give every rank the same number of batches (DistributedSampler with drop_last=True, "
        "equal shards), or wrap the loop in `with model.join():`.",
        false_positives="None known for the join message itself.",
    ),
    fix=(
        "Use DistributedSampler(dataset, drop_last=True) or shard iterable datasets to equal "
        "lengths per rank.",
        "Or train inside `with ddp_model.join():` so ranks that finish early shadow the others.",
    ),
    positive=(
        "RuntimeError: Detected at least one rank that exhausted inputs. Throwing across all ranks.",
        "RuntimeError: Rank 2 exhausted all inputs.",
    ),
    negative=(
        "Epoch 3: 100%|##########| 250/250 [00:10<00:00]",
        # WeNet's join: a rank late at the barrier, for whatever reason (DDP110)
        "2024-01-05 10:00:00,000 INFO Detected uneven workload distribution: [Rank 0]: Rank 1 "
        "failed to pass monitoredBarrier in 30000 ms",
    ),
)

JOIN_BARRIER_MISSED = Rule(
    code="DDP110",
    kind="uneven-inputs",
    title="A rank did not reach WeNet's per-batch join barrier (its epoch was ended)",
    sources="WeNet wenet/utils/train_utils.py wenet_join (and CosyVoice, FunASR forks)",
    # the ranks that log it waited at the barrier; the rank it names did not come, and the
    # barrier cannot tell why: its data ran out first (what the recipe means by 'uneven
    # workload'), or it was busy, stuck or had failed. An error of that rank's own, a busy
    # or stuck rank, explains it; alone, uneven data is what it says
    echo=Echo.WAITING,
    specificity=30,
    signatures=(
        Signature(
            r"Detected uneven workload distribution: (?:\[Rank \d+\]: )?Ranks? "
            r"(?P<missing>\d+(?:, \d+)*) failed to pass monitoredBarrier",
            "Detected uneven workload distribution: ",
        ),
        Signature(
            r"Detected uneven workload distribution: Rank \d+ successfully reached "
            r"monitoredBarrier, but received errors while waiting for send/recv from rank "
            r"(?P<missing>0)\b",
            "Detected uneven workload distribution: ",
        ),
        Signature(r"Detected uneven workload distribution: "),
    ),
    explanation=Explanation(
        what="WeNet-style recipes call a gloo monitored_barrier before every batch; a rank that "
        "does not reach it in time makes the others log this and end their epoch.",
        why="The named rank had no batch left (its shard of the data list was shorter: what "
        "the message calls an uneven workload), or it was still busy, stuck, or had died.",
        fix="Read the named rank's log around that time. If it had simply run out of data, "
        "equalise the shards (the same number of utterances per rank) or accept the shorter "
        "epochs, which the recipe handles by design.",
        false_positives="A rank that was slow or had crashed is reported the same way; its own "
        "error or its last words say which.",
    ),
    fix=(
        "Give every rank the same amount of data (split the data list into equal shards per "
        "rank); a shorter epoch on the others is what the recipe does when they differ.",
        "If the named rank raised an error or was stuck, that is the cause: read its log.",
    ),
    positive=(
        # corpus/cases/416 (CosyVoice, the rank that waited on rank 0)
        "2024-08-03 14:52:07,318 INFO Detected uneven workload distribution: Rank 3 "
        "successfully reached monitoredBarrier, but received errors while waiting for "
        "send/recv from rank 0. Please check rank 0 logs for faulty rank.",
        "2024-01-05 10:00:00,000 INFO Detected uneven workload distribution: [Rank 0]: Rank 1 "
        "failed to pass monitoredBarrier in 30000 ms",
    ),
    negative=("RuntimeError: [Rank 0]: Rank 1 failed to pass monitoredBarrier in 2000 ms",),
)

FIND_UNUSED_NEEDLESS = Rule(
    code="DDP108",
    kind="ddp-unused-parameters",
    title="find_unused_parameters=True, but no parameter was unused (a cost every step)",
    sources="torch/csrc/distributed/c10d/reducer.cpp (torch 1.x-2.13)",
    severity="info",
    specificity=10,
    signatures=(
        Signature(
            r"find_unused_parameters=True was specified in DDP constructor, but did not find any "
            r"unused parameters",
            "but did not find any unused parameters",
        ),
    ),
    explanation=Explanation(
        what="DDP was built with find_unused_parameters=True and found every parameter used.",
        why="The flag makes DDP walk the autograd graph after every forward to find "
        "parameters without a gradient: wasted time when there are none. Never a failure.",
        fix="Turn the flag off unless some steps really leave parameters unused.",
        false_positives="A model whose later steps take branches that leave parameters unused "
        "needs the flag (the warning is printed from the first steps).",
    ),
    fix=(
        "Set find_unused_parameters=False (DistributedDataParallel(..., "
        "find_unused_parameters=False); HF Trainer: --ddp_find_unused_parameters False; "
        "Lightning: strategy='ddp') unless some steps really leave parameters unused.",
    ),
    positive=(
        "[W reducer.cpp:1300] Warning: find_unused_parameters=True was specified in DDP "
        "constructor, but did not find any unused parameters in the forward pass.",
    ),
    negative=("find_unused_parameters=True",),
)

BARRIER_DEVICE_UNKNOWN = Rule(
    code="DDP109",
    kind="device-assignment",
    title="barrier() guessed the rank's GPU (no device_id given)",
    sources="torch/csrc/distributed/c10d/ProcessGroupNCCL.cpp (torch 2.4-2.6; guessDeviceId "
    "2.7+), torch/distributed/distributed_c10d.py barrier (2.7-2.13)",
    severity="info",
    specificity=10,
    signatures=(
        Signature(
            r"to perform barrier as devices used by this process are currently unknown",
            "to perform barrier as devices used by this process are currently unknown",
        ),
        Signature(
            r"barrier\(\): using the device under current context", "using the device under current"
        ),
        # torch 2.7+'s ProcessGroupNCCL::guessDeviceId, before any collective that needs a GPU
        Signature(
            r"using GPU \d+ as device used by this process is currently unknown",
            "as device used by this process is currently unknown",
        ),
    ),
    explanation=Explanation(
        what="NCCL's barrier did not know which GPU the rank uses and picked one (the rank's "
        "index, or the current device).",
        why="The process group was created without device_id and no collective had run on a "
        "GPU yet. Harmless when each rank has already called torch.cuda.set_device(local "
        "rank); a hang when two ranks end up on one GPU.",
        fix="Create the process group with device_id, or call torch.cuda.set_device(local "
        "rank) first and barrier(device_ids=[local_rank]).",
        false_positives="None: it is a notice; only a wrong GPU mapping makes it a fault.",
    ),
    fix=(
        "init_process_group('nccl', device_id=torch.device(f'cuda:{local_rank}')) (torch >= "
        "2.3), or torch.cuda.set_device(local_rank) before it and barrier(device_ids="
        "[local_rank]).",
    ),
    positive=(
        "[PG 0 Rank 4]  using GPU 4 to perform barrier as devices used by this process are "
        "currently unknown. This can potentially cause a hang if this rank to GPU mapping is "
        "incorrect.",
        "UserWarning: barrier(): using the device under current context. You can specify "
        "`device_id` in `init_process_group` to mute this warning.",
        "[PG ID 0 PG GUID 0 Rank 2]  using GPU 2 as device used by this process is currently "
        "unknown. This can potentially cause a hang if this rank to GPU mapping is incorrect. "
        "You can specify device_id in init_process_group() to force use of a particular device.",
    ),
    negative=("dist.barrier(device_ids=[local_rank])",),
)

RULES = (
    DDP_UNUSED_PARAMETERS,
    FIND_UNUSED_NEEDLESS,
    BARRIER_DEVICE_UNKNOWN,
    DDP_PARAMETERS_WITHOUT_GRAD,
    DDP_MARK_READY_TWICE,
    DDP_GRAD_STRIDES,
    DDP_MODEL_MISMATCH,
    PROCESS_GROUP_NOT_INITIALIZED,
    UNEVEN_INPUTS,
    JOIN_BARRIER_MISSED,
)
