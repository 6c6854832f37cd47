"""Real gloo runs of a hundred-and-seventh training-program style
(tests/programs/hundredseventh_style_train.py, linked into each run's folder as grpo.py): GRPO
reinforcement-learning fine-tuning of a small language model in the way of Hugging Face TRL's
GRPOTrainer with a separate vLLM generation server, as open-r1's grpo.py and TRL's docs run it,
re-created in plain torch (trl, transformers, accelerate and vllm are not used). Two terminals:
in the first `CUDA_VISIBLE_DEVICES=0 trl vllm-serve --model models/TinyMath-S --port S`
(tests/programs/hundredseventh_vllm_serve.py: TRL's vllm_serve.py with its engine worker process
'EngineCore_DP0', vLLM's log lines 'INFO 12-06 05:31:22 [api_server.py:1024] Starting vLLM API
server on http://0.0.0.0:S', uvicorn's 'Uvicorn running on' and access lines 'INFO:
127.0.0.1:N - "POST /generate/ HTTP/1.1" 200 OK', the 'Processed prompts' bar, the weight-sync
endpoints /init_communicator/, /update_named_param/, /close_communicator/, and vLLM V1's shutdown
when its engine process dies: 'Engine core proc EngineCore_DP0 died unexpectedly, shutting down
client.'); in the second, once the server says 'Uvicorn running on', `accelerate launch
--num_processes 2 --config_file multi_gpu.yaml --main_process_port P grpo.py --config
recipes/grpo.yaml --use_vllm --vllm_mode server` (tests/programs/hundredseventh_accelerate.py:
accelerate's launch command handing the script to torch elastic, no rank prefixes on the
console). The trainer: open-r1's logging ('2026-12-06 09:27:49 - INFO - __main__ - ...', INFO on
the main process, WARNING on the others; transformers' '[INFO|trainer.py:2414] ... >> *****
Running training *****'), accelerate's state print ('Distributed environment: MULTI_GPU  Backend:
gloo'), one prompt shard per process (data/prompts/train-0000K-of-0000N.jsonl, prompts over
max_prompt_length filtered out with a warning), TRL's VLLMClient on the main process only
('Server is up!' / 'Server is not up yet. Retrying in 2.0 seconds...', then the weight-update
group: a gloo group of its own on the group port G, the server's worker its rank 0), every step
the weights pushed to the server, gather_object of the prompts, the main process's /generate/,
broadcast_object_list of the completions, rewards per process (accuracy through a verification
worker process per rank, format, an optional closeness reward) gathered for group-relative
advantages, a KL term to a frozen reference, DDP's gradient all-reduce, TRL's log dicts ("{'loss':
0.0, 'grad_norm': 0.31, 'learning_rate': 0.0004, 'num_tokens': 192.0, 'completions/mean_length':
9.0, ..., 'rewards/accuracy_reward/mean': 0.0625, 'reward': 1.0625, 'reward_std': 0.125, 'kl':
0.0, 'clip_ratio/region_mean': 0.0, 'epoch': 0.17}") and the tqdm bar from the main process, the
'train_runtime' dict, 'Saving model checkpoint to data/TinyMath-S-GRPO'. The recipe: 12 prompts a
shard, 4 generations of each prompt, one prompt a process a step (12 steps), 15 s collective
timeout (ddp_timeout), vllm_server_timeout 8 s. Ports 39312-39327: P one a mode, S = P + 5, G =
P + 10 (wrapped into the range). The fixture of a mode is what a user hands over: the trainer's
terminal, console.log, and the server's, vllm-serve.log (stopped with Ctrl-C after the trainer
ended and the server had answered its last request). Captured with
tests/fixtures/real/capture_hundredseventh.sh; a fault in the code is chosen by $TQ_CASE (never
printed), the others are in what a run is given (flags, a torn or filtered prompt shard, the
server's model or port, a stale process on the group port, a SIGTERM to the launcher,
OMP_NUM_THREADS unset). Neither the program nor the launch were used to build the rules: the
diagnosis must generalise.

Seen while capturing: the SFT'd tiny model writes a malformed answer now and then once GRPO has
moved it (at temperature 0.9 after about 40 steps), so the accuracy reward had to parse answers
robustly for the long runs to live; the fault is the added closeness reward that does not. A gloo
weight-update group whose listening socket is closed under its TCPStore daemon kills the process
('Unexpected poll revent on the master's listening socket'): vLLM's StatelessProcessGroup keeps
the socket, and so does the re-creation. The trainer SIGTERMed in the middle of a weight push can
kill the server's engine with 'Connection reset by peer' in its broadcast (one capture of the
time-limit mode did, the committed one did not). With gloo, rank 0's next weight broadcast to a
server whose engine died fails at once ('Connection reset by peer'), where NCCL would hang.

EXPECTED was written from each mode's mechanism and the taxonomy before any diagnosis was seen;
a mode ddpdoctor gets wrong today is a strict xfail whose reason says what it says instead.
First diagnosis: 13 of 16 right (calm-groups, loud-groups, target-hit, tag-spill, torn-shard,
logit-hoard, detok-fault, postfix-solo, ramble-base, verify-stall, quota-term, port-astray,
gen-split). Rank 1's filter warning about its own shard is not read as the reason it ran out of
steps first, so gloo's size abort at the end of its loop reads as a side-collective mismatch of
the main process (shard-short); a root read from the server's terminal (its engine's OSError on
the held group port, its AssertionError on a weight of another shape) has no rank and is given
to rank 0 instead of staying outside the job's ranks (group-squat, wide-serve: kinds right)."""

