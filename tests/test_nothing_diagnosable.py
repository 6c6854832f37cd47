""" "OK" only when there was something to read and it was healthy: inputs that hold nothing to
diagnose are a usage/input error (exit 2) that says what was missing, and a log that simply
stops in the middle of training is "unknown", not OK. Through the real CLI."""

from __future__ import annotations

import json
import random
from pathlib import Path

from tests.conftest import REPO, run_cli

HEALTHY = REPO / "tests" / "fixtures" / "real" / "healthy-plain" / "console.log"


def test_empty_stdin_is_nothing_to_diagnose() -> None:
    proc = run_cli("diagnose", "-", stdin=b"")
    assert proc.returncode == 2, proc.stdout
    assert "<stdin>: is empty" in proc.stderr
    assert "nothing to diagnose" in proc.stderr
    assert "No failure found" not in proc.stdout


def test_a_zero_byte_file_is_nothing_to_diagnose(tmp_path: Path) -> None:
    empty = tmp_path / "rank0.log"
    empty.write_bytes(b"")
    proc = run_cli("diagnose", str(empty))
    assert proc.returncode == 2
    assert f"{empty}: is empty" in proc.stderr


def test_a_folder_of_binary_files_is_nothing_to_diagnose(tmp_path: Path) -> None:
    rng = random.Random(7)
    for name in ("a.bin", "b.log", "c.txt"):
        (tmp_path / name).write_bytes(bytes(rng.randrange(256) for _ in range(200_000)))
    proc = run_cli("diagnose", str(tmp_path), "--format", "json")
    assert proc.returncode == 2
    assert proc.stderr.count("binary data, not a log") == 3
    assert proc.stdout == ""


def test_a_run_folder_whose_job_never_started(tmp_path: Path) -> None:
    """A real `ddpdoctor run` of a command that does not exist."""
    run_dir = tmp_path / "run"
    start = run_cli("run", "--run-dir", str(run_dir), "--", str(tmp_path / "no-such-program"))
    assert start.returncode == 127
    proc = run_cli("diagnose", str(run_dir))
    assert proc.returncode == 2
    assert "the job never started" in proc.stderr
    assert "No such file or directory" in proc.stderr


def test_a_log_that_stops_mid_training_is_unknown(tmp_path: Path) -> None:
    """A real healthy run's log cut at step 16 of 20: no error, but no end either."""
    lines = HEALTHY.read_text().splitlines(keepends=True)
    cut = [line for line in lines if "training complete" not in line]
    log = tmp_path / "console.log"
    log.write_text("".join(cut))
    proc = run_cli("diagnose", str(log), "--format", "json")
    assert proc.returncode == 1
    verdict = json.loads(proc.stdout)["verdict"]
    assert verdict["status"] == "unknown"
    assert "ends at step 16 of 20 without an end" in verdict["summary"]
    # the leading guess is named, at the confidence of a guess: a hang, or a run still going
    assert (verdict["kind"], verdict["category"]) == ("hang", "unknown")
    assert verdict["confidence"] <= 0.3


def test_the_whole_healthy_log_is_ok() -> None:
    proc = run_cli("diagnose", str(HEALTHY), "--format", "json")
    assert proc.returncode == 0, proc.stderr
    verdict = json.loads(proc.stdout)["verdict"]
    assert verdict["status"] == "ok"
    assert verdict["confidence"] == 0.5
    assert "Nothing in these logs says how the job went on" not in verdict["summary"]


def test_only_messages_of_normal_operation_are_ok_with_little_confidence(tmp_path: Path) -> None:
    """The same real run's launcher banner alone (torchrun's OMP_NUM_THREADS note; no step, no
    end, no exit): what was read is healthy, and nothing says the job went anywhere: OK, said
    with low confidence and what to collect."""
    lines = HEALTHY.read_text().splitlines(keepends=True)
    log = tmp_path / "console.log"
    log.write_text("".join(line for line in lines if "run.py" in line))
    proc = run_cli("diagnose", str(log), "--format", "json")
    assert proc.returncode == 0, proc.stderr
    verdict = json.loads(proc.stdout)["verdict"]
    assert verdict["status"] == "ok"
    assert verdict["confidence"] == 0.35
    assert "messages of normal operation" in verdict["summary"]
    assert any("--tee 3" in step for step in verdict["next_steps"])


