#!/usr/bin/env bash
# Stage 4 of the fifty-third style's recipe run.sh (as a WeNet examples/*/s0/run.sh: "torchrun
# --nnodes=1 --nproc_per_node=$num_gpus --rdzv_id=$job_id --rdzv_backend=c10d
# --rdzv_endpoint=$HOST_NODE_ADDR wenet/bin/train.py --config $train_config --data_type raw
# --train_data data/$train_set/data.list --cv_data data/dev/data.list --model_dir $dir ..."),
# run in the recipe folder: conf/train_conformer.yaml, data/{train,dev}/data.list. NUM_GPUS
# ranks (default 3), PORT the rendezvous endpoint's port, TEE=1 for torchrun's --tee 3, $PY the
# Python with torch and yaml (default: python3); arguments after the defaults are the script's.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
num_gpus=${NUM_GPUS:-3}
tee=()
if [ -n "${TEE:-}" ]; then
  tee=(--tee 3)
fi
dir=exp/conformer
mkdir -p $dir
exec "${PY:-python3}" -m torch.distributed.run --nnodes=1 --nproc_per_node="$num_gpus" \
  --rdzv_id=2023 --rdzv_backend=c10d --rdzv_endpoint="localhost:${PORT:-29400}" "${tee[@]}" \
  "$here/fiftythird_style_train.py" \
  --config conf/train_conformer.yaml --data_type raw --train_data data/train/data.list \
  --cv_data data/dev/data.list --model_dir $dir --num_workers 0 --dist_backend gloo "$@"
