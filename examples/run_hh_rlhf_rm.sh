#!/usr/bin/env bash
# Step 1 of RLHF (docs/rlhf.md): train a reward model on Anthropic HH-RLHF preference pairs.
# The bundled SmolLM2-135M-Instruct gets a scalar head and learns -log sigmoid(r_chosen - r_rejected);
# the result is an HF folder that run_hh_rlhf_ppo.sh passes as reward_model.model.path.
# CPU is slow for this, so the defaults train on a slice: TRAIN_PAIRS pairs, VAL_PAIRS for accuracy.
# Measured on 2 busy shared CPU cores with TRAIN_PAIRS=128 VAL_PAIRS=64 data.max_length=128:
# 85-360 s per step of 16 pairs, 34 minutes in all; that little data only moves val/loss from
# 0.693 to 0.691 (val/accuracy 0.48, chance): a smoke test, not a useful reward model. On a GPU
# use every pair (TRAIN_PAIRS=-1 VAL_PAIRS=-1) and a few epochs (trainer.total_epochs=3).
# HH_JSONL: a folder with HH-RLHF *.jsonl.gz files (default: ../shared/data/hh_rlhf, which holds only
# harmless-base test: 10% of it is held out for validation). Without it the preprocess reads the hub.
# Extra key=value arguments are passed on to the trainer (they win over the ones below).
set -euo pipefail
HH_JSONL=${HH_JSONL:-$(dirname "$0")/../../shared/data/hh_rlhf}
DATA_DIR=${DATA_DIR:-$HOME/data/hh_rlhf}
TRAIN_PAIRS=${TRAIN_PAIRS:-256}
VAL_PAIRS=${VAL_PAIRS:-128}
RM_DIR=${RM_DIR:-checkpoints/hybridrl_examples/hh_rlhf_rm}
[ -f "$DATA_DIR/train.parquet" ] || hybridrl preprocess hh_rlhf --input_dir "$HH_JSONL" --local_dir "$DATA_DIR"

hybridrl rm \
    data.train_files="$DATA_DIR/train.parquet" \
    data.val_files="$DATA_DIR/test.parquet" \
    data.train_max_samples="$TRAIN_PAIRS" \
    data.val_max_samples="$VAL_PAIRS" \
    data.max_length=192 \
    data.truncation=left \
    data.train_batch_size=16 \
    data.micro_batch_size_per_gpu=4 \
    model.path=HuggingFaceTB/SmolLM2-135M-Instruct \
    model.fsdp_config.mixed_precision.param_dtype=auto \
    optim.lr=5e-5 \
    optim.warmup_steps_ratio=0.1 \
    optim.lr_scheduler=cosine \
    trainer.device=auto \
    trainer.logger="['console','file']" \
    trainer.project_name=hybridrl_examples \
    trainer.experiment_name=hh_rlhf_rm \
    trainer.default_local_dir="$RM_DIR" \
    trainer.total_epochs=1 \
    trainer.max_ckpt_to_keep=1 \
    "$@"

echo "reward model: $RM_DIR/global_step_$(cat "$RM_DIR/latest_checkpointed_iteration.txt")/huggingface"
echo "PPO with it: bash examples/run_hh_rlhf_ppo.sh"
