"""The prepare step of the hundredtwenty-third style (tests/programs/hundredtwentythird_style_train.py),
copied into each run's folder as tools/preprocess_data.py: nanotron's tokenization of a corpus into
a nanoset folder, re-created without datatrove or a tokenizer download. It writes NUM_FILES token
files NNN_<name>.ds of uint16 tokens (a synthetic "language": a fixed Markov chain over a 256-token
vocabulary, documents separated by the eos token 2) with each file's .ds.metadata (the tokenizer
and the token count), as datatrove's DocumentTokenizer leaves them.
"""

import argparse
import os

import numpy as np


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--output-folder", required=True)
    parser.add_argument("--name", default="tiny_corpus")
    parser.add_argument("--num-files", type=int, default=2)
    parser.add_argument("--tokens-per-file", type=int, default=6145)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    os.makedirs(args.output_folder, exist_ok=True)
    rng = np.random.default_rng(args.seed)
    vocab = 256
    # each token has 4 likely successors: a corpus a tiny model can learn
    successors = rng.integers(3, vocab, size=(vocab, 4))
    for k in range(args.num_files):
        tokens = np.empty(args.tokens_per_file, dtype=np.uint16)
        tok = 1
        for i in range(args.tokens_per_file):
            if rng.random() < 0.01:
                tok = 2
            elif tok == 2:
                tok = 1
            else:
                tok = int(successors[tok, rng.integers(0, 4)])
            tokens[i] = tok
        path = os.path.join(args.output_folder, f"{k:03d}_{args.name}.ds")
        tokens.tofile(path)
        with open(path + ".metadata", "w") as f:
            f.write(
                f"tokenizer_name_or_path=gpt2-tiny-256\ntoken_size=2\ntoken_count={len(tokens)}\n"
            )
        print(f"Wrote {len(tokens)} tokens to {path}")


if __name__ == "__main__":
    main()
