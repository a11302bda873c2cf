"""validate_ppo_config / normalize_batch_sizes: verl's batch-size rules and the value checks."""

import copy
from dataclasses import replace

import pytest
from omegaconf import OmegaConf

from hybridrl.config import ConfigError, load_config, normalize_batch_sizes
from hybridrl.config.defaults import packaged_defaults
from hybridrl.trainer.ppo import config_check as schema
from hybridrl.trainer.ppo.config_check import ignored_key_notes, validate_ppo_config
from hybridrl.workers.config import ActorConfig, CriticConfig

A = "actor_rollout_ref.actor"
R = "actor_rollout_ref.rollout"


@pytest.fixture(scope="module")
def base_cfg():
    """A small valid GRPO config: 8 prompts x 2 responses, mini batch 4, micro batch 2."""
    return load_config(
        [
            "algorithm.adv_estimator=grpo",
            "data.train_batch_size=8",
            f"{A}.ppo_mini_batch_size=4",
            f"{A}.ppo_micro_batch_size_per_gpu=2",
            f"{R}.n=2",
        ]
    )


def cfg_with(base, **changes):
    """Copy of ``base`` with dotted keys (``__`` stands for ``.``) changed."""
    cfg = copy.deepcopy(base)
    for key, value in changes.items():
        OmegaConf.update(cfg, key.replace("__", "."), value, merge=False)
    return cfg


def error_of(cfg, world_size=1) -> str:
    with pytest.raises(ConfigError) as err:
        validate_ppo_config(cfg, world_size=world_size)
    msg = str(err.value)
    assert "\n" not in msg
    return msg


def test_valid_config_with_defaults_has_no_notes(base_cfg):
    assert validate_ppo_config(base_cfg, world_size=1) == []
    assert validate_ppo_config(base_cfg, world_size=2) == []  # 16 responses, 8 per worker, 4 micro


def test_train_batch_size_must_be_positive(base_cfg):
    msg = error_of(cfg_with(base_cfg, data__train_batch_size=0))
    assert "data.train_batch_size=0" in msg and ">= 1" in msg


def test_train_batch_smaller_than_mini_batch(base_cfg):
    msg = error_of(cfg_with(base_cfg, **{f"{A}__ppo_mini_batch_size": 16}))
    assert "data.train_batch_size=8" in msg and f"{A}.ppo_mini_batch_size=16" in msg


def test_responses_must_split_over_workers(base_cfg):
    # 3 prompts x 1 response over 2 workers
    cfg = cfg_with(
        base_cfg,
        data__train_batch_size=3,
        algorithm__adv_estimator="reinforce_plus_plus",
        **{f"{R}__n": 1, f"{A}__ppo_mini_batch_size": 2},
    )
    msg = error_of(cfg, world_size=2)
    assert "data.train_batch_size=3" in msg and f"{R}.n=1" in msg and "2 workers" in msg


def test_mini_batch_times_n_must_split_over_workers(base_cfg):
    # train 6 x 1 = 6 splits over 2, but mini 3 x 1 = 3 does not
    cfg = cfg_with(
        base_cfg,
        data__train_batch_size=6,
        algorithm__adv_estimator="reinforce_plus_plus",
        **{f"{R}__n": 1, f"{A}__ppo_mini_batch_size": 3, f"{A}__ppo_micro_batch_size_per_gpu": 1},
    )
    msg = error_of(cfg, world_size=2)
    assert f"{A}.ppo_mini_batch_size=3" in msg and "= 3 responses" in msg and "2 workers" in msg


def test_micro_batch_must_divide_per_worker_mini_batch(base_cfg):
    # 4 prompts x 2 responses / 1 worker = 8 responses; micro batch 3 does not divide 8
    msg = error_of(cfg_with(base_cfg, **{f"{A}__ppo_micro_batch_size_per_gpu": 3}))
    assert "= 8 responses per worker" in msg and f"{A}.ppo_micro_batch_size_per_gpu" in msg
    # dynamic batch sizes pack by tokens: the divisibility rule does not apply
    validate_ppo_config(cfg_with(base_cfg, **{f"{A}__ppo_micro_batch_size_per_gpu": 3, f"{A}__use_dynamic_bsz": True}))