def test_nothing_recognised_is_unknown_not_ok(tmp_path: Path) -> None:
    """The banner's frame without its message (lines of the same real run that say nothing):
    no error, but nothing healthy was read either: unknown, not OK; the likelier reading of
    output that stops (a hang, INF233) at the confidence of a guess, quoting where it stops."""
    lines = HEALTHY.read_text().splitlines(keepends=True)
    log = tmp_path / "console.log"
    log.write_text("".join(line for line in lines if "run.py" in line and "OMP" not in line))
    proc = run_cli("diagnose", str(log), "--format", "json")
    assert proc.returncode == 1, proc.stderr
    verdict = json.loads(proc.stdout)["verdict"]
    assert verdict["status"] == "unknown"
    assert "Nothing in these logs was recognised" in verdict["summary"]
    assert any("--tee 3" in step for step in verdict["next_steps"])
    assert (verdict["rule"], verdict["kind"]) == ("INF233", "hang")
    assert verdict["confidence"] < 0.3
    assert verdict["evidence"] and verdict["evidence"][-1]["line"] == len(
        log.read_text().splitlines()
    )


def test_every_input_unreadable_but_one_empty_says_both(tmp_path: Path) -> None:
    (tmp_path / "x.bin").write_bytes(b"\x00\x01\x02" * 1000)
    (tmp_path / "y.log").write_bytes(b"")
    proc = run_cli("diagnose", str(tmp_path))
    assert proc.returncode == 2
    assert "binary data, not a log" in proc.stderr and "y.log: is empty" in proc.stderr


def test_not_ok_while_a_named_input_could_not_be_read(tmp_path: Path) -> None:
    """A healthy log and a log that does not exist: nothing found in the first is not OK."""
    proc = run_cli("diagnose", str(HEALTHY), str(tmp_path / "rank1.log"), "--format", "json")
    assert proc.returncode == 1, proc.stderr
    verdict = json.loads(proc.stdout)["verdict"]
    assert verdict["status"] == "unknown"
    assert "rank1.log" in verdict["summary"] and "no such file" in verdict["summary"]


def test_a_lone_end_of_training_line_cannot_vouch_for_the_run() -> None:
    """A paste that holds fairseq's 'done training in N seconds' and nothing else (corpus case
    750: its processes hung after it) is unknown, with how to check for a teardown hang; the
    same line after the run's progress is an end (tests/test_fifteenth_style_runs.py)."""
    logs = next((REPO / "corpus" / "cases").glob("750-*")) / "logs"
    proc = run_cli("diagnose", "--format", "json", str(logs))
    verdict = json.loads(proc.stdout)["verdict"]
    assert verdict["status"] == "unknown", verdict
    assert verdict["title"] == "Only the end of training was read"
    assert any("hung in teardown" in step for step in verdict["next_steps"])
    # what it leaves room for is a teardown hang, named as a guess with the line it rests on
    assert verdict["kind"] == "exit-teardown-crash" and verdict["confidence"] == 0.3
    assert ["done training in" in e["text"] for e in verdict["evidence"]] == [True]


def test_ranked_end_lines_alone_cannot_vouch_for_the_run_either(tmp_path: Path) -> None:
    """The last four lines of a real torchtitan run ('[rank3]:... Training completed', 'Process
    group destroyed.' of ranks 3 and 0): the ranks the lines name are not the run's start, so
    the paste is still a fragment of the end (a stated world size, a config dump's, would be)."""
    run = REPO / "tests" / "fixtures" / "real" / "seventyfourth-tarn-glide" / "console.log"
    tail = tmp_path / "console.log"
    tail.write_text("".join(run.read_text().splitlines(keepends=True)[-4:]))
    proc = run_cli("diagnose", "--format", "json", str(tail))
    verdict = json.loads(proc.stdout)["verdict"]
    assert verdict["status"] == "unknown", verdict
    assert verdict["title"] == "Only the end of training was read"


