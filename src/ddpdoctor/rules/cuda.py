"""CUDA-side failures: memory, device asserts, hardware, library and device-assignment errors
(c10/cuda/CUDACachingAllocator.cpp, c10/cuda/CUDAException.cpp, torch/cuda/__init__.py, NCCL)."""

from __future__ import annotations

from ddpdoctor.rules.base import Explanation, Rule, Signature

OOM_ALLOCATE = r"CUDA out of memory\. Tried to allocate (?P<size>[\d.]+ [KMGT]i?B)"
CUDA_FAILURE = r"(?:Cuda failure (?:\d{1,4} )?|Test CUDA failure \S{1,200}:\d{1,6} )"
"""How NCCL's CUDACHECK ("Cuda failure 'out of memory'"; since NCCL 2.19 with the error's
number, "Cuda failure 2 'out of memory'") and nccl-tests ("Test CUDA failure common.cu:941
'invalid device ordinal'") put the CUDA runtime's error string, which follows in quotes."""

CUDA_OOM = Rule(
    code="CUDA101",
    kind="cuda-oom",
    title="Out of GPU memory",
    sources="c10/cuda/CUDACachingAllocator.cpp",
    specificity=60,
    signatures=(
        # NCCL's own allocation of GPU memory (census nccl-warn-cuda-malloc)
        Signature(r"NCCL WARN Failed to CUDA malloc \d{1,15} bytes", "Failed to CUDA malloc"),
        # NCCL running out of GPU memory for its buffers (its CUDACHECK: "Cuda failure 'out of
        # memory'", with the error's number since NCCL 2.19 "Cuda failure 2 'out of memory'";
        # nccl-tests: "Test CUDA failure common.cu:941 'out of memory'")
        Signature(CUDA_FAILURE + r"'out of memory'", " 'out of memory'"),
        Signature(
            # and the device, as the process numbers it: "(GPU 1; 10.92 GiB total capacity",
            # torch 2's ". GPU 1 has a total capacity" (no number where it is unknown)
            OOM_ALLOCATE + r"(?:\.? \(?GPU (?P<own_device>\d{1,3})(?:;| has))?",
            "CUDA out of memory",
        ),
        Signature(r"CUDA out of memory"),
        Signature(r"CUDA error: out of memory"),
        # torch < 1.9's exception: 'RuntimeError: cuda runtime error (2) : out of memory at
        # ...' (not the allocator's own 'THCudaCheck FAIL ... error=2 : out of memory' line,
        # printed before an exception a program may catch: fairseq skips the batch, case 662)
        Signature(r"cuda runtime error \(2\) : out of memory", "cuda runtime error (2)"),
        # torch.OutOfMemoryError / torch.cuda.OutOfMemoryError (not Ray's host-memory kill,
        # ray.exceptions.OutOfMemoryError)
        Signature(r"(?<!exceptions\.)OutOfMemoryError", "OutOfMemoryError"),
        Signature(r"CUBLAS_STATUS_ALLOC_FAILED"),
        # cuDNN's allocation of its workspace or handle failed (aten/src/ATen/cudnn/
        # Exceptions.h: 'cuDNN error: ' + cudnnGetErrorString)
        Signature(r"cuDNN error: CUDNN_STATUS_ALLOC_FAILED", "CUDNN_STATUS_ALLOC_FAILED"),
        Signature(r"cudaErrorMemoryAllocation"),
        # accelerate utils/memory.py find_executable_batch_size: every batch size ran out of
        # GPU memory
        Signature(r"No executable batch size found, reached zero"),
        # vLLM's engine at start-up (vllm/v1/worker/gpu_worker.py, vllm/v1/core/
        # kv_cache_utils.py): the GPU share gpu_memory_utilization asks for is not free (an RL
        # trainer's actor on the same GPU), or what is left after the weights holds no KV
        # cache or not one max_model_len sequence (census vllm-free-memory-below-utilization,
        # vllm-no-memory-for-cache-blocks, vllm-kv-cache-too-small-for-max-len)
        Signature(
            r"Free memory on device \([\d.]{1,12}/[\d.]{1,12} GiB\) on startup is less than "
            r"desired GPU memory utilization",
            "is less than desired GPU memory utilization",
        ),
        Signature(r"No available memory for the cache blocks"),
        Signature(
            r"GiB KV cache is needed, which is larger than the available KV cache memory",
            "which is larger than the available KV cache memory",
        ),
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
        "If it ran out while loading a checkpoint (torch.load, load_from_checkpoint, a resume): "
        "load it onto the CPU first, torch.load(path, map_location='cpu'): a checkpoint saved "
        "from cuda:0 otherwise lands on cuda:0 in every rank.",
    ),
    positive=(
        "host7:1234:1300 [0] include/alloc.h:48 NCCL WARN Cuda failure 2 'out of memory'",
        "g0010: Test CUDA failure common.cu:941 'out of memory'",
        "gpu-n7:2291:2384 [3] include/alloc.h:161 NCCL WARN Failed to CUDA malloc 2097152 bytes",
        "RuntimeError: cuda runtime error (2) : out of memory at "
        "/pytorch/aten/src/THC/generic/THCStorage.cu:58",
        "torch.cuda.OutOfMemoryError: CUDA out of memory. Tried to allocate 336.00 MiB. GPU  "
        "has a total capacity of 79.15 GiB of which 141.25 MiB is free.",
        "ValueError: Free memory on device (31.42/79.19 GiB) on startup is less than desired GPU "
        "memory utilization (0.6, 47.51 GiB). Decrease GPU memory utilization or reduce GPU "
        "memory used by other processes.",
        "ValueError: No available memory for the cache blocks. Try increasing "
        "`gpu_memory_utilization` when initializing the engine.",
    ),
    negative=(
        "Memory cgroup out of memory: Killed process 1234 (python)",
        "THCudaCheck FAIL file=/pytorch/torch/lib/THC/generic/THCStorage.cu line=58 error=2 : out "
        "of memory",
    ),
)

