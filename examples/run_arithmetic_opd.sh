#!/usr/bin/env bash
# On-policy distillation on the main job's task (docs/distillation.md): the bundled SmolLM2-135M-Instruct
# student samples, a GRPO-trained teacher scores every sampled token, and the student is trained on
# the teacher's reverse KL as a per-token reward (verl's distillation.* keys; loss k1 under the
# policy-gradient loss, no task reward). CPU; about 15 s per step on 2 cores (AVX512-BF16).
#
# The teacher: the main job's actor, as a Hugging Face folder, e.g.
#   bash examples/run_arithmetic_grpo.sh trainer.default_local_dir=$HOME/ckpt/arith_grpo
#   hybridrl merge --local_dir $HOME/ckpt/arith_grpo/global_step_30/actor --target_dir $HOME/models/arith_teacher
#   TEACHER=$HOME/models/arith_teacher bash examples/run_arithmetic_opd.sh
# GKD instead: ... distillation.distillation_loss.loss_mode=forward_kl_topk \
#   distillation.distillation_loss.use_policy_gradient=false distillation.distillation_loss.topk=16
# Extra key=value arguments are passed on to the trainer (they win over the ones below).
set -euo pipefail
DATA_DIR=${DATA_DIR:-$HOME/data/arithmetic}
TEACHER=${TEACHER:?set TEACHER to the teacher model folder (see the comment at the top of this script)}
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
    distillation.enabled=true \
    distillation.teacher_models.teacher_model.model_path="$TEACHER" \
    distillation.distillation_loss.loss_mode=k1 \
    distillation.distillation_loss.use_policy_gradient=true \
    distillation.distillation_loss.use_task_rewards=false \
    trainer.device=cpu \
    trainer.logger="['console','file']" \
    trainer.project_name=hybridrl_examples \
    trainer.experiment_name=arithmetic_opd \
    trainer.total_training_steps=20 \
    trainer.val_before_train=True \
    trainer.test_freq=5 \
    trainer.save_freq=-1 \
    "$@"
