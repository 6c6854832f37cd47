#!/usr/bin/env bash
# The launch script of the forty-sixth style (as OpenRLHF's examples/scripts/train_ppo_*.sh):
# torchrun on one node, NPROC ranks, a static rendezvous on 127.0.0.1:MASTER_PORT, the PPO
# arguments after the script. $PY is the Python with torch (default: python3).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
exec "${PY:-python3}" -m torch.distributed.run --nproc-per-node "${NPROC:-2}" \
  --master-addr 127.0.0.1 --master-port "${MASTER_PORT:-29500}" \
  "$here/fortysixth_style_train.py" \
  --prompt_data data --reward_pretrain data/reward_model.pt --save_path ckpt \
  --rollout_batch_size 4 --generate_max_len 16 --init_kl_coef 0.05 "$@"
