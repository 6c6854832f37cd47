"""CUDA-side failures: memory, device asserts, hardware, library and device-assignment errors
(c10/cuda/CUDACachingAllocator.cpp, c10/cuda/CUDAException.cpp, torch/cuda/__init__.py, NCCL)."""

from __future__ import annotations

from ddpdoctor.rules.base import Explanation, Rule, Signature

CUDA_OOM = Rule(
    code="CUDA101",
    kind="cuda-oom",
    title="Out of GPU memory",
    sources="c10/cuda/CUDACachingAllocator.cpp",
    specificity=60,
    signatures=(
        # NCCL running out of GPU memory for its buffers
        Signature(r"Cuda failure 'out of memory'", "Cuda failure 'out of memory'"),
        Signature(
            r"CUDA out of memory\. Tried to allocate (?P<size>[\d.]+ [KMGT]i?B)",
            "CUDA out of memory",
        ),
        Signature(r"CUDA out of memory"),
        Signature(r"CUDA error: out of memory"),
        Signature(r"OutOfMemoryError"),
        Signature(r"CUBLAS_STATUS_ALLOC_FAILED"),
        Signature(r"cudaErrorMemoryAllocation"),
    ),
    explanation=Explanation(
        what="The CUDA caching allocator could not allocate memory on a GPU.",
        why="Batch, sequence length or model too large for the GPU, fragmentation, or another "
        "process on the same GPU.",
        fix="Lower the per-GPU batch size (keep the global batch with gradient accumulation), "
        "enable activation checkpointing or mixed precision, set "
        "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True, check nvidia-smi for other processes.",
        false_positives="An OOM during torch.load on resume is checkpoint-load-device (CUDA102).",
    ),
    fix=(
        "Reduce the per-GPU batch size and keep the global batch with gradient accumulation.",
        "export PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True (fragmentation).",
        "Enable activation checkpointing and bf16/fp16 mixed precision.",
    ),
    positive=(
        "torch.cuda.OutOfMemoryError: CUDA out of memory. Tried to allocate 336.00 MiB. GPU  "
        "has a total capacity of 79.15 GiB of which 141.25 MiB is free.",
    ),
    negative=("Memory cgroup out of memory: Killed process 1234 (python)",),
)

CHECKPOINT_LOAD_DEVICE = Rule(
    code="CUDA102",
    kind="checkpoint-load-device",
    title="Checkpoint loaded onto the GPU it was saved from (no map_location)",
    sources="torch/serialization.py _cuda_deserialize / default_restore_location",
    specificity=80,
    signatures=CUDA_OOM.signatures,
    context_all=(r"torch\.load|serialization\.py|_cuda_deserialize|restore_location",),
    explanation=Explanation(
        what="Out of GPU memory while torch.load restored CUDA tensors.",
        why="Without map_location, torch.load puts every tensor on the device it was saved "
        "from (cuda:0), so every rank allocates the whole checkpoint on GPU 0 at resume.",
        fix="torch.load(path, map_location='cpu') then move, or map_location=f'cuda:{local_rank}'.",
        false_positives="A genuinely too large checkpoint for one GPU also fails here.",
    ),
    fix=(
        "Load with torch.load(path, map_location='cpu') (or map_location=f'cuda:{local_rank}').",
        "Call torch.cuda.set_device(local_rank) before loading anything.",
    ),
    positive=(
        "RuntimeError: CUDA out of memory. Tried to allocate 20.00 MiB (GPU 0; 11.17 GiB total "
        "capacity; 962.69 MiB already allocated; 17.19 MiB free",
    ),
    negative=("torch.cuda.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB",),
)