SWEEP = REPO / "tests" / "fixtures" / "real" / "fortyninth-sweep-duo" / "console.log"


def test_results_after_the_last_bar_at_its_total_are_ok_with_less_confidence() -> None:
    """A real evaluation run (lm-eval style): its bar reaches 13/13, then it saves and prints
    its results table, every rank exits 0, and torchrun prints nothing on success. The last
    bar at its total with no error after it is OK, said at 0.4 with what it cannot rule out."""
    proc = run_cli("diagnose", str(SWEEP), "--format", "json")
    assert proc.returncode == 0, proc.stderr
    verdict = json.loads(proc.stdout)["verdict"]
    assert (verdict["status"], verdict["confidence"]) == ("ok", 0.4)
    assert "hung after that line would read the same" in verdict["summary"]


STEPS = REPO / "tests" / "fixtures" / "real" / "seventyfirst-still-tide" / "console.log"


def _verdict_of(text: str, tmp_path: Path) -> dict[str, object]:
    """The CLI's JSON verdict on `text` given as one console log."""
    log = tmp_path / "console.log"
    log.write_text(text, encoding="utf-8")
    proc = run_cli("diagnose", str(log), "--format", "json")
    verdict: dict[str, object] = json.loads(proc.stdout)["verdict"]
    return verdict


def test_a_step_counter_at_its_total_ends_the_loop_as_a_full_bar_does() -> None:
    """A real OpenNMT-style run: 'Step 60/   60;', its validation and its last checkpoint,
    then nothing (the program prints no end line, the console no exit code). The step counter
    at its total with no error after it is OK at 0.4, as the last bar at 100% is."""
    proc = run_cli("diagnose", str(STEPS), "--format", "json")
    assert proc.returncode == 0, proc.stderr
    verdict = json.loads(proc.stdout)["verdict"]
    assert (verdict["status"], verdict["confidence"]) == ("ok", 0.4)


def test_the_same_log_cut_before_the_counters_total_is_unknown(tmp_path: Path) -> None:
    """The same console cut after 'Step 55/   60;': it ends in the middle of training."""
    lines = STEPS.read_text(encoding="utf-8").splitlines()
    last = max(i for i, line in enumerate(lines) if "Step 55/   60;" in line)
    verdict = _verdict_of("\n".join(lines[: last + 1]) + "\n", tmp_path)
    assert (verdict["status"], verdict["rule"]) == ("unknown", "INF212")


NANOGPT = REPO / "tests" / "fixtures" / "real" / "seventysixth-calm-fern" / "console.log"


def test_the_last_step_after_its_counter_reached_the_total_ends_the_loop(tmp_path: Path) -> None:
    """A real nanoGPT-style run: its evaluation line 'step:60/60 val_loss:...', the save,
    then the last step's own 'iter 60: loss ...' and nothing (no end line, torchrun silent on
    success): the counter reached its total and the last line names that step: OK. Cut after
    'iter 55', or with the last line naming a step short of the total, it is unknown."""
    assert _verdict_of(NANOGPT.read_text(encoding="utf-8"), tmp_path)["status"] == "ok"
    text = NANOGPT.read_text(encoding="utf-8")
    short = text.replace("iter 60: loss", "iter 58: loss")
    assert _verdict_of(short, tmp_path)["status"] == "unknown"
    lines = text.splitlines()
    cut = max(i for i, line in enumerate(lines) if line.startswith("iter 55:"))
    assert _verdict_of("\n".join(lines[: cut + 1]) + "\n", tmp_path)["status"] == "unknown"


