"""The prepare step of the hundredtwentysecond training-program style (tests/fixtures/real/
hundredtwentysecond-*), copied into each run's folder as local/compute_fbank_librispeech.py (the
stage of icefall's prepare.sh that writes data/fbank): synthetic LibriSpeech-like cuts, no audio
and nothing downloaded. Every cut is a MonoCut record of a jsonl.gz manifest
(data/fbank/librispeech_cuts_<part>.jsonl.gz) whose features are a numpy file
(data/fbank/<part>/<cut id>.npy, storage_type numpy_files, 16 log-mel-like bins every 10 ms):
each token of the upper-case transcript is given a spectral pattern held over its share of the
frames, plus noise, at the magnitude of Kaldi log-fbank energies. The token list
(data/lang_bpe_500/bpe.model, one piece a line: this port's stand-in for sentencepiece) has
<blk>, <sos/eos>, <unk>, the word boundary and the letters. --use-log-fbank false writes the
filter-bank energies themselves (no log), as a feature extractor configured so would.
"""
# ruff: noqa: SIM905, RUF046 (a prepare script as such scripts are written)

import argparse
import gzip
import json
import logging
import os
import random

import numpy as np

NUM_BINS = 16
WORDS = (
    "THE AND OF TO A IN HE THAT WAS IT HIS HAD WITH YOU AS FOR HER SHE NOT BUT AT ON IS HIM "
    "BE ALL THEY BY SO WHICH SAID FROM ONE WERE WOULD THERE WHEN MY LITTLE UPON OLD GREAT "
    "MAN COULD NIGHT HOUSE WATER LIGHT DOOR MOTHER FATHER CHILDREN RIVER MORNING"
).split()
PIECES = ["<blk>", "<sos/eos>", "<unk>", "\u2581"] + [chr(c) for c in range(65, 91)] + ["'"]
SPEAKERS = [(103, 1240), (1034, 121119), (1040, 133433), (1069, 133699), (1081, 125237),
            (1088, 134315), (1098, 133695), (1116, 132851)]  # fmt: skip


def str2bool(v: str) -> bool:
    return v.lower() in ("yes", "true", "t", "y", "1")


def pieces_of(text: str) -> list[int]:
    ids = []
    for w in text.split():
        ids.append(PIECES.index("\u2581"))
        ids.extend(PIECES.index(ch) for ch in w)
    return ids


def write_part(out: str, part: str, n: int, seed: int, lo: float, hi: float, short: int,
               use_log: bool) -> None:  # fmt: skip
    rng = random.Random(seed)
    nrs = np.random.default_rng(seed)
    patterns = np.random.default_rng(7).uniform(4.0, 12.0, size=(len(PIECES), NUM_BINS))
    feat_dir = os.path.join(out, part)
    os.makedirs(feat_dir, exist_ok=True)
    path = os.path.join(out, f"librispeech_cuts_{part}.jsonl.gz")
    with gzip.open(path, "wt") as f:
        for i in range(n):
            spk, chap = SPEAKERS[i % len(SPEAKERS)]
            rec = f"{spk}-{chap}-{i:04d}"
            cid = f"{rec}-{rng.randrange(1000, 9999)}"
            duration = round(rng.uniform(0.55, 0.85) if i < short else rng.uniform(lo, hi), 2)
            frames = int(round(duration * 100))
            nwords = max(1, int(duration * 1.6))
            text = " ".join(rng.choice(WORDS) for _ in range(nwords))
            ids = pieces_of(text)
            align = np.minimum(np.arange(frames) * len(ids) // frames, len(ids) - 1)
            feats = patterns[np.array(ids)[align]] + nrs.normal(0.0, 0.6, (frames, NUM_BINS))
            if not use_log:
                feats = np.exp(feats)
            np.save(os.path.join(feat_dir, f"{cid}.npy"), feats.astype(np.float32))
            cut = {
                "id": cid,
                "start": 0.0,
                "duration": duration,
                "channel": 0,
                "supervisions": [
                    {
                        "id": rec,
                        "recording_id": rec,
                        "start": 0.0,
                        "duration": duration,
                        "channel": 0,
                        "text": text,
                        "language": "English",
                        "speaker": f"{spk}",
                    }
                ],
                "features": {
                    "type": "kaldi-fbank",
                    "num_frames": frames,
                    "num_features": NUM_BINS,
                    "frame_shift": 0.01,
                    "sampling_rate": 16000,
                    "start": 0.0,
                    "duration": duration,
                    "storage_type": "numpy_files",
                    "storage_path": feat_dir,
                    "storage_key": f"{cid}.npy",
                    "channels": 0,
                },
                "recording": {"id": rec, "sampling_rate": 16000, "duration": duration},
                "type": "MonoCut",
            }
            f.write(json.dumps(cut) + "\n")
    logging.info(f"Wrote {n} cuts to {path}")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out-dir", default="data/fbank")
    parser.add_argument("--lang-dir", default="data/lang_bpe_500")
    parser.add_argument("--num-train", type=int, default=100)
    parser.add_argument("--num-dev", type=int, default=12)
    parser.add_argument("--num-short", type=int, default=0, help="train cuts under 1 s")
    parser.add_argument("--use-log-fbank", type=str2bool, default=True)
    args = parser.parse_args()
    logging.basicConfig(format="%(asctime)s %(levelname)s [%(filename)s:%(lineno)d] %(message)s",
                        level=logging.INFO)  # fmt: skip
    os.makedirs(args.lang_dir, exist_ok=True)
    with open(os.path.join(args.lang_dir, "bpe.model"), "w") as f:
        f.write("\n".join(PIECES) + "\n")
    use_log = args.use_log_fbank
    write_part(
        args.out_dir, "train-clean-100", args.num_train, 1, 1.0, 3.0, args.num_short, use_log
    )
    write_part(args.out_dir, "dev-clean", args.num_dev, 2, 1.0, 3.0, 0, use_log)
    write_part(args.out_dir, "dev-other", args.num_dev, 3, 1.0, 3.0, 0, use_log)


if __name__ == "__main__":
    main()
