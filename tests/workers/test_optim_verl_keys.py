"""verl's optimizer keys hybridrl supports: the schedule's name (``lr_scheduler_type`` and the older
``warmup_style``), the floor as ``min_lr`` (Megatron's) or ``min_lr_ratio``, ``lr_decay_steps``, and
``optim.clip_grad`` as the role's ``grad_clip``."""

from __future__ import annotations

import math

import pytest
import torch

from hybridrl.config import ConfigError, load_config
from hybridrl.trainer.ppo.config import typed_ppo_config
from hybridrl.workers.config.fsdp import OptimConfig
from hybridrl.workers.optim import build_lr_scheduler


def _lrs(optim: OptimConfig, total: int, steps: int) -> list[float]:
    param = torch.nn.Parameter(torch.zeros(1))
    optimizer = torch.optim.AdamW([param], lr=optim.lr)
    schedule = build_lr_scheduler(optimizer, optim, total)
    out = []
    for _ in range(steps):
        out.append(schedule.get_last_lr()[0])
        optimizer.step()
        schedule.step()
    return out


def test_lr_scheduler_type_cosine_is_the_cosine_schedule():
    lrs = _lrs(OptimConfig(lr=1.0, lr_scheduler_type="cosine"), total=10, steps=11)
    assert lrs[0] == pytest.approx(1.0) and lrs[5] == pytest.approx(0.5) and lrs[10] == pytest.approx(0.0, abs=1e-12)
    assert lrs == _lrs(OptimConfig(lr=1.0, warmup_style="cosine"), total=10, steps=11)  # the older name
    assert _lrs(OptimConfig(lr=1.0), total=10, steps=4) == [1.0] * 4  # constant by default


def test_min_lr_is_the_floor_in_lr_units():
    by_ratio = _lrs(OptimConfig(lr=2.0, lr_scheduler_type="cosine", min_lr_ratio=0.1), total=10, steps=11)
    by_value = _lrs(OptimConfig(lr=2.0, lr_scheduler_type="cosine", min_lr=0.2), total=10, steps=11)
    assert by_value == pytest.approx(by_ratio) and by_value[-1] == pytest.approx(0.2)


def test_lr_decay_steps_reach_the_floor_then_stay():
    optim = OptimConfig(lr=1.0, lr_scheduler_type="cosine", min_lr=0.1, lr_decay_steps=6, lr_warmup_steps=2)
    lrs = _lrs(optim, total=20, steps=12)
    assert lrs[:2] == pytest.approx([0.0, 0.5])  # warmup
    assert lrs[2] == pytest.approx(1.0)
    assert lrs[4] == pytest.approx(0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * 0.5)))  # half way through the decay
    assert lrs[6:] == pytest.approx([0.1] * 6)  # held at the floor after lr_decay_steps


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"warmup_style": "cosine", "lr_scheduler_type": "constant"}, None),
        ({"warmup_style": "constant", "lr_scheduler_type": "cosine"}, "two names of the schedule"),
        ({"lr_scheduler_type": "linear"}, "optim.lr_scheduler_type='linear' is not one of constant, cosine"),
        ({"min_lr": 0.5, "min_lr_ratio": 0.1, "lr": 1.0}, "ask for two floors"),
        ({"lr_decay_steps": 0}, "optim.lr_decay_steps=0 must be >= 1"),
    ],
)
def test_bad_schedule_keys_are_one_line(kwargs, message):
    if message is None:
        OptimConfig(**kwargs)
        return
    with pytest.raises(ConfigError, match=message):
        OptimConfig(**kwargs)


def test_clip_grad_is_verls_newer_name_of_grad_clip():
    typed = typed_ppo_config(load_config(["actor_rollout_ref.actor.optim.clip_grad=0.5"], resolve_auto_dtypes=False))
    assert typed.actor_rollout_ref.actor.grad_clip == 0.5
    typed = typed_ppo_config(load_config(["critic.grad_clip=0.3"], resolve_auto_dtypes=False))
    assert typed.critic.grad_clip == 0.3 and typed.critic.optim.clip_grad == 1.0
    both = load_config(["critic.grad_clip=0.3", "critic.optim.clip_grad=0.5"], resolve_auto_dtypes=False)
    with pytest.raises(
        ConfigError, match=r"critic.grad_clip=0.3 and critic.optim.clip_grad=0.5 are verl's two spellings"
    ):
        typed_ppo_config(both)


def test_fsdp_config_spellings_of_the_role_keys():
    typed = typed_ppo_config(
        load_config(
            [
                "actor_rollout_ref.actor.fsdp_config.ulysses_sequence_parallel_size=2",
                "actor_rollout_ref.actor.fsdp_config.entropy_checkpointing=true",
                "critic.model.fsdp_config.ulysses_sequence_parallel_size=2",
            ],
            resolve_auto_dtypes=False,
        )
    )
    actor = typed.actor_rollout_ref.actor
    assert actor.ulysses_sequence_parallel_size == 2 and actor.entropy_checkpointing is True
    assert typed.actor_rollout_ref.ref.ulysses_sequence_parallel_size == 2  # the reference follows the actor
    assert typed.critic.ulysses_sequence_parallel_size == 2
    clash = load_config(
        [
            "actor_rollout_ref.actor.ulysses_sequence_parallel_size=2",
            "actor_rollout_ref.actor.fsdp_config.ulysses_sequence_parallel_size=4",
        ],
        resolve_auto_dtypes=False,
    )
    with pytest.raises(
        ConfigError, match="ulysses_sequence_parallel_size=2 and .*fsdp_config.ulysses_sequence_parallel_size=4"
    ):
        typed_ppo_config(clash)