CHECKPOINT_LOAD_DEVICE = Rule(
    code="CUDA102",
    kind="checkpoint-load-device",
    title="Checkpoint loaded onto the GPU it was saved from (no map_location)",
    sources="torch/serialization.py _cuda_deserialize / default_restore_location",
    # above the rules it refines (OOM, a device busy) where its context holds
    specificity=90,
    signatures=(
        # (the allocation's device is where the checkpoint's tensors land, not the rank's own:
        # the same signatures, that one without it)
        *(
            Signature(OOM_ALLOCATE, "CUDA out of memory") if "own_device" in s.regex else s
            for s in CUDA_OOM.signatures
        ),
        # the saved device held by another process (every rank restores onto the GPU the
        # checkpoint names; in exclusive-process mode the first rank there holds it)
        Signature(
            r"(?:CUDA-capable device\(s\) is/are|all CUDA-capable devices are) busy or unavailable",
            "busy or unavailable",
        ),
    ),
    context_all=(r"torch\.load|serialization\.py|_cuda_deserialize|restore_location",),
    explanation=Explanation(
        what="Out of GPU memory, or the GPU busy or unavailable, while torch.load restored CUDA "
        "tensors.",
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
        "RuntimeError: CUDA error: CUDA-capable device(s) is/are busy or unavailable",
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
        # the kernel's own report: "<file>.cu:<line>: <function>: block: [..], thread: [..]
        # Assertion `...` failed."; the function may be a lambda's operator() or a template
        # with its arguments ("void cunn_ClassNLLCriterion_updateOutput_kernel(...) [with
        # Dtype = float]", torch < 1.5)
        # (the block/thread coordinates alone: a gap up to them was quadratic on long lines)
        Signature(
            r"block: \[\d+,\d+,\d+\], thread: \[\d+,\d+,\d+\] Assertion",
            "], thread: [",
        ),
        # not "Compile with `TORCH_USE_CUDA_DSA` to enable device-side assertions": c10's CUDA
        # check (c10/cuda/CUDAException.cpp) appends it to every CUDA error, so it made an
        # out-of-memory or illegal-access error read as a device-side assert (census)
    ),
    explanation=Explanation(
        what="A CUDA kernel hit an assertion: almost always an index out of range.",
        why="Labels outside [0, num_classes), token ids >= embedding size (tokens added to a "
        "tokenizer without resizing the embeddings), negative indices.",
        fix="Re-run with CUDA_LAUNCH_BLOCKING=1 (or on CPU) to get the exact line; check "
        "label/token ranges; model.resize_token_embeddings(len(tokenizer)).",
        false_positives="The 'Compile with TORCH_USE_CUDA_DSA' hint follows every CUDA error "
        "(out of memory, illegal memory access): it is not evidence of an assert.",
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
        "/pytorch/aten/src/ATen/native/cuda/IndexKernel.cu:92: operator(): block: [0,0,0], "
        'thread: [0,0,0] Assertion `-sizes[i] <= index && index < sizes[i] && "index out of '
        'bounds"` failed.',
        "/pytorch/aten/src/THCUNN/ClassNLLCriterion.cu:106: void "
        "cunn_ClassNLLCriterion_updateOutput_kernel(Dtype *, Dtype *, Dtype *, long *, Dtype *, "
        "int, int, int, int, long) [with Dtype = float, Acctype = float]: block: [0,0,0], "
        "thread: [16,0,0] Assertion `t >= 0 && t < n_classes` failed.",
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
        # not Xid 13 and 31: a kernel's out-of-range access and a GPU page fault, mostly the
        # application's own (CUDA109)
        # (a MIG instance adds its id: 'Xid (PCI:0000:01:00 GPU-I:05): 94')
        Signature(
            r"NVRM: Xid \(PCI:(?P<pci>[\w:.]+)(?: GPU-I:\w{1,6})?\): (?P<xid>(?!(?:13|31)\b)\d+)",
            "NVRM: Xid",
        ),
        Signature(r"GPU has fallen off the bus"),
        # not a corrected error: the link retried and nothing was lost
        Signature(r"PCIe Bus Error: severity=(?P<severity>(?!Correct)\w+)", "PCIe Bus Error"),
        Signature(r"unrecoverable.{0,20}(?:ECC|NVLink)", "unrecoverable"),
        # NVML_ERROR_GPU_IS_LOST, as nvidia-smi and NVML users print it ("Unable to determine
        # the device handle for GPU ...: GPU is lost. Reboot the system to recover this GPU")
        Signature(r"\bGPU is lost\b", "GPU is lost"),
        # the same nvidia-smi line with another NVML error ("Unknown Error"): the driver can no
        # longer reach that GPU at all
        Signature(
            r"Unable to determine the device handle for GPU ?(?P<pci>[0-9A-Fa-f:.]{7,20}): \S",
            "Unable to determine the device handle for GPU",
        ),
        # cudaErrorNvlinkUncorrectable (libcudart cudaGetErrorString)
        Signature(r"uncorrectable NVLink error detected"),
        # the driver could not initialise the GPU (open-gpu-kernel-modules osinit.c): unusable
        # until reset (census nvrm-rminitadapter-failed)
        Signature(r"NVRM: GPU \S{1,20}: RmInitAdapter failed!", "RmInitAdapter failed"),
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
        "[  18.220931] NVRM: GPU 0000:3b:00.0: RmInitAdapter failed! (0x26:0xffff:1601)",
        "RuntimeError: CUDA error: uncorrectable ECC error encountered",
        "pcieport 0000:00:03.1: PCIe Bus Error: severity=Uncorrected (Non-Fatal), type=Transaction Layer",
        "Unable to determine the device handle for GPU 0000:41:00.0: GPU is lost. Reboot the "
        "system to recover this GPU",
        "Unable to determine the device handle for GPU0000:62:00.0: Unknown Error",
        "NVRM: Xid (PCI:0000:3b:00): 79, pid=2150, name=python, GPU has fallen off the bus.",
    ),
    negative=(
        "CUDA error: device-side assert triggered",
        "nvidia 0000:83:00.0: PCIe Bus Error: severity=Correctable, type=Data Link Layer",
        "NVRM: Xid (PCI:0000:07:00): 13, pid=2150, name=python, Graphics SM Warp Exception",
    ),
)

# the first CUDA release that compiles for each architecture (NVIDIA's CUDA release notes): an
# older torch wheel's toolkit cannot have a kernel for the GPU
ARCH_FIXES = tuple(
    (
        "arch",
        arch,
        f"{name} GPUs ({arch_name}) need a PyTorch built with CUDA {cuda} or newer: install "
        f"a wheel for CUDA {cuda}+ (pytorch.org/get-started, e.g. `pip install torch "
        f"--index-url https://download.pytorch.org/whl/{wheel}`) that the driver supports.",
    )
    for arch, arch_name, name, cuda, wheel in (
        ("sm_80", "sm_80", "Ampere A100", "11.0", "cu118"),
        ("sm_86", "sm_86", "Ampere (RTX 30xx, A10, A40)", "11.1", "cu118"),
        ("sm_89", "sm_89", "Ada (RTX 40xx, L4, L40)", "11.8", "cu118"),
        ("sm_90a?", "sm_90", "Hopper (H100, H200)", "11.8", "cu118"),
        ("sm_100a?", "sm_100", "Blackwell (B200)", "12.8", "cu128"),
        ("sm_120a?", "sm_120", "Blackwell (RTX 50xx)", "12.8", "cu128"),
    )
)
FABRIC_MANAGER_FIX = (
    "what",
    "system not yet initialized",
    "CUDA error 802 (system not yet initialized): on an NVSwitch system (HGX/DGX) the Fabric "
    "Manager must run at exactly the driver's version: `systemctl status nvidia-fabricmanager`, "
    "`nvidia-smi -q | grep -i -A2 fabric`; install the nvidia-fabricmanager package of the "
    "driver's version and start it.",
)

BUILD_FIX = (
    "extension",
    r"[\w.-]+",
    "An extension was compiled at run time and the build failed: the compiler's error above "
    "'Error building extension' says why. Most often nvcc's CUDA differs from torch.version.cuda "
    "(point CUDA_HOME at the matching toolkit) or a compiler or header is missing; DeepSpeed "
    "can be installed with its ops prebuilt (DS_BUILD_OPS=1 pip install deepspeed) so nothing "
    "is compiled when the job starts.",
)

CXX_RUNTIME_FIX = (
    "cxx_runtime",
    r"\w+_[\d.]+",
    "The C++ runtime library loaded (libstdc++.so.6) is older than the one torch or an "
    "extension was built with: the system's copy is found before the environment's. Put the "
    "environment's first (LD_LIBRARY_PATH=$CONDA_PREFIX/lib, or conda install -c conda-forge "
    "'libstdcxx-ng>=12'), or use a build made for this system's compiler.",
)

EXTENSION_FIX = (
    "op",
    r"[\w.]+::\w+",
    "The operator's extension has no CUDA kernel: its build does not match the installed "
    "torch (a CPU-only wheel, or one built for another torch or CUDA). Install the "
    "extension's build for this torch and CUDA (torchvision: from the same index URL as "
    "torch, at the version paired with it), or rebuild it from source with CUDA available.",
)