from __future__ import annotations

import re

import pytest

from tests.program_runs import Expected, RunSet

# mode -> (status, kind, culprit ranks: GLOBAL ranks); the trainer's flags or the server's
# options in brackets (capture_hundredseventh.sh; 2 ranks unless a mode says otherwise)
EXPECTED: dict[str, Expected] = {
    # 12 steps: 168 weight pushes and 12 /generate/ requests on the server, six log dicts
    # ('reward' 1.06 -> 1.69), 'Training completed.', the train_runtime dict, 'Model saved to
    # data/TinyMath-S-GRPO', the close_communicator request at exit; the launcher exits 0, the
    # server is stopped with Ctrl-C ('Shutting down', 'Finished server process')
    "calm-groups": ("ok", None, []),
    # [3 ranks, no --config_file, OMP_NUM_THREADS unset, --log_completions; server --dtype
    # bfloat16] the same healthy run with scary text: accelerate's "The following values were
    # not passed to `accelerate launch` and had defaults used instead" (with "More than one GPU
    # was found, enabling multi-GPU training"), torch elastic's OMP_NUM_THREADS banner, the
    # server's "WARNING ... Casting torch.float32 to torch.bfloat16.", TRL's rich completions
    # table every second step; 12 steps, every rank exits 0
    "loud-groups": ("ok", None, []),
    # [--reward_target 1.4] the callback reads the logged reward, gathered from every process
    # and so the same on each: at step 8 'Reward 1.4375 reached reward_target 1.4 at step 8:
    # stopping training' (main process's INFO; the other rank stops silently at the same step),
    # 'Training completed.', the model saved, every rank exits 0: an agreed, intended stop
    "target-hit": ("ok", None, []),
    # [--reward_funcs accuracy format closeness --num_train_epochs 5] the added closeness reward
    # parses the answer with int() unguarded; at step 31 one of rank 1's four completions is
    # malformed ('<think> 7 + 8 7 ? <think> 7', no answer tags): rank 1 raises "ValueError:
    # invalid literal for int() with base 10" in closeness_reward; rank 0 loses it in the
    # rewards' all_gather ("Connection closed by peer") and is SIGTERMed: a bug of the user's
    # reward function on rank 1
    "tag-spill": ("failed", "python-exception", [1]),
    # rank 1's prompt shard was cut off in its fifth line: rank 1's json.loads raises
    # "json.decoder.JSONDecodeError: Unterminated string" while loading train-00001-of-00002
    # before training; rank 0 is SIGTERMed by the launcher (before it asked the server for
    # anything): a rank failing on its input data
    "torn-shard": ("failed", "data-error", [1]),
    # rank 1 keeps 16 MiB a completion (the full logits, for a completions table) and SIGKILLs
    # itself at the 16th, in step 4, as the OOM killer would: no traceback of its own, the
    # launcher's "failed (exitcode: -9) local_rank: 1"; rank 0 "Connection closed by peer" in
    # backward's gradient all-reduce
    "logit-hoard": ("failed", "host-oom", [1]),
    # rank 1's fast detokenizer reads address 0 at step 4 (batch_decode): SIGSEGV, no
    # traceback, the launcher's "exitcode: -11" for local rank 1; rank 0 "Connection reset by
    # peer" in the rewards' all_gather
    "detok-fault": ("failed", "native-crash", [1]),
    # the main process alone averages the length statistics it shows in the bar (`if
    # is_main_process: reduce(...)`, four floats) at the step-2 log: its all_reduce meets rank
    # 1's next collective, the all_gather of the next step's gather_object; both time out after
    # 15 s ("Timed out waiting 15000ms"), rank 0 in all_reduce under _log_step/reduce, rank 1
    # in all_gather_object: a collective in a rank-dependent branch of rank 0
    "postfix-solo": ("failed", "collective-mismatch", [0]),
    # rank 1's shard was rebuilt with three three-term questions, longer than max_prompt_length:
    # rank 1 logs 'Filtered 3 of 12 prompts in data/prompts/train-00001-of-00002.jsonl longer
    # than max_prompt_length=8 tokens' and has 9 steps against rank 0's 12; after its 9th step
    # rank 1 leaves the loop for the end-of-training all_gather (store_flos) while rank 0 enters
    # step 10's gather_object: gloo aborts rank 1 ("op.preamble.length <= op.nbytes. 4 vs 2",
    # SIGABRT, exitcode -6), rank 0 "Connection reset by peer": rank 1 ran out of batches first
    "shard-short": ("failed", "uneven-inputs", [1]),
    # [recipe: model_name_or_path models/TinyMath-S-base, max_completion_length 2048; server
    # --model models/TinyMath-S-base] GRPO from the base model, which never ends a completion:
    # the main process's first /generate/ asks for 2 x 4 completions of 2048 tokens and waits on
    # the server (its 'Processed prompts: 50% ... 1/2 [00:56<00:56, 56.85s/it]', the request
    # answered after about two minutes) while rank 1 waits in broadcast_object_list and times
    # out after 15 s ("Timed out waiting 15000ms for recv"); the launcher SIGTERMs rank 0, still
    # waiting on the server: rank 0 busy with an external service past the collective timeout
    "ramble-base": ("failed", "slow-rank-timeout", [0]),
    # rank 1's verification worker process is SIGKILLed (as the OOM killer would) while it checks
    # the first answer of step 4: multiprocessing.Pool replaces the worker but the task is lost,
    # and rank 1 waits in pool.map forever, silently; rank 0 times out after 15 s in the rewards'
    # all_gather ("Timed out waiting 15000ms for send") and exits 1, the launcher SIGTERMs the
    # stuck rank 1
    "verify-stall": ("hung", "hang", [1]),
    # a stale process listens on the weight-update group's port G: the server's engine fails to
    # bind it ("OSError: [Errno 98] Address already in use" in StatelessProcessGroup.create,
    # 'Engine core proc EngineCore_DP0 died unexpectedly, shutting down client.'), the trainer's
    # main process connects its store client to the stale listener and waits in
    # init_communicator, rank 1 times out after 15 s in wait_for_everyone's barrier, the
    # launcher SIGTERMs rank 0: the weight-update group's rendezvous cannot form (a port held by
    # a stale process); no training rank is the cause
    "group-squat": ("failed", "rendezvous-failure", []),
    # [recipe: num_train_epochs 500; SIGTERM to the launcher 4 s after 'Running training'] a
    # time limit: torch elastic's "Received 15 death signal, shutting down workers", both ranks
    # SIGTERMed, "SignalException: Process N got signal: 15" (the server, not signalled, is
    # stopped with Ctrl-C afterwards)
    "quota-term": ("failed", "preempted", []),
    # [server --port S + 3] the server was started on another port than the recipe's
    # vllm_server_port: the main process logs 'Server is not up yet. Retrying in 2.0 seconds...'
    # four times and raises "ConnectionError: The vLLM server can't be reached at 0.0.0.0:S
    # after 8 seconds" (from URLError Connection refused); rank 1, in wait_for_everyone's
    # barrier, gets "Connection closed by peer"; the server, up on its own port, got no request.
    # The taxonomy has no kind for an unreachable generation server: an uncaught exception of
    # the training script on rank 0 (a configuration error by category)
    "port-astray": ("failed", "python-exception", [0]),
    # [server --model models/TinyMath-M] the server serves a wider model than the one trained:
    # at step 1's weight push the engine's default_weight_loader raises "AssertionError:
    # Attempted to load weight (torch.Size([39, 32])) into parameter (torch.Size([39, 48]))",
    # the engine process dies and the server shuts down; rank 0's next weight broadcast gets
    # "Connection reset by peer", rank 1 "Connection closed by peer" in gather_object. The root
    # is the server's uncaught exception (a mismatch of the server's model and the trained one,
    # not of the job's ranks): python-exception, and no training rank is the culprit
    "wide-serve": ("failed", "python-exception", []),
    # [--per_device_train_batch_size 3] every rank raises "ValueError: The global train batch
    # size (2 x 3) must be evenly divisible by the number of generations per prompt (4)" in
    # GRPOTrainer.__init__, before any request to the server: an uncaught exception on every
    # rank (a configuration error by category)
    "gen-split": ("failed", "python-exception", [0, 1]),
}

