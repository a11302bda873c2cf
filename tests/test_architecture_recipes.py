"""docs/architecture.md's "How to add" recipes, run as written: each section's code block is
executed, then the new component is used through the real path (the config check, the trainer,
a worker group, the agent-loop registry)."""

import asyncio
import json
import os
import re

import numpy as np
import pytest
import torch

from hybridrl.protocol import DataProto

DOC = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "docs", "architecture.md")


def _recipes() -> dict[str, str]:
    """``"an advantage estimator"`` -> the python block of the section "## How to add an advantage estimator"."""
    with open(DOC) as f:
        text = f.read()
    recipes = {}
    for section in re.split(r"^## ", text, flags=re.M)[1:]:
        title, _, body = section.partition("\n")
        blocks = re.findall(r"```python\n(.*?)```", body, flags=re.S)
        if title.startswith("How to add ") and blocks:
            recipes[title[len("How to add ") :]] = blocks[0]
    return recipes


def _run(title: str) -> dict:
    namespace = {"__name__": f"recipe_{title.replace(' ', '_')}"}
    exec(compile(_recipes()[title], f"{DOC}: {title}", "exec"), namespace)  # our own doc
    return namespace


def test_every_component_kind_has_a_recipe():
    assert set(_recipes()) == {
        "an advantage estimator",
        "a policy loss",
        "a reward",
        "a rollout engine",
        "an agent loop",
        "a worker role",
    }


@pytest.fixture
def registered():
    """Runs a recipe; forgets what it registered afterwards."""
    from hybridrl.agents.base import AGENT_LOOPS
    from hybridrl.algorithms.advantages import ADV_ESTIMATORS
    from hybridrl.algorithms.policy_loss import POLICY_LOSSES
    from hybridrl.rewards import SCORERS
    from hybridrl.workers.rollout import ROLLOUTS

    before = {reg: set(reg.names()) for reg in (AGENT_LOOPS, ADV_ESTIMATORS, POLICY_LOSSES, SCORERS, ROLLOUTS)}
    yield _run
    for reg, names in before.items():
        for name in set(reg.names()) - names:
            reg.unregister(name)


def _scored_batch(scores, uids, length=3):
    mask = torch.ones(len(scores), length)
    rewards = torch.zeros(len(scores), length)
    rewards[:, -1] = torch.tensor(scores)
    return DataProto.from_dict(
        {"token_level_rewards": rewards, "response_mask": mask}, non_tensors={"uid": np.array(uids, dtype=object)}
    )


def test_advantage_estimator_recipe(registered):
    from hybridrl.algorithms.advantages import ADV_ESTIMATOR_NEEDS_GROUP
    from hybridrl.trainer.ppo.stages import compute_advantage

    registered("an advantage estimator")
    assert "mean_baseline" in ADV_ESTIMATOR_NEEDS_GROUP
    data = compute_advantage(_scored_batch([1.0, 0.0, 0.5, 0.5], ["a", "a", "b", "b"]), "mean_baseline")
    assert torch.allclose(data.batch["advantages"][:, 0], torch.tensor([0.5, -0.5, 0.0, 0.0]))


def test_policy_loss_recipe(registered):
    from hybridrl.algorithms.functional import agg_loss
    from hybridrl.algorithms.policy_loss import get_policy_loss_fn

    registered("a policy loss")
    torch.manual_seed(0)
    log_prob = torch.randn(3, 5, requires_grad=True)
    advantages, mask = torch.randn(3, 5), (torch.rand(3, 5) > 0.3).float()
    loss, metrics = get_policy_loss_fn("plain_pg")(log_prob.detach(), log_prob, advantages, mask, "seq-mean-token-mean")
    assert loss.item() == pytest.approx(agg_loss(-advantages * log_prob, mask, "seq-mean-token-mean").item())
    loss.backward()
    assert torch.count_nonzero(log_prob.grad) == int(mask.sum()) and set(metrics) >= {"actor/ppo_kl"}


