#!/usr/bin/env bash
# The sixtieth style's launcher, as examples/distributed/tensor_parallelism/run_example.sh:
# `bash sixtieth_run_example.sh [NPROC] [SCRIPT] [ARGS...]`, one node, a fixed rendezvous endpoint
# (RDZV_PORT here, 5972 in the example).

echo "Launching ${2:-sixtieth_style_train.py} with ${1:-4} processes per node"

torchrun --nnodes=1 --nproc_per_node=${1:-4} --rdzv_id=101 \
  --rdzv_endpoint="localhost:${RDZV_PORT:-5972}" "${2:-$(dirname "$0")/sixtieth_style_train.py}" "${@:3}"
