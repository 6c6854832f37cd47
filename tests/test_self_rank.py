"""A per-process file's own rank, named once at its start (ingest/self_rank.py), and how a
diagnosis reads the file's lines as that rank's."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from ddpdoctor.ingest.inputs import Input
from ddpdoctor.ingest.self_rank import files_announcing_ranks, own_rank


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
        # behind torch's prefix on the same line
        (b"[rank1]:[W1206 rank.cpp:12] x\n[rank1]: I am rank 1 of 2\n", 1),
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


def _files(tmp_path: Path, heads: dict[str, bytes]) -> list[Input]:
    inputs = []
    for name, head in heads.items():
        (tmp_path / name).write_bytes(head + b"Train | Epoch 1 | 1/4 | loss 0.3\n")
        inputs.append(Input(str(tmp_path / name), name))
    return inputs


def test_files_that_each_announce_another_rank_are_those_ranks(tmp_path: Path) -> None:
    """dora's console (rank 0's records and the launcher's) beside worker_1.log: rank 0 counts
    where every announcing file names another rank."""
    inputs = _files(
        tmp_path,
        {
            "console.log": b"Distributed init: 0/2 (local 0) from env\n",
            "worker_1.log": b"Distributed init: 1/2 (local 1) from env\n",
            "notes.txt": b"nothing announced\n",
        },
    )
    assert [i.own_rank for i in files_announcing_ranks(inputs)] == [0, 1, None]


@pytest.mark.parametrize(
    "heads",
    [
        # one file: a console where only the main process logs
        {"console.log": b"rank 0 of 2\n"},
        # two files naming the same rank: two runs, or a copy
        {"a.log": b"rank 0 of 2\n", "b.log": b"rank 0 of 2\n"},
        # a shared console and one rank's own file
        {"a.log": b"rank 0 of 2\nrank 1 of 2\n", "b.log": b"rank 1 of 2\n"},
    ],
)
def test_files_that_do_not_each_name_one_writer(tmp_path: Path, heads: dict[str, bytes]) -> None:
    assert all(i.own_rank is None for i in files_announcing_ranks(_files(tmp_path, heads)))


def test_a_named_pipe_among_the_files_is_not_read_ahead(tmp_path: Path) -> None:
    """A FIFO has no start to read before the scan: opening it here would wait for a writer."""
    inputs = _files(tmp_path, {"worker_1.log": b"Distributed init: 1/2 (local 1) from env\n"})
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    inputs.append(Input(str(fifo), "pipe"))
    assert [i.own_rank for i in files_announcing_ranks(inputs)] == [None, None]
