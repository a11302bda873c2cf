#!/usr/bin/env bash
# GRPO of a GSM8K tool agent with the bundled SmolLM2-135M-Instruct, on CPU: the model may call
# calc_gsm8k_reward (checks an answer) and calculator in Hermes <tool_call> blocks, and a GSM8K
# teacher (interaction) tells it when an answer is wrong so that it can retry.
# Metrics: num_turns/*, tool_calls/mean, tool_errors/sum, critic/score/mean.
#
# GSM8K_JSONL: folder with GSM8K train.jsonl/test.jsonl (default: ../shared/data/gsm8k).
# Extra key=value arguments are passed on to the trainer.
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
GSM8K_JSONL=${GSM8K_JSONL:-$HERE/../../shared/data/gsm8k}
DATA_DIR=${DATA_DIR:-$HOME/data/gsm8k_tool}
[ -f "$DATA_DIR/train.parquet" ] || hybridrl preprocess gsm8k_tool \
    --input_dir "$GSM8K_JSONL" --local_dir "$DATA_DIR" --test_size 32 --interaction

hybridrl train \
    algorithm.adv_estimator=grpo \
    data.train_files="$DATA_DIR/train.parquet" \
    data.val_files="$DATA_DIR/test.parquet" \
    data.return_raw_chat=True \
    data.train_batch_size=4 \
    data.val_batch_size=32 \
    data.max_prompt_length=512 \
    data.max_response_length=384 \
    actor_rollout_ref.model.path=HuggingFaceTB/SmolLM2-135M-Instruct \
    actor_rollout_ref.model.enable_gradient_checkpointing=False \
    actor_rollout_ref.actor.optim.lr=1e-6 \
    actor_rollout_ref.actor.ppo_mini_batch_size=4 \
    actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=4 \
    actor_rollout_ref.actor.use_kl_loss=True \
    actor_rollout_ref.actor.kl_loss_coef=0.001 \
    actor_rollout_ref.actor.fsdp_config.mixed_precision.param_dtype=auto \
    actor_rollout_ref.rollout.n=4 \
    actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=8 \
    actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=8 \
    actor_rollout_ref.rollout.multi_turn.enable=True \
    actor_rollout_ref.rollout.multi_turn.tool_config_path="$HERE/config/gsm8k_tool_config.yaml" \
    actor_rollout_ref.rollout.multi_turn.interaction_config_path="$HERE/config/gsm8k_interaction_config.yaml" \
    actor_rollout_ref.rollout.multi_turn.max_user_turns=3 \
    actor_rollout_ref.rollout.multi_turn.max_tokens_per_turn=128 \
    trainer.device=auto \
    trainer.logger="['console','file']" \
    trainer.project_name=hybridrl_examples \
    trainer.experiment_name=gsm8k_tool_agent \
    trainer.total_training_steps=20 \
    trainer.val_before_train=True \
    trainer.test_freq=10 \
    trainer.save_freq=-1 \
    "$@"
