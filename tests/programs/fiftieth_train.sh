#!/usr/bin/env bash
# The launch script of the fiftieth style (as open_clip's README recipe, `torchrun
# --nproc_per_node 4 -m open_clip_train.main --train-data '/data/cc12m/cc12m-train-{0000..2175}.tar'
# --train-num-samples ... --dataset-type webdataset --imagenet-val ... --zeroshot-frequency 1
# ...`): torchrun on one node, NPROC ranks, a static rendezvous on 127.0.0.1:MASTER_PORT, the
# training arguments after the script (later ones override these). $PY is the Python with torch,
# PIL and tqdm (default: python3).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
exec "${PY:-python3}" -m torch.distributed.run --nproc-per-node "${NPROC:-2}" \
  --master-addr 127.0.0.1 --master-port "${MASTER_PORT:-29500}" \
  "$here/fiftieth_style_train.py" \
  --train-data "shards/shard-{000000..000023}.tar" --train-num-samples 384 \
  --dataset-type webdataset --imagenet-val shards/val.tar --zeroshot-frequency 1 \
  --batch-size 16 --workers 2 --epochs 2 --lr 1e-3 --warmup 4 --wd 0.1 \
  --log-every-n-steps 4 --save-frequency 1 --dist-backend gloo --model TinyCLIP-C16 "$@"
