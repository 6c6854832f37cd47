"""Real gloo runs of a hundred-and-sixty-sixth training-program style
(tests/programs/hundredsixtysixth_style_train.py): an ESPnet2 ASR fine-tuning recipe
(`python -m espnet2.bin.asr_train`, stage 11 of egs2/TEMPLATE/asr1) re-created in plain torch
without espnet installed: a small CTC acoustic model (STFT and log-mel frontend, GlobalMVN from
the collected statistics, a transformer encoder with a conv2d input layer, a CTC head over a
character token list) whose encoder is initialised from a pretrained model (`--init_param
exp/asr_pretrained/valid.loss.ave.pth:encoder:encoder`) and fine-tuned on synthetic 16 kHz
command words read from WAV files through a DataLoader (--num_workers 1), sorted batches split
batch[rank::world], ESPnet's iterator_stop all-reduce before every step and its stats
all-reduced by recursive_average. ESPnet's console: the command line from every process, then
'[vm:0/4] 2026-12-07 19:03:29,354 (abs_task:1140) INFO: ...' from rank 0 only (every other
rank logs at ERROR with its own '[vm:R/4]'), the model structure and 'Model summary:', the
reporter's '1epoch:train:3-4batch: iter_time=..., loss_ctc=..., grad_norm=...' and '1epoch
results: [train] ..., [valid] loss_ctc=..., cer_ctc=1.000, ...', 'The best model has been
updated: valid.loss', 'The training was finished at 3 epochs ', 'Averaging 2best models:
criterion="valid.loss": ...', torch's FutureWarning for torch.cuda.amp.autocast on every rank,
no destroy_process_group. The launch is a user's across two 'nodes' (two folders on this
machine, each with its own copy of the recipe, the output folder on storage both share) by REAL
GNU parallel 20221122: `parallel --tag --line-buffer --halt now,fail=1 --joblog jobs.tsv 'cd {}
&& . ./path.sh && torchrun --nnodes 2 --nproc-per-node 2 --node-rank $(({#}-1)) --master-addr
127.0.0.1 --master-port PORT asr_train.py --config conf/train_asr_ctc_ft.yaml ...' ::: node0
node1` (a static rendezvous: node0 has ranks 0 and 1, node1 ranks 2 and 3), so every line of
the console is 'node0<TAB>...' or 'node1<TAB>...', torchrun's workers print without a prefix
(tracebacks with torch's '[rankN]:'), and the first failed job makes parallel print 'parallel:
This job failed:' with its command and kill the other job at once (its output ends there, its
line missing from the joblog). gloo on CPU, a 20 s collective timeout (the lab's patch; ESPnet
passes none). The fixture of a mode is parallel's console, console.log, and its joblog,
jobs.tsv (Seq, Host, Starttime, JobRuntime, Send, Receive, Exitval, Signal, Command). Neither
the program nor the launch were used to build the rules: the diagnosis must generalise.
Captured by tests/fixtures/real/capture_hundredsixtysixth.sh.

EXPECTED was written from each mode's mechanism and the taxonomy before any diagnosis was seen;
a mode ddpdoctor gets wrong today is a strict xfail whose reason says what it says instead.
"""

from __future__ import annotations

import pytest

from tests.program_runs import Expected, RunSet