DEVICE_SIDE_ASSERT = Rule(
    code="CUDA103",
    kind="device-side-assert",
    title="CUDA device-side assertion (usually an index out of range)",
    sources="aten/src/ATen/native/cuda/*.cu, c10/cuda/CUDAException.cpp",
    specificity=70,
    signatures=(
        Signature(r"device-side assert triggered"),
        Signature(r"\.cu:\d+: \w+: block: \[[\d,]+\], thread: \[[\d,]+\] Assertion", "Assertion"),
        Signature(r"Compile with `TORCH_USE_CUDA_DSA` to enable device-side assertions"),
    ),
    explanation=Explanation(
        what="A CUDA kernel hit an assertion: almost always an index out of range.",
        why="Labels outside [0, num_classes), token ids >= embedding size (tokens added to a "
        "tokenizer without resizing the embeddings), negative indices.",
        fix="Re-run with CUDA_LAUNCH_BLOCKING=1 (or on CPU) to get the exact line; check "
        "label/token ranges; model.resize_token_embeddings(len(tokenizer)).",
        false_positives="The 'Compile with TORCH_USE_CUDA_DSA' hint follows every CUDA error; "
        "it only counts when no more specific CUDA error is present.",
    ),
    fix=(
        "Re-run with CUDA_LAUNCH_BLOCKING=1 to get the failing operation's true stack.",
        "Check that labels are in [0, num_classes) and token ids < embedding rows "
        "(model.resize_token_embeddings(len(tokenizer)) after adding tokens).",
    ),
    positive=(
        "/opt/conda/conda-bld/pytorch/work/aten/src/ATen/native/cuda/Indexing.cu:1146: "
        "indexSelectLargeIndex: block: [58,0,0], thread: [21,0,0] Assertion srcIndex < "
        "srcSelectDimSize failed.",
    ),
    negative=("AssertionError: batch size must be positive",),
)

GPU_HARDWARE = Rule(
    code="CUDA104",
    kind="gpu-hardware",
    title="GPU hardware fault (ECC, Xid, fallen off the bus)",
    sources="CUDA runtime errors, kernel NVRM messages",
    specificity=90,
    proves_infrastructure=True,
    signatures=(
        Signature(r"uncorrectable ECC error encountered"),
        Signature(r"NVRM: Xid \(PCI:(?P<pci>[\w:.]+)\): (?P<xid>\d+)", "NVRM: Xid"),
        Signature(r"GPU has fallen off the bus"),
        Signature(r"PCIe Bus Error: severity=(?P<severity>\w+)", "PCIe Bus Error"),
        Signature(r"unrecoverable.{0,20}(?:ECC|NVLink)", "unrecoverable"),
        Signature(r"CUDA error: GPU is lost"),
    ),
    explanation=Explanation(
        what="The GPU or its link reported a hardware error.",
        why="Memory ECC failures, a GPU dropping off PCIe, NVLink faults: the node needs "
        "attention from operations.",
        fix="Drain the node, run the vendor diagnostics (dcgmi diag -r 3, nvidia-smi -q -d ECC), "
        "and resubmit elsewhere.",
        false_positives="None known for these texts.",
    ),
    fix=(
        "Exclude the node (Slurm: --exclude=HOST) and resubmit.",
        "Report the node to operations with `nvidia-smi -q -d ECC` and `dmesg | grep -i xid`.",
    ),
    positive=(
        "RuntimeError: CUDA error: uncorrectable ECC error encountered",
        "pcieport 0000:00:03.1: PCIe Bus Error: severity=Uncorrected (Non-Fatal), type=Transaction Layer",
    ),
    negative=("CUDA error: device-side assert triggered",),
)

