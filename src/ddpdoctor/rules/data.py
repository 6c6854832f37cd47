"""Errors of the job's inputs and environment: data files, disk, shared memory for DataLoader
workers, missing modules, checkpoint loading (weights_only)."""

from __future__ import annotations

import re

from ddpdoctor.model.taxonomy import Category
from ddpdoctor.rules.base import Echo, Explanation, Rule, Signature

DATA_ERROR = Rule(
    code="DATA101",
    kind="data-error",
    title="A rank failed on its input data (missing, corrupt or undecodable file)",
    sources="Python I/O, PIL, json, pickle, datasets/pyarrow",
    specificity=55,
    confirm="which sample failed: the worker's traceback names the dataset's __getitem__ or "
    "the transform; load that index alone, outside the DataLoader",
    signatures=(
        # a checkpoint's zip archive without its records (a truncated or half-written file,
        # census serialization-locating-file); the HF Trainer's DeepSpeed resume that could not
        # read its checkpoint (hf-deepspeed-failed-resume)
        Signature(
            r"PytorchStreamReader failed locating file \S{1,200}: file not found",
            "PytorchStreamReader failed locating file",
        ),
        Signature(
            r"\[deepspeed\] failed to resume from checkpoint", "failed to resume from checkpoint"
        ),
        # accelerate's Accelerator.load_state (accelerator.py) when the state folder is not
        # there, as on a node whose disk never got the checkpoint (census
        # accelerate-load-state-missing-folder)
        Signature(
            r"ValueError: Tried to find (?P<path>\S{1,300}) but folder does not exist",
            "but folder does not exist",
        ),
        # NeMo's SentencePieceTokenizer when its model file is not there (a tokenizer dir that
        # exists on one node only, a relative path from another working directory):
        # "ValueError: model_path: tokenizers/spe/tokenizer.model is invalid"
        Signature(r"ValueError: model_path: (?P<path>\S{1,300}) is invalid", "model_path: "),
        # a .safetensors file that is not one: a git-lfs pointer left by a clone without LFS,
        # a download cut short (safetensors' deserialize, Rust; HeaderTooLarge,
        # MetadataIncompleteBuffer, InvalidHeader...)
        Signature(
            r"SafetensorError: Error while deserializing header: (?P<what>\w{3,60})",
            "Error while deserializing header",
        ),
        # a checkpoint path that is not there: fvcore/detectron2's Checkpointer asserts it
        # ('Checkpoint {} not found!'; not a program's own warning that it starts afresh)
        Signature(
            r"AssertionError: Checkpoint (?P<path>\S{1,300}) not found!",
            "AssertionError: Checkpoint ",
        ),
        Signature(r"broken data stream when reading image file"),
        # a file mapped with torch.from_file / np.memmap-like loaders that is shorter than
        # its header says (ATen MapAllocator: a cut download, a git-lfs pointer in its place)
        Signature(
            r"file <(?P<path>[^>\n]{1,400})> size <\d{1,15}> is smaller than the required "
            r"mapping size <\d{1,15}>",
            "is smaller than the required mapping size",
        ),
        # the same for numpy: a token or feature file (Megatron's indexed .bin, nanoGPT's and
        # the memory-mapped datasets' uint16 shards) shorter than its index or header says, or
        # cut inside an element: np.frombuffer (numpy's ctors.c) and np.memmap (CPython's
        # mmap module)
        Signature(
            r"ValueError: (?:buffer is smaller than requested size"
            r"|buffer size must be a multiple of element size"
            r"|mmap length is greater than file size"
            r"|Size of available data is not a multiple of the data-type size)",
            "ValueError: ",
        ),
        # np.load of a .npy cut short (numpy/lib/format.py read_array)
        Signature(
            r"Failed to read all data for array\. .{0,200}\(file seems not fully written\?\)",
            "Failed to read all data for array",
        ),
        # RandomSampler over a dataset of length 0 (its num_samples defaults to len(data)):
        # this rank's part of the data is empty (more ranks than files or samples to split,
        # a filter that kept nothing, an empty folder on this node)
        Signature(
            r"num_samples should be a positive integer value, but got num_samples=0\b",
            "num_samples should be a positive integer value",
        ),
        # a Dataset whose __len__ came out negative: a sliding-window dataset (time series:
        # len(data) - seq_len - pred_len + 1, Informer/Autoformer/Time-Series-Library) over
        # data shorter than its window; CPython's len() refuses it
        Signature(r"ValueError: __len__\(\) should return >= 0", "__len__() should return >= 0"),
        Signature(r"OSError: Unable to open file", "Unable to open file"),
        Signature(r"DatasetGenerationError"),
        Signature(
            r"FileNotFoundError: \[Errno 2\] No such file or directory: (?P<path>.+)",
            "FileNotFoundError",
        ),
        Signature(r"FileNotFoundError"),
        # the same error written by the program's own handler (f"could not read {p}: {e}"):
        # str() of the OSError, without its class name
        Signature(
            r"(?<!FileNotFoundError: )\[Errno 2\] No such file or directory: "
            r"(?P<path>'[^'\n]{1,400}')",
            "[Errno 2] No such file or directory: ",
        ),
        Signature(r"IsADirectoryError|NotADirectoryError", "DirectoryError"),
        Signature(r"(?:PIL\.)?UnidentifiedImageError|cannot identify image file", "identif"),
        Signature(r"image file is truncated"),
        Signature(r"JSONDecodeError"),
        Signature(r"UnicodeDecodeError"),
        Signature(r"EOFError: Ran out of input"),
        Signature(r"pyarrow\.lib\.Arrow\w*Error|ArrowInvalid", "Arrow"),
        # CPython's _pickle.c on a file that is not a whole pickle: a cache read while another
        # rank still wrote it, a copy cut short, a text file under a .pkl name
        Signature(
            r"UnpicklingError: (?:invalid load key|pickle data was truncated"
            r"|could not find MARK|unpickling stack underflow)",
            "UnpicklingError: ",
        ),
        Signature(r"PytorchStreamReader failed reading zip archive"),
        # caffe2/serialize/inline_container.cc (a corrupt member) and torch/serialization.py
        # (a legacy-format file that is not a checkpoint)
        Signature(r"invalid header or archive is corrupted"),
        Signature(r"Invalid magic number; corrupt file\?", "Invalid magic number"),
        # any reader's check of a file's magic number or header against the format it expects,
        # as the exception's message: a file of another format or version, or cut short
        # (nanoGPT-style token shards' "AssertionError: magic number mismatch in the data .bin
        # file", numpy's "ValueError: the magic string is not correct; expected b'\x93NUMPY'")
        Signature(
            r"^\**[\w.]*(?:Error|Exception): [^\n]{0,200}?(?i:\bmagic (?:number|string|bytes?)\b"
            r"[^\n]{0,60}?\b(?:mismatch|not correct|does not match|doesn't match|invalid|wrong"
            r"|unexpected)|\b(?:invalid|wrong|bad|unexpected|unknown) magic (?:number|string"
            r"|bytes?)\b)",
            "agic ",
        ),
        # transformers trainer.py: resume_from_checkpoint missing on this node
        Signature(r"Can't find a valid checkpoint at"),
        Signature(r"No valid checkpoint found in output directory"),
        # transformers / diffusers from_pretrained and load_sharded_checkpoint: the model or
        # checkpoint folder is there without its weights or config (a save cut short, another
        # node's copy, a wrong path)
        Signature(r"Error no file named \S.{0,300}? found in directory", "Error no file named "),
        Signature(r"BadZipFile"),
        # Megatron-LM: a .idx file not in its MMIDIDX format (megatron/core/datasets/
        # indexed_dataset.py _IndexReader), and a latest_checkpointed_iteration.txt that is
        # neither a number nor 'release' (megatron/training/checkpointing.py read_metadata)
        # (census megatron-idx-bad-header, megatron-invalid-metadata-file)
        Signature(r"\bbad (?:header|version), cannot read: ", "cannot read: "),
        Signature(
            r"ERROR: Invalid metadata file \S{1,400}\. Exiting", "ERROR: Invalid metadata file"
        ),
        # NeMo exp_manager.py check_resume: resume_if_exists found no checkpoint (not its
        # tolerated twin "... Training from scratch."), or only one whose save never finished
        # (census nemo-no-checkpoints-cannot-resume, nemo-last-checkpoint-unfinished)
        Signature(
            r"There were no checkpoints found in checkpoint_dir or no checkpoint folder at "
            r"checkpoint_dir :[^\n]{0,400}?\. Cannot resume\.",
            "Cannot resume.",
        ),
        Signature(r"Last checkpoint is unfinished and cannot be used to resume the training"),
        # Hugging Face datasets load.py and huggingface_hub file_download.py: the dataset or
        # model file is neither reachable on the Hub (no internet on the compute nodes, a
        # wrong or private name) nor in this node's cache, or its download was cut short
        # (census datasets-not-found-on-hub, datasets-couldnt-reach-hub,
        # hfhub-local-entry-offline, hfhub-locate-file-no-cache,
        # hfhub-consistency-check-failed)
        Signature(r"doesn't exist on the Hub or cannot be accessed"),
        Signature(r"Couldn't reach '[^'\n]{1,300}' on the Hub \(", "' on the Hub ("),
        Signature(
            r"Cannot find the requested files in the disk cache and outgoing traffic has been "
            r"disabled",
            "Cannot find the requested files in the disk cache",
        ),
        Signature(
            r"we cannot find the requested files in the local cache",
            "cannot find the requested files in the local cache",
        ),
        Signature(
            r"Consistency check failed: file should be of size \d{1,15} but has size",
            "Consistency check failed: file should be of size",
        ),
        # torch/utils/data/_utils/worker.py re-raising in the main process what a DataLoader
        # worker raised while building a batch: the dataset's __getitem__ or its transforms
        # failed on a sample (more specific rules take the CUDA-in-a-forked-worker case)
        Signature(
            r"Caught (?P<exc>[A-Za-z_][\w.]{0,100}) in DataLoader worker process \d+",
            "in DataLoader worker process",
            suggests=True,
        ),
        # a dataset's own loader giving up on a sample it cannot decode (video and image
        # pipelines retry other samples, then raise)
        # (one signature per verb: with the literal 'ailed to ' alone every c10d 'failed to
        # connect' line was a candidate to confirm, 79,000 of them in 10,000 rank files)
        *(
            Signature(
                rf"[Ff]ailed to {verb} (?:the )?(?:video|image|audio|frame|clip)s?\b"
                r"(?! Python extension)",  # torchvision's warning about its own C++ extension
                f"ailed to {verb} ",
            )
            for verb in ("decode", "fetch", "load", "read")
        ),
    ),
    context_none=(r"No space left on device", r"can't open file"),
    explanation=Explanation(
        what="A rank raised an error while reading or decoding its input data or a file.",
        why="A path that exists only on some nodes or in the author's environment, a corrupt or "
        "truncated file, a cache written by one rank while another reads it.",
        fix="Check the path on the failing rank's node; validate the data; build caches on one "
        "rank behind a barrier.",
        false_positives="A missing checkpoint or config file is reported the same way.",
    ),
    fix=(
        "Check the file named in the evidence exists and is readable on the failing rank's node.",
        "Validate or regenerate corrupt files; create shared caches on rank 0 and barrier() "
        "before other ranks read them.",
    ),
    # the frameworks save checkpoints from the main process only: on node-local disks the
    # other nodes have none (or a folder with their RNG state only) when they resume
    framework_fix=(
        (
            "accelerate",
            "Accelerate: if the missing file is a checkpoint, save_state() wrote the weights on "
            "the main process only: save where every node reads, or "
            "ProjectConfiguration(save_on_each_node=True).",
        ),
        (
            "lightning",
            "Lightning: if the missing file is a checkpoint, pass fit(ckpt_path=...) a path "
            "every node reads (shared storage): ModelCheckpoint writes on global rank 0 only.",
        ),
        (
            "transformers",
            "transformers Trainer: if the missing file is a checkpoint, put output_dir on "
            "storage every node reads, or TrainingArguments(save_on_each_node=True): "
            "resume_from_checkpoint must exist on every node.",
        ),
    ),
    positive=(
        # set 111 (modded-nanogpt's token shards)
        "AssertionError: magic number mismatch in the data .bin file",
        "ValueError: the magic string is not correct; expected b'\\x93NUMPY', got b'PK\\x03\\x04\\x14\\x00'",
        "RuntimeError: PytorchStreamReader failed locating file data.pkl: file not found",
        "ValueError: [deepspeed] failed to resume from checkpoint /scratch/out/checkpoint-2000",
        "ValueError: Tried to find epoch_1 but folder does not exist",
        "ValueError: model_path: tokenizers/tokenizer_spe_bpe_v128/tokenizer.model is invalid",
        "safetensors_rust.SafetensorError: Error while deserializing header: HeaderTooLarge",
        "RuntimeError: file <data/fineweb10B/fineweb_train_000001.bin> size <130> is smaller "
        "than the required mapping size <1024>",
        "AssertionError: Checkpoint /output/model_final.pth not found!",
        "FileNotFoundError: [Errno 2] No such file or directory: "
        "'E:/visionlab/data/imnet_val/val5k/val_file_list.pickle'",
        "E1204 00:23:30.193631 24467 train.py:48] could not read /data/shard-1.txt: [Errno 2] "
        "No such file or directory: '/data/shard-1.txt'",
        "RuntimeError: Failed to fetch video after 10 retries.",
        "ValueError: buffer is smaller than requested size",
        "ValueError: Size of available data is not a multiple of the data-type size.",
        "ValueError: mmap length is greater than file size",
        "ValueError: Failed to read all data for array. Expected (100, 100) = 10000 elements, "
        "could only read 4992 elements. (file seems not fully written?)",
        "ValueError: num_samples should be a positive integer value, but got num_samples=0",
        "ValueError: __len__() should return >= 0",
        "_pickle.UnpicklingError: pickle data was truncated",
        "[rank3]: AssertionError: bad header, cannot read: /data/gpt2/my-corpus_text_document.idx",
        "nemo.utils.exp_manager.NotFoundError: There were no checkpoints found in checkpoint_dir "
        "or no checkpoint folder at checkpoint_dir :/results/megatron_gpt/checkpoints. Cannot "
        "resume.",
        "huggingface_hub.errors.LocalEntryNotFoundError: Cannot find the requested files in the "
        "disk cache and outgoing traffic has been disabled. To enable hf.co look-ups and "
        "downloads online, set 'local_files_only' to False.",
        "ConnectionError: Couldn't reach 'allenai/c4' on the Hub (LocalEntryNotFoundError)",
    ),
    negative=(
        "header magic number: 20240520, version 1",
        # the same miss tolerated (resume_ignore_no_checkpoint): a run that starts over
        "[NeMo W 2026-12-05 10:12:44 exp_manager:1022] There were no checkpoints found in "
        "checkpoint_dir or no checkpoint folder at checkpoint_dir :/results/ckpt. Training from "
        "scratch.",
        "Checkpoint ./out/last.pt not found! Training from scratch.",
        "python3: can't open file '/work/train.py': [Errno 2] No such file or directory",
        "Failed to load image Python extension: 'libc10_cuda.so: cannot open shared object file'",
        "_pickle.UnpicklingError: Weights only load failed. This file can still be loaded",
        "ValueError: cannot reshape array of size 0 into shape (8,1024)",
        "ValueError: num_samples should be a positive integer value, but got num_samples=-5",
        "OverflowError: cannot fit 'int' into an index-sized integer",
    ),
)

