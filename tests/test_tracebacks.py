"""Traceback stitching when ranks interleave line by line in one console."""

from __future__ import annotations

from pathlib import Path

from ddpdoctor.analysis.diagnose import diagnose_paths

# Two ranks printing their tracebacks at the same time, as torchrun's console shows them.
INTERLEAVED = """\
[rank0]:Traceback (most recent call last):
[rank1]:Traceback (most recent call last):
[rank0]:  File "/work/train.py", line 40, in <module>
[rank1]:  File "/work/train.py", line 40, in <module>
[rank0]:    main()
[rank1]:    main()
[rank1]:  File "/work/train.py", line 31, in main
[rank0]:  File "/work/train.py", line 35, in main
[rank1]:    ckpt = torch.load(path)
[rank0]:    loss = model(x).sum()
[rank1]:  File "/usr/lib/python3/site-packages/torch/serialization.py", line 99, in _cuda_deserialize
[rank0]:  File "/usr/lib/python3/site-packages/torch/nn/modules/module.py", line 1, in _call_impl
[rank1]:torch.cuda.OutOfMemoryError: CUDA out of memory. Tried to allocate 20.00 MiB (GPU 0; 11.17 GiB total capacity)
[rank0]:torch.cuda.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB (GPU 0; 79.15 GiB total capacity)
"""


def test_interleaved_tracebacks_are_stitched_per_rank(tmp_path: Path) -> None:
    """The interleaving is taken from how torchrun prints two ranks; the texts are those of
    corpus case 052 (OOM inside torch.load) and 006 (OOM in forward)."""
    log = tmp_path / "console.log"
    log.write_text(INTERLEAVED)
    report = diagnose_paths([str(log)])
    by_rule = {f.rule: f for f in report.findings}
    # rank 1's OOM happened inside torch.load: checkpoint-load-device; rank 0's is a plain OOM.
    assert by_rule["CUDA102"].ranks == [1]
    assert by_rule["CUDA101"].ranks == [0]
    ctx = by_rule["CUDA102"].hits[0].context
    assert all(c.origin.rank == 1 for c in ctx)
    assert ctx[0].text.startswith("Traceback")
    assert [c.line for c in ctx] == [2, 4, 6, 7, 9, 11]