CUDA_LIBRARY_MISMATCH = Rule(
    code="CUDA105",
    kind="cuda-library-mismatch",
    title="CUDA/cuDNN/NCCL/driver versions or GPU architecture do not match",
    sources="torch/cuda/__init__.py _check_capability, CUDA runtime, dynamic loader",
    specificity=80,
    signatures=(
        # NCCL's loader: NVML's library missing, or a driver too old for the CUDA entry points
        # it needs (census nccl-warn-libnvml-open, nccl-warn-cuda-pfn)
        Signature(r"NCCL WARN Failed to open libnvidia-ml\.so", "Failed to open libnvidia-ml"),
        Signature(r"CUDA some PFN functions not found in the library", "PFN functions not found"),
        Signature(r"the provided PTX was compiled with an unsupported toolchain"),
        Signature(r"no kernel image is available for execution on the device"),
        # a C++/CUDA extension compiled at run time (torch.utils.cpp_extension: DeepSpeed's
        # ops, apex, flash-attn from source) failed to build: the compiler or nvcc does not
        # match torch's CUDA, or headers are missing
        Signature(
            r"Error building extension '(?P<extension>[\w.-]{1,100})'", "Error building extension"
        ),
        # an extension's operator with no CUDA kernel (c10/core/dispatch, OperatorEntry.cpp):
        # the extension (torchvision, mmcv, torch_scatter) was built without CUDA or for
        # another torch ("Could not run 'torchvision::nms' with arguments from the 'CUDA'
        # backend"); aten's own operators missing a kernel are the program's call (PY101)
        Signature(
            r"Could not run '(?!aten::)(?P<op>[\w.]{1,80}::\w{1,120})' with arguments from the "
            r"'CUDA' backend",
            "with arguments from the 'CUDA' backend",
        ),
        # "NVIDIA GeForce RTX 3090 with CUDA capability sm_86 is not compatible with the
        # current PyTorch installation." (torch/cuda/__init__.py _check_capability)
        Signature(
            r"(?:CUDA capability (?P<arch>sm_\d{2,3}a?) )?is not compatible with the current "
            r"PyTorch installation",
            "is not compatible with the current PyTorch installation",
        ),
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
        Signature(
            # torch 1.13 merged libtorch_cuda_cu/_cpp back into libtorch_cuda: an extension
            # compiled against an older torch asks for a library this torch does not have
            r"lib(?:torch_cuda_cu|torch_cuda_cpp|c10_cuda|torch_cuda)\.so: cannot open shared "
            r"object file",
            ": cannot open shared object file",
        ),
        Signature(r"undefined symbol: (?:nccl|cudnn|cublas)\w*", "undefined symbol: "),
        # a compiled extension (flash-attn, apex, mmcv, xformers) built against another torch:
        # its .so asks for a C++ symbol of torch's (c10::, at::) this torch does not export
        Signature(
            r"\.so: undefined symbol: _ZN?K?\d*(?:c10|at|torch)\w*", ".so: undefined symbol: _Z"
        ),
        # cudaGetErrorString (libcudart): cudaErrorNoDevice, cudaErrorSystemDriverMismatch,
        # cudaErrorCompatNotSupportedOnDevice
        Signature(r"no CUDA-capable device is detected"),
        Signature(r"system has unsupported display driver / cuda driver combination"),
        Signature(r"forward compatibility was attempted on non supported HW"),
        # NCCL init.cc: ranks run different NCCL builds (different images or wheels per node)
        Signature(r"Mismatched NCCL version detected"),
        # a build without kernels for this GPU's architecture (cudaErrorSymbolNotFound,
        # cudaErrorInvalidDeviceFunction), as NCCL's WARN or torch's CUDA error prints it:
        # NCCL 2.14 of torch 2.0 / CUDA 11.8 on an RTX 5090 (sm_120), corpus case 1359
        Signature(
            r"(?:" + CUDA_FAILURE + r"|CUDA error:? )'?named symbol not found",
            "named symbol not found",
        ),
        Signature(
            # (ROCm: torch's hipified CUDAException prints "HIP error: invalid device function",
            # clr hip_error.cpp's text for hipErrorInvalidDeviceFunction; census
            # hip-error-invalid-device-function)
            r"(?:" + CUDA_FAILURE + r"|(?:CUDA|HIP) error:? )'?invalid device function",
            "invalid device function",
        ),
        # cudaErrorSystemNotReady (802), as NCCL's 'Cuda failure 802' or torch's CUDA error
        # prints it: on NVSwitch systems (HGX/DGX) the Fabric Manager is not running, or
        # runs another version than the driver
        Signature(
            r"(?:" + CUDA_FAILURE + r"|CUDA error:? )'?(?P<what>system not yet initialized)",
            "system not yet initialized",
        ),
        # torch builds without the requested backend or without CUDA, or no visible GPU
        # (distributed_c10d.py, torch/cuda/__init__.py, c10/cuda/CUDAFunctions.cpp,
        # ProcessGroupNCCL.cpp)
        # (also its source line, which the traceback shows and a paste may keep alone: the
        # string split in two, 'raise RuntimeError("Distributed package doesn't have NCCL "
        # "built in")')
        Signature(
            r"Distributed package doesn't have (?:NCCL|Gloo|XCCL) (?:\" \")?built in",
            "Distributed package doesn't have",
        ),
        Signature(r"Torch not compiled with CUDA enabled"),
        # the C++ runtime loaded is older than the one a binary was built with (the system's
        # or an old environment's libstdc++.so.6 ahead of the environment's own)
        Signature(
            r"version `(?P<cxx_runtime>GLIBCXX_[\d.]{1,12}|CXXABI_[\d.]{1,12})' not found",
            "' not found",
        ),
        # a kernel library that needs a newer GPU than this one (flash-attn's Ampere check,
        # transformers' bf16 check on a GPU without bf16)
        Signature(r"FlashAttention only supports Ampere GPUs or newer", "FlashAttention only"),
        Signature(r"Your setup doesn't support bf16/gpu", "doesn't support bf16"),
        # bitsandbytes could not load its CUDA library for this CUDA (its cuda_setup, < 0.43)
        Signature(r"CUDA Setup failed despite GPU being available", "CUDA Setup failed"),
        # the same on a CPU-only build's torch.cuda.set_device (torch 2.13: the CUDA bindings
        # are simply absent from torch._C)
        Signature(r"module 'torch\._C' has no attribute '_cuda_\w+'", "has no attribute '_cuda_"),
        Signature(r"No CUDA GPUs are available"),
        # torchrun --nproc-per-node=gpu where torch sees no GPU (torch/distributed/run.py:
        # census run-cuda-not-available)
        Signature(r"ValueError: Cuda is not available\.", "Cuda is not available."),
        # the precision asked for is not on this GPU (pre-Ampere): DeepSpeed runtime/engine.py
        # _do_sanity_check, transformers training_args.py; and Lightning's accelerator='gpu'
        # with no CUDA device (accelerator_connector.py) (census ds-bf16-not-supported,
        # hf-tf32-unsupported, lightning-no-gpu-backend)
        Signature(
            r"Type (?:bf16|fp16) is not supported on your device", "is not supported on your device"
        ),
        Signature(r"--tf32 requires Ampere or a newer GPU arch", "--tf32 requires Ampere"),
        # the driver's user-space libraries and its kernel module are of two versions
        # (open-gpu-kernel-modules osapi.c; census nvrm-api-mismatch)
        Signature(r"NVRM: API mismatch: the client ", "NVRM: API mismatch"),
        Signature(
            r"MisconfigurationException: No supported gpu backend found!",
            "No supported gpu backend found",
        ),
        Signature(r"ProcessGroupNCCL is only supported with GPUs, no GPUs found"),
        # DeepSpeed launcher/runner.py and op_builder/builder.py (JIT-compiled ops)
        Signature(r"Unable to proceed, no GPU resources available"),
        # its error goes on ", unable to compile cuda/cpp extensions"; not its notes that
        # the build goes on ("... compiled with 12.4 but since the APIs are compatible,
        # accepting this combination", "... 12.1. Detected `DS_SKIP_CUDA_CHECK=1`")
        Signature(
            r"Installed CUDA version \S+ does not match the version torch was compiled with"
            r" [\d.]{0,11}\d(?:,|$)",
            "does not match the version torch was compiled with",
        ),
        Signature(r"CUDA_HOME does not exist, unable to compile CUDA op"),
        # DeepSpeed op_builder/builder.py: prebuilt ops of another torch or CUDA, or an op
        # whose is_compatible() check failed (census ds-ops-torch-version-mismatch,
        # ds-ops-cuda-version-mismatch, ds-jit-load-not-compatible)
        Signature(
            r"(?:PyTorch|CUDA|HIP) version mismatch! DeepSpeed ops were compiled and installed",
            "version mismatch! DeepSpeed ops were compiled",
        ),
        Signature(
            r"Unable to JIT load the \w{1,60} op due to it not being compatible",
            "op due to it not being compatible",
        ),
        # torch/utils/cpp_extension.py, building or JIT-loading a C++/CUDA extension: nvcc of
        # another CUDA major version than torch's, no CUDA toolkit, a host compiler nvcc
        # rejects, an arch this torch does not know (census cpp-ext-cuda-major-mismatch,
        # cpp-ext-cuda-not-found, cpp-ext-cuda-home-not-set, cpp-ext-compiler-too-new,
        # cpp-ext-unknown-cuda-arch); not its note on a minor-version difference ("has a minor
        # version mismatch ... shouldn't be a problem")
        Signature(
            r"The detected CUDA version \(.{1,20}?\) mismatches the version that was used to "
            r"compile",
            "mismatches the version that was used to compile",
        ),
        Signature(
            r"CUDA was not found on the system, please set the CUDA_HOME",
            "CUDA was not found on the system",
        ),
        Signature(
            r"CUDA_HOME environment variable is not set\. Please set it to your CUDA install root",
            "CUDA_HOME environment variable is not set",
        ),
        Signature(
            r"The current installed version of \S{1,40} \([^)\n]{1,40}\) is (?:greater|less) than "
            r"the (?:maximum|minimum) required version by CUDA",
            "required version by CUDA",
        ),
        Signature(
            r"Unknown CUDA arch \([^)\n]{1,40}\) or GPU not supported", "or GPU not supported"
        ),
        # flash-attn's and apex's setup.py: nvcc too old, or of another CUDA than torch's
        # (census flash-attn-cuda-too-old, apex-cuda-version-mismatch)
        Signature(r"FlashAttention is only supported on CUDA 11\.7 and above"),
        Signature(
            r"Cuda extensions are being compiled with a version of Cuda that does not match",
            "Cuda extensions are being compiled with a version of Cuda",
        ),
        # xformers ops/fmha/common.py, a reason under "No operator found for ...": the
        # xformers installed has no CUDA kernels (census xformers-not-built-with-cuda)
        Signature(r"xFormers wasn't build with CUDA support"),
        # bitsandbytes >= 0.46 cextension.py: no binary of its own for torch's CUDA/ROCm
        # version (census bnb-native-library-unavailable)
        Signature(
            r"Attempted to use bitsandbytes native library functionality but it's not available",
            "bitsandbytes native library functionality",
        ),
        # vLLM distributed/device_communicators/pynccl_wrapper.py: its own NCCL binding could
        # not dlopen libnccl (census vllm-failed-load-nccl)
        Signature(
            r"Failed to load NCCL library from \S{1,300}\. It is expected if you are not running",
            "Failed to load NCCL library from ",
        ),
        # ROCm's HIP runtime (clr hipamd/src/hip_code_object.cpp): no code object for this
        # GPU's gfx target in the binary (census hip-no-binary-for-gpu)
        Signature(r"hipErrorNoBinaryForGpu: Unable to find code object", "hipErrorNoBinaryForGpu"),
        # Megatron-LM: rank 0's make of the dataset helpers failed (megatron/core/datasets/
        # utils.py compile_helpers), or no usable CUDA (megatron/training/initialize.py)
        # (census megatron-compile-helpers-failed, megatron-requires-cuda)
        Signature(r"Failed to compile the C\+\+ dataset helper functions"),
        Signature(r"Megatron requires CUDA\.", "Megatron requires CUDA"),
        # torchvision (extension.py _check_cuda_version) refuses a torch built for another
        # CUDA version (older wording) or major version; a torchvision or torchaudio built
        # for another torch fails to load or register its C++ ops: _assert_has_ops says so,
        # or the first use of one (torchvision's own meta registrations at import) finds
        # none: "operator torchvision::nms does not exist"
        Signature(
            r"PyTorch and torchvision were compiled with different CUDA (?:major )?versions",
            "compiled with different CUDA ",
        ),
        Signature(
            r"Couldn't load custom C\+\+ ops\. This can happen if your PyTorch and "
            r"torchvision versions are incompatible",
            "Couldn't load custom C++ ops",
        ),
        Signature(
            r"operator (?:torchvision|torchaudio)::\w{1,60} does not exist", " does not exist"
        ),
        # torch.cuda's capability checks and cuDNN's (census torch-cuda-unsupported-cc,
        # torch-cuda-no-published-build, torch-old-gpu-too-old, cudnn-sm75-unsupported), a
        # CPU-only build given a CUDA device_id (c10d-device-id-accelerator-mismatch),
        # inductor's GPU check (triton-gpu-too-old)
        Signature(
            r"Found GPU\d{1,3} .{1,80} which is of compute capability \(CC\) \d",
            "which is of compute capability (CC)",
        ),
        Signature(
            r"No published PyTorch CUDA builds for release \S{1,40} support this GPU",
            "No published PyTorch CUDA builds",
        ),
        Signature(r"PyTorch no longer supports this GPU because it is too old"),
        Signature(
            r"cuDNN version \d{1,8} is not compatible with devices with SM < ",
            "is not compatible with devices with SM < ",
        ),
        Signature(
            r"does not match the current compilation's accelerator support",
            "does not match the current compilation's accelerator support",
        ),
        Signature(r"GPUTooOldForTriton"),
        # NCCL: ranks or the application and the library of other NCCL versions, a driver
        # without the symbols this NCCL needs (census nccl-ras-version-mismatch,
        # nccl-library-too-old, nccl-retrieve-symbol-failed, nccl-cumem-prior-cuda-11-3)
        Signature(r"NCCL version mismatch with remote peer", "NCCL version mismatch with remote"),
        Signature(
            r"NCCL library is too old\. This application was compiled with",
            "NCCL library is too old",
        ),
        Signature(
            r"NCCL WARN Retrieve \w{1,60} failed with \d{1,4} status \d{1,4}", "NCCL WARN Retrieve "
        ),
        Signature(r"CUMEM not supported prior to CUDA"),
        # torch/__init__.py on Windows: one of torch's own DLLs (CUDA, cuDNN, c10) or a
        # library it needs (the VC++ runtime) could not be loaded
        Signature(
            r"Error loading \"[^\"\n]{1,300}\.dll\" or one of its dependencies",
            "or one of its dependencies",
        ),
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
        "A compiled extension (apex, mmcv, pytorch3d, torch-scatter...) that asks for a torch "
        "library this torch lacks (libtorch_cuda_cu.so) or an undefined symbol was built for "
        "another torch: rebuild it against the installed one (pip install --no-build-isolation "
        "--no-cache-dir ...), or install the wheel built for this torch and CUDA.",
    ),
    capture_fix=(*ARCH_FIXES, FABRIC_MANAGER_FIX, EXTENSION_FIX, BUILD_FIX, CXX_RUNTIME_FIX),
    positive=(
        "[ 881.001234] NVRM: API mismatch: the client 'nvidia-smi' (pid 4242)",
        "ValueError: Type bf16 is not supported on your device.",
        "ValueError: --tf32 requires Ampere or a newer GPU arch, cuda>=11 and torch>=1.7",
        "lightning.fabric.utilities.exceptions.MisconfigurationException: No "
        "supported gpu backend found!",
        "ValueError: Cuda is not available.",
        "RuntimeError: Error building extension 'fused_adam'",
        "RuntimeError: Distributed package doesn't have NCCL built in",
        '    raise RuntimeError("Distributed package doesn\'t have NCCL " "built in")',
        "ImportError: /lib/x86_64-linux-gnu/libstdc++.so.6: version `GLIBCXX_3.4.29' not found "
        "(required by /opt/conda/lib/python3.10/site-packages/torch/lib/libtorch_python.so)",
        "RuntimeError: CUDA Setup failed despite GPU being available. Please run the following "
        "command to get more information: python -m bitsandbytes",
        "RuntimeError: FlashAttention only supports Ampere GPUs or newer.",
        "ValueError: Your setup doesn't support bf16/gpu. You need torch>=1.10, using Ampere GPU "
        "with cuda>=11.0",
        "NotImplementedError: Could not run 'torchvision::nms' with arguments from the 'CUDA' "
        "backend. This could be because the operator doesn't exist for this backend",
        "g0010: Test CUDA failure common.cu:941 'system not yet initialized'",
        "host7:61204:61204 [0] enqueue.cc:1100 NCCL WARN Cuda failure 500 'named symbol not found'",
        "gpu-n7:2291:2384 [3] misc/nvmlwrap.cc:66 NCCL WARN Failed to open libnvidia-ml.so.1",
        "c3f9e81a05b7:61204:61204 [0] NCCL WARN Cuda failure 'named symbol not found'",
        "NVIDIA A100-PCIE-40GB with CUDA capability sm_80 is not compatible with the current "
        "PyTorch installation.",
        "RuntimeError('CUDA error: no kernel image is available for execution on the device')",
        "ImportError: libtorch_cuda_cu.so: cannot open shared object file: No such file or "
        "directory",
        "Cuda failure 802 'system not yet initialized'",
        "RuntimeError: Detected that PyTorch and torchvision were compiled with different CUDA "
        "major versions. PyTorch has CUDA Version=12.8 and torchvision has CUDA Version=13.0. "
        "Please reinstall the torchvision that matches your PyTorch install.",
        "RuntimeError: operator torchvision::nms does not exist",
        'OSError: [WinError 126] The specified module could not be found. Error loading "C:\\'
        'Python310\\lib\\site-packages\\torch\\lib\\cudnn_cnn_infer64_8.dll" or one of its '
        "dependencies.",
        "RuntimeError: HIP error: invalid device function",
        '"hipErrorNoBinaryForGpu: Unable to find code object for all current devices!"',
        "RuntimeError: ('The detected CUDA version (%s) mismatches the version that was used to "
        "compilePyTorch (%s). Please make sure to use the same CUDA versions.', '13.0', '12.8')",
        "OSError: CUDA_HOME environment variable is not set. Please set it to your CUDA install "
        "root.",
        "ValueError: Unknown CUDA arch (12.0) or GPU not supported",
        "RuntimeError: PyTorch version mismatch! DeepSpeed ops were compiled and installed with a "
        "different version than what is being used at runtime.",
        "RuntimeError: Attempted to use bitsandbytes native library functionality but it's not "
        "available.",
        "    xFormers wasn't build with CUDA support",
        "ERROR:megatron.core.datasets.utils:Failed to compile the C++ dataset helper functions",
        "AssertionError: Megatron requires CUDA.",
    ),
    negative=(
        "I1203 08:01:11.512000 4242 torch/distributed/run.py:780] Using "
        "nproc_per_node=gpu, setting nproc_per_node to 8 since the instance has 8 gpu",
        "NotImplementedError: Could not run 'aten::_sparse_mm' with arguments from the 'CUDA' "
        "backend.",
        "RuntimeError: operator mylib::fused_attn does not exist",
        "NCCL INFO cudaDriverVersion 12020",
        "OSError: libmydata.so: cannot open shared object file: No such file or directory",
        # torch's note on a minor-version difference: the build goes on
        "The detected CUDA version (12.4) has a minor version mismatch with the version that was "
        "used to compile PyTorch (12.8). Most likely this shouldn't be a problem.",
        "RuntimeError: Unable to JIT load the cpu_adam op due to ninja not being installed.",
    ),
)

