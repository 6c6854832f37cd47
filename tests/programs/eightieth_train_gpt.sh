#!/bin/bash
# Launch script of the eightieth style (tests/programs/eightieth_style_train.py, linked as
# pretrain_gpt.py in the run's folder), written as Megatron-LM's
# examples/gpt3/train_gpt3_175b_distributed.sh is, scaled down to a tiny GPT on CPU (gloo).
# Usage: bash train_gpt.sh CHECKPOINT_PATH DATA_PATH [extra pretrain_gpt.py arguments]

GPUS_PER_NODE=${GPUS_PER_NODE:-2}
MASTER_ADDR=${MASTER_ADDR:-localhost}
MASTER_PORT=${MASTER_PORT:-6000}
NUM_NODES=${NUM_NODES:-1}
NODE_RANK=${NODE_RANK:-0}

CHECKPOINT_PATH=$1
DATA_PATH=$2
shift 2

DISTRIBUTED_ARGS=(
    --nproc_per_node "$GPUS_PER_NODE"
    --nnodes "$NUM_NODES"
    --node_rank "$NODE_RANK"
    --master_addr "$MASTER_ADDR"
    --master_port "$MASTER_PORT"
)

GPT_MODEL_ARGS=(
    --num-layers 2
    --hidden-size 64
    --num-attention-heads 4
    --seq-length 32
    --max-position-embeddings 32
)

TRAINING_ARGS=(
    --micro-batch-size 4
    --global-batch-size 16
    --train-iters 30
    --weight-decay 0.1
    --adam-beta1 0.9
    --adam-beta2 0.95
    --clip-grad 1.0
    --lr 3.0e-3
    --lr-decay-style cosine
    --min-lr 3.0e-4
    --lr-warmup-iters 5
    --distributed-backend gloo
    --distributed-timeout-minutes 0.25
    --overlap-grad-reduce
    --use-distributed-optimizer
    --ddp-bucket-size 40000
    --num-workers 1
)

MODEL_PARALLEL_ARGS=(
    --tensor-model-parallel-size 1
    --pipeline-model-parallel-size 1
)

DATA_ARGS=(
    --data-path "$DATA_PATH"
    --tokenizer-type NullTokenizer
    --vocab-size 500
    --split 969,30,1
)

EVAL_AND_LOGGING_ARGS=(
    --log-interval 5
    --save-interval 15
    --eval-interval 15
    --save "$CHECKPOINT_PATH"
    --load "$CHECKPOINT_PATH"
    --eval-iters 2
)

torchrun "${DISTRIBUTED_ARGS[@]}" pretrain_gpt.py \
    "${GPT_MODEL_ARGS[@]}" \
    "${TRAINING_ARGS[@]}" \
    "${MODEL_PARALLEL_ARGS[@]}" \
    "${DATA_ARGS[@]}" \
    "${EVAL_AND_LOGGING_ARGS[@]}" \
    "$@"