CUDA_LIBRARY_MISMATCH = Rule(
    code="CUDA105",
    kind="cuda-library-mismatch",
    title="CUDA/cuDNN/NCCL/driver versions or GPU architecture do not match",
    sources="torch/cuda/__init__.py _check_capability, CUDA runtime, dynamic loader",
    specificity=80,
    signatures=(
        Signature(r"the provided PTX was compiled with an unsupported toolchain"),
        Signature(r"no kernel image is available for execution on the device"),
        Signature(r"is not compatible with the current PyTorch installation"),
        Signature(r"The NVIDIA driver on your system is too old"),
        Signature(r"CUDA driver version is insufficient for CUDA runtime version"),
        Signature(r"cuDNN version incompatibility"),
        Signature(r"Found no NVIDIA driver on your system"),
        Signature(r"Driver/library version mismatch"),
        Signature(
            r"CUDNN_STATUS_(?:NOT_INITIALIZED|ARCH_MISMATCH|VERSION_MISMATCH)", "CUDNN_STATUS_"
        ),
        Signature(
            # bounded runs: `\w*` from every "libcuda" of a long word was quadratic
            r"lib(?:cudnn|nccl|cublas|cudart|cuda)\w{0,64}\.so[.\d]{0,16}: cannot open shared "
            r"object file",
            ": cannot open shared object file",
        ),
        Signature(r"undefined symbol: (?:nccl|cudnn|cublas)\w*", "undefined symbol: "),
    ),
    explanation=Explanation(
        what="The installed PyTorch binary does not fit the GPU, the driver or the CUDA libraries.",
        why="A wheel built for older GPU architectures, a driver older than the wheel's CUDA, "
        "two cuDNN/NCCL copies on the library path, or a missing library.",
        fix="Install a PyTorch build for this GPU and driver (see pytorch.org/get-started), "
        "remove stray libraries from LD_LIBRARY_PATH, update the driver.",
        false_positives="None known.",
    ),
    fix=(
        "Check `python -c 'import torch; print(torch.__version__, torch.version.cuda, "
        "torch.backends.cudnn.version(), torch.cuda.get_arch_list())'` against `nvidia-smi`.",
        "Install a PyTorch wheel whose CUDA version the driver supports and whose arch list "
        "includes the GPU (e.g. sm_80 for A100); clear LD_LIBRARY_PATH of other CUDA/cuDNN copies.",
    ),
    positive=(
        "NVIDIA A100-PCIE-40GB with CUDA capability sm_80 is not compatible with the current "
        "PyTorch installation.",
        "RuntimeError('CUDA error: no kernel image is available for execution on the device')",
    ),
    negative=("NCCL INFO cudaDriverVersion 12020",),
)

DEVICE_ASSIGNMENT = Rule(
    code="CUDA106",
    kind="device-assignment",
    title="Ranks share a GPU or use a device that is not theirs",
    sources="NCCL init.cc (Duplicate GPU detected), CUDA runtime",
    specificity=85,
    signatures=(
        Signature(r"CUDA-capable device\(s\) is/are busy or unavailable", "busy or unavailable"),
        Signature(
            r"Duplicate GPU detected : rank (?P<rank_a>\d+) and rank (?P<rank_b>\d+) both on "
            r"CUDA device (?P<busid>\w+)",
            "Duplicate GPU detected",
        ),
        Signature(r"CUDA error: invalid device ordinal"),
        Signature(
            r"Expected all tensors to be on the same device, but found at least two devices",
            "Expected all tensors to be on the same device",
        ),
        Signature(r"Tensors must be CUDA and dense"),
        Signature(r"NCCL error.{0,80}invalid usage", "invalid usage"),
    ),
    explanation=Explanation(
        what="Several ranks ended up on the same GPU, or a rank used a device index it cannot see.",
        why="torch.cuda.set_device(local_rank) missing or a hard-coded device, "
        "CUDA_VISIBLE_DEVICES set after CUDA was initialised, or device numbering differing "
        "from nvidia-smi (CUDA_DEVICE_ORDER).",
        fix="Call torch.cuda.set_device(int(os.environ['LOCAL_RANK'])) before init_process_group "
        "and use device=f'cuda:{local_rank}'; set CUDA_VISIBLE_DEVICES before Python starts; "
        "export CUDA_DEVICE_ORDER=PCI_BUS_ID.",
        false_positives="'invalid usage' has other causes; NCCL_DEBUG=WARN prints which.",
    ),
    fix=(
        "torch.cuda.set_device(int(os.environ['LOCAL_RANK'])) before "
        "init_process_group('nccl'); never hard-code cuda:0.",
        "Set CUDA_VISIBLE_DEVICES in the launcher environment, not inside the script after "
        "import torch; export CUDA_DEVICE_ORDER=PCI_BUS_ID.",
    ),
    positive=("Duplicate GPU detected : rank 0 and rank 1 both on CUDA device 2000",),
    negative=("NCCL INFO comm 0x55 rank 1 nranks 2 cudaDev 1 busId 2000 - Init COMPLETE",),
)