DISK_FULL = Rule(
    code="DATA102",
    kind="disk-full",
    confirm="that the checkpoint folder's filesystem is full or over quota: `df -h` and "
    "`quota -s` (or the storage's own tool) on the node of the culprit",
    title="No space left on device",
    sources="OS errno 28 (ENOSPC), 122 (EDQUOT)",
    specificity=75,
    signatures=(
        Signature(r"No space left on device"),
        Signature(r"\[Errno 28\]", "[Errno 28]"),
        Signature(r"Disk quota exceeded"),
        # Kubernetes pkg/kubelet/eviction/helpers.go: the pod's own filesystem filled up
        Signature(r"Pod ephemeral local storage usage exceeds the total limit of containers"),
        Signature(r"The node was low on resource: ephemeral-storage"),
        # ... a container's own limit and an emptyDir's sizeLimit (a memory-backed /dev/shm
        # among them) (census k8s-evicted-container-ephemeral, k8s-evicted-emptydir)
        Signature(
            r"Container \S{1,253} exceeded its local ephemeral storage limit",
            "exceeded its local ephemeral storage limit",
        ),
        Signature(
            r"Usage of EmptyDir volume \S{1,260} exceeds the limit", "Usage of EmptyDir volume"
        ),
        # torch.save(obj, path) on a full disk: the zip writer does not report the failed
        # write, it finds at the end that the file position is short (real run, /dev/full)
        Signature(
            r"inline_container\.cc:\d+\] \. unexpected pos \d+ vs \d+",
            "unexpected pos ",
            suggests=True,
        ),
        # torch.save to a path on a full disk (torch 2.13's file writer, real run to /dev/full,
        # tests/fixtures/real/thirtysixth-full-disk): the C++ stream's failure, raised when the
        # zip's end is written
        Signature(
            r"RuntimeError: basic_ios::clear: iostream error",
            "basic_ios::clear: iostream error",
            suggests=True,
        ),
        # the same writer when the short write is reported at once (caffe2/serialize/
        # inline_container.cc)
        Signature(
            r"PytorchStreamWriter failed writing file \S+: file write failed",
            "PytorchStreamWriter failed writing file",
            suggests=True,
        ),
    ),
    context_none=(r"shared memory|/dev/shm|shm\b",),
    explanation=Explanation(
        what="A write failed because the filesystem (or quota) is full.",
        why="Checkpoints, caches or logs filled the disk where the job writes. `torch.save` to "
        "a path says so only indirectly: '[enforce fail at inline_container.cc] . unexpected "
        "pos N vs M' means the checkpoint file came out shorter than what was written.",
        fix="Free space or write checkpoints elsewhere; keep fewer checkpoints "
        "(save_total_limit); check `df -h` on the node.",
        false_positives="'No space left on device' for shared memory is a /dev/shm problem "
        "(DL101). 'unexpected pos' only says a checkpoint write came out short, and torch.save's "
        "'basic_ios::clear: iostream error' that its file stream failed: a full disk or quota "
        "is the usual cause, a network filesystem that failed the write another.",
    ),
    fix=(
        "Check `df -h <output dir>` on the node and free space, or point checkpoints elsewhere.",
        "Keep fewer checkpoints (e.g. save_total_limit=2).",
    ),
    positive=(
        '  Message:          Container pytorch exceeded its local ephemeral storage limit "20Gi". ',
        '  Message:          Usage of EmptyDir volume "scratch" exceeds the limit "50Gi". ',
        "OSError: [Errno 28] No space left on device",
        "RuntimeError: [enforce fail at inline_container.cc:672] . unexpected pos 896 vs 790",
        # torch's message format (inline_container.cc), file name and line as torch fills them
        "RuntimeError: [enforce fail at inline_container.cc:471] . PytorchStreamWriter failed "
        "writing file data/148: file write failed",
        "[rank0]: RuntimeError: basic_ios::clear: iostream error",
    ),
    negative=(
        "RuntimeError: unable to allocate shared memory(shm) for file </torch_1_2>: No space left on device (28)",
        "RuntimeError: [enforce fail at inline_container.cc:145] . PytorchStreamReader failed "
        "reading zip archive: failed finding central directory",
    ),
)