DEVICE_ASSIGNMENT = Rule(
    code="CUDA106",
    kind="device-assignment",
    title="Ranks share a GPU or use a device that is not theirs",
    sources="NCCL init.cc (Duplicate GPU detected), CUDA runtime",
    specificity=85,
    signatures=(
        # Lightning's device parser: devices asked for that this machine (or this process's
        # CUDA_VISIBLE_DEVICES) does not have ("You requested gpu: [0, 1]" then " But your
        # machine only has: [0]"; Lightning 1.x "You requested GPUs: [0, 1]")
        Signature(r"You requested (?:gpu|GPUs): \[[\d, ]{1,200}\]", "You requested "),
        # NVLS asked for while several ranks of a communicator share one GPU (census
        # nccl-warn-nvls-multi-rank)
        Signature(
            r"communicator has multiple ranks using the same NVML device",
            "multiple ranks using the same NVML device",
        ),
        # init_process_group(device_id=...) naming a GPU this process does not see (census
        # c10d-device-id-out-of-range)
        Signature(r"device_id cuda:\d{1,4} is out of range", "is out of range"),
        # cudaErrorDevicesUnavailable in the words of CUDA 11+ and of earlier releases: the
        # GPU is in exclusive-process mode and another process holds it
        Signature(r"CUDA-capable device\(s\) is/are busy or unavailable", "busy or unavailable"),
        Signature(r"all CUDA-capable devices are busy or unavailable", "busy or unavailable"),
        Signature(
            r"Duplicate GPU detected : rank (?P<rank_a>\d+) and rank (?P<rank_b>\d+) both on "
            r"CUDA device (?P<busid>\w+)",
            "Duplicate GPU detected",
        ),
        # cudaSetDevice to a GPU that is not there, in every torch's words: 'CUDA error:
        # invalid device ordinal', torch < 1.9's THC check 'THCudaCheck FAIL file=... error=101
        # : invalid device ordinal' and 'cuda runtime error (101) : invalid device ordinal'
        # (NCCL's and nccl-tests' own words too: "Cuda failure 101 'invalid device ordinal'",
        # "Test CUDA failure common.cu:941 'invalid device ordinal'"; NCCL's peer-to-peer
        # transport's is a GPU another process cannot see: NET103 claims it first)
        Signature(r"(?:CUDA error: |error=101 : |error \(101\) : )invalid device ordinal"),
        Signature(
            r"^(?!.{0,300}transport/p2p\.cc:\d).{0,300}?" + CUDA_FAILURE + r"'invalid device "
            r"ordinal'",
            "'invalid device ordinal'",
        ),
        # two GPUs (a rank's tensors on another rank's device); a GPU and the CPU is a tensor
        # the program left on the CPU, its own bug (census aten-tensors-on-cpu-and-gpu)
        Signature(
            r"Expected all tensors to be on the same device, but found at least two devices"
            r"(?!, (?:cuda:\d{1,4} and cpu|cpu and cuda:\d{1,4})\b)",
            "Expected all tensors to be on the same device",
        ),
        Signature(r"Tensors must be CUDA and dense"),
        # ATen's device check in newer wording (aten/src/ATen/core/adaption.cpp): a tensor on
        # another GPU than the rest (census aten-common-device-check-two-gpus); not the cpu/cuda pair
        Signature(
            r"Expected all tensors to be on the same device, but got \w{1,40} is on "
            r"cuda:\d{1,4}, different from other tensors on cuda:\d{1,4}",
            "Expected all tensors to be on the same device, but got ",
        ),
        # a device index beyond the GPUs this process sees (LOCAL_RANK past CUDA_VISIBLE_DEVICES,
        # more processes than GPUs): ATen's getDeviceProperties assert, torch.cuda's own checks,
        # c10d's device_id without an index (census cuda-context-device-assert,
        # cuda-lazy-init-deferred-error, cuda-invalid-device-id, c10d-device-id-no-index)
        Signature(r"device >= 0 && device < num_gpus INTERNAL ASSERT FAILED", "device < num_gpus"),
        Signature(r"^\**AssertionError: Invalid (?:peer )?device id\s*$", "Invalid "),
        Signature(r"Expected a cuda device, but got: cpu", "Expected a cuda device, but got"),
        Signature(r"Please use a device_id with index\.", "Please use a device_id with index"),
        Signature(r"NCCL error.{0,80}invalid usage", "invalid usage"),
        # the detail line torch prints under it (c10d NCCLUtils.hpp) and NCCL 2.30's wording
        # of the duplicate-GPU check (init.cc)
        Signature(r"ncclInvalidUsage"),
        Signature(r"Multiple Ranks are using the same GPU"),
        # torchrun local_elastic_agent.py: more workers than visible GPUs
        Signature(
            r"local_rank \d+ exceeds available GPUs in CUDA_VISIBLE_DEVICES",
            "exceeds available GPUs in CUDA_VISIBLE_DEVICES",
        ),
        # c10/cuda/CUDAFunctions.cpp: CUDA_VISIBLE_DEVICES changed after CUDA started
        Signature(
            r"CUDA unknown error - this may be due to an incorrectly set up environment, e\.g\. "
            r"changing env variable CUDA_VISIBLE_DEVICES",
            "CUDA unknown error - this may be due to an incorrectly set up environment",
        ),
        # DDP (nn/parallel/distributed.py), FSDP (_runtime_utils.py), DeviceMesh: a model or
        # mesh placed on the wrong devices
        Signature(r"device_ids can only be None or contain a single element"),
        Signature(
            r"DistributedDataParallel device_ids and output_device arguments only work with",
            "DistributedDataParallel device_ids and output_device arguments",
        ),
        Signature(r"An FSDP-managed module unexpectedly has parameters on"),
        # FSDP's flat parameter (_flat_param.py _check_on_compute_device) and its init
        # (_init_utils.py): the rank's current device is not the one its module was put on
        # (torch.cuda.set_device(local_rank) never called, so every rank computes on cuda:0)
        Signature(
            r"Expects tensor to be on the compute device (?:cuda|\w+)(?::\d+)?",
            "Expects tensor to be on the compute device",
        ),
        Signature(
            r"Inconsistent compute device and `device_id` on rank (?P<rank>\d+)",
            "Inconsistent compute device and `device_id`",
        ),
        Signature(r"DeviceMesh only support homogeneous hardware"),
        # accelerate accelerator.py and utils/operations.py (debug mode)
        Signature(
            r"has been loaded with `device_map='auto'` in any distributed mode",
            "in any distributed mode",
        ),
        Signature(
            r"were not on the \w+ while the `Accelerator` is configured for",
            "while the `Accelerator` is configured for",
        ),
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
    positive=(
        "lightning.fabric.utilities.exceptions.MisconfigurationException: You requested gpu: [0, 1]",
        "host7:1234:1300 [0] init.cc:400 NCCL WARN Cuda failure 101 'invalid device ordinal'",
        "g0010: Test CUDA failure common.cu:941 'invalid device ordinal'",
        "gpu-n7:2291:2384 [3] transport/nvls.cc:254 NCCL WARN NCCL_NVLS_ENABLE has been set to "
        '"1" and communicator has multiple ranks using the same NVML device.',
        "ValueError: device_id cuda:4 is out of range. Please use a device index less than the "
        "number of accelerators available: 4.",
        "Duplicate GPU detected : rank 0 and rank 1 both on CUDA device 2000",
        # corpus case 1205 (torch.distributed.launch with more processes than GPUs)
        "THCudaCheck FAIL file=/pytorch/torch/csrc/cuda/Module.cpp line=37 error=101 : invalid "
        "device ordinal",
        "RuntimeError: cuda runtime error (101) : invalid device ordinal at "
        "/pytorch/torch/csrc/cuda/Module.cpp:59",
        # torch/distributed/fsdp/_flat_param.py _check_on_compute_device (corpus case 1622)
        "AssertionError: Expects tensor to be on the compute device cuda:1, was on cuda:0",
        "ValueError: Inconsistent compute device and `device_id` on rank 1: cuda:0 vs cuda:1",
    ),
    negative=(
        "gpu8a:804053:804200 [0] transport/p2p.cc:275 NCCL WARN Cuda failure 101 'invalid device ordinal'",
        "RuntimeError: Expected all tensors to be on the same device, but found at least two "
        "devices, cuda:0 and cpu!",
        "NCCL INFO comm 0x55 rank 1 nranks 2 cudaDev 1 busId 2000 - Init COMPLETE",
        # its sibling check on CPU offload: not a device assignment
        "AssertionError: Expects tensor to be on CPU but got cuda:0",
    ),
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
        # torch < 1.0 printed the CUDA runtime's code: 3 is cudaErrorInitializationError
        Signature(r"cuda runtime error \(3\) : initialization error", "cuda runtime error (3)"),
        # accelerate's notebook_launcher forks its workers and checks CUDA first
        Signature(
            r"CUDA has been initialized before (?:the )?`?notebook_launcher(?:\(\))?`? could "
            r"create a forked subprocess",
            "could create a forked subprocess",
        ),
        # Lightning's fork launchers (ddp_fork, ddp_notebook) check CUDA first (lightning
        # fabric/strategies/launchers/multiprocessing.py _check_bad_cuda_fork)
        Signature(
            r"Lightning can't create new processes if CUDA is already initialized",
            "can't create new processes if CUDA is already initialized",
        ),
    ),
    # a forked child: a DataLoader worker, or a multiprocessing.Process (its _bootstrap frame)
    # (Lightning's own check names what it was about to do: create new processes)
    context_all=(
        r"worker|dataloader|DataLoader|forked|collate|multiprocessing|create new processes",
    ),
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
        "RuntimeError: Lightning can't create new processes if CUDA is already initialized. Did "
        "you manually call `torch.cuda.*` functions",
        "RuntimeError: Cannot re-initialize CUDA in forked subprocess. To use CUDA with multiprocessing, you must use the 'spawn' start method",
        "RuntimeError: CUDA has been initialized before the `notebook_launcher` could create a "
        "forked subprocess. This likely stems from an outside import causing issues once the "
        "`notebook_launcher()` is called.",
    ),
    negative=(
        "RuntimeError: CUDA error: out of memory",
        # the main process's initialization error: a driver or installation problem
        "RuntimeError: cuda runtime error (3) : initialization error at /pytorch/aten/src/THC/THCGeneral.cpp:51",
    ),
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

