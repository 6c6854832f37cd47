"""The host could not give a process memory, in the words each layer uses: Python's
MemoryError, numpy's MemoryError subclass (_ArrayMemoryError, 'Unable to allocate 7.28 TiB
for an array ...') and torch's CPU allocator. Each program runs for real; all three are the
host's memory (LCH101), not a bug of the program's own."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from ddpdoctor.analysis.diagnose import diagnose_paths

PROGRAMS = {
    "python": "x = bytearray(2**62)",
    "numpy": "import numpy as np\nx = np.ones((10**6, 10**6))",
    "torch": "import torch\nx = torch.empty(2**62, dtype=torch.uint8)",
}
WORDS = {
    "python": "MemoryError",
    "numpy": "_ArrayMemoryError: Unable to allocate",
    "torch": "DefaultCPUAllocator: ",
}


@pytest.mark.parametrize("layer", sorted(PROGRAMS))
def test_a_failed_host_allocation_is_host_memory(layer: str, tmp_path: Path) -> None:
    if layer != "python":
        pytest.importorskip(layer)
    script = tmp_path / "train.py"
    script.write_text('print("caching the dataset in memory", flush=True)\n' + PROGRAMS[layer])
    proc = subprocess.run(
        [sys.executable, str(script)],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 1
    assert WORDS[layer] in proc.stdout, proc.stdout[-500:]
    log = tmp_path / "console.log"
    log.write_text(proc.stdout)
    report = diagnose_paths([str(log)])
    assert (report.verdict.kind, report.verdict.rule) == ("host-oom", "LCH101")
