#!/usr/bin/env bash
# Step 2 of RLHF (docs/rlhf.md): PPO on HH-RLHF prompts with the reward model of run_hh_rlhf_rm.sh.
# Four roles: the actor (SmolLM2-135M-Instruct, trained), its frozen reference (KL penalty in the
# reward), the critic (GAE values) and the reward model, which scores every response; HH-RLHF has
# no rule scorer, so the reward is the reward model's score alone (rm/score/mean in the metrics).
# Measured on 2 busy shared CPU cores (STEPS=2 data.train_batch_size=4
# actor_rollout_ref.actor.ppo_mini_batch_size=4 data.max_response_length=32): 300 s and 210 s per
# step, 9 minutes in all, rm/score/mean = critic/score/mean (no rule scorer for HH-RLHF).
# Progress shows in rm/score/mean per step; add trainer.test_freq=N for greedy validation on the
# held-out prompts (slow on a CPU: 231 of them).
# RM_PATH: the reward model (default: the latest checkpoint of run_hh_rlhf_rm.sh in RM_DIR).
# Extra key=value arguments are passed on to the trainer (they win over the ones below).
set -euo pipefail
DATA_DIR=${DATA_DIR:-$HOME/data/hh_rlhf}
RM_DIR=${RM_DIR:-checkpoints/hybridrl_examples/hh_rlhf_rm}
STEPS=${STEPS:-4}
if [ -z "${RM_PATH:-}" ]; then
    [ -f "$RM_DIR/latest_checkpointed_iteration.txt" ] || { echo "no reward model in $RM_DIR: run examples/run_hh_rlhf_rm.sh first" >&2; exit 1; }
    RM_PATH="$RM_DIR/global_step_$(cat "$RM_DIR/latest_checkpointed_iteration.txt")/huggingface"
fi

hybridrl train \
    algorithm.adv_estimator=gae \
    algorithm.use_kl_in_reward=True \
    algorithm.kl_ctrl.kl_coef=0.05 \
    data.train_files="$DATA_DIR/train.parquet" \
    data.val_files="$DATA_DIR/test.parquet" \
    data.train_batch_size=8 \
    data.val_batch_size=64 \
    data.max_prompt_length=256 \
    data.max_response_length=64 \
    data.filter_overlong_prompts=True \
    actor_rollout_ref.model.path=HuggingFaceTB/SmolLM2-135M-Instruct \
    actor_rollout_ref.model.enable_gradient_checkpointing=False \
    actor_rollout_ref.actor.optim.lr=1e-6 \
    actor_rollout_ref.actor.ppo_mini_batch_size=8 \
    actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=4 \
    actor_rollout_ref.actor.fsdp_config.mixed_precision.param_dtype=auto \
    actor_rollout_ref.rollout.n=1 \
    actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=8 \
    actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=8 \
    critic.model.path=HuggingFaceTB/SmolLM2-135M-Instruct \
    critic.model.enable_gradient_checkpointing=False \
    critic.model.fsdp_config.mixed_precision.param_dtype=auto \
    critic.optim.lr=1e-5 \
    critic.ppo_micro_batch_size_per_gpu=4 \
    reward_model.enable=True \
    reward_model.model.path="$RM_PATH" \
    reward_model.micro_batch_size_per_gpu=8 \
    reward_model.model.fsdp_config.mixed_precision.param_dtype=auto \
    trainer.device=auto \
    trainer.logger="['console','file']" \
    trainer.project_name=hybridrl_examples \
    trainer.experiment_name=hh_rlhf_ppo \
    trainer.total_training_steps="$STEPS" \
    trainer.val_before_train=False \
    trainer.test_freq=-1 \
    trainer.save_freq=-1 \
    "$@"
