"""On-policy distillation end to end (issue 32 items 3 and 4): the tiny random model as student and
teacher on gsm8k, two steps with k1 as a policy-gradient reward and two with forward_kl_topk; the
distillation metrics (verl's names) are there and finite, timing_s/teacher is, and with identical
student and teacher the reverse-KL loss of step 1 is ~0."""

import json
import math
import os

import pytest

from hybridrl.trainer.main_ppo import main

A = "actor_rollout_ref.actor"
D = "distillation"
TOPK_METRICS = ("distillation/overlap_ratio", "distillation/student_mass", "distillation/teacher_mass")


def _overrides(gsm8k_parquet, model, out, device, loss):
    return [
        f"data.train_files={gsm8k_parquet}/train.parquet",
        "data.val_files=null",
        "data.train_batch_size=4",
        "data.max_prompt_length=256",
        "data.filter_overlong_prompts=True",
        "data.max_response_length=8",
        f"actor_rollout_ref.model.path={model}",
        f"{A}.ppo_mini_batch_size=4",
        f"{A}.ppo_micro_batch_size_per_gpu=4",
        f"{A}.optim.lr=1e-4",
        f"{A}.fsdp_config.mixed_precision.param_dtype=fp32",
        "actor_rollout_ref.rollout.dtype=float32",
        "actor_rollout_ref.rollout.n=2",
        "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=8",
        "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=8",
        "algorithm.adv_estimator=grpo",
        f"{D}.enabled=true",
        f"{D}.n_gpus_per_node=1",
        f"{D}.nnodes=0",  # the teacher in the trainer's workers (> 0: a Ray pool of its own)
        f"{D}.teacher_models.teacher_model.model_path={model}",
        f"{D}.teacher_models.teacher_model.inference.tensor_model_parallel_size=1",
        *loss,
        f"trainer.device={device}",
        "trainer.logger=['file']",
        f"trainer.default_local_dir={out}",
        "trainer.total_training_steps=2",
        "trainer.test_freq=-1",
        "trainer.save_freq=-1",
        "trainer.val_before_train=False",
    ]


def _rows(out):
    with open(os.path.join(out, "metrics.jsonl")) as f:
        return [json.loads(line) for line in f]


@pytest.mark.slow
def test_opd_k1_reward_then_forward_kl_topk(gsm8k_parquet, tiny_model_dir, tmp_path, device):
    k1 = [
        f"{D}.distillation_loss.loss_mode=k1",
        f"{D}.distillation_loss.use_policy_gradient=true",
        f"{D}.distillation_loss.use_task_rewards=false",
    ]
    out = tmp_path / "k1"
    assert main(_overrides(gsm8k_parquet, tiny_model_dir, out, device, k1)) == 0
    rows = _rows(out)
    assert len(rows) == 2
    for row in rows:
        for key in ("distillation/loss", "distillation/loss_min", "distillation/loss_max", "distillation/abs_loss"):
            assert math.isfinite(row[key]), key
        assert row["timing_s/teacher"] > 0
    first = rows[0]  # the student is the teacher: reverse KL 0 on every token
    assert abs(first["distillation/abs_loss"]) < 1e-3
    assert abs(first["distillation/loss"]) < 1e-3

    topk = [f"{D}.distillation_loss.loss_mode=forward_kl_topk", f"{D}.distillation_loss.topk=8"]
    out = tmp_path / "topk"
    assert main(_overrides(gsm8k_parquet, tiny_model_dir, out, device, topk)) == 0
    rows = _rows(out)
    assert len(rows) == 2
    for row in rows:
        for key in ("distillation/loss", "distillation/loss_min", "distillation/loss_max", *TOPK_METRICS):
            assert math.isfinite(row[key]), key
    assert rows[0]["distillation/overlap_ratio"] > 0.99  # same model, same top-k


