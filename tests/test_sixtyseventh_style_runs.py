"""Real gloo runs of a sixty-seventh training-program style (tests/programs/sixtyseventh_style_train.py:
a tiny DDPM trained in the way of lucidrains' denoising-diffusion-pytorch `Trainer`: a small
Unet-like denoiser inside a GaussianDiffusion wrapper with a cosine beta schedule, the Trainer
with Accelerate's Accelerator(split_batches=True, mixed_precision='no') and a 15 s process-group
timeout (InitProcessGroupKwargs), `cycle(dl)` over a prepared DataLoader (1 worker), two
`accelerator.wait_for_everyone()` a step, an EMA model on the main process only, a tqdm bar on
the main process only ('loss: 0.6416:   6%|▌         | 11/200 [00:01<00:22,  8.38it/s]', with
tqdm's carriage returns as it writes into a file) and, every 20 steps on the main process only,
a 50-step "sampling loop time step" bar, a sample grid results/sample-{milestone}.png (PIL is
missing here: the grid's raw tensor under that name), an optional FID ('fid_score: ...') and a
milestone results/model-{milestone}.pt (step, model, opt, ema, scaler, version), resumed with
`trainer.load(milestone)` (torch.load, weights_only=True); 'training complete' at the end.
Launched on one machine with `accelerate launch --config_file accelerate_config.yaml train.py`
(tests/programs/sixtyseventh_accelerate_config.yaml as `accelerate config` writes it:
distributed_type MULTI_GPU, gpu_ids all, num_processes 3, use_cpu false; the Trainer passes
cpu=True where CUDA is missing): accelerate 1.15 runs torch elastic with 3 processes over gloo,
ranks 0-2, and prints nothing of its own before the program. (A config of distributed_type
MULTI_CPU with use_cpu true, tried first, starts ONE process through accelerate's
simple_launcher on one machine: not used.) A fixture is the console of the launch, console.log
(torch elastic's lines, its ChildFailedError summary, the processes' '[rankN]:' tracebacks,
tqdm's bars), and where the results folder holds something, results.txt (`ls -l results`). The
fault is chosen by an environment variable the program never prints, or by what a run is given
(capture_sixtyseventh.sh). Neither the program nor the launch were used to build the rules.

EXPECTED was written from each mode's mechanism and the taxonomy before any diagnosis was seen;
a mode ddpdoctor gets wrong today is a strict xfail whose reason says what it says instead.
First diagnosis: 13 of 14 right (calm-blur, loud-blur, hush-goal, solo-hush, grid-crawl,
fid-lone, tstep-edge, cache-bloat, null-unet, shm-pinch, torn-milestone, frame-rot, port-held);
png-park, a silent wait of the main process after its sampling bar, reads as slow-rank-timeout:
no line of this style carries a clock, so busy and silent cannot be told apart."""

from __future__ import annotations

import re

import pytest

from tests.program_runs import Expected, RunSet

