"""The data step of a hundred-eleventh training-program style for the generalisation fixtures
(tests/fixtures/real/hundredeleventh-*): a GPT-2 speedrun in the way of KellerJordan's
modded-nanogpt, whose train_gpt.py (tests/programs/hundredeleventh_style_train.py, a CPU port:
gloo, no torch.compile) is started as `torchrun --standalone --nproc_per_node=N train_gpt.py`
after `python data/cached_fineweb10B.py 8` fetched the GPT-2 tokens of FineWeb10B. This file is
that data step, linked into each run's folder as data/cached_fineweb10B.py: it cannot download
anything here, so it writes synthetic shards of the same format instead (a 256 int32 header:
magic 20240520, version 1, token count; then the tokens as uint16), the validation shard
fineweb_val_000000.bin (8,192 tokens) and the training shards fineweb_train_000001.bin ...
_00000N.bin (4,096 tokens each), all of a Markov chain over 256 GPT-2 token ids (documents
end with <|endoftext|>, 50256). The training script keeps nothing of the fixture set in it (its own code is the first
thing of its log, logs/<uuid>.txt): no fault switch, every fault of the set is in what a run is
given (tests/fixtures/real/capture_hundredeleventh.sh).

usage: python data/cached_fineweb10B.py [num_chunks]   (default 8)
"""

from __future__ import annotations

import os
import sys

import numpy as np

TOKENS = 4096  # a training shard's tokens (the validation shard has twice as many)
STATES = 256  # distinct token ids of the chain
EOT = 50256


def chain(seed: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The token ids, each state's six successors and their probabilities (the same for every
    shard: one language)."""
    rng = np.random.default_rng(seed)
    ids = rng.choice(EOT, size=STATES, replace=False).astype(np.uint16)
    successors = rng.integers(0, STATES, size=(STATES, 6))
    probs = np.array([0.4, 0.2, 0.15, 0.1, 0.1, 0.05])
    return ids, successors, probs


def write_shard(path: str, n: int, seed: int) -> None:
    ids, successors, probs = chain(1234)
    rng = np.random.default_rng(seed)
    tokens = np.empty(n, dtype=np.uint16)
    state = int(rng.integers(STATES))
    choice = rng.choice(6, size=n, p=probs)
    ends = rng.random(n) < 1 / 256
    for i in range(n):
        if ends[i]:
            tokens[i] = EOT
            state = int(rng.integers(STATES))
            continue
        tokens[i] = ids[state]
        state = int(successors[state, choice[i]])
    header = np.zeros(256, dtype=np.int32)
    header[0] = 20240520  # magic
    header[1] = 1  # version
    header[2] = n  # number of tokens
    with open(path, "wb") as f:
        f.write(header.tobytes())
        f.write(tokens.tobytes())


def main() -> None:
    num_chunks = int(sys.argv[1]) if len(sys.argv) > 1 else 8
    local_dir = os.path.join(os.path.dirname(os.path.abspath(__file__)), "fineweb10B")
    os.makedirs(local_dir, exist_ok=True)
    write_shard(os.path.join(local_dir, "fineweb_val_000000.bin"), 2 * TOKENS, 0)
    for i in range(1, num_chunks + 1):
        write_shard(os.path.join(local_dir, f"fineweb_train_{i:06d}.bin"), TOKENS, i)


if __name__ == "__main__":
    main()
