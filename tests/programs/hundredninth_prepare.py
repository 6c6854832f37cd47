"""The prepare step of the hundred-and-ninth style (for the fixtures
tests/fixtures/real/hundredninth-*; copied into each run's folder beside train_network.py and its
library/): what a kohya-ss/sd-scripts user has before the first launch, written without any
download. The base model, model.safetensors (a Stable Diffusion v1 checkpoint in miniature,
library/model_util.py's three models under the original checkpoint's key prefixes), and the
training images of the DreamBooth layout: img/10_sks dog/img_0001.png ... (512x512 RGB PNGs of a
seeded shape on a seeded background) with a caption .txt beside each image ('sks dog, sitting on
the grass, ...'). With --portrait N, N more images of 448x576 in img/1_sks dog standing.
"""

from __future__ import annotations

import argparse
import os
import random

import numpy as np
from library import model_util, train_util

PLACES = ["on the grass", "on a sofa", "in the snow", "on the beach", "in a garden", "by the lake"]
POSES = ["sitting", "lying down", "running", "looking up", "sleeping", "playing with a ball"]
STYLES = ["photo", "close-up", "full body", "side view"]


def make_image(rng: random.Random, w: int, h: int) -> np.ndarray:
    yy, xx = np.mgrid[0:h, 0:w].astype(np.float32)
    top = np.array([rng.randint(60, 200) for _ in range(3)], dtype=np.float32)
    bottom = np.array([rng.randint(60, 200) for _ in range(3)], dtype=np.float32)
    t = (yy / h)[..., None]
    image = top * (1 - t) + bottom * t
    cx, cy = rng.uniform(0.3, 0.7) * w, rng.uniform(0.4, 0.7) * h
    rx, ry = rng.uniform(0.15, 0.3) * w, rng.uniform(0.1, 0.2) * h
    body = ((xx - cx) / rx) ** 2 + ((yy - cy) / ry) ** 2 < 1
    head = ((xx - cx - rx) / (ry * 0.8)) ** 2 + ((yy - cy + ry) / (ry * 0.8)) ** 2 < 1
    fur = np.array(
        [rng.randint(90, 160), rng.randint(60, 110), rng.randint(20, 60)], dtype=np.float32
    )
    image[body | head] = fur
    return np.clip(image, 0, 255).astype(np.uint8)


def write_folder(folder: str, n: int, w: int, h: int, rng: random.Random) -> None:
    os.makedirs(folder, exist_ok=True)
    for i in range(1, n + 1):
        stem = os.path.join(folder, f"img_{i:04d}")
        train_util.write_png(stem + ".png", make_image(rng, w, h))
        caption = f"sks dog, {rng.choice(POSES)} {rng.choice(PLACES)}, {rng.choice(STYLES)}"
        with open(stem + ".txt", "w", encoding="utf-8") as f:
            f.write(caption + "\n")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", default=".")
    parser.add_argument("--images", type=int, default=12)
    parser.add_argument("--portrait", type=int, default=0)
    args = parser.parse_args()
    rng = random.Random(109)
    model_util.save_stable_diffusion_checkpoint(
        os.path.join(args.out, "model.safetensors"), seed=109
    )
    write_folder(os.path.join(args.out, "img", "10_sks dog"), args.images, 512, 512, rng)
    if args.portrait:
        write_folder(
            os.path.join(args.out, "img", "1_sks dog standing"), args.portrait, 448, 576, rng
        )


if __name__ == "__main__":
    main()
