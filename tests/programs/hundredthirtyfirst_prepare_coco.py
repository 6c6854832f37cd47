"""The prepare step of the hundred-and-thirty-first training-program style
(tests/programs/hundredthirtyfirst_style_train.py): a COCO-caption-like data folder in the layout
LAVIS's coco_caption builder reads (coco/annotations/coco_karpathy_{train,val}.json, a list of
{"caption", "image", "image_id"} entries; coco/images/{train2014,val2014}/COCO_*_<id>.ppm), made
of synthetic images (binary netpbm, 3 x 32 x 32: no PIL on the host) whose colour pattern matches
a few caption words. Nothing is downloaded. Usage: python prepare_coco.py DIR [--num-train N]
[--num-val N]
"""

from __future__ import annotations

import argparse
import json
import os
import random

COLOURS = {
    "red": (220, 40, 40),
    "green": (40, 200, 60),
    "blue": (40, 60, 220),
    "yellow": (230, 220, 40),
    "white": (240, 240, 240),
    "black": (20, 20, 20),
}
THINGS = ["dog", "cat", "bus", "kite", "train", "boat", "pizza", "clock", "horse", "bench"]
PLACES = ["on a street", "in a field", "near the water", "in a kitchen", "at the park"]


def write_ppm(path: str, rng: random.Random, colour: tuple[int, int, int], stripe: int) -> None:
    size = 32
    pixels = bytearray()
    for y in range(size):
        for x in range(size):
            base = colour if (x // 4 + y // 4 * stripe) % 3 == 0 else (128, 128, 128)
            pixels.extend(max(0, min(255, c + rng.randint(-20, 20))) for c in base)
    with open(path, "wb") as f:
        f.write(b"P6\n32 32\n255\n" + bytes(pixels))


def make_split(root: str, split: str, n: int, seed: int) -> None:
    rng = random.Random(seed)
    folder = "train2014" if split == "train" else "val2014"
    os.makedirs(os.path.join(root, "coco", "images", folder), exist_ok=True)
    entries = []
    for i in range(n):
        image_id = 9 + 17 * i + (0 if split == "train" else 500000)
        colour = rng.choice(sorted(COLOURS))
        thing = rng.choice(THINGS)
        name = f"{folder}/COCO_{folder}_{image_id:012d}.ppm"
        write_ppm(
            os.path.join(root, "coco", "images", name),
            rng,
            COLOURS[colour],
            1 + THINGS.index(thing) % 3,
        )
        caption = f"A {colour} {thing} {rng.choice(PLACES)}."
        entries.append({"caption": caption, "image": name, "image_id": f"coco_{image_id}"})
    os.makedirs(os.path.join(root, "coco", "annotations"), exist_ok=True)
    with open(os.path.join(root, "coco", "annotations", f"coco_karpathy_{split}.json"), "w") as f:
        json.dump(entries, f)


def main() -> None:
    parser = argparse.ArgumentParser(description="write a small COCO-caption-like data folder")
    parser.add_argument("root")
    parser.add_argument("--num-train", type=int, default=96)
    parser.add_argument("--num-val", type=int, default=48)
    args = parser.parse_args()
    make_split(args.root, "train", args.num_train, 1)
    make_split(args.root, "val", args.num_val, 2)
    print(f"wrote {args.num_train} train and {args.num_val} val pairs under {args.root}/coco")


if __name__ == "__main__":
    main()
