"""How a log says its training ran to its end, each way with its positive and near-miss lines.
The lines marked with a fixture are copied, some shortened, from real captures
(tests/fixtures/real/thirtyseventh-* for ESPnet's trainer and Kaldi's run.pl, fortieth-* for a
Keras-like loop's counters, fortyfirst-* for MMEngine's); the others are composed in the same
shapes to test the patterns' edges (the verdicts on whole real runs are
tests/test_*_style_runs.py's)."""

from __future__ import annotations

from pathlib import Path

import pytest

from ddpdoctor.analysis.diagnose import diagnose_paths
from ddpdoctor.analysis.facts import FACT_PATTERNS
from ddpdoctor.analysis.scanner import _epoch_state, last_epoch_done

REPO = Path(__file__).resolve().parents[1]

COMPLETED = [f for f in FACT_PATTERNS if f.name == "completed"]


def _completed(line: str) -> bool:
    return any(f.compiled.search(line) for f in COMPLETED)


@pytest.mark.parametrize(
    "line",
    [
        # ESPnet's trainer after its epoch loop (thirtyseventh-steady's train.log)
        "The training was finished at 3 epochs ",
        # Kaldi's utils/run.pl (and queue.pl, slurm.pl) after the job exited 0
        "# Ended (code 0) at Fri Dec  4 04:16:23 UTC 2026, elapsed time 9 seconds",
        "Training is done.",
        "training has completed",
        # litgpt pretrain's performance block after fit() (sixtythird-calm-loom), finetune's
        "| - Training Time : 0.33 s",
        "Training time: 812.33s",
        # PyTorch's examples/distributed/tensor_parallelism (sixtieth-calm-grid)
        "2D training successfully completed!",
        # a loop that stops at its configured end (FourCastNet's, hundredfourth-calm-era)
        "Terminating training after reaching params.max_epochs while LR scheduler is set to "
        "CosineAnnealingLR",
        "Reached max_steps (5000), stopping",
        "Maximum number of epochs reached.",
        # a job runner's word that every replica exited 0 (hundredsecond-calm-cifar)
        "Job finished: SUCCEEDED",
        "Job finished (status: SUCCEEDED).",
        # the SageMaker training toolkit (hundredfifth-calm-fit)
        "2026-12-06 08:52:57,172 sagemaker-training-toolkit INFO     Reporting training SUCCESS",
    ],
)
def test_a_sentence_or_a_wrapper_exit_code_ends_training(line: str) -> None:
    assert _completed(line)


@pytest.mark.parametrize(
    "line",
    [
        # the job failed: run.pl records it
        "# Ended (code 1) at Fri Dec  4 04:16:37 UTC 2026, elapsed time 8 seconds",
        # one epoch's or one phase's end
        "training is finished for epoch 3",
        "Training is done with this stage, evaluating",
        # ESPnet's early stop names its own end: "stopped", not finished
        "[Early stopping] valid.loss has not been improved 1 epochs continuously. The training "
        "was stopped at 2epoch",
        # a step's timing, not the run's
        "| - Training Time per step : 0.33 s",
        "Epoch 3 | Training time: 12.5s | val loss 2.1",
        "training successfully completed for epoch 2",
        # what a loop will do, said at its start; a configuration's value
        "Training will stop after reaching max_steps",
        "max_epochs: 100 (reached)",
        "Job finished: FAILED",
        "sagemaker-training-toolkit ERROR    Reporting training FAILURE",
    ],
)
def test_an_epoch_a_phase_or_a_failed_exit_ends_nothing(line: str) -> None:
    assert not _completed(line)


@pytest.mark.parametrize(
    ("line", "done"),
    [
        # fortieth-calm: every rank's last epoch summary, and its bar redrawn in place
        ("Epoch: 4/4 Train steps: 10 Val steps: 4 0.10s loss: 0.341106 val_loss: 0.29", True),
        ("\rEpoch: 4/4 Step: 9/10  90.00% |██████| 0.09s\rEpoch: 4/4 Step: 10/10 100.00% |", True),
        ("Epoch 3/3: 100%|██████████| 50/50 [00:05<00:00,  9.81it/s]", True),
        # the last epoch, not yet through; an earlier epoch at its end; no epoch counted
        ("\rEpoch: 4/4 Step: 3/10  30.00% |██████| 0.03s loss: 0.3", False),
        ("Epoch [2/3] step 50/50 loss 0.31", False),
        ("step 5/5 loss 0.31", None),
        # the DDP tutorial's 'Epoch 2 | ... | Steps: 4' says no total: not known to be the last
        ("[GPU3] Epoch 2 | Batchsize: 16 | Steps: 4", False),
    ],
)
def test_the_last_epoch_with_its_steps_done_ends_the_loop(line: str, done: bool | None) -> None:
    state = _epoch_state(line)
    assert (None if state is None else last_epoch_done(state, set())) is done


