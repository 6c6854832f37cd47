"""Real gloo runs of a twenty-second training-program style
(tests/programs/twentysecond_style_train.py: a text-to-image fine-tuning script in the way of
diffusers' examples/text_to_image/train_text_to_image.py: an imagefolder read with PIL in
DataLoader workers, a tiny UNet with a mid-block position embedding sized by --resolution, an EMA
of its weights, Accelerator(gradient_accumulation_steps, project_config=ProjectConfiguration),
get_logger(__name__, log_level="INFO"), the "Steps" tqdm bar on the main process, save_state to
checkpoint-N/ with --checkpoints_total_limit, --resume_from_checkpoint latest, validation images
on the main process, a NaN-loss guard that stops training, wait_for_everyone() before the final
save, end_training(), a 10 s collective timeout through InitProcessGroupKwargs), launched five
ways: accelerate launch --multi_gpu (CPU), two accelerate launch agents as two machines (each its
own data folder and flags), torchrun --standalone (console), torchrun --log-dir --tee 3, and
python -m torch.distributed.launch. Neither the program nor the launches were used to build the
rules: the diagnosis must generalise. Captured by tests/fixtures/real/capture_twentysecond.sh.

EXPECTED was written from each mode's mechanism and the taxonomy before any diagnosis was seen;
a mode ddpdoctor gets wrong today is a strict xfail whose reason says what it says instead."""

from __future__ import annotations

import pytest

from tests.program_runs import Expected, RunSet

# mode -> (status, kind, culprit ranks); launch and world size in brackets
# (capture_twentysecond.sh)
EXPECTED: dict[str, Expected] = {
    # [alaunch 2, --gradient_checkpointing --dataloader_num_workers 4] accelerate's "values were
    # not passed to `accelerate launch`" note, two diffusers-style FutureWarnings, an "xformers is
    # not available" warning, torch.utils.checkpoint's use_reentrant warning, the DataLoader's
    # "4 worker processes ... suggested max"; 10 steps, a checkpoint, the final save; exits 0
    "chatty-finish": ("ok", None, []),
    # [console 2, --use_ema --checkpoints_total_limit 2 --validation_epochs 1] 24 steps,
    # checkpoints every 4 with old ones removed, validation at the epoch's end, Steps: 100%,
    # wait_for_everyone, the final save, end_training; exits 0
    "all-steps-saved": ("ok", None, []),
    # [alaunch 2, --resume_from_checkpoint latest into an empty output dir] "Checkpoint 'latest'
    # does not exist. Starting a new training run."; 8 steps; exits 0
    "fresh-start-resume": ("ok", None, []),
    # [alaunch 3, --validation_inference_steps 1000, 8 images x 2 prompts] at the first epoch's
    # end rank 0 samples validation images (1000 DDIM steps) for longer than the 10 s timeout
    # while ranks 1 and 2 wait in the next epoch's first gather and time out
    "val-outlasts": ("failed", "slow-rank-timeout", [0]),
    # [alaunch 2] accelerator.wait_for_everyone() inside `if accelerator.is_main_process:` before
    # save_state: rank 0 enters the barrier at step 4, rank 1 goes on into step 5's gather
    "save-wait-main": ("failed", "collective-mismatch", [0]),
    # [alaunch 2, --use_ema --checkpointing_steps 2] rank 0 is SIGKILLed (the OOM killer's
    # signature, no traceback) while writing the UNet's second shard of checkpoint-4; rank 1
    # loses it in its next collective
    "save-kill9": ("failed", "host-oom", [0]),
    # [logdir 2, --resume_from_checkpoint latest] the newest folder, checkpoint-4, is what a
    # SIGKILLed save left: unet_ema/ and one UNet shard, no weights index, no optimizer.bin;
    # every rank's load_state raises OSError "Error no file named ...index.json found"
    "torn-latest": ("failed", "data-error", [0, 1]),
    # [console 2] one caption in the data is empty: its mean-pooled text embedding is 0/0, rank
    # 1's loss is NaN at its step 7; the guard logs "Loss is nan ... stopping training" and breaks
    # out of training on rank 1 only (into wait_for_everyone) while rank 0 goes on into the next
    # gather and times out
    "nan-break-one": ("failed", "uncoordinated-exit", [1]),
    # [logdir 2, --dataloader_num_workers 2] 0051.png is an HTML page a failed download saved:
    # PIL.UnidentifiedImageError in rank 1's DataLoader worker, re-raised on rank 1; rank 0
    # loses its peer
    "undecodable-r1": ("failed", "data-error", [1]),
    # [alaunch 2, --dataloader_num_workers 2] a DataLoader worker of rank 0 is SIGKILLed:
    # "DataLoader worker (pid N) is killed by signal: Killed." on rank 0
    "worker-kill9-r0": ("failed", "dataloader-worker-killed", [0]),
    # [anodes 2x2] machine 1 is given --resolution 48: its UNet's mid-block position embedding
    # has 144 positions, machine 0's 64; DDP's construction in prepare() finds different
    # parameter shapes ("DDP expects same model across all ranks")
    "node1-res": ("failed", "ddp-model-mismatch", [2, 3]),
    # [anodes 2x2, --num_train_epochs 1] machine 1's copy of the data has 40 images, machine 0's
    # 64: ranks 2 and 3 compute 5 steps, ranks 0 and 1 8; ranks 2 and 3 leave the loop into
    # wait_for_everyone while ranks 0 and 1 gather in step 6
    "node1-fewer": ("failed", "uneven-inputs", [2, 3]),
    # [legacy 2] torch.distributed.launch appends --local-rank=N, the script's argparse (written
    # for accelerate launch) has no such option: "unrecognized arguments" on every rank
    "old-launcher-argv": ("failed", "local-rank-argument", [0, 1]),
    # [console 3, --use_8bit_adam] bitsandbytes is not installed: every rank raises ImportError
    # "Please install bitsandbytes to use 8-bit Adam"
    "adam8bit-absent": ("failed", "missing-module", [0, 1, 2]),
    # [console 2, --output_dir on a 64 kB tmpfs] rank 0's save_state of checkpoint-4 does not
    # fit: writing the checkpoint fails with "No space left on device", rank 0 exits, rank 1
    # loses it
    "tiny-output-fs": ("failed", "disk-full", [0]),
}

# mode -> what ddpdoctor says instead today (known gaps: fixing one turns its xfail into a failure)
MISSES: dict[str, str] = {}


RUNS = RunSet("twentysecond-", EXPECTED, MISSES, label_nowhere=True)


@pytest.mark.parametrize("mode", RUNS.params())
def test_twentysecond_style_run(mode: str) -> None:
    RUNS.check_verdict(mode)


@pytest.mark.parametrize("mode", list(EXPECTED))
def test_twentysecond_style_fixture_is_small_rewritten_and_unlabelled(mode: str) -> None:
    RUNS.check_fixture(mode)
    for f in RUNS.files(mode):
        assert "T2I_FAULT" not in f.read_text(errors="replace"), f


@pytest.mark.parametrize("mode", ["node1-res", "node1-fewer"])
def test_two_machines_write_one_console_per_machine(mode: str) -> None:
    RUNS.check_two_agents(mode)
