"""The learning-rate schedules of hybridrl/workers/optim.py against verl's formulas."""

import math

import pytest
import torch

from hybridrl.errors import ConfigError
from hybridrl.workers.optim import lr_factor, lr_schedule


def _verl_cosine(step, warmup, total, min_lr_ratio=0.0, num_cycles=0.5, zero_indexed_step=True):
    """verl.utils.torch_functional.get_cosine_schedule_with_warmup's lr_lambda (verl 0.9.1)."""
    if not zero_indexed_step:
        step += 1
    if step < warmup:
        return step / max(1, warmup)
    progress = (step - warmup) / max(1, total - warmup)
    x = math.cos(math.pi * num_cycles * 2.0 * progress)
    return max(min_lr_ratio, x * (1 - min_lr_ratio) * 0.5 + (1 + min_lr_ratio) * 0.5)


def _verl_wsd(step, warmup, total, min_lr_ratio=0.0, num_cycles=0.5, stable_ratio=0.9):
    """verl.utils.torch_functional.get_wsd_schedule_with_warmup's lr_lambda."""
    remaining = max(0, total - warmup)
    stable = int(remaining * stable_ratio)
    decay = remaining - stable
    if step < warmup:
        return step / max(1, warmup)
    if step < warmup + stable:
        return 1.0
    if step < total:
        progress = (step - warmup - stable) / max(1, decay)
        value = max(0.0, 0.5 * (1.0 + math.cos(math.pi * num_cycles * 2.0 * progress)))
        return (1.0 - min_lr_ratio) * value + min_lr_ratio
    return min_lr_ratio


@pytest.mark.parametrize("min_lr_ratio", [0.0, 0.1])
@pytest.mark.parametrize("zero_indexed_step", [True, False])
def test_cosine_is_verls(min_lr_ratio, zero_indexed_step):
    for step in range(25):
        got = lr_factor(step, "cosine", 3, 20, min_lr_ratio, 0.5, zero_indexed_step)
        assert got == pytest.approx(_verl_cosine(step, 3, 20, min_lr_ratio, 0.5, zero_indexed_step))
    # the cosine reaches min_lr_ratio at the last step
    assert lr_factor(20, "cosine", 3, 20, min_lr_ratio) == pytest.approx(min_lr_ratio)


@pytest.mark.parametrize("min_lr_ratio", [0.0, 0.2])
def test_wsd_is_verls(min_lr_ratio):
    values = [lr_factor(step, "wsd", 2, 40, min_lr_ratio) for step in range(45)]
    assert values == pytest.approx([_verl_wsd(step, 2, 40, min_lr_ratio) for step in range(45)])
    assert values[1] == 0.5 and values[2] == 1.0 and values[35] == 1.0  # warmup, then 90% of 38 steps stable
    assert values[38] < 1.0 and values[44] == min_lr_ratio


def test_constant_and_the_transformers_schedules_agree():
    """PPO's constant/cosine schedules give the numbers they gave with transformers' functions."""
    from transformers import get_constant_schedule_with_warmup, get_cosine_with_min_lr_schedule_with_warmup

    def lrs(scheduler, optimizer, n=12):
        out = []
        for _ in range(n):
            out.append(scheduler.get_last_lr()[0])
            optimizer.step()
            scheduler.step()
        return out

    def opt():
        return torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=0.5)

    o1, o2 = opt(), opt()
    assert lrs(lr_schedule(o1, "constant", 4, 10), o1) == pytest.approx(
        lrs(get_constant_schedule_with_warmup(o2, num_warmup_steps=4), o2)
    )
    o1, o2 = opt(), opt()
    ours = lr_schedule(o1, "cosine", 2, 10, min_lr_ratio=0.1, num_cycles=0.5)
    theirs = get_cosine_with_min_lr_schedule_with_warmup(o2, 2, 10, num_cycles=0.5, min_lr_rate=0.1)
    assert lrs(ours, o1) == pytest.approx(lrs(theirs, o2))


def test_bad_schedule_is_one_line():
    optimizer = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=0.1)
    with pytest.raises(ConfigError, match="'linear' is not one of constant, cosine, wsd"):
        lr_schedule(optimizer, "linear", 0, 10)
    with pytest.raises(ConfigError, match="min_lr_ratio=1.5"):
        lr_schedule(optimizer, "cosine", 0, 10, min_lr_ratio=1.5)