CUDA_KERNEL_FAULT = Rule(
    code="CUDA109",
    kind="native-crash",
    title="A CUDA kernel faulted",
    sources="CUDA runtime cudaGetErrorString (libcudart) via c10/cuda/CUDAException.cpp "
    "('CUDA error: ...') and NCCL's WARN 'Cuda failure ...'",
    specificity=45,
    signatures=(
        # cudaErrorIllegalAddress: printed after "CUDA error: " by torch and inside
        # "Cuda failure '...'" by NCCL
        Signature(r"an illegal memory access was encountered"),
        # cudaErrorIllegalInstruction, cudaErrorMisalignedAddress, cudaErrorLaunchFailure
        Signature(r"an illegal instruction was encountered"),
        Signature(r"CUDA error: misaligned address", "misaligned address"),
        Signature(r"unspecified launch failure"),
        # the driver's record of the same (dmesg): Xid 13 (an out-of-range access in a kernel)
        # and 31 (a GPU memory page fault), which NVIDIA lists as the application's first
        Signature(r"NVRM: Xid \(PCI:(?P<pci>[\w:.]+)\): (?P<xid>13|31)\b", "NVRM: Xid"),
    ),
    explanation=Explanation(
        what="A GPU kernel accessed memory it must not (illegal memory access, misaligned "
        "address, illegal instruction, launch failure).",
        why="An out-of-bounds index in a kernel (custom CUDA extensions, fused kernels, "
        "embedding lookups with ids past the table in code that does not assert), a library "
        "bug, or a GPU fault. The error is sticky: every later CUDA call on that rank fails, "
        "so NCCL reports 'unhandled cuda error' after it. NCCL's own 'Cuda failure' line (with "
        "NCCL_DEBUG=WARN) names the CUDA error; when it says 'out of memory' the cause is an OOM.",
        fix="Re-run with CUDA_LAUNCH_BLOCKING=1 (or under compute-sanitizer) to find the "
        "failing kernel; check index ranges and custom extensions; look at `dmesg` for NVRM Xid "
        "13/31/43/79 on that node, which makes it a hardware fault.",
        false_positives="'unhandled cuda error' also follows a CUDA OOM inside NCCL (the OOM "
        "rule then explains it) and driver problems at start-up.",
    ),
    fix=(
        "Re-run the failing rank with CUDA_LAUNCH_BLOCKING=1 (or `compute-sanitizer python "
        "train.py`) to get the kernel that faulted.",
        "Check indices and custom CUDA extensions (rebuild them against the installed torch).",
        "Run `dmesg -T | grep -i xid` on the node: an Xid 13/31/43/79 means a GPU fault, "
        "drain the node.",
        "With NCCL: export NCCL_DEBUG=WARN to see NCCL's 'Cuda failure' line naming the error.",
    ),
    positive=(
        "RuntimeError: CUDA error: an illegal memory access was encountered",
        "node01:4242:4300 [3] NCCL WARN Cuda failure 'an illegal memory access was encountered'",
        "[5521.003311] NVRM: Xid (PCI:0000:3b:00): 31, pid=12345, name=python, Ch 00000010",
    ),
    negative=(
        "RuntimeError: NCCL error in: /pytorch/torch/lib/c10d/ProcessGroupNCCL.cpp:410, "
        "unhandled system error, NCCL version 2.4.8",
        "RuntimeError: CUDA error: device-side assert triggered",
    ),
)

