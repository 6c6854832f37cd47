#!/usr/bin/bash
# torchtitan's run_train.sh, as a user's checkout has it (the rendezvous port from
# RDZV_PORT instead of localhost:0, so that a run keeps to its port)
set -ex

# use envs as local overwrites for convenience
# e.g.
# LOG_RANK=0,1 NGPU=4 ./run_train.sh
NGPU=${NGPU:-"8"}
export LOG_RANK=${LOG_RANK:-0}
CONFIG_FILE=${CONFIG_FILE:-"./train_configs/debug_pp.toml"}
TRAIN_FILE=${TRAIN_FILE:-"titan_train"}

PYTORCH_CUDA_ALLOC_CONF="expandable_segments:True" \
torchrun --nproc_per_node=${NGPU} --rdzv_backend c10d --rdzv_endpoint="localhost:${RDZV_PORT:-0}" \
--local-ranks-filter ${LOG_RANK} --role rank --tee 3 \
-m ${TRAIN_FILE} --job.config_file ${CONFIG_FILE} "$@"