# mode -> what ddpdoctor says instead today (known gaps: fixing one turns its xfail into a failure)
MISSES: dict[str, str] = {
    "shard-short": "failed, collective-mismatch on rank 0 (COL101, 0.75): gloo's '4 vs 2' abort "
    "of rank 1 is read as two small side collectives of which the main process is named for "
    "being the main process; rank 1's 'Filtered 3 of 12 prompts in "
    "data/prompts/train-00001-of-00002.jsonl longer than max_prompt_length' (its shard, so "
    "fewer steps) is not read, nor that rank 0 was in step 10's gather_object after the bar's "
    "8/12 while rank 1 (9 prompts) had left its loop for the end-of-training all_gather",
    "group-squat": "failed, rendezvous-failure on rank 0 (LCH108, 0.9): right kind, from the "
    "server's 'OSError: [Errno 98] Address already in use' in vllm-serve.log; that line has no "
    "rank (the server's engine process, no rank of the job) and the culprit goes to rank 0, "
    "the rank that was not the victim (rank 1 timed out in the barrier, rank 0 was SIGTERMed "
    "while waiting in init_communicator): the stale process on the group port is no rank",
    "wide-serve": "failed, python-exception on rank 0 (PY101, 0.6): right kind, from the "
    "server's 'AssertionError: Attempted to load weight (torch.Size([39, 32])) into parameter "
    "(torch.Size([39, 48]))' in vllm-serve.log; the rankless root of the server's terminal is "
    "given to rank 0 (whose weight broadcast got 'Connection reset by peer', and whom the "
    "launcher's root cause names), not kept outside the job's ranks",
}