# mode -> (status, kind, culprit ranks: GLOBAL ranks); arguments in brackets (capture_sixtyseventh.sh)
EXPECTED: dict[str, Expected] = {
    # 60 steps, three milestones (sample-1..3.png, model-1..3.pt) and "training complete";
    # DeepSpeed's "[WARNING] [real_accelerator.py:213:get_accelerator] Setting accelerator to
    # CPU" (accelerate imports deepspeed in a DataLoader worker) is the only warning
    "calm-blur": ("ok", None, []),
    # [--fid --workers 4, OMP_NUM_THREADS unset] the same run with scary warnings: every rank's
    # DataLoader "UserWarning: This DataLoader will create 4 worker processes in total. Our
    # suggested max number of worker in current system is 2, which is smaller than what this
    # DataLoader is going to create" (twice a rank), three 'fid_score: 6.9...' lines; trains to
    # the end
    "loud-blur": ("ok", None, []),
    # [--steps 200 --stop-loss 0.45] a rank's loss below the target calls
    # accelerator.set_trigger(), every rank's accelerator.check_trigger() (an all-reduce) sees
    # it at step 40: the main process prints "loss target 0.45 reached at step 40, stopping
    # early" and "training complete", all three exit 0: an agreed, intended stop
    "hush-goal": ("ok", None, []),
    # [--steps 200 --stop-loss 0.45] the target is checked on the main process' own loss only,
    # with no trigger: at step 44 (after two milestones) rank 0 prints "loss 0.4281 below 0.45,
    # stopping early" and "training complete" and exits 0; ranks 1 and 2 go on and lose it in
    # accelerate's RNG broadcast at their DataLoader's next epoch (synchronize_rng_states,
    # "Connection closed by peer"); torch elastic names rank 1 (exit 1) its root cause
    "solo-hush": ("failed", "uncoordinated-exit", [0]),
    # sampling on the main process at step 20 takes 0.8 s a timestep (50 timesteps, its
    # "sampling loop time step" bar going on at 1.25it/s); ranks 1 and 2 wait in the next
    # step's collective and time out after 15 s ("Timed out waiting 15000ms for recv
    # operation"); torch elastic SIGTERMs rank 0 while it still samples (19/50)
    "grid-crawl": ("failed", "slow-rank-timeout", [0]),
    # [--fid] the FID of the main process gathers features with accelerator.gather (an
    # all_gather) that only the main process calls: it meets ranks 1 and 2 in DDP's buffer
    # broadcast of the next forward; no size check fires, ranks 1 and 2 time out after 15 s,
    # rank 0's all_gather then loses them ("Connection closed by peer")
    "fid-lone": ("failed", "collective-mismatch", [0]),
    # rank 1 samples a timestep one past the schedule at step 7 (randint(0, T + 1)): "[rank1]:
    # RuntimeError: index 1000 is out of bounds for dimension 0 with size 1000" in extract's
    # gather; ranks 0 and 2 lose it, torch elastic names rank 1 its root cause
    "tstep-edge": ("failed", "python-exception", [1]),
    # the main process keeps every sample grid at full size and grows 64 MiB each 50 ms after
    # the step-20 sampling, then SIGKILLs itself (the OOM killer's way): no traceback, "failed
    # (exitcode: -9) local_rank: 0", ranks 1 and 2 SIGTERMed while they wait
    "cache-bloat": ("failed", "host-oom", [0]),
    # rank 1's conv fast path reads address 0 in its forward at step 9: SIGSEGV, no traceback,
    # torch elastic's "exitcode: -11" for rank 1, the others SIGTERMed
    "null-unet": ("failed", "native-crash", [1]),
    # the main process hands the step-20 sample grid to a writer thread that is never started
    # and waits on its event: silent, outside any collective; ranks 1 and 2 time out after 15 s
    # in the next step's collective; torch elastic SIGTERMs the stuck rank 0
    "png-park": ("hung", "hang", [0]),
    # rank 2's DataLoader worker is SIGKILLed (as when /dev/shm runs out) before step 1:
    # "[rank2]: RuntimeError: DataLoader worker (pid N) is killed by signal: Killed."; ranks 0
    # and 1 lose it
    "shm-pinch": ("failed", "dataloader-worker-killed", [2]),
    # [--resume 2] an earlier run was killed while writing results/model-2.pt (cut at 20 kB):
    # trainer.load(2) fails on all three ranks in torch.load's zip reader, as torch 2.13 says it
    # "OSError: [Errno 22] Invalid argument"; torch elastic names rank 1 the first
    "torn-milestone": ("failed", "data-error", [0, 1, 2]),
    # one image file (img_0037.pt) was cut short when the folder was copied: rank 1's DataLoader
    # worker is the one that draws it, "Caught RuntimeError in DataLoader worker process 0 ...
    # PytorchStreamReader failed reading zip archive: failed finding central directory" before
    # step 1; ranks 0 and 2 lose it
    "frame-rot": ("failed", "data-error", [1]),
    # a stale process holds the config's main_process_port: accelerate 1.15 warns "UserWarning:
    # Port `38534` is already in use. Accelerate will attempt to launch in a standalone-like mode
    # by finding an open port automatically for this session" and the run trains to the end
    # (expected as a rendezvous failure when the mode was planned; the launch does not fail)
    "port-held": ("ok", None, []),
}

# mode -> what ddpdoctor says instead today (known gaps: fixing one turns its xfail into a failure)
MISSES: dict[str, str] = {
    "png-park": "failed, slow-rank-timeout on rank 0 (INF201, 0.60): rank 0 is right, the kind "
    "is not: rank 0's last line is its finished 'sampling loop time step: 100%' bar, and no "
    "line of the program carries a time (tqdm's bars only count their own seconds), so the 15 s "
    "rank 0 then waits silently on the writer thread's event are not measured; ranks 1 and 2 "
    "timing out while rank 0 is alive until torch elastic SIGTERMs it reads as work on the "
    "main process (as grid-crawl's sampling really is), not as a silent wait",
}


RUNS = RunSet("sixtyseventh-", EXPECTED, MISSES, label_nowhere=True)

HEALTHY = ("calm-blur", "loud-blur", "port-held")