DATALOADER_CUDA_FORK = Rule(
    code="CUDA107",
    kind="dataloader-cuda-fork",
    title="CUDA initialised inside forked DataLoader workers",
    sources="torch/cuda/__init__.py _lazy_init, CUDA runtime",
    specificity=85,
    signatures=(
        Signature(r"Cannot re-initialize CUDA in forked subprocess"),
        Signature(r"CUDA error: initialization error"),
    ),
    context_all=(r"worker|dataloader|DataLoader|forked|collate",),
    explanation=Explanation(
        what="A DataLoader worker (a forked process) touched CUDA.",
        why="CUDA cannot be used in a child forked after the parent initialised CUDA: CUDA "
        "tensors created in Dataset.__getitem__/collate, a CUDA default tensor type, or a "
        "CUDA model captured by the dataset.",
        fix="Keep datasets and collate on CPU and move batches to the GPU in the training loop; "
        "or use multiprocessing_context='spawn' for the DataLoader.",
        false_positives="'initialization error' outside workers is a driver/installation problem.",
    ),
    fix=(
        "Return CPU tensors from Dataset/collate_fn; call .cuda() in the training loop.",
        "Do not set a CUDA default tensor type; or DataLoader(..., "
        "multiprocessing_context='spawn').",
    ),
    positive=(
        "RuntimeError: Cannot re-initialize CUDA in forked subprocess. To use CUDA with multiprocessing, you must use the 'spawn' start method",
    ),
    negative=("RuntimeError: CUDA error: out of memory",),
)

SHARED_GPU_OOM = Rule(
    code="CUDA108",
    kind="device-assignment",
    title="Out of GPU memory on a GPU that several processes share",
    sources="c10/cuda/CUDACachingAllocator.cpp (lists other processes on the device)",
    specificity=70,
    signatures=(
        Signature(
            r"Process \d+ has [\d.]+ [KMGT]iB memory in use\. Process \d+ has",
            "memory in use. Process ",
        ),
    ),
    explanation=Explanation(
        what="The OOM message lists several processes holding memory on the same GPU.",
        why="Ranks landed on the same device: torch.cuda.set_device(local_rank) missing, a "
        "hard-coded cuda:0, CUDA_VISIBLE_DEVICES set after CUDA started, or torch.load without "
        "map_location putting every rank's checkpoint on GPU 0.",
        fix="torch.cuda.set_device(local_rank) first thing; load checkpoints with "
        "map_location='cpu'; check nvidia-smi shows one process per GPU.",
        false_positives="Another user's job on a shared GPU also shows up as a second process.",
    ),
    fix=(
        "torch.cuda.set_device(int(os.environ['LOCAL_RANK'])) before any CUDA work.",
        "torch.load(path, map_location='cpu') on resume; run `nvidia-smi` to see who shares the GPU.",
    ),
    positive=(
        "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 64.00 MiB. GPU 0 has a total "
        "capacity of 23.65 GiB of which 9.06 MiB is free. Process 3522 has 5.91 GiB memory in use. "
        "Process 3523 has 5.91 GiB memory in use.",
    ),
    negative=(
        "torch.cuda.OutOfMemoryError: CUDA out of memory. Tried to allocate 336.00 MiB. GPU  has a "
        "total capacity of 79.15 GiB of which 141.25 MiB is free. Process 2109115 has 78.99 GiB "
        "memory in use.",
    ),
)

RULES = (
    SHARED_GPU_OOM,
    CUDA_OOM,
    CHECKPOINT_LOAD_DEVICE,
    DEVICE_SIDE_ASSERT,
    GPU_HARDWARE,
    CUDA_LIBRARY_MISMATCH,
    DEVICE_ASSIGNMENT,
    DATALOADER_CUDA_FORK,
)