# mode -> (status, kind, culprit ranks: GLOBAL ranks); what a run is given in brackets
# (capture_hundredsixtysixth.sh; every run: GNU parallel, one torchrun agent per node)
EXPECTED: dict[str, Expected] = {
    # three epochs of 8 sorted batches of 8 utterances (2 a rank), validation all-reduced, rank
    # 0 saves checkpoint.pth and Nepoch.pth, 'The training was finished at 3 epochs ' and
    # 'Averaging 2best models', every process exits 0, both joblog lines Exitval 0
    "calm-reel": ("ok", None, []),
    # [path.sh without OMP_NUM_THREADS; the training list dump/raw/train_all with the newest
    # session, one clip cut to 0.1 s for 'RIGHT LEFT'; --ctc_conf zero_infinity=false] the same
    # healthy run with scary lines: torchrun's OMP_NUM_THREADS banner on both nodes, the
    # too-short clip's infinite CTC loss in its batch ('loss_ctc=inf, loss=inf' in the
    # reporter's lines and epoch results) and rank 0's 'The grad norm is nan. Skipping updating
    # the model.' once an epoch (every rank skips that step alike); the training finishes, exit 0
    "hiss-reel": ("ok", None, []),
    # [--max_epoch 10 --patience 1 --early_stopping_criterion valid cer_ctc min] ESPnet's early
    # stopping on the all-reduced validation CER, which stays 1.000 (the fresh CTC head emits
    # only blanks in the first epochs): every rank stops after epoch 3 alike, rank 0 logs
    # '[Early stopping] valid.cer_ctc has not been improved 2 epochs continuously. The training
    # was stopped at 3epoch', every process exits 0: a planned stop
    "blank-plateau": ("ok", None, []),
    # [MT_CASE a3] from epoch 2 rank 3 (node1's local rank 1) applies a fork's time masking of a
    # fixed 60 frames to utterances shorter than that: 'RuntimeError: random_ expects 'from' to
    # be less than 'to'' from torch.randint; the others lose it in the next all-reduce; node1's
    # job fails and parallel kills node0's
    "mask-slip": ("failed", "python-exception", [3]),
    # [node1's copy of one WAV file rank 2 reads, zeroed by a failed transfer] rank 2 (node1's
    # local rank 0) fails reading it in epoch 1, in its DataLoader worker: 'wave.Error: Caught
    # Error in DataLoader worker process 0.' ... 'file does not start with RIFF id'; a corrupt
    # input file read on rank 2
    "wav-rot": ("failed", "data-error", [2]),
    # [MT_CASE k1] from epoch 2 rank 1 (node0's local rank 1) keeps 64 MiB a batch and is
    # SIGKILLed at the fifth (the OOM killer's way): node0's agent 'exitcode: -9', no traceback;
    # the others lose it
    "cache-swell": ("failed", "host-oom", [1]),
    # [MT_CASE z2] rank 2 (node1's local rank 0) reads address 0 at epoch 2's third step:
    # SIGSEGV, node1's agent 'exitcode: -11', no traceback; the others lose it
    "ctc-poke": ("failed", "native-crash", [2]),
    # [MT_CASE s0, --nbest_averaging_interval 1] after epoch 1 rank 0 averages the best
    # checkpoints ('Averaging 1best models: criterion="valid.loss": ...') from the shared disk,
    # which stalls: 45 s per checkpoint read; ranks 1, 2 and 3 wait in epoch 2's first
    # all-reduce and time out after 20 s ('Timed out waiting 20000ms'); rank 0 busy past the
    # timeout
    "nfs-crawl": ("failed", "slow-rank-timeout", [0]),
    # [MT_CASE h3] at epoch 2's start rank 3's (node1's local rank 1) fork of a feature cache
    # flushes it in a thread holding the cache's lock while the DataLoader forks its worker:
    # the worker waits on the copied lock for ever, rank 3 waits on the worker, silent, outside
    # any collective; ranks 0, 1 and 2 time out after 20 s in epoch 2's first all-reduce
    "flush-wedge": ("hung", "hang", [3]),
    # [MT_CASE m1] from epoch 2 rank 1's (node0's local rank 1) model adds a stat the others do
    # not ('loss_interctc'), so recursive_average all-reduces one tensor more on rank 1 than on
    # the others: rank 1's collectives fall out of step with the others' (its scalar against
    # their weight sum and gradient buckets), gloo's size check aborts a rank or the
    # collectives time out; a collective only rank 1 issued
    "stat-skew": ("failed", "collective-mismatch", [1]),
    # [MT_CASE u0, --max_epoch 10 --patience 1 --early_stopping_criterion valid cer_ctc min]
    # a fork checks early stopping only where rank 0 reports the epoch: rank 0 alone logs
    # '[Early stopping] ... The training was stopped at 3epoch', averages and exits 0; ranks 1,
    # 2 and 3 go on into epoch 4's first all-reduce and lose it: one rank left the run
    "solo-patience": ("failed", "uncoordinated-exit", [0]),
    # [--max_epoch 40; SIGTERM to every process of the job after '3epoch results'] a healthy
    # run stopped by the scheduler's time limit: parallel, both torchrun agents ('Received 15
    # death signal') and the workers get SIGTERM
    "wall-term": ("failed", "preempted", []),
    # [a process of an earlier job listens on node0's master port] node0's torchrun cannot
    # host the rendezvous's TCPStore (EADDRINUSE), no worker starts; parallel kills node1's
    # agent, which waits on the squatter
    "port-camp": ("failed", "rendezvous-failure", []),
    # [the shared output folder a volume with 640 KiB free (a tmpfs)] rank 0 writes checkpoint.pth and 1epoch.pth, then epoch 2's 2epoch.pth
    # fills the volume: torch.save's zip writer fails ('[enforce fail at inline_container.cc]
    # ... unexpected pos', no errno text) on rank 0; the others lose it in epoch 3
    "quota-pinch": ("failed", "disk-full", [0]),
    # [node1's tools/ set up without espnet's dependencies] ranks 2 and 3 (node1) fail at import:
    # 'ModuleNotFoundError: No module named 'humanfriendly''; node1's job fails and parallel
    # kills node0's, whose workers wait for them
    "site-gap": ("failed", "missing-module", [2, 3]),
    # [--init_param exp/asr_pretrained/checkpoint.pth:encoder:encoder, the pretraining's last
    # checkpoint with its reporter state] every rank's torch.load (weights_only by default in
    # torch 2.6+) rejects it: 'Weights only load failed ... Unsupported global: GLOBAL
    # datetime.timedelta'
    "ckpt-globals": ("failed", "weights-only-load", [0, 1, 2, 3]),
}

# mode -> what ddpdoctor says instead today (known gaps: fixing one turns its xfail into a failure)
MISSES: dict[str, str] = {}

RUNS = RunSet("hundredsixtysixth-", EXPECTED, MISSES, label_nowhere=True)


@pytest.mark.parametrize("mode", RUNS.params())
def test_hundredsixtysixth_style_run(mode: str) -> None:
    RUNS.check_verdict(mode)


@pytest.mark.parametrize("mode", list(EXPECTED))
def test_hundredsixtysixth_style_fixture_is_small_rewritten_and_unlabelled(mode: str) -> None:
    RUNS.check_fixture(mode)
    assert RUNS.names(mode) == ["console.log", "jobs.tsv"]
    for name in RUNS.names(mode):
        assert "MT_CASE" not in RUNS.text(mode, name)
