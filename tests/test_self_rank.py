"""A per-process file's own rank, named once at its start (ingest/self_rank.py), and how a
diagnosis reads the file's lines as that rank's."""

from __future__ import annotations

import pytest

from ddpdoctor.ingest.self_rank import own_rank


@pytest.mark.parametrize(
    ("head", "rank"),
    [
        (b"[12-06 05:52:48][dora.distrib][INFO] - Distributed init: 1/2 (local 1) from env\n", 1),
        (b"Starting rank=1, seed=1, world_size=2.\n", 1),
        (b"rank 3 of 4 joined\n", 3),
        (b"Global rank: 2/8\n", 2),
        (b"RANK=1 LOCAL_RANK=1 WORLD_SIZE=2 MASTER_PORT=29500\n", 1),
        (b"Initializing distributed: GLOBAL_RANK: 3, MEMBER: 4/4\n", 3),
        (b"| distributed init (rank 1): env://\n", 1),
        (b"Process rank: 1, device: cpu, n_gpu: 0, distributed training: True\n", 1),
        # the same process announcing twice, and its own excepthook prefix
        (b"rank 1 of 2\nrank 1 of 2\n[rank1]: Traceback (most recent call last):\n", 1),
    ],
)
def test_a_file_that_names_its_writers_rank(head: bytes, rank: int) -> None:
    assert own_rank(head) == rank


@pytest.mark.parametrize(
    "head",
    [
        b"",
        b"epoch 1 loss 0.3\n",
        # rank 0 alone: a console where only the main process logs holds the others' output
        b"Starting rank=0, seed=0, world_size=2.\n",
        # a console two processes share
        b"Starting rank=0, seed=0, world_size=2.\nStarting rank=1, seed=1, world_size=2.\n",
        # a device, not a rank
        b"local rank 1 of 2\n",
        b"LOCAL_RANK=1 WORLD_SIZE=2\n",
        # a rank outside its world is no announcement
        b"rank 5 of 2\n",
        # another rank's prefixed lines in the same file
        b"[rank0]: Traceback (most recent call last):\nrank 1 of 2\n",
    ],
)
def test_files_that_name_no_single_writer(head: bytes) -> None:
    assert own_rank(head) is None