def test_both_micro_batch_keys_set(base_cfg):
    msg = error_of(cfg_with(base_cfg, **{f"{A}__ppo_micro_batch_size": 4}))
    assert f"{A}.ppo_micro_batch_size=4" in msg and f"{A}.ppo_micro_batch_size_per_gpu=2" in msg
    assert "remove the deprecated" in msg


def test_no_micro_batch_key_set(base_cfg):
    cfg = cfg_with(base_cfg, **{f"{A}__ppo_micro_batch_size_per_gpu": None})
    msg = error_of(cfg)
    assert f"{A}.ppo_micro_batch_size_per_gpu is not set" in msg and "use_dynamic_bsz" in msg
    validate_ppo_config(cfg_with(cfg, **{f"{A}__use_dynamic_bsz": True}))


def test_deprecated_global_micro_batch_smaller_than_workers(base_cfg):
    cfg = cfg_with(base_cfg, **{f"{A}__ppo_micro_batch_size_per_gpu": None, f"{A}__ppo_micro_batch_size": 2})
    validate_ppo_config(cfg, world_size=2)  # 2 // 2 = 1 per worker
    msg = error_of(cfg, world_size=4)
    assert f"{A}.ppo_micro_batch_size=2" in msg and "0 per worker" in msg


def test_critic_rules_apply_only_with_gae(base_cfg):
    cfg = cfg_with(base_cfg, algorithm__adv_estimator="gae")
    msg = error_of(cfg)
    assert "critic.ppo_micro_batch_size_per_gpu is not set" in msg
    validate_ppo_config(cfg_with(cfg, critic__ppo_micro_batch_size_per_gpu=4))
    msg = error_of(cfg_with(cfg, critic__ppo_micro_batch_size_per_gpu=3))
    assert "critic.ppo_mini_batch_size=4" in msg and "micro batches of 3" in msg


@pytest.mark.parametrize("prefix", [R, "actor_rollout_ref.ref"])
def test_log_prob_micro_batch_keys(base_cfg, prefix):
    p = prefix.replace(".", "__")
    msg = error_of(cfg_with(base_cfg, **{f"{p}__log_prob_micro_batch_size_per_gpu": 0}))
    assert f"{prefix}.log_prob_micro_batch_size_per_gpu=0" in msg
    msg = error_of(
        cfg_with(base_cfg, **{f"{p}__log_prob_micro_batch_size_per_gpu": 2, f"{p}__log_prob_micro_batch_size": 4})
    )
    assert f"{prefix}.log_prob_micro_batch_size=4" in msg


@pytest.mark.parametrize("key, value", [("algorithm__use_pf_ppo", True)])
def test_features_not_in_this_build_are_refused(base_cfg, key, value):
    msg = error_of(cfg_with(base_cfg, **{key: value}))
    assert key.replace("__", ".") in msg and "not in this build" in msg


def test_unknown_adv_estimator_lists_known_ones(base_cfg):
    pytest.importorskip("hybridrl.algorithms.advantages")
    msg = error_of(cfg_with(base_cfg, algorithm__adv_estimator="grp0"))
    assert "algorithm.adv_estimator='grp0' is unknown" in msg
    assert "gae" in msg and "grpo" in msg


# grpo and rloo with n=1: a note, as verl runs them: tests/trainer/test_verl_commands_rules.py
@pytest.mark.parametrize("estimator", ["grpo_passk", "reinforce_plus_plus_baseline", "opo", "gpg"])
def test_group_estimator_with_one_response_per_prompt_fails_at_start_up(base_cfg, estimator):
    msg = error_of(cfg_with(base_cfg, algorithm__adv_estimator=estimator, **{f"{R}__n": 1}))
    assert f"algorithm.adv_estimator={estimator}" in msg and f"{R}.n=1" in msg and "2 or more" in msg