CHECKPOINT_UNREADABLE = Rule(
    code="DATA104",
    kind="data-error",
    title="torch.load could not open a checkpoint file (truncated, corrupt or not a checkpoint)",
    sources="torch/serialization.py load: _open_zipfile_reader -> torch._C.PyTorchFileReader "
    "(caffe2/serialize/inline_container.cc)",
    specificity=60,
    signatures=(
        # whatever the reader raises on a file it cannot parse: an OSError ("[Errno 22]
        # Invalid argument" on a file cut in half, torch 2.13), a RuntimeError, an EOFError
        Signature(r"^\**(?:OSError|RuntimeError|EOFError|ValueError)(?::|$)", "Error"),
    ),
    # raised by the reader's constructor itself: its frame is the innermost one
    context_all=(r"PyTorchFileReader\(",),
    explanation=Explanation(
        what="torch.load failed while opening the checkpoint's archive: the file exists but "
        "is not a readable checkpoint.",
        why="A checkpoint cut short (a save killed midway, a copy that did not finish, a full "
        "disk at save time), a file another rank was still writing, or another file under "
        "the checkpoint's name.",
        fix="Check the file's size against a good checkpoint; resume from the previous one; "
        "write checkpoints to a temporary name and rename them when complete.",
        false_positives="A checkpoint written by a much newer torch than the one loading it.",
    ),
    fix=(
        "Compare the checkpoint file's size with a good one (`ls -l`); resume from the "
        "previous checkpoint, or save it again.",
        "Save to a temporary name and rename when the write is complete, so a killed save "
        "never leaves a truncated checkpoint under the real name.",
    ),
    positive=("OSError: [Errno 22] Invalid argument",),
    negative=("OSError: [Errno 5] Input/output error: '/data/train/000123.jpg'",),
)

