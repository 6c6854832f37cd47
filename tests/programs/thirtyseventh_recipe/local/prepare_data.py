"""Stage 1 and 2 of the recipe: a synthetic corpus in Kaldi's layout (feats.scp, text, utt2spk,
features as .npy files) and each set's feats_shape."""

import sys
from pathlib import Path

import numpy as np


def prepare(root: Path) -> None:
    rng = np.random.default_rng(37)
    feats = root / "feats"
    feats.mkdir(parents=True, exist_ok=True)
    for dset, per_spk in (("train", 12), ("dev", 3)):
        d = root / dset
        d.mkdir(parents=True, exist_ok=True)
        scp, text, u2s = [], [], []
        for s in range(8):
            spk = f"spk{s:02d}"
            for u in range(per_spk):
                utt = f"{spk}-{dset}-{u:04d}"
                label = int(rng.integers(4))
                x = rng.standard_normal((int(rng.integers(20, 61)), 8)).astype(np.float32)
                x[:, label] += 2.0
                path = feats / f"{utt}.npy"
                np.save(path, x)
                scp.append(f"{utt} {path.as_posix()}")
                text.append(f"{utt} {label}")
                u2s.append(f"{utt} {spk}")
        (d / "feats.scp").write_text("\n".join(scp) + "\n")
        (d / "text").write_text("\n".join(text) + "\n")
        (d / "utt2spk").write_text("\n".join(u2s) + "\n")
        print(f"{d}: {len(scp)} utterances, {len(set(u2s))} speakers")


def shapes(d: Path) -> None:
    lines = []
    for line in (d / "feats.scp").read_text().splitlines():
        utt, path = line.split()
        lines.append(f"{utt} {np.load(path, mmap_mode='r').shape[0]},8")
    (d / "feats_shape").write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    if sys.argv[1] == "--shapes":
        shapes(Path(sys.argv[2]))
    else:
        prepare(Path(sys.argv[1]))