@pytest.mark.parametrize("estimator", ["reinforce_plus_plus", "remax"])
def test_estimators_without_groups_accept_one_response_per_prompt(base_cfg, estimator):
    assert validate_ppo_config(cfg_with(base_cfg, algorithm__adv_estimator=estimator, **{f"{R}__n": 1})) == []


@pytest.mark.parametrize("key", [f"{A}.kl_loss_type", "algorithm.kl_penalty"])
def test_kl_forms_accepted_and_unknown_listed(base_cfg, key):
    switch = {f"{A}.kl_loss_type": f"{A}__use_kl_loss", "algorithm.kl_penalty": "algorithm__use_kl_in_reward"}[key]
    for good in ("k3+", "full", "low_var_kl"):
        assert validate_ppo_config(cfg_with(base_cfg, **{switch: True, key.replace(".", "__"): good})) == []
    msg = error_of(cfg_with(base_cfg, **{switch: True, key.replace(".", "__"): "k5"}))
    assert f"{key}='k5' is unknown" in msg and "k3+" in msg and "full" in msg


@pytest.mark.parametrize(
    "key, bad",
    [
        ("trainer.device", "tpu"),
        ("trainer.backend", "slurm"),
        ("algorithm.kl_ctrl.type", "pid"),
        (f"{A}.loss_agg_mode", "token-total"),
        ("data.truncation", "cut"),
        ("trainer.resume_mode", "always"),
        ("reward_model.on_error", "ignore"),
    ],
)
def test_choices(base_cfg, key, bad):
    msg = error_of(cfg_with(base_cfg, **{key.replace(".", "__"): bad}))
    assert f"{key}={bad!r} is not one of" in msg


@pytest.mark.parametrize(
    "key, bad",
    [
        ("data.max_prompt_length", 0),
        ("data.max_response_length", -1),
        ("trainer.critic_warmup", -1),
        (f"{A}.ppo_epochs", 0),
        (f"{A}.clip_ratio", 0),
        (f"{A}.clip_ratio_high", -0.1),
        (f"{A}.clip_ratio_c", 1.0),
        (f"{R}.n", 0),
        ("data.train_batch_size", 0),
    ],
)
def test_value_ranges(base_cfg, key, bad):
    msg = error_of(cfg_with(base_cfg, **{key.replace(".", "__"): bad}))
    assert f"{key}={bad!r}" in msg


def test_resume_path_needs_a_path(base_cfg):
    msg = error_of(cfg_with(base_cfg, trainer__resume_mode="resume_path"))
    assert "trainer.resume_from_path" in msg
    validate_ppo_config(
        cfg_with(base_cfg, trainer__resume_mode="resume_path", trainer__resume_from_path="/ckpt/global_step_10")
    )


def test_cuda_requested_without_cuda(base_cfg):
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    msg = error_of(cfg_with(base_cfg, trainer__device="cuda"))
    assert "trainer.device=cuda" in msg and "trainer.device=cpu" in msg


def test_world_size_must_be_positive(base_cfg):
    with pytest.raises(ConfigError, match="world_size=0"):
        validate_ppo_config(base_cfg, world_size=0)