RUNS = RunSet("hundredseventh-", EXPECTED, MISSES, label_nowhere=True)

NO_REQUEST = {"torn-shard", "port-astray", "gen-split"}  # the server got no request


def _console(mode: str) -> str:
    return RUNS.console(mode)


def _server(mode: str) -> str:
    return (RUNS.folder(mode) / "vllm-serve.log").read_text(errors="replace")


@pytest.mark.parametrize("mode", RUNS.params())
def test_hundredseventh_style_run(mode: str) -> None:
    RUNS.check_verdict(mode)


@pytest.mark.parametrize("mode", list(EXPECTED))
def test_hundredseventh_style_fixture_is_small_rewritten_and_unlabelled(mode: str) -> None:
    RUNS.check_fixture(mode)
    assert [f.name for f in RUNS.files(mode)] == ["console.log", "vllm-serve.log"]
    for f in RUNS.files(mode):
        text = f.read_text(errors="replace")
        assert "TQ_CASE" not in text and "hundredseventh" not in text, f


PLATFORM = re.compile(
    r"INFO \d\d-\d\d [\d:]+ \[__init__\.py:239\] Automatically detected platform cpu\.\n"
)
START = re.compile(
    r"^INFO \d\d-\d\d [\d:]+ \[api_server\.py:1024\] Starting vLLM API server on "
    r"http://0\.0\.0\.0:(\d+)$",
    re.M,
)


@pytest.mark.parametrize("mode", list(EXPECTED))
def test_the_server_terminal_starts_and_ends_as_vllm_serve_does(mode: str) -> None:
    server = _server(mode)
    assert PLATFORM.match(server), server[:300]
    start = START.search(server)
    assert start, server[:600]
    port = start.group(1)
    assert f"INFO:     Uvicorn running on http://0.0.0.0:{port} (Press CTRL+C to quit)" in server
    assert server.rstrip().endswith("Finished server process [" + server.rsplit("[", 1)[1].strip())
    asked = re.search(r"vllm_server_port=(\d+)", _console(mode))
    assert asked, mode
    assert (asked.group(1) == port) == (mode != "port-astray")
    requests = re.findall(r'"(?:GET|POST) (/\w+/) HTTP/1\.1" (\d+)', server)
    assert bool(requests) == (mode not in NO_REQUEST), requests[:3]
    assert all(code == "200" for _, code in requests)