def test_reward_recipe(registered):
    from hybridrl.rewards import default_compute_score

    registered("a reward")
    assert default_compute_score("echo_task", " 42\n", 42) == 1.0
    assert default_compute_score("echo_task", "41", 42) == 0.0


def test_agent_loop_recipe(registered, tokenizer):
    from hybridrl.agents import AgentContext, get_agent_loop_cls

    registered("an agent loop")

    class Engine:
        async def generate(self, prompt_ids, sampling_params, max_new_tokens, stop=None):
            return [7, 8, tokenizer.eos_token_id][:max_new_tokens]

    loop = get_agent_loop_cls("answer_then_check")(
        AgentContext(engine=Engine(), tokenizer=tokenizer, response_length=64)
    )
    out = asyncio.run(loop.run({}, raw_prompt_ids=[1, 2, 3]))
    check = tokenizer("\nCheck your answer.\n", add_special_tokens=False)["input_ids"]
    turn = [7, 8, tokenizer.eos_token_id]
    assert out.response_ids == turn + check + turn
    assert out.response_mask == [1] * 3 + [0] * len(check) + [1] * 3


def test_worker_role_recipe():
    from hybridrl.controller.local import LocalWorkerGroup

    namespace = _run("a worker role")
    group = LocalWorkerGroup(namespace["ResponseLengthWorker"])
    mask = torch.tensor([[1, 1, 0], [1, 0, 0], [1, 1, 1]])
    out = group.response_lengths(DataProto.from_dict({"response_mask": mask}))
    assert out.batch["response_length"].tolist() == [2, 1, 3]


def _train(data_dir, model_dir, out_dir, *extra):
    from hybridrl.trainer.main_ppo import main

    args = [
        f"data.train_files={data_dir}/train.parquet",
        f"data.val_files={data_dir}/test.parquet",
        "data.train_batch_size=2",
        "data.max_prompt_length=256",
        "data.filter_overlong_prompts=True",
        "data.max_response_length=6",
        f"actor_rollout_ref.model.path={model_dir}",
        "actor_rollout_ref.actor.ppo_mini_batch_size=2",
        "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=4",
        "actor_rollout_ref.rollout.n=2",
        "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=4",
        "actor_rollout_ref.actor.use_kl_loss=False",
        "trainer.device=cpu",
        "trainer.logger=['file']",
        f"trainer.default_local_dir={out_dir}",
        "trainer.total_training_steps=1",
        "trainer.test_freq=-1",
        "trainer.save_freq=-1",
        "trainer.val_before_train=False",
        *extra,
    ]
    assert main(args) == 0
    with open(os.path.join(out_dir, "metrics.jsonl")) as f:
        return [json.loads(line) for line in f]


@pytest.mark.slow
def test_estimator_and_loss_recipes_train_through_the_cli(registered, gsm8k_parquet, tiny_model_dir, tmp_path):
    registered("an advantage estimator")
    registered("a policy loss")
    (row,) = _train(
        gsm8k_parquet,
        tiny_model_dir,
        tmp_path,
        "algorithm.adv_estimator=mean_baseline",
        "actor_rollout_ref.actor.policy_loss.loss_mode=plain_pg",
    )
    assert np.isfinite(row["actor/pg_loss"]) and row["actor/grad_norm"] >= 0


@pytest.mark.slow
def test_rollout_engine_recipe_generates_through_the_cli(registered, gsm8k_parquet, tiny_model_dir, tmp_path):
    registered("a rollout engine")
    (row,) = _train(
        gsm8k_parquet,
        tiny_model_dir,
        tmp_path,
        "algorithm.adv_estimator=grpo",
        "actor_rollout_ref.rollout.name=eos_only",
    )
    assert row["response_length/mean"] == 1 and row["response_length/clip_ratio"] == 0
