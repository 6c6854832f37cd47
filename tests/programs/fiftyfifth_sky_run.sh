#!/usr/bin/env bash
# The run section of the fifty-fifth style's SkyPilot task (`sky launch --num-nodes 2 task.yaml`,
# as SkyPilot's distributed-training examples write it): SkyPilot runs it on every node, in the
# node's workdir, with SKYPILOT_NODE_RANK, SKYPILOT_NUM_NODES, SKYPILOT_NODE_IPS (one address a
# line, the head's first) and SKYPILOT_NUM_GPUS_PER_NODE set; it starts torchrun with a c10d
# rendezvous on the head (RDZV_PORT) and tests/programs/fiftyfifth_style_train.py with the data
# on the node's disk and checkpoints in the shared bucket ($SHARED). $PY: the Python with torch
# (default: python3); arguments are the script's.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
head_ip=$(echo "$SKYPILOT_NODE_IPS" | head -n1)
exec "${PY:-python3}" -m torch.distributed.run --nnodes "$SKYPILOT_NUM_NODES" \
  --node_rank "$SKYPILOT_NODE_RANK" --nproc_per_node "$SKYPILOT_NUM_GPUS_PER_NODE" \
  --rdzv_backend c10d --rdzv_endpoint "$head_ip:${RDZV_PORT:-29500}" \
  "$here/fiftyfifth_style_train.py" --data data --shared "${SHARED:-/checkpoints}" "$@"