CHECKPOINT_WRITE_FAILED = Rule(
    code="DATA103",
    kind="disk-full",
    confirm="that the checkpoint folder exists, is writable and its filesystem is neither full "
    "nor over quota: `ls -ld <dir>`, `df -h <dir>`, `quota -s` on the node of the culprit",
    title="A checkpoint could not be written (I/O error, or the file could not be created)",
    sources="torch/serialization.py save: caffe2/serialize/inline_container.cc "
    "(PyTorchFileWriter), the legacy writer's write() check (torch < 1.6)",
    specificity=70,
    signatures=(
        # the legacy writer's failed write(2): EIO is what a full network filesystem or a
        # failing disk returns (ENOSPC itself says "No space left on device", DATA102)
        Signature(
            r"write\(\): fd \d+ failed with Input/output error",
            "failed with Input/output error",
            suggests=True,
        ),
        # the zip writer could not create the file (torch before 2.x gives no reason; 2.x says
        # "open file failed with strerror: ...", and a missing folder "Parent directory ...
        # does not exist.")
        Signature(r"File \S{1,1024} cannot be opened\.", " cannot be opened.", suggests=True),
        Signature(
            r"open file failed with strerror: Input/output error",
            "open file failed with strerror: Input/output error",
            suggests=True,
        ),
    ),
    # raised while saving: torch.save's own frames, or a framework's checkpoint writer
    context_all=(
        r"serialization\.py\"?, line \d{1,7}, in (?:save|_save|_open_zipfile_writer|_with_file_like)"
        r"|PyTorchFileWriter|save_checkpoint|checkpoint_engine|torch\.save\(",
    ),
    explanation=Explanation(
        what="torch.save (or a framework's checkpoint writer) failed to create or write the "
        "checkpoint file, with an I/O error or no reason given.",
        why="Writing a checkpoint is the largest write most jobs make, so it is where a full "
        "disk, a quota or a failing network filesystem shows first; the error then names the "
        "write, not the space. A folder that does not exist or cannot be written gives the "
        "same 'cannot be opened' on torch before 2.x.",
        fix="Check the space and permissions of the checkpoint folder on the node that failed; "
        "free space or save elsewhere, keep fewer checkpoints.",
        false_positives="A missing or read-only checkpoint folder (older torch names neither); "
        "a network filesystem that failed the write for another reason.",
    ),
    fix=(
        "Check `df -h <checkpoint dir>` and `ls -ld <checkpoint dir>` on the node: free space, "
        "create the folder, or point checkpoints to a filesystem with room.",
        "Keep fewer checkpoints (e.g. save_total_limit=2).",
    ),
    positive=(
        # torch 1.0's legacy writer (serialization.py _save -> _write_file)
        "RuntimeError: write(): fd 31 failed with Input/output error",
        # torch 1.x's zip writer (inline_container.cc)
        "RuntimeError: File run_out/checkpoints/checkpoint_0.pt cannot be opened.",
    ),
    negative=(
        # reading, not writing: a file that cannot be read is a data problem (DATA101)
        "RuntimeError: PytorchStreamReader failed reading zip archive: failed finding central "
        "directory",
        "OSError: [Errno 5] Input/output error: '/data/train/000123.jpg'",
    ),
)

DATALOADER_WORKER_KILLED = Rule(
    code="DL101",
    kind="dataloader-worker-killed",
    title="DataLoader worker killed (shared memory /dev/shm too small)",
    sources="torch/utils/data/_utils/signal_handling.py, dataloader.py",
    specificity=80,
    signatures=(
        Signature(r"Unexpected segmentation fault encountered in worker"),
        # SIGTERM ends a worker only when the whole process group is stopped from outside
        # (torchrun's stop of every worker after a failure or its own death signal, a
        # scheduler's preemption): the stop is the cause, the worker's death its echo
        # (tests/fixtures/real/eightieth-term-fold)
        Signature(
            r"DataLoader worker \(pid (?P<pid>\d+)\) is killed by signal: Terminated\b",
            "killed by signal: Terminated",
            echo=Echo.STOPPED,
        ),
        Signature(
            r"DataLoader worker \(pid (?P<pid>\d+)\) is killed by signal: "
            r"(?P<signal>(?!Terminated\b)[\w ]+)",
            "DataLoader worker (pid",
        ),
        Signature(r"Unexpected bus error encountered in worker"),
        Signature(r"insufficient shared memory"),
        Signature(
            r"DataLoader worker \(pid\(s\) (?P<pids>[\d, ]+)\) exited unexpectedly",
            "exited unexpectedly",
        ),
        Signature(r"unable to (?:allocate|write to file|open) shared memory", "shared memory"),
        # torch/csrc/DataLoader.cpp: a worker that exited with a code, no traceback
        Signature(
            r"DataLoader worker \(pid (?P<pid>\d+)\) exited unexpectedly with exit code (?P<code>-?\d+)",
            "exited unexpectedly with exit code",
        ),
        # aten/src/ATen/MapAllocator.cpp writing a shared-memory segment (/torch_<pid>_...):
        # /dev/shm is full, not the disk
        Signature(r"unable to write to file </torch_\d+", "unable to write to file </torch_"),
        # ... and sizing one (ftruncate: /dev/shm too small, or a file-size limit on it)
        Signature(r"unable to resize file </torch_\d+", "unable to resize file </torch_"),
    ),
    explanation=Explanation(
        what="A DataLoader worker process died (bus error, killed, or could not allocate shm).",
        why="Workers pass batches through /dev/shm; containers default to 64 MB, so large "
        "batches cause bus errors or ENOSPC. A 'Killed' worker can also be the host OOM killer.",
        fix="Give the container more shared memory (docker --shm-size=16g or --ipc=host; "
        "Kubernetes: an emptyDir with medium: Memory on /dev/shm), or lower num_workers.",
        false_positives="'killed by signal: Killed' with plenty of shm is the OOM killer "
        "(host memory), not shm.",
    ),
    fix=(
        "Check `df -h /dev/shm`; enlarge it: docker run --shm-size=16g (or --ipc=host); in "
        "Kubernetes mount an emptyDir {medium: Memory} at /dev/shm.",
        "Or lower DataLoader(num_workers=...) / the batch size per worker.",
        "A worker 'killed by signal: Killed' got SIGKILL, most often from the kernel's OOM "
        "killer (host memory, not /dev/shm): check dmesg -T | grep -iE 'killed process|out of "
        "memory' on the node and lower num_workers or what each worker keeps in memory.",
    ),
    # SIGKILL is the kernel's OOM killer (or a cgroup's), host memory: a resource; a bus error
    # or a failed shm allocation is the container's /dev/shm: the environment (the default)
    capture_category=(("signal", r"Killed\.?", Category.RESOURCE),),
    positive=(
        "RuntimeError: DataLoader worker (pid 325) is killed by signal: Bus error.",
        # an echo of a stop sent to the whole job (tests/fixtures/real/eightieth-term-fold)
        "[rank1]: RuntimeError: DataLoader worker (pid 29417) is killed by signal: Terminated. ",
        "ERROR: Unexpected bus error encountered in worker. This might be caused by "
        "insufficient shared memory (shm).",
        "RuntimeError: unable to write to file </torch_18692_1954506624_0>: No space left on "
        "device (28)",
        # tests/fixtures/real/hundredsixtieth-shm-pinch (a small limit on the segment's size)
        "RuntimeError: unable to resize file </torch_31873_3421902410_0> to the right size: File "
        "too large (27)",
    ),
    negative=("RuntimeError: CUDA error: initialization error",),
)

