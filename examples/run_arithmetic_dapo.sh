#!/usr/bin/env bash
# DAPO on the bundled SmolLM2-135M-Instruct, generated arithmetic (the main job's task), CPU:
# verl-recipe's dapo/run_dapo_qwen2.5_32b.sh with the same keys and the sizes cut to this machine
# (docs/algorithms.md, DAPO): clip-higher, token-mean loss, dynamic sampling (filter_groups on acc)
# and overlong reward shaping. Extra key=value arguments are passed on to the trainer.
set -euo pipefail
DATA_DIR=${DATA_DIR:-$HOME/data/arithmetic}
ROLLOUT=${ROLLOUT:-$(python3 -c 'import importlib.util as u; print("vllm" if u.find_spec("vllm") else "hf")')}
[ -f "$DATA_DIR/train.parquet" ] || hybridrl preprocess arithmetic --local_dir "$DATA_DIR"

max_prompt_length=128
max_response_length=48
hybridrl train \
    data.train_files="$DATA_DIR/train.parquet" \
    data.val_files="$DATA_DIR/test.parquet" \
    data.truncation=left \
    data.max_prompt_length=$max_prompt_length \
    data.max_response_length=$max_response_length \
    data.gen_batch_size=24 \
    data.train_batch_size=16 \
    data.val_batch_size=64 \
    actor_rollout_ref.rollout.n=4 \
    algorithm.adv_estimator=grpo \
    algorithm.use_kl_in_reward=False \
    algorithm.kl_ctrl.kl_coef=0.0 \
    actor_rollout_ref.actor.use_kl_loss=False \
    actor_rollout_ref.actor.kl_loss_coef=0.0 \
    actor_rollout_ref.actor.clip_ratio_low=0.2 \
    actor_rollout_ref.actor.clip_ratio_high=0.28 \
    actor_rollout_ref.actor.clip_ratio_c=10.0 \
    algorithm.filter_groups.enable=True \
    algorithm.filter_groups.max_num_gen_batches=10 \
    algorithm.filter_groups.metric=acc \
    actor_rollout_ref.actor.use_dynamic_bsz=True \
    actor_rollout_ref.actor.ppo_max_token_len_per_gpu=$(((max_prompt_length + max_response_length) * 16)) \
    actor_rollout_ref.model.path=HuggingFaceTB/SmolLM2-135M-Instruct \
    actor_rollout_ref.model.enable_gradient_checkpointing=False \
    actor_rollout_ref.actor.optim.lr=1e-5 \
    actor_rollout_ref.actor.optim.weight_decay=0.1 \
    actor_rollout_ref.actor.ppo_mini_batch_size=16 \
    actor_rollout_ref.actor.entropy_coeff=0 \
    actor_rollout_ref.actor.grad_clip=1.0 \
    actor_rollout_ref.actor.loss_agg_mode=token-mean \
    actor_rollout_ref.actor.fsdp_config.mixed_precision.param_dtype=auto \
    actor_rollout_ref.rollout.name="$ROLLOUT" \
    actor_rollout_ref.rollout.temperature=1.0 \
    actor_rollout_ref.rollout.top_p=1.0 \
    actor_rollout_ref.rollout.dtype=auto \
    actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=32 \
    reward_model.reward_manager=dapo \
    reward_model.overlong_buffer.enable=True \
    reward_model.overlong_buffer.len=16 \
    reward_model.overlong_buffer.penalty_factor=1.0 \
    trainer.device=cpu \
    trainer.logger="['console','file']" \
    trainer.project_name=hybridrl_examples \
    trainer.experiment_name=arithmetic_dapo \
    trainer.total_training_steps=30 \
    trainer.val_before_train=True \
    trainer.test_freq=10 \
    trainer.save_freq=10 \
    trainer.max_actor_ckpt_to_keep=1 \
    "$@"
