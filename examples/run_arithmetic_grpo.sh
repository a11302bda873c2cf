#!/usr/bin/env bash
# The main job: GRPO on the bundled SmolLM2-135M-Instruct, generated arithmetic, CPU.
# About 8-9 minutes on 2 cores (AVX512-BF16 CPU); critic/score/mean rises from ~0.2 to ~0.6 within the run.
# Extra key=value arguments are passed on to the trainer (they win over the ones below).
set -euo pipefail
DATA_DIR=${DATA_DIR:-$HOME/data/arithmetic}
# The faster engine by measurement (docs/performance.md): vLLM when its extra is installed
# (generation 1.75x faster, steps 15% faster here), else the HF engine.
ROLLOUT=${ROLLOUT:-$(python3 -c 'import importlib.util as u; print("vllm" if u.find_spec("vllm") else "hf")')}
[ -f "$DATA_DIR/train.parquet" ] || hybridrl preprocess arithmetic --local_dir "$DATA_DIR"

hybridrl train \
    algorithm.adv_estimator=grpo \
    data.train_files="$DATA_DIR/train.parquet" \
    data.val_files="$DATA_DIR/test.parquet" \
    data.train_batch_size=16 \
    data.val_batch_size=64 \
    data.max_prompt_length=128 \
    data.max_response_length=48 \
    actor_rollout_ref.model.path=HuggingFaceTB/SmolLM2-135M-Instruct \
    actor_rollout_ref.model.enable_gradient_checkpointing=False \
    actor_rollout_ref.actor.optim.lr=1e-5 \
    actor_rollout_ref.actor.ppo_mini_batch_size=16 \
    actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=16 \
    actor_rollout_ref.actor.use_kl_loss=False \
    actor_rollout_ref.actor.entropy_coeff=0 \
    actor_rollout_ref.actor.fsdp_config.mixed_precision.param_dtype=auto \
    actor_rollout_ref.rollout.name="$ROLLOUT" \
    actor_rollout_ref.rollout.n=4 \
    actor_rollout_ref.rollout.temperature=1.0 \
    actor_rollout_ref.rollout.dtype=auto \
    actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=32 \
    trainer.device=cpu \
    trainer.logger="['console','file']" \
    trainer.project_name=hybridrl_examples \
    trainer.experiment_name=arithmetic_grpo \
    trainer.total_training_steps=30 \
    trainer.val_before_train=True \
    trainer.test_freq=10 \
    trainer.save_freq=10 \
    trainer.max_actor_ckpt_to_keep=1 \
    "$@"