MISSING_MODULE = Rule(
    code="ENV101",
    kind="missing-module",
    title="A Python module is missing in the interpreter that ran the job",
    sources="CPython import system",
    specificity=60,
    signatures=(
        # the closing quote optional: a pasted line cut at its end still names the module
        Signature(
            r"ModuleNotFoundError: No module named '(?P<module>[^'\s]+)'?", "ModuleNotFoundError"
        ),
        Signature(
            r"ImportError: cannot import name '(?P<name>[^']+)'", "ImportError: cannot import name"
        ),
        Signature(r"ImportError: No module named (?P<module>\S+)", "ImportError: No module named"),
        # Hydra's instantiate (hydra/_internal/utils.py _locate) when the _target_ cannot be
        # imported; the ImportError is chained and printed only with HYDRA_FULL_ERROR=1
        Signature(r"Error locating target '(?P<module>[\w.]{1,200})'", "Error locating target '"),
        # transformers utils/import_utils.py: an optional dependency missing
        Signature(
            # a bounded name: `.+?` from every "requires the " of a long line was quadratic
            r"requires the (?P<module>.{1,100}?) library but it was not found in your environment",
            "library but it was not found in your environment",
        ),
        # a library's own ImportError for an optional dependency: diffusers' "Please install
        # bitsandbytes to use 8-bit Adam. You can do so by running `pip install bitsandbytes`",
        # transformers' "... requires Accelerate: `pip install accelerate`", "apex is not
        # installed"
        # torch.hub's and inductor's own checks for packages (census hub-missing-dependencies,
        # inductor-triton-missing, tensorboard-too-old)
        Signature(
            r"RuntimeError: Missing dependencies: (?P<module>[\w, .-]{1,200})",
            "Missing dependencies: ",
        ),
        Signature(r"TritonMissing: Cannot find a working triton installation", "TritonMissing"),
        # a package a C++ extension's build needs: ninja for torch.utils.cpp_extension.load
        # and DeepSpeed's JIT ops; apex installed without its compiled parts (amp_C)
        # (census cpp-ext-ninja-required, ds-jit-load-no-ninja,
        # apex-multi-tensor-apply-unavailable)
        Signature(r"Ninja is required to load C\+\+ extensions"),
        Signature(
            r"Unable to JIT load the \w{1,60} op due to ninja not being installed",
            "op due to ninja not being installed",
        ),
        Signature(
            r"MultiTensorApply is not available, possibly because Apex was installed without",
            "possibly because Apex was installed without",
        ),
        Signature(
            r"TensorBoard logging requires TensorBoard version", "TensorBoard logging requires"
        ),
        Signature(
            r"ImportError: [^\n]{0,300}?(?:[Pp]lease install (?P<module>[\w.\-]{1,60})"
            r"|pip install|(?:is|are|seems to be) not installed)",
            "ImportError: ",
        ),
    ),
    context_none=(r"lib(?:cudnn|nccl|cublas|cudart|cuda)\w{0,64}\.so",),
    explanation=Explanation(
        what="Python could not import a module.",
        why="The package is not installed for the interpreter the launcher used (torchrun from "
        "another environment, user-site packages, a node with a different image), or versions "
        "do not match (cannot import name).",
        fix="Install it in the environment the job runs with; launch with `python -m "
        "torch.distributed.run` to be sure the same interpreter is used.",
        false_positives="None.",
    ),
    fix=(
        "Check which interpreter runs: `which torchrun python`; install the package there "
        "(python -m pip install PACKAGE).",
        "Launch with `python -m torch.distributed.run ...` instead of `torchrun` to use the "
        "same environment.",
    ),
    positive=(
        # `python -m torch.distributed.run` under an interpreter without torch (set 165)
        "/usr/bin/python3: Error while finding module specification for "
        "'torch.distributed.run' (ModuleNotFoundError: No module named 'torch')",
        "ModuleNotFoundError: No module named 'tensorboard'",
        # a paste cut before the closing quote (corpus 1736)
        "ModuleNotFoundError: No module named 'torch.distributed.pipelining",
        "ImportError: Please install bitsandbytes to use 8-bit Adam. You can do so by running "
        "`pip install bitsandbytes`",
        "Error locating target 'toy_models.TinyTransformer', set env var HYDRA_FULL_ERROR=1 to "
        "see chained exception.",
        "RuntimeError: Ninja is required to load C++ extensions (pip install ninja to get it)",
    ),
    negative=(
        "/usr/bin/python3: No module named trainer_missing",
        "ImportError: libcudnn.so.8: cannot open shared object file: No such file or directory",
    ),
)

WEIGHTS_ONLY = Rule(
    code="ENV102",
    kind="weights-only-load",
    title="torch.load(weights_only=True) rejected the checkpoint",
    sources="torch/serialization.py, torch/_weights_only_unpickler.py (torch >= 2.6 default)",
    specificity=85,
    # a resume: every rank unpickles the same file under the same default
    alike_on_every_rank=True,
    signatures=(
        Signature(r"Weights only load failed"),
        Signature(r"WeightsUnpickler error: (?P<what>.+)", "WeightsUnpickler error"),
        Signature(r"Unsupported global: GLOBAL (?P<global>\S+)", "Unsupported global: GLOBAL"),
    ),
    explanation=Explanation(
        what="torch.load refused to unpickle objects that are not plain tensors/containers.",
        why="Since PyTorch 2.6 torch.load defaults to weights_only=True; checkpoints holding "
        "numpy arrays, argparse Namespaces or custom classes are rejected.",
        fix="For a trusted checkpoint: torch.load(path, weights_only=False); or allowlist the "
        "named globals with torch.serialization.add_safe_globals([...]).",
        false_positives="None.",
    ),
    fix=(
        "If you trust the file: torch.load(path, map_location='cpu', weights_only=False).",
        "Or allowlist the class named in the error: "
        "torch.serialization.add_safe_globals([TheClass]).",
    ),
    positive=(
        "WeightsUnpickler error: Unsupported global: GLOBAL numpy.core.multiarray._reconstruct "
        "was not an allowed global by default.",
    ),
    negative=("_pickle.UnpicklingError: invalid load key, '<'.",),
)