@pytest.mark.parametrize(
    ("line", "max_epochs", "done"),
    [
        # fortyfirst-calm: MMEngine's counters say the epoch, not how many; its config dump
        # said "max_epochs=3"
        ("Epoch(train) [3][12/12]  lr: 1.0000e-02  eta: 0:00:03  loss: 0.8467", {3}, True),
        ("Epoch(val) [3][5/5]    accuracy/top1: 71.6667  data_time: 0.0011", {3}, True),
        # an earlier epoch; the last one not through; no number announced; two numbers
        ("Epoch(train) [2][12/12]  lr: 1.0000e-02  loss: 0.9750", {3}, False),
        ("Epoch(train) [3][ 8/12]  lr: 1.0000e-02  loss: 0.9332", {3}, False),
        ("Epoch(train) [3][12/12]  lr: 1.0000e-02  loss: 0.8467", set(), False),
        ("Epoch(train) [3][12/12]  lr: 1.0000e-02  loss: 0.8467", {3, 12}, False),
        # the DDP tutorial counts from 0: its last epoch of 3 is 'Epoch 2', never the total
        ("[GPU3] Epoch 2 | Batchsize: 16 | Steps: 4", {3}, False),
        # fortysecond-quiet-trio: Composer's console logger, 'max_duration: 3ep' announced
        (
            "[epoch=3][batch=24/24]: Train time/batch: 24, Train loss/train/total: 0.7712, "
            "Train metrics/train/Accuracy: 0.5625",
            {3},
            True,
        ),
        (
            "[epoch=3][batch=20/24]: Train time/batch: 20, Train loss/train/total: 0.8101",
            {3},
            False,
        ),
        ("[epoch=2][batch=16/24]: Train time/batch: 16, Train loss/train/total: 0.9", {3}, False),
    ],
)
def test_the_announced_number_of_epochs_reached(
    line: str, max_epochs: set[int], done: bool
) -> None:
    state = _epoch_state(line)
    assert state is not None and last_epoch_done(state, max_epochs) is done


@pytest.mark.parametrize(
    ("line", "first", "done"),
    [
        # a loop that counts from 0 (the writer's first epoch line said epoch 0): of the 3
        # epochs announced, 'epoch 2' is the last (fiftysecond-quiet-trio's 'num_epochs 3')
        ("epoch 2: eval accuracy 0.385", 0, True),
        ("[GPU3] Epoch 2 | Batchsize: 16 | Steps: 4", 0, True),
        ("epoch 2:  67%|######6   | 4/6 [00:00<00:00, 41.2it/s]", 0, False),
        ("epoch 1: eval accuracy 0.333", 0, False),
        # counted from 1 (or never seen from the start): the last is the number itself
        ("epoch 2: eval accuracy 0.385", 1, False),
        ("epoch 3: eval accuracy 0.385", 1, True),
        ("epoch 2: eval accuracy 0.385", None, False),
    ],
)
def test_a_loop_counted_from_zero_ends_one_before_the_number(
    line: str, first: int | None, done: bool
) -> None:
    state = _epoch_state(line)
    assert state is not None and last_epoch_done(state, {3}, first) is done


@pytest.mark.parametrize(
    ("line", "first", "done"),
    [
        # sixtyninth-calm-mel: coqui's Trainer prints ' > EPOCH: 0/4' to ' > EPOCH: 3/4'
        (" > EPOCH: 3/4", 0, True),
        (" > EPOCH: 2/4", 0, False),
        # counted from 1 (or never seen from the start): '3/4' is not the last
        (" > EPOCH: 3/4", 1, False),
        (" > EPOCH: 3/4", None, False),
        (" > EPOCH: 4/4", 1, True),
        # AllenNLP's GradientDescentTrainer: 'Epoch %d/%d', epoch, num_epochs - 1: of three
        # epochs 'Epoch 0/2' to 'Epoch 2/2', its total the last one's number
        ("Epoch 2/2", 0, True),
        ("Epoch 0/2", 0, False),  # (1/2 is the last of two, counted as coqui counts)
    ],
)
def test_a_total_of_its_own_counted_from_zero_ends_one_before_it(
    line: str, first: int | None, done: bool
) -> None:
    state = _epoch_state(line)
    assert state is not None and last_epoch_done(state, set(), first) is done


