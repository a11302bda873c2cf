#!/usr/bin/env bash
# On-policy distillation on the main job's task (docs/distillation.md): the bundled SmolLM2-135M-Instruct
# student samples, a GRPO-trained teacher scores every sampled token, and the student is trained on
# the teacher's reverse KL as a per-token reward (verl's distillation.* keys; loss k1 under the
# policy-gradient loss, no task reward). CPU; about 30 s per step on 2 cores (AVX512-BF16, measured with
# benchmarks/opd_compare.py, docs/distillation.md).
#
# The teacher: the main job's actor, as a Hugging Face folder, e.g.
#   bash examples/run_arithmetic_grpo.sh trainer.default_local_dir=$HOME/ckpt/arith_grpo
#   hybridrl merge --local_dir $HOME/ckpt/arith_grpo/global_step_30/actor --target_dir $HOME/models/arith_teacher
#   TEACHER=$HOME/models/arith_teacher bash examples/run_arithmetic_opd.sh
# GKD instead: ... distillation.distillation_loss.loss_mode=forward_kl_topk \
#   distillation.distillation_loss.use_policy_gradient=false distillation.distillation_loss.topk=16
# Extra key=value arguments are passed on to the trainer (they win over the ones below).
set -euo pipefail
TEACHER=${TEACHER:?set TEACHER to the teacher model folder (see the comment at the top of this script)}

# the main job's settings (its script), with the distillation keys and this run's schedule on top
bash "$(dirname "$0")/run_arithmetic_grpo.sh" \
    distillation.enabled=true \
    distillation.teacher_models.teacher_model.model_path="$TEACHER" \
    distillation.distillation_loss.loss_mode=k1 \
    distillation.distillation_loss.use_policy_gradient=true \
    distillation.distillation_loss.use_task_rewards=false \
    trainer.experiment_name=arithmetic_opd \
    trainer.total_training_steps=20 \
    trainer.test_freq=5 \
    trainer.save_freq=-1 \
    "$@"