DATALOADER_FD_LIMIT = Rule(
    code="DL102",
    kind="dataloader-worker-killed",
    title="DataLoader workers ran out of file descriptors",
    sources="torch/multiprocessing/reductions.py (file_descriptor sharing), OS errno 24",
    specificity=70,
    signatures=(
        Signature(r"received 0 items of ancdata"),
        Signature(r"\[Errno 24\] Too many open files", "Too many open files"),
        # torch/utils/data/dataloader.py, when a worker's queue read fails with EMFILE
        Signature(
            r"Too many open files\. Communication with the workers is no longer possible",
            "Communication with the workers is no longer possible",
        ),
    ),
    explanation=Explanation(
        what="Passing tensors from DataLoader workers failed for lack of file descriptors.",
        why="The default 'file_descriptor' sharing strategy keeps one descriptor per shared "
        "tensor; with many workers and prefetching the process hits `ulimit -n`.",
        fix="Raise the limit (ulimit -n 65535 in the launcher's shell or container), or call "
        "torch.multiprocessing.set_sharing_strategy('file_system') at start-up.",
        false_positives="Too many open files from the program's own files (logs, datasets) "
        "has the same errno.",
    ),
    fix=(
        "ulimit -n 65535 (or the container's nofile limit) before starting the job.",
        "Or at the top of the script: torch.multiprocessing.set_sharing_strategy('file_system').",
    ),
    positive=("RuntimeError: received 0 items of ancdata",),
    negative=("DataLoader worker (pid 12) is killed by signal: Killed.",),
)

SAMPLE_FETCH_FRAMES = (
    r"torch[/\\]utils[/\\]data[/\\]_utils[/\\]fetch\.py\", line \d{1,6}, in \w{1,40}"
    r"(?:\n[^\n]{0,2000}){0,20}?\", line \d{1,6}, in __(?:getitems?|iter|next)__\b"
    # a loader of the program's own (ffcv's, webdataset's, a streaming reader's): the loop's
    # `for ... in loader:` line, and right under it the loader's __iter__ / __next__ (not
    # torch's DataLoader or a framework's wrapper of it: their path is the fetch's above,
    # and past it the collate function, whose errors are the batching code's)
    r"|\n\s{2,16}for [^\n]{1,200} in [^\n]{1,200}:[ \t]*\r?\n[^\n]{0,200}File \""
    r"(?![^\"\n]{0,400}[/\\](?:torch[/\\]utils[/\\]data|accelerate|(?:pytorch_)?lightning)[/\\])"
    r"[^\"\n]{1,400}\", line \d{1,6}, in __(?:iter|next)__\b"
)
"""A traceback that passes through the DataLoader's fetch into the dataset's __getitem__ (or an
iterable one's __iter__ / __next__), or from the loop's `for` over a loader of its own into
that loader's __iter__ / __next__: the data code raised, reading a sample."""

DATALOADER_CHANNEL_BROKEN = Rule(
    code="DL103",
    kind="dataloader-worker-killed",
    title="A DataLoader worker died while handing over a batch (its channel broke)",
    sources="torch/multiprocessing/reductions.py rebuild_storage_fd, multiprocessing "
    "resource_sharer.py and connection.py, torch/utils/data/dataloader.py",
    # the broken channel says that the worker died, not why (the OOM killer, a crash, a full
    # /dev/shm): no category is claimed
    category=Category.UNKNOWN,
    specificity=75,
    signatures=(
        Signature(
            r"(?P<exc>ConnectionResetError|ConnectionRefusedError|BrokenPipeError|EOFError)"
            r"\b",
            "Error",
        ),
    ),
    # the error was raised while the main process fetched a batch from its workers: fetching a
    # shared tensor's descriptor from a worker that is gone (resource_sharer), or its queue
    context_all=(
        r"resource_sharer|rebuild_storage_fd|torch/utils/data/dataloader\.py"
        r"|torch/utils/data/_utils/",
    ),
    # (not when it passed through the fetch into the dataset's own code: the dataset raised
    # it, reading a sample with pickle or a socket of its own, in the main process itself)
    context_none=(SAMPLE_FETCH_FRAMES,),
    explanation=Explanation(
        what="The main process lost the connection to a DataLoader worker while receiving a "
        "batch: ConnectionResetError, ConnectionRefusedError, BrokenPipeError or EOFError "
        "under the DataLoader's frames.",
        why="Workers hand each batch's shared-memory tensors over a socket (the "
        "'file_descriptor' strategy): when a worker dies mid-way (killed by the OOM killer, a "
        "crash, /dev/shm full) the reader sees the connection reset instead of the usual "
        "'DataLoader worker (pid N) is killed by signal' line, depending on which comes first.",
        fix="Find why the worker died: dmesg for the OOM killer, df -h /dev/shm; lower "
        "num_workers or the memory each worker holds.",
        false_positives="A dataset that itself opens network connections in its workers "
        "(a remote store) raises the same errors from its own frames.",
    ),
    fix=(
        "Check the node for the OOM killer (dmesg -T | grep -iE 'killed process|out of "
        "memory') and /dev/shm (df -h /dev/shm): a worker died while handing over a batch.",
        "Lower DataLoader(num_workers=...) or what each worker keeps in memory; or "
        "torch.multiprocessing.set_sharing_strategy('file_system').",
    ),
    positive=("ConnectionResetError: [Errno 104] Connection reset by peer",),
    negative=("ConnectionResetErrorHandler configured",),
)

SAMPLE_FETCH = Rule(
    code="DATA105",
    kind="data-error",
    title="An exception raised while the dataset read a sample",
    sources="torch/utils/data/_utils/fetch.py (DataLoader with num_workers=0)",
    specificity=5,
    signatures=(
        Signature(r"^\**(?P<exc>[A-Za-z_][\w.]*Error)(?::|$)", "Error", suggests=True),
        # (a bare 'Exception: ...' too: NeMo's audio loader raises one for a file it cannot
        # decode)
        Signature(r"^\**(?P<exc>(?:[A-Za-z_][\w.]*)?Exception)(?::|$)", "Exception", suggests=True),
    ),
    # the same writer's traceback passes through the DataLoader's fetch into the dataset's
    # __getitem__ or __iter__ (reading or decoding a sample; with workers the main process re-raises it
    # as "Caught X in DataLoader worker process N": DATA101). Not the collate function: it
    # assembles samples already read, and its errors are the batching code's
    # (a map-style dataset's __getitem__(s), an iterable one's __iter__ / __next__, in a frame
    # below the fetch's: the DataLoader's own __iter__ and __next__ are above it), within 20
    # lines (real ones: 3-6; a longer window reaches a peer's next traceback, and each
    # fetch.py frame scans it, so its cost is the window times the line)
    context_all=(SAMPLE_FETCH_FRAMES,),
    explanation=Explanation(
        what="A rank's traceback ends in an exception raised while the DataLoader fetched a "
        "sample: in the dataset's __getitem__ (reading, decoding, transforming it).",
        why="A sample that cannot be read or decoded as the code expects: a file of the wrong "
        "size or format, a corrupt record, an annotation that does not fit, or a bug in the "
        "dataset code that only some samples reach.",
        fix="Find the sample: catch the exception in __getitem__ and log its index and path; "
        "validate or drop that file, or fix the decoding for it.",
        false_positives="A plain bug in the dataset code fails the same way on every sample "
        "(then on every rank at its first batch).",
    ),
    fix=(
        "Log the index and path in the dataset's __getitem__ when it raises, and check that "
        "file on the failing rank's node.",
    ),
    positive=("RuntimeError: shape '[3, 32, 32]' is invalid for input of size 1536",),
    negative=("INFO: loss=0.31 RuntimeError count=0",),
)

