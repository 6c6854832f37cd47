"""Real gloo runs of a hundred-and-sixty-fourth training-program style
(tests/programs/hundredsixtyfourth_style_train.py): a DNA-sequence CNN (a small DeeperDeepSEA
that predicts eight chromatin features from 200 bp, both strands averaged) trained the way
Selene (selene_sdk 0.6) trains a DeepSEA model, in a lab's fork that runs it under torchrun,
re-created in plain torch without selene installed, as the `train` rule of a REAL Snakemake
workflow (snakemake 8.30.0, tests/programs/hundredsixtyfourth_workflow): `snakemake --cores 4
-p` runs a prepare rule (the genome's windows labelled with the peak calls) and then `torchrun
--nnodes 1 --nproc_per_node 4 --master_addr 127.0.0.1 --master_port P --tee 3
scripts/selene_ddp.py config/train_deepsea.yml --lr 0.08 > logs/train.log 2>&1`. Selene's
console lines on every worker, none naming its rank ('Running with selene_sdk version 0.6.0',
'Setting random seed = 1447', '2026-12-07 18:38:50,648 - [STEP 16] average number of steps per
second: 22.0', 'training loss: ...', 'validation roc_auc: ...', 'validation loss: ...', then rank
0's 'test roc_auc: ...'), each rank training on its own chromosomes read lazily from gzipped
per-chromosome FASTA files, the validation predictions gathered from all ranks, early stopping
by `stopping_criteria` (its 'Patience ran out. Stopping early.' a DEBUG line the console never
shows). Snakemake's console shows its job banners ('[Mon Dec  7 18:38:40 2026]', 'localrule
train:', 'log: logs/train.log', 'resources: ... mem_mb=4000'), the shell command, and on a
failure 'Error in rule train:', '(check log file(s) for error details)', 'Shutting down, this
might take some time.', 'Exiting because a job execution failed. Look above for error message';
the workers' output is only in the rule's log file. The fixture of a mode is what the user has
after it: console.log (snakemake's stdout and stderr), logs/prepare.log and logs/train.log.
gloo on CPU, a 15 s collective timeout (the config's dist_timeout_s). Neither the program nor
the launch were used to build the rules: the diagnosis must generalise. Captured by
tests/fixtures/real/capture_hundredsixtyfourth.sh.

EXPECTED was written from each mode's mechanism and the taxonomy before any diagnosis was seen;
a mode ddpdoctor gets wrong today is a strict xfail whose reason says what it says instead.
"""

from __future__ import annotations

import pytest

from tests.program_runs import Expected, RunSet

