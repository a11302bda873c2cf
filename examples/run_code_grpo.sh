#!/usr/bin/env bash
# GRPO with code-execution rewards on CPU: the bundled SmolLM2-135M-Instruct writes small Python
# functions (the generated code_tasks: "Write a Python function `add(x)` that returns x plus 7.");
# each response's ```python block runs against the problem's test cases in the local sandbox
# (hybridrl.rewards.code; score = fraction of cases passed). Metrics: critic/score/mean, and the
# scorer's passed/total/reason per sample in the rollout dumps (trainer.rollout_data_dir=...).
# Measured on 2 shared cores with vLLM: 85-130 s a step (scoring 64 responses: 5-6 s), greedy
# validation 0.81 of the test cases before training; trainer.total_training_steps=2 took 4.5 min.
# DATA_DIR: where the parquet goes. Extra key=value arguments are passed on to the trainer,
# e.g. trainer.total_training_steps=2 for a quick check.
set -euo pipefail
DATA_DIR=${DATA_DIR:-$HOME/data/code_tasks}
ROLLOUT=${ROLLOUT:-$(python3 -c 'import importlib.util as u; print("vllm" if u.find_spec("vllm") else "hf")')}
[ -f "$DATA_DIR/train.parquet" ] || hybridrl preprocess code_tasks --local_dir "$DATA_DIR"

hybridrl train \
    algorithm.adv_estimator=grpo \
    data.train_files="$DATA_DIR/train.parquet" \
    data.val_files="$DATA_DIR/test.parquet" \
    data.train_batch_size=16 \
    data.val_batch_size=32 \
    data.max_prompt_length=192 \
    data.max_response_length=160 \
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
    trainer.experiment_name=code_grpo \
    trainer.total_training_steps=30 \
    trainer.val_before_train=True \
    trainer.test_freq=10 \
    trainer.save_freq=10 \
    trainer.max_actor_ckpt_to_keep=1 \
    "$@"
