"""The ``distillation`` section (issue 32 item 1): verl's keys and defaults load, a verl on-policy
distillation command types with only the module name changed, and the teacher rules are one line."""

import pytest

from hybridrl.config import ConfigError, load_config
from hybridrl.config.precision import runs_on_ray
from hybridrl.config.verl_compat import verl_keys
from hybridrl.errors import UserError
from hybridrl.trainer.ppo.config import typed_ppo_config
from hybridrl.trainer.ppo.config_check import _check_distillation
from hybridrl.trainer.run.worker_groups import own_pools
from hybridrl.workers.config.distillation import distillation_loss_config, resolve_teachers

TEACHERS = "distillation.teacher_models"
# a verl OPD command's distillation keys (verl 0.9's distillation.yaml)
VERL_OPD = [
    "distillation.enabled=true",
    "distillation.n_gpus_per_node=1",
    "distillation.nnodes=1",
    f"{TEACHERS}.teacher_model.model_path=/models/teacher",
    f"{TEACHERS}.teacher_model.inference.tensor_model_parallel_size=1",
    f"{TEACHERS}.teacher_model.inference.gpu_memory_utilization=0.3",
    "distillation.distillation_loss.loss_mode=k1",
    "distillation.distillation_loss.use_policy_gradient=true",
    "distillation.distillation_loss.use_task_rewards=false",
]


def typed(overrides):
    return typed_ppo_config(load_config(overrides, resolve_auto_dtypes=False))


def test_the_defaults_are_verls_yaml():
    section = typed([]).distillation
    verl = verl_keys("verl_keys_0.9.1.txt")
    for key, default in verl.items():
        if not key.startswith("distillation.") or isinstance(default, str) and default.startswith("${"):
            continue
        node = section
        for part in key.split(".")[1:]:
            node = node[part]
        assert node == default, key
    assert section.enabled is False and section.teacher_key == "data_source"


def test_a_verl_opd_command_types_and_resolves_one_teacher():
    config = typed(VERL_OPD)
    section = config.distillation
    teachers = resolve_teachers(section)
    assert list(teachers) == ["default"] and teachers["default"].model_path == "/models/teacher"
    loss = distillation_loss_config(section.distillation_loss)
    assert (loss.loss_mode, loss.use_policy_gradient, loss.use_task_rewards) == ("k1", True, False)
    assert teachers["default"].inference.temperature == config.actor_rollout_ref.rollout.temperature
    # verl's teacher pool (nnodes x n_gpus_per_node) is a Ray pool of its own here too
    _check_distillation(config)
    assert own_pools(config) == {"teacher": [1]} and runs_on_ray(config)
    assert own_pools(typed([*VERL_OPD, "distillation.nnodes=0"])) == {}  # verl's default: in the trainer's workers


def test_several_teachers_route_by_key():
    config = typed(
        [
            "distillation.enabled=true",
            f"+{TEACHERS}.math.key=openai/gsm8k",
            f"+{TEACHERS}.math.model_path=/m1",
            f"+{TEACHERS}.geo.key=geometry3k",
            f"+{TEACHERS}.geo.model_path=/m2",
        ]
    )
    teachers = resolve_teachers(config.distillation)
    assert {k: t.model_path for k, t in teachers.items()} == {"openai/gsm8k": "/m1", "geometry3k": "/m2"}


@pytest.mark.parametrize(
    "overrides, message",
    [
        (["distillation.enabled=true"], f"needs a teacher: set {TEACHERS}.teacher_model.model_path"),
        (
            [
                "distillation.enabled=true",
                f"{TEACHERS}.teacher_model.model_path=/m0",
                f"+{TEACHERS}.teacher_model2.key=b",
                f"+{TEACHERS}.teacher_model2.model_path=/m2",
            ],
            "verl silently drops teacher_model then - give it another name",
        ),
        (
            [
                "distillation.enabled=true",
                f"+{TEACHERS}.a.key=x",
                f"+{TEACHERS}.a.model_path=/m1",
                f"+{TEACHERS}.b.model_path=/m2",
            ],
            f"{TEACHERS}.b.key is not set",
        ),
        (
            [
                "distillation.enabled=true",
                f"+{TEACHERS}.a.key=x",
                f"+{TEACHERS}.a.model_path=/m1",
                f"+{TEACHERS}.b.key=x",
                f"+{TEACHERS}.b.model_path=/m2",
            ],
            "is the key of another teacher",
        ),
        (
            [
                "distillation.enabled=true",
                f"{TEACHERS}.teacher_model.model_path=/m",
                "trainer.one_step_off_policy=true",
            ],
            "synchronous trainer only",
        ),
        (
            [
                "distillation.enabled=true",
                f"{TEACHERS}.teacher_model.model_path=/m",
                "distillation.distillation_loss.loss_mode=k9",
            ],
            "k9",
        ),
        (
            [
                "distillation.enabled=true",
                f"{TEACHERS}.teacher_model.model_path=/m",
                "distillation.distillation_loss.loss_mode=forward_kl_topk",
                "actor_rollout_ref.actor.ulysses_sequence_parallel_size=2",
            ],
            "a top-k loss needs each row's logits on one rank",
        ),
        (
            ["distillation.enabled=true", f"{TEACHERS}.teacher_model.model_path=/m", "distillation.nnodes=-1"],
            "distillation.nnodes=-1 must be an integer >= 0",
        ),
        (
            [
                "distillation.enabled=true",
                f"{TEACHERS}.teacher_model.model_path=/m",
                "distillation.nnodes=1",
                "distillation.n_gpus_per_node=0",
            ],
            "leaves the teachers' pool no workers",
        ),
        (
            [
                "distillation.enabled=true",
                f"{TEACHERS}.teacher_model.model_path=/m",
                "distillation.nnodes=1",
                "trainer.backend=local",
            ],
            "the teachers' pool of their own runs on Ray workers; set trainer.backend=ray",
        ),
    ],
)
def test_teacher_rules_are_one_line(overrides, message):
    with pytest.raises(ConfigError) as info:
        _check_distillation(typed(overrides))
    assert message in str(info.value) and "\n" not in str(info.value)


def test_a_loss_value_out_of_range_names_the_key():
    with pytest.raises(UserError) as info:
        typed(["distillation.distillation_loss.loss_mode=k1"])  # k1 backpropagated directly
    assert "distillation.distillation_loss.loss_mode=k1" in str(info.value) and "\n" not in str(info.value)


def test_megatron_keys_stay_refused_in_one_line():
    with pytest.raises(ConfigError) as info:
        load_config(["actor_rollout_ref.actor.megatron.tensor_model_parallel_size=2"], resolve_auto_dtypes=False)
    assert "megatron" in str(info.value) and "\n" not in str(info.value)