# mode -> (status, kind, culprit ranks: GLOBAL ranks = local ranks, one node); what a run is
# given in brackets (capture_hundredsixtyfourth.sh; every run: `snakemake --cores 4 -p` in a
# fresh copy of the workflow)
EXPECTED: dict[str, Expected] = {
    # 96 steps of 16 windows a rank, a report every 16 steps (validation gathered from all
    # ranks), rank 0's test op, every worker exits 0; snakemake: '3 of 3 steps (100%) done'
    "calm-fold": ("ok", None, []),
    # [OMP_NUM_THREADS unset; selene's config without random_seed, stopping_criteria [auroc, 5],
    # the fork's old collate] the same healthy run with scary lines: torchrun's OMP_NUM_THREADS
    # banner, 'Warning: no random seed specified in config file. ...' and 'Did not recognize
    # stopping metric. Not performing early stopping.' from every worker, torch's UserWarning
    # 'Creating a tensor from a list of numpy.ndarrays is extremely slow' from every worker
    "noisy-fold": ("ok", None, []),
    # [lr 0.3 in the workflow config; stopping_criteria [roc_auc, 2], max_steps 400] selene's
    # early stopping: the all-ranks validation AUC has not beaten its best for two reports, so
    # every rank takes the same decision at the same step (the console shows no line of it),
    # rank 0 runs the test op, all exit 0 long before step 400: a planned stop, the workflow
    # completes
    "flat-auc": ("ok", None, []),
    # [MT_CASE t1] from step 20 the fork's shift augmentation on rank 1 slices the chromosome
    # with a float: 'TypeError: slice indices must be integers or None or have an __index__
    # method' in the sampler (through the DataLoader's fetch); the others lose it in the
    # gradient all-reduce; torchrun's summary names rank 1, snakemake 'Error in rule train:'
    "slip-shift": ("failed", "python-exception", [1]),
    # [resources/genome/chr7.fa.gz cut to 4000 bytes: a download that broke off] rank 2 trains
    # on chr3 and chr7 and reads chr7 when its first window is sampled (step 16): gzip's
    # 'EOFError: Compressed file ended before the end-of-stream marker was reached'; the others
    # lose it: a corrupt input file read on rank 2
    "cut-chrom": ("failed", "data-error", [2]),
    # [MT_CASE k3, snakemake --retries 1 (mem_mb 4000 * attempt)] rank 3 keeps 64 MiB a step
    # from step 18 and is SIGKILLed at the sixth (the OOM killer's way), on both attempts:
    # 'exitcode: -9' for local rank 3, no traceback; snakemake 'Trying to restart job 1.', the
    # second attempt's log replaces the first's
    "mem-creep": ("failed", "host-oom", [3]),
    # [MT_CASE z1] rank 1's compiled one-hot encoder reads address 0 at step 27: SIGSEGV (exit
    # -11), no Python traceback; the others lose it
    "null-encode": ("failed", "native-crash", [1]),
    # [MT_CASE s2] rank 2 reads chr7 over a slow mount: 25 s before its step 16 batch; ranks 0,
    # 1 and 3 time out in the gradient all-reduce after 15 s, torchrun stops rank 2 still
    # reading: one rank busy past the collective timeout
    "slow-mount": ("failed", "slow-rank-timeout", [2]),
    # [selene's sampler.num_workers 2; SIGTERM to snakemake 40 s after the last worker's
    # validation set] the fork's warm-up thread holds the genome's lock while the DataLoader
    # forks its workers: every worker process inherits the lock held and blocks on it for good,
    # every rank waits for its first batch, before any collective (no timeout can fire): no
    # line after 'validation examples (8 validation batches)' until the session's time limit
    # ends it; all ranks stuck alike, silently
    "fork-lock": ("hung", "hang", []),
    # [MT_CASE c0] after the first validation rank 0 alone all-reduces the per-feature positive
    # counts (8 floats): it meets the others' gradient all-reduce, gloo aborts ('op.preamble.
    # length <= op.nbytes', SIGABRT): a collective only rank 0 issued
    "solo-count": ("failed", "collective-mismatch", [0]),
    # [MT_CASE u3; stopping_criteria [roc_auc, 3]] the fork decides early stopping on rank 3 from
    # rank 3's own validation share, whose AUC is undefined (nan) at every report: its best
    # stays the first, so after the fourth report (step 64) rank 3 alone leaves the loop and
    # exits 0 while ranks 0-2 (whose all-ranks AUC keeps improving) go on into the next
    # all-reduce and lose it: one rank left the run
    "lone-patience": ("failed", "uncoordinated-exit", [3]),
    # [max_steps 2000; SIGTERM to snakemake once '[STEP 48]' is logged] a healthy run stopped by
    # the session's time limit: snakemake 'Will exit after finishing currently running jobs',
    # its job's shell and torchrun SIGTERMed ('Received 15 death signal, shutting down workers')
    "wall-term": ("failed", "preempted", []),
    # [a crashed job's process still listens on the master port] torchrun's TCPStore cannot
    # listen ('EADDRINUSE'); no worker starts: the rendezvous cannot form
    "port-squat": ("failed", "rendezvous-failure", []),
    # [the workflow config's train_script scripts/train_selene.py, the script's name before its
    # rename to selene_ddp.py] every worker: "python: can't open file ... [Errno 2] No such file
    # or directory" (exit 2): the launcher was given a script that does not exist
    "stale-entry": ("failed", "entrypoint-not-found", []),
    # [selene's sampler.targets bigwig: coverage tracks] every worker: "ModuleNotFoundError: No
    # module named 'pyBigWig'" (not installed in the venv)
    "track-import": ("failed", "missing-module", []),
    # [the workflow config's launcher python: a debugging profile] one process started without
    # torchrun: init_process_group(env://) fails for want of RANK ('environment variable RANK
    # expected, but not set')
    "bare-python": ("failed", "launcher-env-missing", []),
}

# mode -> what ddpdoctor says instead today (known gaps: fixing one turns its xfail into a failure)
MISSES: dict[str, str] = {}

RUNS = RunSet("hundredsixtyfourth-", EXPECTED, MISSES, label_nowhere=True)


@pytest.mark.parametrize("mode", RUNS.params())
def test_hundredsixtyfourth_style_run(mode: str) -> None:
    RUNS.check_verdict(mode)


@pytest.mark.parametrize("mode", list(EXPECTED))
def test_hundredsixtyfourth_style_fixture_is_small_rewritten_and_unlabelled(mode: str) -> None:
    RUNS.check_fixture(mode)
    assert RUNS.names(mode) == ["console.log", "logs/prepare.log", "logs/train.log"]
    for name in RUNS.names(mode):
        assert "MT_CASE" not in RUNS.text(mode, name)
