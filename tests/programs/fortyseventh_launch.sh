#!/usr/bin/env bash
# The forty-seventh style's launcher, as the DLRM / torchrec examples' READMEs give it: one
# torchrun agent on this machine, N processes, a fixed master port. Usage:
#   fortyseventh_launch.sh NPROC PORT [train args...]   ($TORCHRUN: the torchrun to run)
set -euo pipefail
nproc=$1
port=$2
shift 2
exec "${TORCHRUN:-torchrun}" --nnodes 1 --nproc_per_node "$nproc" --master_port "$port" \
  "$(dirname "$0")/fortyseventh_style_train.py" "$@"
