"""Real gloo runs of a hundred-and-fifty-first training-program style
(tests/programs/hundredfiftyfirst_style_train.py): a PyTorch command job on Azure Machine
Learning (`distribution: type: pytorch, process_count_per_instance: 2`, one or two instances),
re-created in plain torch without the Azure ML SDK or mlflow: the azureml-examples' way of
training (argparse, the PyTorch environment variables read from os.environ, init_process_group
on env://, a small CNN in DDP), the data input's .npz shards listed with os.listdir and divided
among the ranks, validation all-reduced, rank 0's checkpoint to the checkpoints output every
epoch; Python logging's default format ('INFO:__main__:epoch 2 train_loss=0.971',
'INFO:__main__:epoch 2 val_loss=1.366 val_acc=0.570'), print() lines ('Rank 1: Starting epoch
2', 'Rank 1: [2,     4] loss: 1.119', "mlflow.log_metric('val_acc', 0.5703, step=2)", 'Rank 0:
Finished Training') block-buffered in a file (they arrive late, or never from a killed
process), a tqdm bar on rank 0 only. No torchrun: the platform's execution wrapper
(tests/programs/hundredfiftyfirst_execution_wrapper.py) starts each process itself with
MASTER_ADDR, MASTER_PORT, RANK, LOCAL_RANK, WORLD_SIZE and NODE_RANK set, through a bash script
of the job's command, and writes each process's stdout and stderr only to its own file: the
fixture of a mode is the job folder as the user downloads it, user_logs/std_log_process_<global
rank>.txt (std_log.txt for a job without a distribution) and system_logs/lifecycler/
execution-wrapper.log and lifecycler.log (one folder of them per node, named by the node's id,
on two nodes). The wrapper logs 'User process N (pid P) finished' and 'Process exited with code
C' for each process (bash's 137 for a SIGKILL, 139 for a SIGSEGV, 134 for a SIGABRT, 143 for the
SIGTERM it sends the node's other processes once one has failed), and ends with 'Execution
failed. User process 'python' exited with status code C. Please check log file
'user_logs/std_log_process_N.txt' for error details.' with the process's last traceback when it
has one; a signal's name ('Killed', 'Segmentation fault', 'Aborted') is only in the process's
own file, from bash. gloo on CPU, a 15 s collective timeout. Neither the program nor the
platform were used to build the rules: the diagnosis must generalise. Captured by
tests/fixtures/real/capture_hundredfiftyfirst.sh.

EXPECTED was written from each mode's mechanism and the taxonomy before any diagnosis was seen;
a mode ddpdoctor gets wrong today is a strict xfail whose reason says what it says instead.
First diagnosis: 14 of 16 right as written (quiet-sail, noisy-pair, goal-halt, bare-job,
lost-mount, shard-snip, blob-crawl, heap-swell, null-deref, solo-score, odd-shard, lock-twice,
wall-term, lr-format), 15 with port-squat, whose culprit was written [] and is now the suite's
[0] for a job whose rank 0 process hosts the store (no launcher: the platform starts the
ranks). Missed: a rank that logs its leaving and exits 0 (lone-leave) is read as killed from
outside (host-oom), because its block-buffered print() lines land after its logging line at
exit and the execution wrapper's per-process 'Process exited with code 0' is not taken as its
exit. Since (session 41): a stop in the program's own words that ends in 'exiting' or
'quitting' as well as 'stopping' ('training loss has stopped improving, exiting') is an early
stop announced by that rank, so rank 1 left on its own (lone-leave right): 16 of 16.
"""

from __future__ import annotations

import re

import pytest

from tests.program_runs import Expected, RunSet