READ_FRAME = (
    r"\bin _?(?:[A-Za-z0-9]+_)*(?:read|load|loader|parse|decode|fromfile|from_file)"
    r"(?:_\w*)?[ \t]*\n(?:(?![ \t]*File \")[ \t][^\n]*\n){0,6}[^\n]*$"
)
"""The traceback's deepest frame is a function that reads a file ('read_sn3_pascalvincent_tensor',
'ppm_loader', 'load_data', '_parse_record', 'from_file'): only its code line and carets follow
it down to the error."""

READ_DATA_SIZE = Rule(
    code="DATA109",
    kind="data-error",
    title="Data read from a file is not the size its shape says (a file cut short or of "
    "another format)",
    sources="ATen view/reshape ('shape ... is invalid for input of size'), numpy reshape",
    specificity=25,
    signatures=(
        Signature(
            r"^\**(?:[\w.]+\.)?RuntimeError: shape '\[[\d, -]{1,200}\]' is invalid for input of "
            r"size \d{1,15}",
            "is invalid for input of size",
        ),
        Signature(
            r"^\**(?:[\w.]+\.)?ValueError: cannot reshape array of size \d{1,15} into shape",
            "cannot reshape array of size",
        ),
    ),
    # a reader's reshape of what it read into the shape the file's header or the format
    # promises (torchvision's MNIST reader: numbers of items and rows from the header, then
    # parsed.view(*s); np.fromfile(...).reshape(n, 28, 28)): the bytes are fewer or more
    # than that shape. The same error in a model's forward or a collate is the code's
    context_all=(READ_FRAME,),
    explanation=Explanation(
        what="A function that reads a file (its name says it reads, loads, parses or decodes) "
        "reshaped what it read into the shape the file's header or format promised, and the "
        "number of values did not fit.",
        why="The file is shorter or longer than its header says: a download or an extraction "
        "cut short, a file overwritten while another rank read it, a file of another format or "
        "version under the expected name.",
        fix="Check the size of the file the reader opened on the failing rank's node against "
        "a good copy (or its checksum); download or extract it again.",
        false_positives="A reader whose own shape arithmetic is wrong fails the same way on "
        "every file and every rank.",
    ),
    fix=(
        "Compare the size (or checksum) of the file the failing rank read with a good copy; "
        "download or extract it again, and build shared caches on one rank behind a barrier.",
    ),
    positive=(
        # tests/fixtures/real/hundredfiftieth-gz-stub (FashionMNIST's reader, an extraction
        # cut short)
        "RuntimeError: shape '[2048, 28, 28]' is invalid for input of size 1048560",
        "ValueError: cannot reshape array of size 1048560 into shape (2048,28,28)",
    ),
    negative=(
        "RuntimeError: shape mismatch: value tensor of shape [8] cannot be broadcast",
        "ValueError: cannot reshape array of size 0",
    ),
)

DATALOADER_TIMEOUT = Rule(
    code="DL104",
    kind="hang",
    title="The DataLoader's own timeout expired: no worker delivered a batch in time",
    sources="torch/utils/data/dataloader.py _try_get_data (DataLoader(timeout=...))",
    specificity=75,
    signatures=(
        Signature(
            r"DataLoader timed out after (?P<after>\d{1,9}) seconds", "DataLoader timed out after"
        ),
    ),
    explanation=Explanation(
        what="DataLoader(timeout=N) was set and no batch came from its workers for N seconds.",
        why="The workers are alive but stuck: reading from a network filesystem or object "
        "store that stalls, a deadlock in the dataset (a lock, a thread pool inside the "
        "worker), or far too many workers for the node's CPUs and I/O.",
        fix="Dump a stuck worker's stack (py-spy dump --pid WORKER_PID) to see what it waits on; "
        "run once with num_workers=0 to get the dataset's own error or slowness.",
        false_positives="A timeout set much shorter than a slow but healthy first batch.",
    ),
    fix=(
        "Take the stacks of the DataLoader worker processes while they stall (py-spy dump "
        "--pid PID): they show the read or lock they wait on.",
        "Run once with num_workers=0; check the storage the dataset reads from (a network "
        "filesystem, an object store) and lower num_workers.",
    ),
    positive=("RuntimeError: DataLoader timed out after 600 seconds",),
    negative=("DataLoader(timeout=600, num_workers=8)",),
)

RECORD_WITHOUT_FIELD = Rule(
    code="DATA107",
    kind="data-error",
    title="A data record lacks the field the code reads from it (KeyError on a row)",
    sources="CPython dict lookups on a dataset's rows (JSON lines, CSV rows, datasets' examples)",
    specificity=30,
    signatures=(Signature(r"^\**KeyError: ['\"][^'\"\n]{1,100}['\"]\s*$", "KeyError: "),),
    # the failing line of code looks a name up in a row of the data: row["instruction"],
    # r["anchor"] in a comprehension over rows, example["text"], sample['label']
    context_all=(
        r"\b(?:rows?|r|ex|examples?|samples?|records?|items?|entry|doc|instance|line|datum)"
        r"\[['\"][^'\"\n]{1,100}['\"]\]",
    ),
    explanation=Explanation(
        what="A KeyError naming a field, raised on a line that reads that field from a row of "
        "the data (a JSON line, a CSV row, a dataset example).",
        why="The data does not have the columns the code expects: another dataset format (an "
        "alpaca row without 'instruction', pairs named 'sentence1' where the loss wants "
        "'anchor'), a malformed row, or the wrong file given as training data.",
        fix="Check the data's columns against what the code reads: rename the columns "
        "(datasets' rename_column), pick the right format in the config, or fix the rows that "
        "lack the field.",
        false_positives="A row built by the program itself under another name (a bug in the "
        "code, not the data).",
    ),
    fix=(
        "Print the first rows' keys of the data the failing rank read and compare them with the "
        "field the KeyError names; rename the columns or choose the matching dataset format.",
    ),
    positive=("KeyError: 'instruction'",),
    negative=("KeyError: 42", "KeyError: 'instruction' not in config, using the default"),
)

