"""verl's command lines that hybridrl runs as verl does (issue 34): rollout.mode's default, vLLM's
tensor parallelism, the tool-call formats, verl's reward managers, verl's script-only keys."""

import pytest

from hybridrl.config import ConfigError, load_config
from hybridrl.trainer.ppo.config import typed_ppo_config
from hybridrl.trainer.ppo.config_check import validate_ppo_config

R = "actor_rollout_ref.rollout"
SMALL = [
    "data.train_batch_size=8",
    "actor_rollout_ref.actor.ppo_mini_batch_size=8",
    "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=2",
    "algorithm.adv_estimator=grpo",
    "actor_rollout_ref.rollout.n=2",
    "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=2",
    "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=2",
]


@pytest.fixture
def _mode(composed):
    """The rollout mode chosen when the default config with ``overrides`` set is typed."""

    def mode(*overrides):
        engine = [o for o in overrides if o.startswith(f"{R}.name=")]  # composed: an interpolation copies it
        changes = [o for o in overrides if o not in engine]
        return typed_ppo_config(composed(engine, changes)).actor_rollout_ref.rollout.mode

    return mode


def test_rollout_mode_unset_follows_verl_where_it_runs(caplog, _mode):
    assert _mode(f"{R}.name=vllm", "trainer.n_gpus_per_node=4") == "async"  # verl's default; one engine per worker
    assert "mode unset: async, verl's default" in caplog.text and "on 4 workers" in caplog.text
    assert _mode(f"{R}.name=vllm", "trainer.nnodes=2") == "async"
    caplog.clear()
    assert _mode(f"{R}.name=vllm") == "sync"  # one worker: the colocated engine, as before, noted
    assert "mode unset: sync on one worker" in caplog.text and f"{R}.mode=async (verl's default)" in caplog.text
    caplog.clear()
    assert _mode() == "sync" and _mode("trainer.n_gpus_per_node=2") == "sync"  # hf: sync only, no note
    assert "mode unset" not in caplog.text
    # set modes are kept
    assert _mode(f"{R}.name=vllm", f"{R}.mode=async") == "async"
    assert _mode(f"{R}.name=vllm", f"{R}.mode=sync", "trainer.n_gpus_per_node=4") == "sync"


def test_a_verl_vllm_command_on_several_workers_passes_in_either_mode(composed):
    cfg = load_config([*SMALL, f"{R}.name=vllm", "trainer.n_gpus_per_node=4"])
    validate_ppo_config(cfg, world_size=4)
    # sync: each worker's engine runs in a process of its own as in async mode (issue 30)
    validate_ppo_config(composed([*SMALL, f"{R}.name=vllm"], [f"{R}.mode=sync", "trainer.n_gpus_per_node=4"]), 4)


def test_sglang_async_runs_on_the_hf_engine_in_sync_mode(caplog, _mode, composed):
    assert _mode(f"{R}.name=sglang", f"{R}.mode=async") == "sync"
    assert "no SGLang server" in caplog.text
    with pytest.raises(ConfigError, match="the 'hf' engine has no async server mode"):
        _mode(f"{R}.mode=async") and validate_ppo_config(composed((), [f"{R}.mode=async"]))


def test_vllm_tensor_parallelism_divides_the_workers_and_runs_with_the_sync_schedule(composed):
    cfg = composed([*SMALL, f"{R}.name=vllm"], [f"{R}.tensor_model_parallel_size=2", "trainer.n_gpus_per_node=2"])
    assert not any("tensor_model_parallel_size" in n for n in validate_ppo_config(cfg, world_size=2))
    odd = composed([*SMALL, f"{R}.name=vllm"], [f"{R}.tensor_model_parallel_size=2", "trainer.n_gpus_per_node=3"])
    with pytest.raises(ConfigError, match=f"{R}.tensor_model_parallel_size=2 must be >= 1 and divide the number of "):
        validate_ppo_config(odd, world_size=3)
    stale = composed(
        [*SMALL, f"{R}.name=vllm"],
        [f"{R}.tensor_model_parallel_size=2", "trainer.n_gpus_per_node=2", "trainer.one_step_off_policy=true"],
    )
    with pytest.raises(ConfigError, match="tensor_model_parallel_size=2 with trainer.one_step_off_policy=true") as err:
        validate_ppo_config(stale, world_size=2)
    assert "\n" not in str(err.value)


def test_tool_call_formats(composed):
    key = f"{R}.multi_turn.format"
    assert typed_ppo_config(load_config([f"{key}=qwen"])).actor_rollout_ref.rollout.multi_turn.format == "qwen"
    with pytest.raises(ConfigError, match=f"{key}=gpt-oss: the gpt-oss \\(harmony\\) tool-call format is not in"):
        typed_ppo_config(composed((), [f"{key}=gpt-oss"]))
    with pytest.raises(ConfigError, match="is not one of hermes, qwen"):
        typed_ppo_config(composed((), [f"{key}=xml"]))


@pytest.mark.parametrize("name, feature", [("prime", "PRIME"), ("batch", "batch reward"), ("remote", "remote")])
def test_verls_other_reward_managers_are_refused_naming_them(name, feature, composed):
    with pytest.raises(ConfigError) as err:
        validate_ppo_config(composed(SMALL, [f"reward_model.reward_manager={name}"]))
    text = str(err.value)
    assert text.startswith(f"reward_model.reward_manager={name}: verl's {feature}") and "\n" not in text


def test_keys_verls_scripts_set_that_verl_does_not_read_are_noted(caplog):
    load_config(["+trainer.tensorboard_dir=/tmp/tb", "+trainer.rl_logging_board_dir=/tmp/b", f"+{R}.server.timeout=9"])
    for key in ("trainer.tensorboard_dir", "trainer.rl_logging_board_dir", f"{R}.server.timeout"):
        assert f"+{key}=" in caplog.text
    assert "$TENSORBOARD_DIR" in caplog.text