# mode -> (status, kind, culprit ranks: GLOBAL ranks); what a run is given in brackets
# (capture_hundredfiftyfirst.sh; `job` is one node whose wrapper starts `python train.py
# --data-dir <INPUT_train_data> --checkpoint-dir <OUTPUT_checkpoints>` as processes 0 and 1,
# eight shards of 64 samples, four epochs)
EXPECTED: dict[str, Expected] = {
    # [job] four epochs of 16 steps a rank, validation and rank 0's checkpoint after each,
    # 'Rank 0: Finished Training', the model saved, every process exits 0: 'Execution
    # succeeded'
    "quiet-sail": ("ok", None, []),
    # [two nodes, --workers 3 --find-unused --val-mmap] the same healthy run on four ranks with
    # scary lines in every rank's file: numpy's "UserWarning: The given NumPy array is not
    # writable", the DataLoader's 'This DataLoader will create 3 worker processes in total. Our
    # suggested max number of worker in current system is 2', DDP's
    # '[rankN]:[W... reducer.cpp:...] Warning: find_unused_parameters=True was specified in DDP
    # constructor, but did not find any unused parameters'; every process exits 0 on both nodes
    "noisy-pair": ("ok", None, []),
    # [job --epochs 10 --target-acc 0.65] the all-reduced validation accuracy passes the target
    # after epoch 3 on both ranks alike ('val_acc 0.680 reached the target 0.650, stopping
    # training'), both leave the loop, finish and exit 0: a planned stop
    "goal-halt": ("ok", None, []),
    # [a job without `distribution:`: the wrapper runs one process into user_logs/std_log.txt
    # and sets none of the PyTorch variables] the script's `int(os.environ["WORLD_SIZE"])`:
    # "KeyError: 'WORLD_SIZE'", exit 1
    "bare-job": ("failed", "launcher-env-missing", []),
    # [two nodes; node 1's data input was never mounted: its path does not exist] ranks 2 and 3
    # (node 1) fail listing their shards: "FileNotFoundError: [Errno 2] No such file or
    # directory: '.../INPUT_train_data/train'"; ranks 0 and 1 lose them in DDP's constructor
    # ('Connection closed by peer'): the input missing on the ranks of node 1
    "lost-mount": ("failed", "data-error", [2, 3]),
    # [job; shard part-00001.npz, one of rank 1's, cut to 3000 bytes] rank 1 fails loading it:
    # 'zipfile.BadZipFile: File is not a zip file', exit 1; rank 0 is SIGTERMed by the wrapper
    "shard-snip": ("failed", "data-error", [1]),
    # [job, MT_CASE s0] from epoch 2 rank 0 writes its checkpoint to the output mount 4 KiB at
    # a time, 2.5 s a block ('Saving checkpoint to .../checkpoint_epoch2.pt', then nothing);
    # rank 1 times out after 15 s in epoch 3's gradient all-reduce ('Timed out waiting
    # 15000ms'), exits 1, and the wrapper SIGTERMs rank 0 still writing: rank 0 busy past the
    # timeout
    "blob-crawl": ("failed", "slow-rank-timeout", [0]),
    # [job, MT_CASE k1] rank 1 keeps 48 MiB for each batch from epoch 2 on and is SIGKILLed at
    # the sixth (the OOM killer's way): bash's 'line 3: PID Killed  python train.py ...' in its
    # file, 'Process exited with code 137' in the wrapper's; rank 0 loses it
    "heap-swell": ("failed", "host-oom", [1]),
    # [job, MT_CASE z1] rank 1 reads address 0 in epoch 2 (a compiled augmentation): bash's
    # 'Segmentation fault' in its file, code 139; rank 0 loses it
    "null-deref": ("failed", "native-crash", [1]),
    # [job, MT_CASE v] a fork validates on rank 0 only, but evaluate() still all-reduces: rank 0
    # issues the metric's all_reduce alone while rank 1 goes on to epoch 2's gradient
    # all-reduce; gloo aborts rank 0 ('gloo::EnforceNotMet ... Is there a distributed
    # collective mismatch in your code?', bash's 'Aborted', code 134): a collective only rank 0
    # issued
    "solo-score": ("failed", "collective-mismatch", [0]),
    # [job; the user's own shard added: nine shards, shards[rank::2] gives rank 0 five and rank
    # 1 four] rank 1 runs out of batches first every epoch and enters the epoch's train-loss
    # all_reduce while rank 0 still all-reduces gradients; gloo aborts rank 1 (code 134): the
    # rank whose batches ran out first
    "odd-shard": ("failed", "uneven-inputs", [1]),
    # [job; a stale process listens on the master port] rank 0's TCPStore cannot listen
    # ('DistNetworkError: ... EADDRINUSE'), exit 1; rank 1 SIGTERMed while it waits for the
    # store. (Written [] before the diagnosis; changed after it to the suite's convention, rank
    # 0 as the process that hosts the store and fails to bind where no launcher holds it, as
    # sets 15, 42-44, 51, 86 and 148 expect: the platform starts the ranks itself here)
    "port-squat": ("failed", "rendezvous-failure", [0]),
    # [job, MT_CASE w1] in epoch 2 rank 1's metrics buffer calls flush() from inside add(),
    # which holds the same non-reentrant lock: rank 1 waits for good, silently, outside any
    # collective; rank 0 times out after 15 s in the gradient all-reduce, exits 1, and the
    # wrapper SIGTERMs rank 1
    "lock-twice": ("hung", "hang", [1]),
    # [job, MT_CASE e1] a fork's stopping rule on the rank's own loss: after epoch 2's train-loss
    # all_reduce rank 1 logs 'training loss has stopped improving, exiting' and calls
    # sys.exit(0) (code 0); rank 0 loses it in the validation all_reduce ('Connection closed by
    # peer') and exits 1
    "lone-leave": ("failed", "uncoordinated-exit", [1]),
    # [job --epochs 300 --batch-size 2; SIGTERM to every process of the job after 20 s] a
    # healthy run stopped by the platform (a low-priority node taken back): the wrapper's
    # 'Received SIGTERM: the job is being cancelled', both processes code 143
    "wall-term": ("failed", "preempted", []),
    # [job, MT_CASE x1] after epoch 2 rank 1 prints the learning rate with a float format of
    # StepLR.get_last_lr()'s list: 'TypeError: unsupported format string passed to
    # list.__format__', exit 1; rank 0 loses it
    "lr-format": ("failed", "python-exception", [1]),
}

