#!/usr/bin/env bash
# The launch script of the forty-eighth style (as Megatron-LM's examples/gpt3/train_gpt3_*.sh):
# torchrun on one node, NPROC ranks (one pipeline stage each), a static rendezvous on
# 127.0.0.1:MASTER_PORT, the model and schedule arguments after the script. $PY is the Python
# with torch (default: python3).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
exec "${PY:-python3}" -m torch.distributed.run --nproc-per-node "${NPROC:-2}" \
  --master-addr 127.0.0.1 --master-port "${MASTER_PORT:-29500}" \
  "$here/fortyeighth_style_train.py" \
  --data-path data --num-layers 8 --hidden-size 32 --seq-length 16 \
  --micro-batch-size 4 --num-micro-batches 4 --log-interval 4 "$@"