NCCL_UNHANDLED_CUDA = Rule(
    code="CUDA115",
    kind="cuda-library-mismatch",
    title="A CUDA call NCCL made failed ('unhandled cuda error'), most often a driver, CUDA "
    "or NCCL that do not fit together",
    sources="NCCL init.cc ncclGetErrorString(ncclUnhandledCudaError) via "
    "torch/csrc/distributed/c10d/NCCLUtils.hpp ('NCCL error in: ...')",
    # below every rule that knows the CUDA error itself: NCCL's own 'Cuda failure ...' WARN
    # (CUDA114), a kernel fault (CUDA109) or an OOM the rank printed first names what failed;
    # this is what the rank says when nothing else does
    specificity=30,
    signatures=(
        # "unhandled cuda error" (NCCL < 2.18), "unhandled cuda error (run with NCCL_DEBUG=INFO
        # for details)" since 2.18; torch adds "ncclUnhandledCudaError: Call to CUDA function
        # failed." below it
        Signature(r"unhandled cuda error", suggests=True),
        Signature(r"ncclUnhandledCudaError", suggests=True),
    ),
    confirm="with NCCL_DEBUG=WARN: NCCL's 'Cuda failure ...' line names the CUDA call that "
    "failed and its error",
    explanation=Explanation(
        what="NCCL reported that a CUDA call it made failed, without saying which (NCCL_DEBUG "
        "was not set to WARN or INFO, so its own 'Cuda failure' line is not in the log).",
        why="Where it is said at the process group's first collective (the communicator's "
        "set-up), the usual cause is the environment: a driver too old for the CUDA or NCCL "
        "that torch ships, an NCCL build that does not support the GPUs (a new architecture "
        "under an old NCCL), or a second NCCL library loaded beside torch's. The same words "
        "come from a container without IPC between its processes (peer-to-peer memory cannot "
        "be shared), from several ranks placed on one GPU, and after an earlier CUDA error on "
        "the rank (a kernel fault or an OOM), which is then the cause.",
        fix="Run once with NCCL_DEBUG=WARN (or INFO): NCCL's 'Cuda failure ...' line names the "
        "failing call. Check `nvidia-smi` (driver version) against the CUDA version of torch "
        "(python -c 'import torch; print(torch.version.cuda, torch.cuda.nccl.version())'); "
        "upgrade the driver, or install a torch/NCCL build for the GPUs.",
        false_positives="IPC or peer-to-peer failing in a container (nccl-p2p: try "
        "NCCL_P2P_DISABLE=1, docker --ipc=host), ranks sharing one GPU (device-assignment), "
        "or an earlier CUDA error on the same rank.",
    ),
    fix=(
        "export NCCL_DEBUG=WARN and run again: NCCL's 'Cuda failure' line says which CUDA call "
        "failed and why.",
        "Compare the driver (`nvidia-smi`) with torch's CUDA and NCCL (`python -c 'import "
        "torch; print(torch.version.cuda, torch.cuda.nccl.version())'`); upgrade the driver or "
        "use a torch build whose NCCL supports the GPUs.",
        "In a container, or if it persists: NCCL_P2P_DISABLE=1 (peer-to-peer) and one GPU per "
        "rank (torch.cuda.set_device(local_rank) before init_process_group).",
    ),
    positive=(
        "torch.distributed.DistBackendError: NCCL error in: ../torch/csrc/distributed/c10d/"
        "NCCLUtils.hpp:275, unhandled cuda error (run with NCCL_DEBUG=INFO for details), NCCL "
        "version 2.20.5",
        "RuntimeError: NCCL error in: /opt/pytorch/torch/lib/c10d/ProcessGroupNCCL.cpp:825, "
        "unhandled cuda error, NCCL version 2.7.8",
        "ncclUnhandledCudaError: Call to CUDA function failed.",
    ),
    negative=(
        "RuntimeError: NCCL error in: /pytorch/torch/lib/c10d/ProcessGroupNCCL.cpp:410, "
        "unhandled system error, NCCL version 2.4.8",
        "RuntimeError: CUDA error: an illegal memory access was encountered",
    ),
)