# mode -> what ddpdoctor says instead today (known gaps: fixing one turns its xfail into a failure)
MISSES: dict[str, str] = {}

RUNS = RunSet("hundredfiftyfirst-", EXPECTED, MISSES, label_nowhere=True)
TWO_NODES = {"noisy-pair", "lost-mount"}
WRAPPER = "system_logs/lifecycler/execution-wrapper.log"


def _proc(mode: str, rank: int) -> str:
    return RUNS.text(mode, f"user_logs/std_log_process_{rank}.txt")


def _wrappers(mode: str) -> list[str]:
    """Each node's execution-wrapper.log, node 0's first."""
    names = [n for n in RUNS.names(mode) if n.endswith("/execution-wrapper.log")]
    texts = [RUNS.text(mode, n) for n in names]
    return sorted(texts, key=lambda t: re.findall(r"node_rank: (\d+)", t))


def _exits(mode: str) -> dict[int, int]:
    """process (global rank) -> the exit code the wrappers logged for it."""
    found = re.findall(
        r"User process (\d+) \(pid \d+\) finished\n\S+ INFO execution-wrapper Process exited with "
        r"code (\d+)",
        "\n".join(_wrappers(mode)),
    )
    return {int(r): int(c) for r, c in found}


@pytest.mark.parametrize("mode", RUNS.params())
def test_hundredfiftyfirst_style_run(mode: str) -> None:
    RUNS.check_verdict(mode)


@pytest.mark.parametrize("mode", list(EXPECTED))
def test_hundredfiftyfirst_style_fixture_is_a_small_rewritten_unlabelled_job_folder(
    mode: str,
) -> None:
    RUNS.check_fixture(mode)
    names = RUNS.names(mode)
    if mode == "bare-job":
        users = ["user_logs/std_log.txt"]
    else:
        users = [f"user_logs/std_log_process_{r}.txt" for r in range(4 if mode in TWO_NODES else 2)]
    assert [n for n in names if n.startswith("user_logs/")] == users
    systems = [n for n in names if n.startswith("system_logs/")]
    if mode in TWO_NODES:
        assert len(systems) == 4, systems
        for n in systems:
            assert re.fullmatch(
                r"system_logs/lifecycler/tvmps_[0-9a-f]{64}_d/(execution-wrapper|lifecycler)\.log",
                n,
            ), n
    else:
        assert systems == [WRAPPER, "system_logs/lifecycler/lifecycler.log"]
    assert len(names) == len(users) + len(systems)
    for n in names:
        assert "MT_CASE" not in RUNS.text(mode, n), n


def test_what_the_healthy_runs_print() -> None:
    for mode in ("quiet-sail", "noisy-pair", "goal-halt"):
        ranks = 4 if mode in TWO_NODES else 2
        assert _exits(mode) == dict.fromkeys(range(ranks), 0), mode
        for wrapper in _wrappers(mode):
            assert wrapper.rstrip().endswith("INFO execution-wrapper Execution succeeded")
        for rank in range(ranks):
            text = _proc(mode, rank)
            assert "Traceback" not in text
            assert f"Rank {rank}: Finished Training" in text
        assert "INFO:__main__:Saved the model to ./outputs/model.pt" in _proc(mode, 0)
    for mode in ("quiet-sail", "noisy-pair"):
        assert _proc(mode, 1).count("Starting epoch") == 4
        assert "INFO:__main__:epoch 4 val_loss=" in _proc(mode, 1)
    for rank in range(4):
        loud = _proc("noisy-pair", rank)
        assert "UserWarning: The given NumPy array is not writable" in loud
        assert "This DataLoader will create 3 worker processes in total" in loud
        assert re.search(rf"\[rank{rank}\]:\[W.*find_unused_parameters=True was specified", loud)
    goal = _proc("goal-halt", 1)
    assert "INFO:__main__:val_acc 0.680 reached the target 0.650, stopping training" in goal
    assert "Starting epoch 4" not in goal
    # the tqdm bar is rank 0's only
    assert "Epoch 1/4: 100%|██████████| 16/16" in _proc("quiet-sail", 0)
    assert "Epoch 1/4" not in _proc("quiet-sail", 1)