def test_ignored_key_notes(base_cfg):
    cfg = cfg_with(
        base_cfg,
        **{
            f"{R}__enforce_eager": False,
            f"{A}__fsdp_config__param_offload": True,
            f"{R}__name": "sglang",
        },
    )
    notes = validate_ppo_config(cfg, world_size=1)
    assert f"{R}.enforce_eager=False is ignored: the HF generate engine does not use it (no CUDA graphs)" in notes
    assert not any(n.startswith(f"{A}.use_torch_compile") for n in notes)  # honoured (compiled on CUDA)
    assert any(n.startswith(f"{A}.fsdp_config.param_offload=True is ignored") for n in notes)
    assert f"{R}.name=sglang: this build has no SGLang engine; generating with the HF engine" in notes
    assert len(notes) == 3
    # vLLM reads the engine keys: no note for them
    vllm_notes = validate_ppo_config(cfg_with(cfg, **{f"{R}__name": "vllm"}), world_size=1)
    assert not any("enforce_eager" in n or "vLLM" in n for n in vllm_notes) and len(vllm_notes) == 1
    # offload means nothing on the CPU, however many workers; on CUDA it works with one worker too
    assert any("param_offload" in n for n in validate_ppo_config(cfg, world_size=2))
    on_cuda = cfg_with(cfg, trainer__device="cuda")
    assert not any("param_offload" in n for n in ignored_key_notes(on_cuda, world_size=1))
    # with several workers a sharding key means something
    sharded = cfg_with(base_cfg, **{f"{A}__fsdp_config__fsdp_size": 2})
    assert any("fsdp_size" in n for n in validate_ppo_config(sharded, world_size=1))
    assert not any("fsdp_size" in n for n in validate_ppo_config(sharded, world_size=2))


def test_every_ignored_key_exists_in_the_packaged_yaml():
    defaults = packaged_defaults()
    absent = [k for k in schema.IGNORED_KEYS if OmegaConf.select(defaults, k, default="<absent>") == "<absent>"]
    assert absent == []


def test_normalize_batch_sizes_like_verl_workers():
    actor = ActorConfig(ppo_mini_batch_size=256, ppo_micro_batch_size_per_gpu=16)  # a typed section
    # 256 prompts x 5 responses / 8 workers = 160 responses per worker
    assert normalize_batch_sizes(actor, 5, 8) == {"ppo_mini_batch_size": 160, "ppo_micro_batch_size_per_gpu": 16}
    deprecated = replace(actor, ppo_micro_batch_size=64, ppo_micro_batch_size_per_gpu=None)
    assert normalize_batch_sizes(deprecated, 5, 8)["ppo_micro_batch_size_per_gpu"] == 8  # 64 // 8
    dynamic = replace(actor, ppo_micro_batch_size_per_gpu=None, use_dynamic_bsz=True)
    assert normalize_batch_sizes(dynamic, 1, 2) == {"ppo_mini_batch_size": 128, "ppo_micro_batch_size_per_gpu": None}


def test_normalize_batch_sizes_critic_forward_micro_batch():
    critic = CriticConfig(
        ppo_mini_batch_size=4,
        ppo_micro_batch_size_per_gpu=2,
        forward_micro_batch_size=None,
        forward_micro_batch_size_per_gpu=8,
        use_dynamic_bsz=False,
    )  # a typed section
    out = normalize_batch_sizes(critic, 2, 1)
    assert out == {"ppo_mini_batch_size": 8, "ppo_micro_batch_size_per_gpu": 2, "forward_micro_batch_size_per_gpu": 8}
    critic = replace(critic, forward_micro_batch_size_per_gpu=None)
    assert normalize_batch_sizes(critic, 2, 1)["forward_micro_batch_size_per_gpu"] == 2
    with pytest.raises(ConfigError, match=r"critic\.ppo_micro_batch_size_per_gpu is not set"):
        normalize_batch_sizes(replace(critic, ppo_micro_batch_size_per_gpu=None), 2, 1)


@pytest.mark.parametrize(
    "key, bad",
    [
        (f"{A}__policy_loss__clip_cov_ratio", 0.0),
        (f"{A}__policy_loss__kl_cov_ratio", 2.0),
        (f"{A}__policy_loss__ppo_kl_coef", -1.0),
    ],
)
def test_policy_loss_knobs_checked_at_start_up(base_cfg, key, bad):
    msg = error_of(cfg_with(base_cfg, **{key: bad}))
    assert key.replace("__", ".") in msg


def test_adaptive_kl_controller_checked_at_start_up(base_cfg):
    msg = error_of(
        cfg_with(
            base_cfg,
            algorithm__use_kl_in_reward=True,
            algorithm__kl_ctrl__type="adaptive",
            algorithm__kl_ctrl__target_kl=0,
        )
    )
    assert "algorithm.kl_ctrl.target_kl=0" in msg