def test_a_step_counter_at_its_total_inside_an_unfinished_epoch_run_ends_nothing(
    tmp_path: Path,
) -> None:
    """The same console whose last step line also counts epochs short of their total ('Epoch
    1/3'): the steps of one epoch are done, not the run."""
    text = STEPS.read_text(encoding="utf-8").replace("Step 60/   60;", "Epoch 1/3 Step 60/   60;")
    assert _verdict_of(text, tmp_path)["status"] == "unknown"


def test_a_loading_bar_at_its_total_is_not_the_runs_end(tmp_path: Path) -> None:
    """The same real console with its last bar's label turned into a loading step's (the
    checkpoint shards transformers loads before training): a bar that prepares the run ends
    nothing, and the log that stops after it is still unknown."""
    text = SWEEP.read_text(encoding="utf-8").replace("Running eval", "Loading checkpoint shards")
    assert _verdict_of(text, tmp_path)["status"] == "unknown"


def test_a_log_whose_last_line_is_a_loading_bar_at_its_total_is_not_ok() -> None:
    """A real report (corpus 2081, alpaca-lora on 8 GPUs that hung after loading): the paste is
    one line, 'Loading checkpoint shards: 100%|...', where the job stopped. A bar that ends
    start-up is not the run's loop at its total: unknown, read as a log that stops."""
    (case,) = (REPO / "corpus" / "cases").glob("2081-*")
    proc = run_cli("diagnose", str(case / "logs"), "--format", "json")
    verdict = json.loads(proc.stdout)["verdict"]
    assert (verdict["status"], verdict["kind"]) == ("unknown", "hang")


FIFTIETH = REPO / "tests" / "fixtures" / "real"


def test_torchs_exit_handlers_with_no_error_are_a_clean_end() -> None:
    """A real open_clip-style run: its last lines are its evaluation's results and torch's
    atexit statistics (dynamo's traced frames, the fake tensor cache), logged at interpreter
    shutdown; no error anywhere, no end line of its own, torchrun silent on success: OK."""
    proc = run_cli("diagnose", str(FIFTIETH / "fiftieth-calm-duo"), "--format", "json")
    assert proc.returncode == 0, proc.stderr
    verdict = json.loads(proc.stdout)["verdict"]
    assert (verdict["status"], verdict["confidence"]) == ("ok", 0.45)
    assert "interpreter shutdown" in verdict["summary"]


def test_torchs_exit_handlers_after_an_error_end_nothing() -> None:
    """The same program's run where rank 1 raised (a KeyError in its batch's text lengths): the
    same exit statistics follow the traceback, and the verdict is the error's."""
    proc = run_cli("diagnose", str(FIFTIETH / "fiftieth-meta-key"), "--format", "json")
    verdict = json.loads(proc.stdout)["verdict"]
    assert verdict["status"] == "failed"


def test_the_barrier_device_notice_reads_alike_in_every_torch_wording(tmp_path: Path) -> None:
    """The notice that barrier() guessed the rank's GPU, as torch 2.4-2.6 (ProcessGroupNCCL),
    2.5-2.9 and 2.7+ (distributed_c10d) word it (the census's examples): one notice, a message of
    normal operation each time, never 'nothing recognised'."""
    census = [json.loads(line) for line in (REPO / "census" / "messages.jsonl").open()]
    wanted = {
        "pgnccl-barrier-device-unknown",
        "c10d-barrier-device-warning",
        "c10d-barrier-no-device-id-warning",
    }
    examples = [m["example"] for m in census if m["id"] in wanted]
    assert len(examples) == 3
    for index, example in enumerate(examples):
        log = tmp_path / f"notice{index}.log"
        log.write_text(example + "\n")
        proc = run_cli("diagnose", str(log), "--format", "json")
        verdict = json.loads(proc.stdout)["verdict"]
        assert verdict["status"] == "ok", (example, verdict["summary"])