def test_the_wrapper_names_exit_codes_and_bash_the_signals() -> None:
    assert _exits("heap-swell") == {1: 137, 0: 143}
    assert _exits("null-deref") == {1: 139, 0: 143}
    assert _exits("solo-score") == {0: 134, 1: 143}
    assert _exits("odd-shard") == {1: 134, 0: 143}
    assert _exits("lone-leave") == {1: 0, 0: 1}
    assert _exits("blob-crawl") == {1: 1, 0: 143}
    assert _exits("lock-twice") == {0: 1, 1: 143}
    assert _exits("wall-term") == {0: 143, 1: 143}
    assert _exits("bare-job") == {0: 1}
    assert re.search(
        r"run_user_command\.sh: line 3: +\d+ Killed +python train\.py", _proc("heap-swell", 1)
    )
    assert "Segmentation fault" in _proc("null-deref", 1)
    for mode, rank in (("solo-score", 0), ("odd-shard", 1)):
        text = _proc(mode, rank)
        assert "terminate called after throwing an instance of 'gloo::EnforceNotMet'" in text
        assert re.search(r"line 3: +\d+ Aborted", text)
    for mode in ("heap-swell", "null-deref"):
        wrapper = RUNS.text(mode, WRAPPER)
        assert "Killed" not in wrapper and "Segmentation" not in wrapper
        assert "Traceback" not in _proc(mode, 1)
        assert "for error details." in wrapper and "Error:" not in wrapper
    assert "Received SIGTERM: the job is being cancelled" in RUNS.text("wall-term", WRAPPER)
    assert "Execution was cancelled (SIGTERM)" in RUNS.text("wall-term", WRAPPER)


def test_what_the_failing_ranks_say() -> None:
    assert "KeyError: 'WORLD_SIZE'" in RUNS.text("bare-job", "user_logs/std_log.txt")
    assert "Please check log file 'user_logs/std_log.txt'" in RUNS.text("bare-job", WRAPPER)
    for rank in (2, 3):
        assert re.search(
            rf"\[rank{rank}\]: FileNotFoundError: \[Errno 2\] No such file or directory: "
            r"'/tmp/run-\d+/node1/cap/data-capability/wd/INPUT_train_data/train'",
            _proc("lost-mount", rank),
        )
    for rank in (0, 1):
        assert "FileNotFoundError" not in _proc("lost-mount", rank)
    node0, node1 = _wrappers("lost-mount")
    assert "Please check log file 'user_logs/std_log_process_2.txt'" in node1
    assert "FileNotFoundError" in node1 and "Connection closed by peer" in node0
    assert "[rank1]: zipfile.BadZipFile: File is not a zip file" in _proc("shard-snip", 1)
    assert "EADDRINUSE" in _proc("port-squat", 0)
    assert "[rank1]: TypeError: unsupported format string passed to list.__format__" in _proc(
        "lr-format", 1
    )
    assert "Error: [rank1]: Traceback (most recent call last):" in RUNS.text("lr-format", WRAPPER)


def test_the_busy_the_stuck_the_early_and_the_short_rank() -> None:
    crawl = _proc("blob-crawl", 0)
    assert crawl.rstrip().endswith("checkpoint_epoch2.pt")  # rank 0's last line, still writing
    assert "Timed out waiting 15000ms" in _proc("blob-crawl", 1)
    assert "Timed out waiting 15000ms" in _proc("lock-twice", 0)
    stuck = _proc("lock-twice", 1)
    assert stuck.rstrip().endswith("INFO:__main__:epoch 1 val_loss=1.529 val_acc=0.445")
    assert "Please check log file 'user_logs/std_log_process_0.txt'" in RUNS.text(
        "lock-twice", WRAPPER
    )
    leave = _proc("lone-leave", 1)
    assert "INFO:__main__:Rank 1: training loss has stopped improving, exiting" in leave
    assert "Traceback" not in leave
    assert "Connection closed by peer" in _proc("lone-leave", 0)
    assert "INFO:__main__:Rank 0: 320 samples from" in _proc("odd-shard", 0)
    assert "INFO:__main__:Rank 1: 256 samples from" in _proc("odd-shard", 1)
    assert "INFO:__main__:epoch 1 train_loss" not in _proc("odd-shard", 0)
    assert "INFO:__main__:epoch 1 val_loss" not in _proc("solo-score", 0)
