#!/bin/bash
# timm's distributed_train.sh: the first argument is the number of processes, the rest go to the
# training script (tests/programs/seventeenth_style_train.py) unchanged.
NUM_PROC=$1
shift
torchrun --nproc_per_node=$NUM_PROC "$(dirname "$0")/seventeenth_style_train.py" "$@"
