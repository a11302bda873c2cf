#!/usr/bin/env bash
# PPO (GAE with a critic, KL penalty in the reward) on GSM8K with the bundled
# SmolLM2-135M-Instruct: actor, reference and critic. See run_gsm8k_grpo.sh for the data
# variables. Extra key=value arguments are passed on to the trainer.
set -euo pipefail
GSM8K_JSONL=${GSM8K_JSONL:-$(dirname "$0")/../../shared/data/gsm8k}
DATA_DIR=${DATA_DIR:-$HOME/data/gsm8k}
TEST_SIZE=${TEST_SIZE:-64}
[ -f "$DATA_DIR/train.parquet" ] || python "$(dirname "$0")/data_preprocess/gsm8k.py" \
    --input_dir "$GSM8K_JSONL" --local_dir "$DATA_DIR" --test_size "$TEST_SIZE"

hybridrl train \
    algorithm.adv_estimator=gae \
    algorithm.use_kl_in_reward=True \
    algorithm.kl_ctrl.type=adaptive \
    algorithm.kl_ctrl.kl_coef=0.01 \
    data.train_files="$DATA_DIR/train.parquet" \
    data.val_files="$DATA_DIR/test.parquet" \
    data.train_batch_size=16 \
    data.val_batch_size=64 \
    data.max_prompt_length=256 \
    data.max_response_length=256 \
    data.filter_overlong_prompts=True \
    actor_rollout_ref.model.path=HuggingFaceTB/SmolLM2-135M-Instruct \
    actor_rollout_ref.model.enable_gradient_checkpointing=False \
    actor_rollout_ref.actor.optim.lr=1e-6 \
    actor_rollout_ref.actor.ppo_mini_batch_size=8 \
    actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=8 \
    actor_rollout_ref.actor.fsdp_config.mixed_precision.param_dtype=auto \
    actor_rollout_ref.rollout.n=1 \
    actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=16 \
    actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=16 \
    critic.model.path=HuggingFaceTB/SmolLM2-135M-Instruct \
    critic.model.enable_gradient_checkpointing=False \
    critic.model.fsdp_config.mixed_precision.param_dtype=auto \
    critic.optim.lr=1e-5 \
    critic.ppo_micro_batch_size_per_gpu=8 \
    trainer.critic_warmup=0 \
    trainer.device=auto \
    trainer.logger="['console','file']" \
    trainer.project_name=hybridrl_examples \
    trainer.experiment_name=gsm8k_ppo \
    trainer.total_training_steps=10 \
    trainer.val_before_train=True \
    trainer.test_freq=10 \
    trainer.save_freq=10 \
    trainer.max_actor_ckpt_to_keep=1 \
    "$@"