@pytest.mark.parametrize("mode", RUNS.params())
def test_sixtyseventh_style_run(mode: str) -> None:
    RUNS.check_verdict(mode)


@pytest.mark.parametrize("mode", list(EXPECTED))
def test_sixtyseventh_style_fixture_is_small_rewritten_and_unlabelled(mode: str) -> None:
    RUNS.check_fixture(mode)
    names = [f.name for f in RUNS.files(mode)]
    assert names[0] == "console.log" and set(names) <= {"console.log", "results.txt"}, names
    for f in RUNS.files(mode):
        assert "DIFFQ" not in f.read_text(errors="replace"), f


def _lines(mode: str) -> list[str]:
    """The console's lines, tqdm's carriage-return updates each a line of its own."""
    return [x for x in re.split(r"[\r\n]", RUNS.console(mode)) if x.strip()]


OWN = re.compile(
    r"\[rank[0-2]\]: .*"  # a process' traceback, as torch elastic prefixes it
    r"|(loss: \d\.\d{4}: +| *)\d+%\|.*\| \d+/\d+ \[.*\]"  # the training bar
    r"|sampling loop time step: +\d+%\|.*\| \d+/50 \[.*\].*"  # the sampling bar (and what follows)
    r"|.*\d+/\d+ \[.*\](\[rank\d\]: .*|W\d{4} .*|E\d{4} .*|/repo/\.venv/.*Warning: .*)"  # a bar cut by another process' line
    r"|fid_score: \d+\.\d+|training complete"
    r"|loss \d\.\d{4} below 0\.45, stopping early|loss target 0\.45 reached at step \d+, stopping early"
    r"|\[\d{4}-\d\d-\d\d [\d:,]+\] \[WARNING\] \[real_accelerator\.py:213:get_accelerator\] .*"
    r"|[WE]\d{4} [\d:.]+ \d+ torch/distributed/elastic/.*"
    r"|/repo/\.venv/lib/python3\.11/site-packages/.*Warning: .*"
    r"|  (self\.check_worker_number_rationality|warnings\.warn)\(.*"
    r"|Traceback \(most recent call last\):|  File \"/repo/\.venv/.*|    .*"
    r"|torch\.distributed\.elastic\.multiprocessing\.errors\.ChildFailedError: "
    r"|=+(Traceback \(most recent call last\):)?|-+|train\.py FAILED|Failures:|Root Cause \(first observed failure\):"
    r"|\[\d\]:|  (time|host|rank|exitcode|error_file|traceback) *: .*"
    r"|subprocess\.CalledProcessError: .*"
)


@pytest.mark.parametrize("mode", list(EXPECTED))
def test_every_console_line_is_the_launchers_or_the_programs(mode: str) -> None:
    for line in _lines(mode):
        assert OWN.fullmatch(line), line


def test_the_healthy_runs_end_with_three_milestones() -> None:
    for mode in HEALTHY:
        text = RUNS.console(mode)
        assert "Traceback" not in text and text.rstrip().endswith("training complete")
        listing = (RUNS.folder(mode) / "results.txt").read_text()
        assert re.findall(r"model-(\d)\.pt", listing) == ["1", "2", "3"]
    assert RUNS.console("loud-blur").count("fid_score: ") == 3
    assert "Accelerate will attempt to launch in a standalone-like mode" in RUNS.console(
        "port-held"
    )


def test_torch_elastic_names_the_signalled_ranks() -> None:
    assert RUNS.agent_exits("cache-bloat") == [("-9", "0")]
    assert RUNS.agent_exits("null-unet") == [("-11", "1")]
    assert "[rank0]: Traceback" not in RUNS.console("cache-bloat")
    assert "[rank1]: Traceback" not in RUNS.console("null-unet")
    assert "[rank1]: RuntimeError: index 1000 is out of bounds for dimension 0 with size 1000" in (
        RUNS.console("tstep-edge")
    )
    assert "[rank2]: RuntimeError: DataLoader worker (pid " in RUNS.console("shm-pinch")
    for rank in "012":
        assert f"[rank{rank}]: OSError: [Errno 22] Invalid argument" in RUNS.console(
            "torn-milestone"
        )


def test_only_the_main_process_draws_bars_and_samples() -> None:
    for mode in EXPECTED:
        for line in _lines(mode):
            assert not re.match(r"\[rank[12]\]: .*(it/s|sampling loop)", line), line
    crawl = RUNS.console("grid-crawl")
    assert re.search(r"sampling loop time step: +\d+%\|.*\| 1\d/50 \[00:1\d<", crawl)
    assert crawl.count("Timed out waiting 15000ms") >= 2
