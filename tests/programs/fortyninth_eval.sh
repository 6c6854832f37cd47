#!/usr/bin/env bash
# The launch script of the forty-ninth style (as lm-evaluation-harness's multi-GPU recipe,
# `torchrun --nproc-per-node N -m lm_eval ...`): torchrun on one node, NPROC ranks, a static
# rendezvous on 127.0.0.1:MASTER_PORT, the harness's arguments after the script. $PY is the
# Python with torch and tqdm (default: python3).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
exec "${PY:-python3}" -m torch.distributed.run --nproc-per-node "${NPROC:-2}" \
  --master-addr 127.0.0.1 --master-port "${MASTER_PORT:-29500}" \
  "$here/fortyninth_style_train.py" \
  --model ckpt/model.pt --data data/eval.jsonl --batch-size 4 --output-path results "$@"
