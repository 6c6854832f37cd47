"""Performance rules read from measurements a job printed (a profiler's table), not from a
failure: a job that ran, slowly, and the line that says where its time went."""

from __future__ import annotations

from ddpdoctor.rules.base import Explanation, Rule, Signature

# torch.profiler's key_averages().table(): with CPU and CUDA columns the share is the eighth
# field (Name, Self CPU %, Self CPU, CPU total %, CPU total, CPU time avg, Self CUDA, Self CUDA
# %, ...); with CUDA columns only, the third (Name, Self CUDA, Self CUDA %, ...)
_PCT = r"[\d.]+%"
_TIME = r"[\d.]+(?:s|ms|us|ns)"
_TO_SELF_CUDA_SHARE = rf"\s+(?:{_PCT}\s+{_TIME}\s+{_PCT}\s+{_TIME}\s+{_TIME}\s+)?{_TIME}\s+"
# half of the GPU's kernel time or more: (5x-9x or 100)%
_HALF_OR_MORE = r"(?P<share>(?:[5-9]\d|100)(?:\.\d+)?)%"

COLLECTIVES_DOMINATE_PROFILE = Rule(
    code="PERF102",
    kind="zero3-multinode-slow",
    title="Collective kernels take half the GPU time or more in a torch.profiler table",
    sources="torch.profiler key_averages().table() (torch/autograd/profiler_util.py); NCCL's "
    "kernel names (ncclKernel_* / ncclDevKernel_*), c10d's ops (c10d::allreduce_, "
    "c10d::_allgather_base_, ...)",
    severity="warning",
    specificity=8,
    signatures=(
        Signature(
            rf"^\s*(?P<op>nccl(?:Dev)?Kernel_\S*){_TO_SELF_CUDA_SHARE}{_HALF_OR_MORE}",
            "Kernel_",
        ),
        Signature(rf"^\s*(?P<op>c10d::\S+){_TO_SELF_CUDA_SHARE}{_HALF_OR_MORE}", "c10d::"),
    ),
    explanation=Explanation(
        what="In the profile the job printed, one collective (its NCCL kernel or its c10d "
        "op) takes half of the GPU's kernel time or more.",
        why="A step cannot take less time than its communication: when the collectives' "
        "kernels run as long as all the compute together, even perfect overlap leaves every "
        "step waiting on the network. Across nodes that is the link (TCP sockets instead of "
        "IB/RoCE, one NIC for many GPUs), made worse by full sharding (ZeRO-3, FSDP "
        "FULL_SHARD gathers every layer's parameters each forward and backward); inside a "
        "node, peer-to-peer paths that are disabled or go through the CPU.",
        fix="Cut the traffic that crosses the slow link (hybrid sharding: FSDP HYBRID_SHARD or "
        "DeepSpeed zero_hpz_partition_size; ZeRO-2; gradient accumulation for fewer "
        "all-reduces), and check the transport NCCL chose (NCCL_DEBUG=INFO: 'NET/IB' or "
        "'NET/Socket'; `nvidia-smi topo -m` inside a node).",
        false_positives="A profile of a few warm-up steps, or one taken while a rank waited "
        "for a slower peer (the collective's kernel then includes the wait: a straggler, "
        "not the link).",
    ),
    fix=(
        "Check the transport: NCCL_DEBUG=INFO must say 'NET/IB : Using ...' between nodes "
        "('NET/Socket' is TCP); inside a node `nvidia-smi topo -m` shows the GPU paths.",
        "Cut the traffic across nodes: FSDP sharding_strategy=HYBRID_SHARD or DeepSpeed "
        '"zero_hpz_partition_size": <GPUs per node>, or ZeRO stage 2; accumulate gradients '
        "over more micro-batches.",
        "Profile a few steady-state steps of every rank: a collective that is long on every "
        "rank is the link; one long on some ranks only is those ranks waiting for a straggler.",
    ),
    positive=(
        "                                 c10d::_allgather_base_         0.04%      49.806ms  "
        "       0.05%      59.418ms      73.356us       41.212s        53.98%       41.212s  "
        "    50.879ms           810  ",
        "ncclKernel_AllGather_RING_LL_Sum_int8_t(ncclDevComm*...         0.00%       0.000us  "
        "       0.00%       0.000us       0.000us       41.212s        53.98%       41.212s  "
        "    50.879ms           810  ",
    ),
    negative=(
        # a collective's small share, the generic comms record, compute's rows
        "ncclKernel_AllReduce_RING_LL_Sum_float(ncclWorkElem)...      494.207ms         3.95%  "
        "   494.207ms      30.888ms ",
        "                                     record_param_comms         0.02%      28.117ms  "
        "       0.03%      32.904ms      20.186us       27.402s        35.89%       27.402s  "
        "    16.811ms          1630  ",
        "                                aten::native_layer_norm         2.105s        16.81%  "
        "      2.224s     638.068us ",
    ),
)

RULES = (COLLECTIVES_DOMINATE_PROFILE,)