@pytest.mark.parametrize("mode", sorted(set(EXPECTED) - {"loud-groups"}))
def test_the_trainer_terminal_has_no_rank_prefix_outside_tracebacks(mode: str) -> None:
    """accelerate launch (torch elastic without --tee) writes the workers' lines as they are:
    '[rankN]:' only comes with torch's uncaught-exception hook."""
    console = _console(mode)
    assert console.startswith("2026-") and " - WARNING - __main__ - Process rank: " in console
    for line in console.splitlines():
        if "[rank" in line:
            assert re.search(r"\[rank[01]\]: ", line), line
    info = re.findall(r"^\S+ \S+ - INFO - (\S+) - ", console, re.M)
    assert set(info) <= {"__main__", "trl.extras.vllm_client"}


def test_what_the_healthy_and_stopped_runs_print() -> None:
    for mode in ("calm-groups", "loud-groups", "target-hit"):
        console = _console(mode)
        assert "Traceback" not in console and "Traceback" not in _server(mode)
        assert "Training completed. Do not forget to share your model" in console
        assert console.rstrip().endswith("Model saved to data/TinyMath-S-GRPO")
        assert '"POST /close_communicator/ HTTP/1.1" 200 OK' in _server(mode)
    assert _console("calm-groups").count("{'loss': ") == 6
    loud = _console("loud-groups")
    assert loud.startswith("The following values were not passed to `accelerate launch`")
    assert "Setting OMP_NUM_THREADS environment variable for each process" in loud
    assert loud.count("Process rank: ") == 3 and loud.count("┃ Prompt") == 6
    assert "Casting torch.float32 to torch.bfloat16." in _server("loud-groups")
    hit = _console("target-hit")
    assert "Reward 1.4375 reached reward_target 1.4 at step 8: stopping training" in hit
    assert "'epoch': 0.67}" in hit


def test_the_faults_happened_as_intended() -> None:
    spill = _console("tag-spill")
    assert "[rank1]: ValueError: invalid literal for int() with base 10: '<think> 7 + 8" in spill
    assert "in closeness_reward" in spill and "[rank0]: ValueError" not in spill
    torn = _console("torn-shard")
    assert "[rank1]: json.decoder.JSONDecodeError: Unterminated string" in torn
    assert "Running training" not in torn
    assert "failed (exitcode: -9) local_rank: 1" in _console("logit-hoard")
    assert "failed (exitcode: -11) local_rank: 1" in _console("detok-fault")
    for mode in ("logit-hoard", "detok-fault"):
        assert "[rank1]:" not in _console(mode)
    solo = _console("postfix-solo")
    assert "in _log_step" in solo and "in all_reduce" in solo and "in all_gather_object" in solo
    assert solo.count("Timed out waiting 15000ms") == 2
    short = _console("shard-short")
    assert "Filtered 3 of 12 prompts in data/prompts/train-00001-of-00002.jsonl" in short
    assert "4 vs 2. Received data size doesn't match expected size" in short
    assert "failed (exitcode: -6) local_rank: 1" in short
    ramble = _console("ramble-base")
    assert "in broadcast_object_list" in ramble and "Timed out waiting 15000ms" in ramble
    assert "[rank0]:" not in ramble
    assert "1/2 [00:56<00:56, 56.85s/it" in _server("ramble-base")
    stall = _console("verify-stall")
    assert "[rank1]:" not in stall and "Timed out waiting 15000ms for send" in stall
    squat = _server("group-squat")
    assert "OSError: [Errno 98] Address already in use" in squat
    assert "Engine core proc EngineCore_DP0 died unexpectedly" in squat
    assert "in wait_for_everyone" in _console("group-squat")
    term = _console("quota-term")
    assert "Received 15 death signal, shutting down workers" in term
    assert "SignalException: Process" in term and "Traceback" not in _server("quota-term")
    astray = _console("port-astray")
    assert astray.count("Server is not up yet. Retrying in 2.0 seconds...") == 4
    assert "ConnectionError: The vLLM server can't be reached at 0.0.0.0:" in astray
    wide = _server("wide-serve")
    assert "AssertionError: Attempted to load weight (torch.Size([39, 32]))" in wide
    assert "into parameter (torch.Size([39, 48]))" in wide
    split = _console("gen-split")
    assert split.count("must be evenly divisible by the number of generations per prompt") == 2