def test_a_run_whose_epochs_count_from_zero_and_reach_the_last_is_ok() -> None:
    """fiftysecond-quiet-trio (a real 3-rank run under notebook_launcher): its config table
    says 'num_epochs  3', its epochs are 'epoch 0' to 'epoch 2', each with its bar at 6/6 and
    an evaluation line, then 'done, ...'; torchrun prints nothing on success."""
    folder = REPO / "tests" / "fixtures" / "real" / "fiftysecond-quiet-trio"
    verdict = diagnose_paths([str(folder)]).verdict
    assert (verdict.status, verdict.kind) == ("ok", None)


@pytest.mark.parametrize(
    ("line", "n"),
    [
        ("max_epochs=3", 3),
        ("  Num Epochs = 12", 12),
        # a config table's row, a YAML dump, argparse's Namespace
        ("1  num_epochs  3", 3),
        ("total_epochs: 90", 90),
        ("Namespace(batch_size=16, epochs=5, lr=0.1)", 5),
        # an argument dump one per line, a YAML config
        ("                                     epochs: 3", 3),
        ("epochs: 90", 90),
        ("epoch: 3", None),
        ("epochs: 3 done", None),
        # an argument table's words (Time-Series-Library), a script's summary line; not
        # Megatron's passes over the data for its samples
        ("  Train Epochs:       3                   Batch Size:         32", 3),
        ("\tTotal epochs: 2; iters: 60.", 2),
        ("max epochs = 40", 40),
        (" > number of epochs: 47", None),
        ("Train epochs: 3.5", None),
        # fairseq's Namespace dump (its --max-epoch)
        ("Namespace(task='language_modeling', max_epoch=6, max_update=0)", 6),
        ("Namespace(max_epoch_size=6)", None),
        # a count of something else, or a float
        ("num_epochs_trained 3", None),
        ("num_epochs: 2.5", None),
        ("Namespace(warmup_epochs=5, lr=0.1)", None),
        # Composer's and llm-foundry's YAML config: a duration in epochs
        ("max_duration: 3ep", 3),
        ("max_duration: '10ep'", 10),
        # a duration in batches or tokens says no number of epochs
        ("max_duration: 800ba", None),
        ("max_duration: 1000000tok", None),
    ],
)
def test_the_number_of_epochs_a_run_announces(line: str, n: int | None) -> None:
    found = [
        m["n"] for f in FACT_PATTERNS if f.name == "max_epochs" and (m := f.compiled.search(line))
    ]
    assert found == ([] if n is None else [str(n)])


@pytest.mark.parametrize(
    ("folder", "ok"),
    [
        # DiT's main-process logger (the other ranks log to a NullHandler): its steps, the
        # checkpoint 'Saved ...', then a bare 'Done!' as its last words
        ("tests/fixtures/real/ninetyeighth-calm-dit", True),
        # hifi-gan's 'Saving checkpoint to ...' then 'Complete.': the save's end, and the log
        # stops there (the launcher was SIGTERMed and died without a word)
        ("tests/fixtures/real/ninetieth-term-voc", False),
        # torchvision's MNIST download, 'Processing...' then 'Done!', before any step: the
        # job then hung in its first collective (corpus case 802)
        ("corpus/cases/802-hang-kubeflow-pytorchjob-mnist-nccl-no-output-after-download", False),
    ],
)
def test_a_bare_done_after_the_main_loggers_own_steps_ends_training(folder: str, ok: bool) -> None:
    assert (diagnose_paths([str(REPO / folder)]).verdict.status == "ok") is ok


def test_doras_executor_reports_every_worker_done() -> None:
    """tests/fixtures/real/hundredth-calm-codec: `dora run -d`'s last line."""
    assert _completed("Executor: All workers completed successfully")
    assert not _completed("Executor: Worker 1 died, killing all workers")


@pytest.mark.parametrize(
    ("text", "bare"),
    [
        ("Done!", True),
        ("[rank 1/3] finished.", True),
        ("All done", True),
        # icefall's records keep their head in the message: level, caller, (rank/world)
        ("INFO [train.py:914] (1/2) Done!", True),
        ("INFO [train.py:696] (0/2) Epoch 2 done", False),
        ("loading done", False),
        ("INFO [train.py:522] (0/2) Saving checkpoint to exp/epoch-2.pt", False),
    ],
)
def test_a_bare_end_is_a_whole_message_after_its_tags(text: str, bare: bool) -> None:
    from ddpdoctor.analysis.job import BARE_END

    assert bool(BARE_END.match(text)) is bare


