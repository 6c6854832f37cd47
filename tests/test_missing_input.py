"""A program that checks its inputs and stops says so in its own words: an assertion or a
ValueError it raises ('/data/train does not exist'), or an error it logs before it exits
('ERROR: data_dir ... does not exist', 'No data found'). Those words name missing input data
(DATA108, data-error); the same phrases about anything else (a config key) or about a place
the program writes to (torch.save's 'Parent directory ... does not exist') stay a plain
exception. Each program runs for real; the verdict reads what it printed."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from ddpdoctor.analysis.diagnose import diagnose_paths
from ddpdoctor.rules.data import MISSING_INPUT_WORDS

PROGRAMS = {
    "assert": (
        "import os\ndata = '/nonexistent/coco/train2017'\n"
        "print('building dataset', flush=True)\n"
        "assert os.path.exists(data), f'{data} does not exist'\n",
        ("data-error", "DATA108"),
    ),
    "raise": (
        "print('loading shards', flush=True)\n"
        "raise ValueError('No data files found in /nonexistent/shards (pattern *.parquet)')\n",
        ("data-error", "DATA108"),
    ),
    "logged": (
        "import logging, sys\nlogging.basicConfig(level=logging.INFO)\n"
        "log = logging.getLogger('train')\nlog.info('config: data_dir=/nonexistent/wavs')\n"
        "log.error('data_dir /nonexistent/wavs does not exist, nothing to train on')\n"
        "sys.exit(0)\n",
        ("data-error", "DATA108"),
    ),
    "save-output": (
        "import torch\nprint('epoch 3 done', flush=True)\n"
        "torch.save({'w': 1}, '/nonexistent/run-3/checkpoint.pt')\n",
        ("python-exception", "PY101"),
    ),
    "config-key": (
        "cfg = {'lr': 0.1}\nprint('reading config', flush=True)\n"
        "assert 'warmup' in cfg, \"key 'warmup' not found in config\"\n",
        ("python-exception", "PY101"),
    ),
}


@pytest.mark.parametrize("case", sorted(PROGRAMS))
def test_a_program_saying_its_data_is_missing(case: str, tmp_path: Path) -> None:
    code, want = PROGRAMS[case]
    if "import torch" in code:
        pytest.importorskip("torch")
    script = tmp_path / "train.py"
    script.write_text(code)
    proc = subprocess.run(
        [sys.executable, str(script)],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        timeout=60,
    )
    log = tmp_path / "console.log"
    log.write_text(proc.stdout)
    report = diagnose_paths([str(log)])
    assert (report.verdict.kind, report.verdict.rule) == want, proc.stdout


def test_the_words_need_data_and_absence_together() -> None:
    assert MISSING_INPUT_WORDS.search("No images found in /data/faces")
    assert MISSING_INPUT_WORDS.search("dataset train.jsonl is empty")
    assert not MISSING_INPUT_WORDS.search("checkpoint dir not found")  # no data noun
    assert not MISSING_INPUT_WORDS.search("found 120 images in /data/faces")  # no absence
