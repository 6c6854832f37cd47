"""data/shakespeare_char/prepare.py of the hundred-and-sixth style (nanoGPT's, for the
fixtures tests/fixtures/real/hundredsixth-*): nanoGPT downloads tinyshakespeare's input.txt;
nothing is downloaded here, the text is written from a small seeded grammar of play lines
(speaker names, verses) instead, then mapped to integers character by character as nanoGPT's
prepare.py does: train.bin and val.bin (uint16, a 90/10 split) and meta.pkl (vocab_size, itos,
stoi), with nanoGPT's prints.
"""

from __future__ import annotations

import os
import pickle
import random

import numpy as np

SPEAKERS = ["ROMEO", "JULIET", "MERCUTIO", "NURSE", "TYBALT", "BENVOLIO", "CAPULET", "FRIAR"]
SUBJECTS = ["my lord", "the night", "thy heart", "this hand", "sweet love", "the sun", "our house"]
VERBS = ["doth call", "shall keep", "hath sworn", "will see", "must bear", "may find"]
OBJECTS = ["a gentle word", "the stars", "my soul", "thy name", "no more", "the morning light"]
ENDS = [".", "!", "?", ";", ","]


def verse(rng: random.Random) -> str:
    line = f"{rng.choice(SUBJECTS)} {rng.choice(VERBS)} {rng.choice(OBJECTS)}{rng.choice(ENDS)}"
    return line[0].upper() + line[1:]


def main() -> None:
    here = os.path.dirname(os.path.abspath(__file__))
    input_file_path = os.path.join(here, "input.txt")
    if not os.path.exists(input_file_path):
        rng = random.Random(106)
        parts = []
        while sum(len(p) for p in parts) < 300_000:
            speaker = rng.choice(SPEAKERS)
            lines = "\n".join(verse(rng) for _ in range(rng.randint(1, 4)))
            parts.append(f"{speaker}:\n{lines}\n\n")
        with open(input_file_path, "w") as f:
            f.write("".join(parts))

    with open(input_file_path) as f:
        data = f.read()
    print(f"length of dataset in characters: {len(data):,}")

    chars = sorted(set(data))
    vocab_size = len(chars)
    print("all the unique characters:", "".join(chars))
    print(f"vocab size: {vocab_size:,}")

    stoi = {ch: i for i, ch in enumerate(chars)}
    itos = {i: ch for i, ch in enumerate(chars)}

    def encode(s: str) -> list[int]:
        return [stoi[c] for c in s]

    n = len(data)
    train_data = data[: int(n * 0.9)]
    val_data = data[int(n * 0.9) :]
    train_ids = encode(train_data)
    val_ids = encode(val_data)
    print(f"train has {len(train_ids):,} tokens")
    print(f"val has {len(val_ids):,} tokens")

    np.array(train_ids, dtype=np.uint16).tofile(os.path.join(here, "train.bin"))
    np.array(val_ids, dtype=np.uint16).tofile(os.path.join(here, "val.bin"))
    meta = {"vocab_size": vocab_size, "itos": itos, "stoi": stoi}
    with open(os.path.join(here, "meta.pkl"), "wb") as f:
        pickle.dump(meta, f)


if __name__ == "__main__":
    main()