def test_every_icefall_rank_saying_done_ends_a_healthy_run() -> None:
    """Set 122 calm-cuts: icefall's ranks each log 'Done!' after their last epoch, then
    leave through a silent barrier and mp.spawn's silent return."""
    v = diagnose_paths([str(REPO / "tests/fixtures/real/hundredtwentysecond-calm-cuts")]).verdict
    assert (v.status, v.kind) == ("ok", None)


@pytest.mark.parametrize(
    ("fixture", "ok"),
    [
        # nanotron: 'iteration: 20 / 20', then 'Saving weights: 100%' and its config: the end
        ("hundredtwentythird-calm-llama", True),
        # the same save bar mid-run (a save on rank 0 past the timeout): no end
        ("hundredtwentythird-save-crawl", False),
    ],
)
def test_a_save_bar_after_the_last_step_ends_the_run(fixture: str, ok: bool) -> None:
    path = REPO / "tests" / "fixtures" / "real" / fixture
    assert (diagnose_paths([str(path)]).verdict.status == "ok") is ok


@pytest.mark.parametrize(
    ("fixture", "ok"),
    [
        # arcface_torch: config dump ': total_step  48', last line '... Global Step: 48 ...'
        ("hundredtwentyfourth-calm-faces", True),
        # the same program with a rank stuck in its data queue mid-run: no end
        ("hundredtwentyfourth-queue-park", False),
    ],
)
def test_the_last_step_at_the_configured_number_of_steps_ends_the_run(
    fixture: str, ok: bool
) -> None:
    path = REPO / "tests" / "fixtures" / "real" / fixture
    assert (diagnose_paths([str(path)]).verdict.status == "ok") is ok


@pytest.mark.parametrize(
    ("line", "n"),
    [
        ("Training: 2026-12-06 19:16:56,675-: total_step               48", "48"),
        ("[Start training] ... | train_steps: 40 | start_iteration_step: 0", "40"),
        ("  train_iters ..................... 320000", "320000"),
    ],
)
def test_a_configured_number_of_steps_is_read(line: str, n: str) -> None:
    import re

    found = [
        m["n"] for f in FACT_PATTERNS if f.name == "train_steps" and (m := re.search(f.regex, line))
    ]
    assert found == [n]


@pytest.mark.parametrize(
    ("fixture", "ok"),
    [
        # mmcv 1.x: 'workflow: [('train', 1)], max: 3 epochs', last 'Epoch(val) [3][11] ...'
        ("hundredtwentyseventh-calm-det", True),
        # the same runner with rank 0's evaluation past the timeout: no end
        ("hundredtwentyseventh-eval-crawl", False),
    ],
)
def test_the_last_epochs_validation_ends_the_run(fixture: str, ok: bool) -> None:
    path = REPO / "tests" / "fixtures" / "real" / fixture
    assert (diagnose_paths([str(path)]).verdict.status == "ok") is ok


@pytest.mark.parametrize(
    ("fixture", "ok"),
    [
        # icefall: every rank's 'INFO [train.py:914] (R/2) Done!' behind its record head
        ("hundredtwentysecond-calm-cuts", True),
        # the same recipe stopped from outside mid-run: its logs stop after a save, no 'Done!'
        ("hundredtwentysecond-wall-term", False),
        # LeRobot: 'INFO 2026-12-06 19:05:56 s/train.py:1042 End of training'
        ("hundredtwentyfifth-calm-act", True),
        # the same trainer stopped from outside mid-run
        ("hundredtwentyfifth-wall-term", False),
    ],
)
def test_an_end_behind_a_record_head_and_its_mid_run_stop(fixture: str, ok: bool) -> None:
    path = REPO / "tests" / "fixtures" / "real" / fixture
    assert (diagnose_paths([str(path)]).verdict.status == "ok") is ok


def test_a_format_field_in_a_config_dump_counts_no_epoch() -> None:
    """hundredthirtyfourth-calm-ldm's config dump: ModelCheckpoint's filename '{epoch:06}' is
    a format field, not epoch 6 (its bar's 'Epoch 0: 12%|...' is the writer's first epoch)."""
    assert (
        _epoch_state("{'filename': '{epoch:06}', 'verbose': True, 'monitor': 'val/loss'}") is None
    )
    assert _epoch_state("Epoch 0:  12%|#2        | 1/8 [00:02<00:18,  2.59s/it, loss=1.079]") == (
        0,
        None,
        False,
    )