CHECKPOINT_DEVICE_MISSING = Rule(
    code="CUDA110",
    kind="checkpoint-load-device",
    title="Checkpoint restored onto a GPU this process does not have (no map_location)",
    sources="torch/serialization.py _validate_device (validate_cuda_device)",
    specificity=85,
    # a resume: every rank loads the same file onto the same missing device
    alike_on_every_rank=True,
    signatures=(
        # CUDA tensors in the file, but CUDA is unavailable in this process
        Signature(
            r"Attempting to deserialize object on a CUDA device but torch\.cuda\.is_available\(\) "
            r"is False",
            "Attempting to deserialize object on a CUDA device",
        ),
        # saved from cuda:N, loaded where fewer GPUs are visible (one GPU per rank)
        Signature(
            r"Attempting to deserialize object on CUDA device (?P<device>\d+) but "
            r"torch\.cuda\.device_count\(\) is (?P<count>\d+)",
            "Attempting to deserialize object on CUDA device",
        ),
        # a storage tagged with a device kind no restore function knows here (saved on an
        # XLA/TPU or another accelerator): torch.serialization.default_restore_location
        # (census load-restore-location-unknown)
        Signature(
            r"don't know how to restore data location of \S{1,80} \(tagged with "
            r"(?P<device>[\w:]{1,40})\)",
            "don't know how to restore data location",
        ),
    ),
    explanation=Explanation(
        what="torch.load tried to put tensors back on the GPU they were saved from, and this "
        "process has no such GPU.",
        why="Without map_location, torch.load restores each tensor onto the device it was "
        "saved from: a checkpoint written on cuda:3 fails on a rank that sees one GPU "
        "(CUDA_VISIBLE_DEVICES per rank, Slurm --gpus-per-task) or on a CPU-only node.",
        fix="torch.load(path, map_location='cpu') and move to the rank's device, or "
        "map_location=f'cuda:{local_rank}'.",
        false_positives="None known.",
    ),
    fix=(
        "Load with torch.load(path, map_location='cpu') (or map_location=f'cuda:{local_rank}').",
        "Save checkpoints from CPU copies (state_dict tensors .cpu()) so they load anywhere.",
    ),
    positive=(
        "RuntimeError: Attempting to deserialize object on a CUDA device but "
        "torch.cuda.is_available() is False. If you are running on a CPU-only machine, please "
        "use torch.load with map_location=torch.device('cpu') to map your storages to the CPU.",
        "RuntimeError: Attempting to deserialize object on CUDA device 3 but "
        "torch.cuda.device_count() is 1. Please use torch.load with map_location to map your "
        "storages to an existing device.",
    ),
    negative=(
        "RuntimeError: Attempting to deserialize object on a HPU device but "
        "torch.hpu.is_available() is False.",
    ),
)

