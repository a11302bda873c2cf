"""The ``composed`` fixture of tests/config/conftest.py stands for composing the command line."""

from hybridrl.config import load_config


def test_set_keys_is_the_command_line(composed):
    """What :func:`set_keys` stands for: the keys set on a composed config equal composing them
    (the keys tests/config sets as ``changes``; a key an interpolation reads, such as
    actor_rollout_ref.rollout.name, goes into the composed overrides instead)."""
    changes = [
        "trainer.n_gpus_per_node=4",
        "trainer.logger=[console,file]",
        "algorithm.use_kl_in_reward=true",
        "actor_rollout_ref.actor.clip_ratio_low=0.25",
        "actor_rollout_ref.rollout.mode=sync",
        "actor_rollout_ref.rollout.tensor_model_parallel_size=2",
        "actor_rollout_ref.rollout.multi_turn.format=xml",
        "reward_model.reward_manager=prime",
    ]
    assert composed((), changes) == load_config(changes) != composed()
    # keys that decide the auto dtypes (resolved last, as load_config does)
    for where in (["trainer.device=cpu"], ["trainer.nnodes=2"], ["trainer.backend=ray", "trainer.device=cuda"]):
        assert composed((), where) == load_config(where)
    base = ["algorithm.adv_estimator=grpo", "actor_rollout_ref.rollout.name=vllm"]
    assert composed(base, changes) == load_config(base + changes) != composed(base)
