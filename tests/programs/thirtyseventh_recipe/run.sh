#!/usr/bin/env bash
# A speech recipe in the Kaldi/ESPnet manner (tests/programs/thirtyseventh_style_train.py is its
# local/train.py): numbered stages, options as --name value, the training job run through
# utils/run.pl with its log in exp/train/train.log.
# -e 'error', -u 'undefined variable', -o ... 'error in pipeline'
set -e
set -u
set -o pipefail

log() {
    local fname=${BASH_SOURCE[1]##*/}
    echo -e "$(date '+%Y-%m-%dT%H:%M:%S') (${fname}:${BASH_LINENO[0]}:${FUNCNAME[1]}) $*"
}
SECONDS=0

stage=1           # processes starts from the specified stage.
stop_stage=100    # processes is stopped at the specified stage.
nj=3              # number of training processes (one per device)
launcher=torchrun # torchrun or launch (the older torch.distributed.launch)
use_env=false     # launch only: pass --use_env
master_port=29500
resume=false
train_args=       # extra options of local/train.py
train_cmd=utils/run.pl
expdir=exp/train

# a parse_options.sh of our own: --name value sets $name (dashes read as underscores)
while [ $# -gt 0 ]; do
    case $1 in
        --*)
            name=${1#--}
            name=${name//-/_}
            if [ -z "${!name+x}" ]; then
                echo "$0: invalid option $1" >&2
                exit 1
            fi
            printf -v "${name}" '%s' "$2"
            shift 2
            ;;
        *) break ;;
    esac
done

log "$0 $*"

if [ ${stage} -le 1 ] && [ ${stop_stage} -ge 1 ]; then
    log "Stage 1: Data preparation for data/train, data/dev"
    python3 local/prepare_data.py data
fi

if [ ${stage} -le 2 ] && [ ${stop_stage} -ge 2 ]; then
    log "Stage 2: Feature shapes for data/train, data/dev"
    for dset in train dev; do
        python3 local/prepare_data.py --shapes "data/${dset}"
        log "data/${dset}: $(wc -l < "data/${dset}/feats_shape") utterances"
    done
fi

if [ ${stage} -le 3 ] && [ ${stop_stage} -ge 3 ]; then
    log "Stage 3: Network training: ${expdir}"
    mkdir -p "${expdir}"
    if [ "${launcher}" = launch ]; then
        launch_cmd="python3 -m torch.distributed.launch --nproc_per_node ${nj} --master_port ${master_port}"
        if "${use_env}"; then
            launch_cmd+=" --use_env"
        fi
    else
        launch_cmd="torchrun --nproc-per-node ${nj} --master-port ${master_port}"
    fi
    log "Training log: ${expdir}/train.log"
    # shellcheck disable=SC2086
    ${train_cmd} "${expdir}/train.log" \
        ${launch_cmd} local/train.py \
            --train_data data/train \
            --valid_data data/dev \
            --output_dir "${expdir}" \
            --resume "${resume}" \
            ${train_args}
fi

if [ ${stage} -le 4 ] && [ ${stop_stage} -ge 4 ]; then
    log "Stage 4: Snapshot selection: ${expdir}"
    last=$(find "${expdir}" -maxdepth 1 -name '[0-9]*.pth' | sort -V | tail -n 1)
    cp "${last}" "${expdir}/valid.loss.best.pth"
    log "${last} -> ${expdir}/valid.loss.best.pth"
fi

log "Successfully finished. [elapsed=${SECONDS}s]"