DATA_NOUN = (
    r"(?:(?<![A-Za-z])(?:data(?:sets?)?|images?|files?|shards?|manifests?|corpus|samples?"
    r"|examples?|annotations?|audios?|videos?|recordings?)(?![A-Za-z])|\.(?:jsonl?|csv|tsv"
    r"|parquet|arrow|npy|npz|h5|hdf5|pkl|tfrecords?|lmdb|idx|tar|zip|jpe?g|png|wav|flac|mp[34]"
    r"|pth?|ckpt|safetensors)"
    r"\b|(?<![\w.])(?:\.{0,2}|~)/[\w.-]+/[\w./-]+"
    r"|(?<![\w./-])[\w.-]{1,80}(?:/[\w.-]{1,80})+\.[A-Za-z][A-Za-z0-9]{0,9}\b)"
)
"""Words for a job's input data: its nouns (also inside names: 'data_dir', 'train_images'),
the extensions of data and checkpoint files, a path of two parts or more
('/data/coco/train2017'), or a relative path to a file ('exp/epoch-2.pt')."""

MISSING_PHRASES = (
    "does not exist",
    "doesn't exist",
    "not found",
    "could not be found",
    "cannot be found",
    "could not find",
    "cannot find",
    "can't find",
    "unable to find",
    "is empty",
)
"""How programs say, in their own words, that something they were given is not there."""

NONE_FOUND = r"no (?:data|images?|files?|samples?|examples?)\b[^\n]{0,40}\bfound"
"""'No data found', 'No images found in ...': the input looked for and not there."""


def _absent(phrases: str) -> str:
    """A data noun somewhere in the line (ahead or behind), then one of `phrases`."""
    return r"(?=[^\n]{0,300}" + DATA_NOUN + r")[^\n]{0,300}?\b(?:" + phrases + ")"


MISSING_INPUT_WORDS = re.compile(
    r"(?i)(?:"
    + _absent("|".join(re.escape(p) for p in MISSING_PHRASES))
    + r"|\b"
    + NONE_FOUND
    + ")"
)
"""An error in the program's own words saying its input data is not there: a data noun or a
data file's extension, and a phrase of absence ('data_dir /data/x does not exist', 'No data
found', 'dataset is empty')."""

OWN_EXCEPTION = (
    r"^\**(?:[\w.]+\.)?(?P<exc>AssertionError|ValueError|RuntimeError|OSError|IOError"
    r"|Exception): (?!Parent directory )"
)


def _missing_input_signatures() -> tuple[Signature, ...]:
    """One signature per phrase of absence, each with its own literal for the prefilter,
    and one for 'no images found'."""
    return (
        *(
            Signature(r"(?i)" + OWN_EXCEPTION + _absent(re.escape(phrase)), phrase)
            for phrase in MISSING_PHRASES
        ),
        Signature(r"(?i)" + OWN_EXCEPTION + r"[^\n]{0,300}?\b" + NONE_FOUND, " found"),
    )


MISSING_INPUT = Rule(
    code="DATA108",
    kind="data-error",
    title="The program's own error says its input data is not there",
    sources="programs' own checks of their inputs (assert os.path.exists(...), raise "
    "ValueError(f'{path} does not exist'))",
    specificity=20,
    signatures=_missing_input_signatures(),
    # not a place the program writes to: torch.save's 'Parent directory ... does not exist',
    # a traceback through a save or write function
    context_none=(r"PyTorchFileWriter", r", in _?(?:save|write|dump)\w*\s*$"),
    explanation=Explanation(
        what="An exception of the program's own (an assertion, a ValueError or RuntimeError it "
        "raised), or an error it logged before its output stopped (INF240's reading of such "
        "words), that says data it was given is not there: a dataset, a folder of images, a "
        "file of samples that does not exist, was not found or is empty.",
        why="The path points where the data is not: a relative path run from another working "
        "directory, a mount or a download missing on this node, a preprocessing step that did "
        "not run or wrote elsewhere, a folder layout the loader does not expect.",
        fix="Check the path the message names on the node and rank that raised it (absolute "
        "path, the mount, the preprocessing output), then start again.",
        false_positives="A file the program writes (an output folder that does not exist yet) "
        "named in the same words.",
    ),
    fix=(
        "Check the path the error names on the node that raised it: `ls -la PATH` from the "
        "job's working directory; use an absolute path, mount or copy the data there, or run "
        "the preprocessing step that makes it.",
    ),
    positive=(
        "AssertionError: /data/coco/train2017 does not exist",
        "ValueError: Dataset file data/train.jsonl not found",
        "RuntimeError: No images found in /data/faces (expected .jpg or .png files)",
        # a relative path to a file: icefall's resume check (set 122 epoch-gone)
        "AssertionError: pruned_transducer_stateless7/exp/epoch-2.pt does not exist!",
    ),
    negative=(
        "RuntimeError: operator torchvision::nms does not exist",
        # a hub model's name is no path to a file
        "OSError: meta-llama/Llama-3.1-8B-Instruct does not exist on the Hub",
        "AssertionError: key 'lr' not found in config",
        "ValueError: Tried to find epoch_1 but folder does not exist, skip",
        # torch.save into a folder that is not there: an output, not an input
        "RuntimeError: Parent directory /tmp/run-38566/vits-0000000 does not exist.",
    ),
)

DEEPSPEED_NO_CHECKPOINT = Rule(
    code="DATA106",
    kind="data-error",
    title="DeepSpeed found no checkpoint files to load on this rank",
    sources="DeepSpeed runtime/state_dict_factory.py SDLoaderBase.check_ckpt_list (0.6-0.19)",
    specificity=70,
    signatures=(Signature(r"^\**AssertionError\s*$", "AssertionError"),),
    # its bare assert on the list of model-state files engine.load_checkpoint found
    context_all=(r"in check_ckpt_list\b",),
    explanation=Explanation(
        what="engine.load_checkpoint found no mp_rank_*_model_states.pt files for the tag it "
        "was given: DeepSpeed's bare 'assert len(self.ckpt_list) > 0' failed.",
        why="The checkpoint folder (or the tag in 'latest') is not there on this node: saved "
        "on another node's local disk, a tag that was never written, a path relative to "
        "another working directory.",
        fix="Put the checkpoint on a filesystem every node sees (or copy it to each node), and "
        "check the tag and the 'latest' file in the checkpoint folder.",
        false_positives="None: the assert is this exact check.",
    ),
    fix=(
        "Make the checkpoint folder readable on every node (shared storage, or copy it), and "
        "check that the tag you pass (or 'latest') names a folder holding "
        "mp_rank_00_model_states.pt.",
    ),
    positive=("AssertionError",),
    negative=("AssertionError: batch size must be positive",),
)

RULES = (
    DATA_ERROR,
    RECORD_WITHOUT_FIELD,
    MISSING_INPUT,
    DEEPSPEED_NO_CHECKPOINT,
    DATALOADER_TIMEOUT,
    SAMPLE_FETCH,
    READ_DATA_SIZE,
    CHECKPOINT_UNREADABLE,
    DISK_FULL,
    CHECKPOINT_WRITE_FAILED,
    DATALOADER_WORKER_KILLED,
    DATALOADER_FD_LIMIT,
    DATALOADER_CHANNEL_BROKEN,
    MISSING_MODULE,
    WEIGHTS_ONLY,
)