CUDA_INIT_ERROR = Rule(
    code="CUDA113",
    kind="dataloader-cuda-fork",
    title="CUDA failed to initialise (most often: CUDA used in a forked process)",
    sources="CUDA runtime (cudaErrorInitializationError, code 3), torch/cuda/__init__.py "
    "_lazy_init, THC (torch < 1.5)",
    specificity=70,
    signatures=(
        Signature(r"CUDA error: initialization error", suggests=True),
        Signature(
            r"cuda runtime error \(3\) : initialization error",
            "cuda runtime error (3)",
            suggests=True,
        ),
        # THC's check before torch 1.5: code 3 is cudaErrorInitializationError
        Signature(
            r"THCudaCheck FAIL file=\S+ line=\d+ error=3 : initialization error",
            "error=3 : initialization error",
            suggests=True,
        ),
    ),
    explanation=Explanation(
        what="The CUDA runtime's initialization error, with nothing in sight that says which "
        "process raised it (no DataLoader worker or fork in its traceback).",
        why="CUDA cannot be initialised again in a process forked after its parent had "
        "initialised it: DataLoader workers (num_workers > 0) whose dataset, transform or "
        "collate_fn touches CUDA, a multiprocessing.Process started with fork. Much less "
        "often the driver itself: updated without a reboot, or a container started without "
        "the GPU devices, where the main process fails at start-up and nvidia-smi fails too.",
        fix="Keep datasets, transforms and collate on CPU and move batches to the GPU in the "
        "training loop, or start workers with spawn; if the main process fails at start-up, "
        "check the driver (nvidia-smi).",
        false_positives="A driver or container problem in the main process: nvidia-smi and "
        "`python -c 'import torch; torch.zeros(1).cuda()'` fail too.",
    ),
    fix=(
        "Return CPU tensors from Dataset/collate_fn/transforms and call .cuda() in the training "
        "loop; or DataLoader(..., multiprocessing_context='spawn') / "
        "torch.multiprocessing.set_start_method('spawn').",
        "If it fails in the main process before any worker: run nvidia-smi and "
        "`python -c 'import torch; torch.zeros(1).cuda()'` on the node (driver, container "
        "GPU access).",
    ),
    positive=(
        "RuntimeError: CUDA error: initialization error",
        "THCudaCheck FAIL file=/pytorch/aten/src/THC/THCGeneral.cpp line=50 error=3 : "
        "initialization error",
    ),
    # a traceback through a script's module level is the main process itself, never a
    # forked child: there the error is the driver's or the installation's (census
    # cuda-err-init-main); a worker's error re-raised in the main process is CUDA107's
    context_none=(r"line \d+,? in <module>",),
    negative=("RuntimeError: CUDA error: invalid device ordinal",),
)

CUDA_INIT_IN_MAIN = Rule(
    code="CUDA116",
    kind="cuda-library-mismatch",
    title="CUDA failed to initialise in the main process (driver, container GPU access)",
    sources="CUDA runtime (cudaErrorInitializationError, code 3), torch/cuda/__init__.py "
    "_lazy_init, THC (torch < 1.5)",
    specificity=70,
    signatures=CUDA_INIT_ERROR.signatures,
    # the mirror of CUDA113's: a traceback through a script's module level is the main
    # process itself, never a forked child (census cuda-err-init-main)
    context_all=(r"line \d+,? in <module>",),
    explanation=Explanation(
        what="The CUDA runtime could not initialise in the program's own process (its "
        "traceback runs through the script's module level): no fork, no DataLoader worker.",
        why="The driver and the CUDA runtime cannot talk: a driver updated without a reboot "
        "(its kernel module older than its libraries), a container started without the GPU "
        "devices or the driver's libraries (no --gpus, no NVIDIA runtime), a runtime newer "
        "than the driver supports, or a GPU in a bad state.",
        fix="Check the node: nvidia-smi must work (in the container too), and `python -c "
        "'import torch; torch.zeros(1).cuda()'` must pass; reboot after a driver update, "
        "start the container with the NVIDIA runtime, use a torch build for the driver's CUDA.",
        false_positives="A process the script forked after using CUDA (multiprocessing with "
        "fork) whose module-level code shows in its traceback: use spawn.",
    ),
    fix=(
        "On the node that failed: run nvidia-smi and `python -c 'import torch; "
        "torch.zeros(1).cuda()'`; if they fail too, reboot after a driver update or give the "
        "container the GPUs (--gpus all / the NVIDIA container runtime).",
        "If the driver is older than the CUDA runtime torch was built for (torch.version.cuda "
        "against nvidia-smi's 'CUDA Version'), install a torch build for that CUDA.",
    ),
    positive=CUDA_INIT_ERROR.positive,
    negative=("RuntimeError: CUDA error: invalid device ordinal",),
)

OWN_CALL_ERRORS = (
    r"operation not permitted when stream is capturing|too many resources requested for launch"
)
"""CUDA errors that name a mistake in the call the program made, not the system's state."""

CUDA_CALL_FAILED = Rule(
    code="CUDA114",
    kind="native-crash",
    title="A CUDA call failed (an error no more specific rule knows)",
    sources="CUDA runtime cudaGetErrorString (libcudart) as torch's c10/cuda/CUDAException.cpp "
    "('CUDA error: ...') and NCCL's CUDACHECK ('Cuda failure ...') print it",
    # below every rule that knows a CUDA error by its words (out of memory, device-side
    # assert, a library or device mismatch, a kernel fault): they claim those lines first
    specificity=35,
    signatures=(
        # not the errors of a call the program itself made wrong (a synchronising call
        # inside CUDA graph capture, a kernel launched with too many threads or registers):
        # an exception in the program's code (census: PY101)
        Signature(
            r"\bCUDA error: (?!" + OWN_CALL_ERRORS + r")(?P<what>[^\n]{3,160})", "CUDA error: "
        ),
        *(
            Signature(
                head + r"'(?!" + OWN_CALL_ERRORS + r")(?P<what>[^'\n]{3,160})'",
                literal,
            )
            for head, literal in (
                (r"\bCuda failure (?:\d{1,4} )?", "Cuda failure "),
                (r"Test CUDA failure \S{1,200}:\d{1,6} ", "Test CUDA failure "),
            )
        ),
        # a cuDNN call that failed inside the library or the driver (aten/src/ATen/cudnn/
        # Exceptions.h: 'cuDNN error: ' + cudnnGetErrorString); not NOT_SUPPORTED or BAD_PARAM,
        # which answer the program's own arguments (a shape, a layout, a size), nor
        # NOT_INITIALIZED (CUDA105: a cuDNN that does not fit)
        Signature(
            r"cuDNN error: CUDNN_STATUS_(?P<what>INTERNAL_ERROR|EXECUTION_FAILED|MAPPING_ERROR"
            r"|RUNTIME_[A-Z_]{3,40})\b",
            "cuDNN error: CUDNN_STATUS_",
        ),
    ),
    explanation=Explanation(
        what="A CUDA runtime call returned an error that names neither memory, a kernel fault, "
        "an assert, nor a version or device mismatch: 'invalid argument', 'unknown error', "
        "'operation not supported', 'the launch timed out and was terminated', an MPS error.",
        why="The driver or runtime refused the call: a driver in a bad state (look for Xid "
        "errors), a feature the system does not support (a VM or container without peer-to-"
        "peer, NCCL's cuMem on an older driver), a display watchdog ending a long kernel, "
        "MPS, or a bug in the code that made the call. The error says which call failed, not "
        "always why.",
        fix="Read the error's words and the rank's first CUDA error (later ones follow from "
        "it); check `dmesg -T | grep -i xid` on the node; re-run with CUDA_LAUNCH_BLOCKING=1 "
        "to find the call.",
        false_positives="A rank whose CUDA context was already broken by an earlier error "
        "(the first one is the cause).",
    ),
    fix=(
        "Re-run the failing rank with CUDA_LAUNCH_BLOCKING=1 to see which call failed; run "
        "`dmesg -T | grep -i xid` and `nvidia-smi` on its node.",
        "Inside NCCL ('Cuda failure ...'): export NCCL_DEBUG=INFO; an 'operation not "
        "supported' often goes away with NCCL_CUMEM_ENABLE=0 or NCCL_P2P_DISABLE=1 on systems "
        "without peer-to-peer support, which then says where to look.",
    ),
    positive=(
        "g0010: Test CUDA failure common.cu:891 'unknown error'",
        "RuntimeError: CUDA error: invalid argument",
        "node01:4242:4300 [3] NCCL WARN Cuda failure 'operation not supported'",
        "Cuda failure 999 'unknown error'",
        "RuntimeError: cuDNN error: CUDNN_STATUS_INTERNAL_ERROR",
        "RuntimeError: cuDNN error: CUDNN_STATUS_EXECUTION_FAILED",
    ),
    negative=(
        "RuntimeError: cuDNN error: CUDNN_STATUS_NOT_SUPPORTED. This error may appear if you "
        "passed in a non-contiguous input.",
        "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB",
        "CUDA error (the program's own wording)",
        "RuntimeError: CUDA error: too many resources requested for launch",
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
    CUDA_INIT_ERROR,
    CUDA_INIT_IN_MAIN,
    CUDA_KERNEL_FAULT,
    CHECKPOINT_DEVICE_MISSING,
    CUDA_CALL_FAILED,
    NCCL_UNHANDLED_CUDA,
)