@pytest.mark.slow
def test_opd_routes_samples_to_the_teacher_of_their_data_source(gsm8k_parquet, tiny_model_dir, tmp_path, device):
    teachers = f"{D}.teacher_models"
    two = [
        f"{teachers}.teacher_model.model_path=null",
        f"+{teachers}.gsm.key=openai/gsm8k",
        f"+{teachers}.gsm.model_path={tiny_model_dir}",
        f"+{teachers}.other.key=another/source",
        f"+{teachers}.other.model_path={tiny_model_dir}",
    ]
    out = tmp_path / "two"
    overrides = [o for o in _overrides(gsm8k_parquet, tiny_model_dir, out, device, two) if "teacher_model." not in o]
    overrides = [o.replace("total_training_steps=2", "total_training_steps=1") for o in overrides] + two[:1]
    assert main(overrides) == 0
    (row,) = _rows(out)
    assert abs(row["distillation/loss"]) < 1e-3  # k3, direct: every sample scored by an identical teacher
    assert math.isfinite(row["timing_s/teacher"])


@pytest.mark.slow
def test_opd_on_two_ray_workers_with_a_sharded_teacher(ray_cluster, gsm8k_parquet, tiny_model_dir, tmp_path):
    """The teacher FSDP2-sharded over two Ray workers like the reference; two teachers, so every
    rank runs each teacher on its rows (the collectives of a sharded teacher need every rank)."""
    pytest.importorskip("ray")
    teachers = f"{D}.teacher_models"
    extra = [
        f"+{teachers}.gsm.key=openai/gsm8k",
        f"+{teachers}.gsm.model_path={tiny_model_dir}",
        f"+{teachers}.other.key=another/source",
        f"+{teachers}.other.model_path={tiny_model_dir}",
        f"{D}.distillation_loss.loss_mode=forward_kl_topk",
        f"{D}.distillation_loss.topk=8",
        "trainer.backend=ray",
        "trainer.nnodes=1",
        "trainer.n_gpus_per_node=2",
        f"{A}.ppo_micro_batch_size_per_gpu=2",
        "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=4",
        "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=4",
    ]
    out = tmp_path / "ray"
    overrides = [o for o in _overrides(gsm8k_parquet, tiny_model_dir, out, "cpu", extra) if "teacher_model." not in o]
    overrides = [o.replace("total_training_steps=2", "total_training_steps=1") for o in overrides]
    assert main(overrides) == 0
    (row,) = _rows(out)
    assert abs(row["distillation/loss"]) < 1e-3 and row["distillation/overlap_ratio"] > 0.99


@pytest.mark.slow
def test_opd_with_the_teacher_on_a_ray_pool_of_its_own(ray_cluster, gsm8k_parquet, tiny_model_dir, tmp_path):
    """distillation.nnodes=1 x n_gpus_per_node=2: the teacher sharded over two workers of its own
    pool, the student on one trainer worker (whose worker holds no teacher: a call there fails). The
    pool scores the student's tokens as the student would (identical models: loss ~0, overlap ~1)."""
    pytest.importorskip("ray")
    extra = [
        f"{D}.distillation_loss.loss_mode=forward_kl_topk",
        f"{D}.distillation_loss.topk=8",
        "trainer.backend=ray",
        "trainer.nnodes=1",
        "trainer.n_gpus_per_node=1",
        "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=2",
    ]
    out = tmp_path / "pool"
    overrides = _overrides(gsm8k_parquet, tiny_model_dir, out, "cpu", extra)
    overrides = [
        o.replace(f"{D}.nnodes=0", f"{D}.nnodes=1").replace(f"{D}.n_gpus_per_node=1", f"{D}.n_gpus_per_node=2")
        for o in overrides
    ]
    overrides = [o.replace("total_training_steps=2", "total_training_steps=1") for o in overrides]
    assert main(overrides) == 0
    (row,) = _rows(out)
    assert abs(row["distillation/loss"]) < 1e-3 and row["distillation/overlap_ratio"] > 0.99
    assert row["perf/cpu_memory_used_gb"] > 0 and math.isfinite(row["timing_s/teacher"])
