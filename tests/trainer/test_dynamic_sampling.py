"""DAPO's dynamic sampling: only groups with different rewards are kept, batches are collected
until train_batch_size groups are in, the count of generation batches is reported, and a batch
that cannot be filled stops with the numbers."""

import numpy as np
import pytest
import torch

from hybridrl.protocol import DataProto
from hybridrl.trainer.ppo.dynamic_sampling import DynamicSampler, DynamicSamplingError, kept_group_rows

N = 2  # responses per prompt


def scored_batch(scores, prompt_width=3, tag="b", extras=None):
    """One generation batch: len(scores) / N groups, ``scores`` per response (in group order)."""
    rows, resp = len(scores), 4
    uids = np.array([f"{tag}{i // N}" for i in range(rows)], dtype=object)
    levels = torch.zeros(rows, resp)
    levels[:, -1] = torch.tensor(scores, dtype=torch.float32)
    tensors = {
        "prompts": torch.full((rows, prompt_width), 7),
        "responses": torch.ones(rows, resp, dtype=torch.long),
        "input_ids": torch.full((rows, prompt_width + resp), 7),
        "attention_mask": torch.ones(rows, prompt_width + resp, dtype=torch.long),
        "position_ids": torch.arange(prompt_width + resp).expand(rows, -1).clone(),
        "token_level_scores": levels,
    }
    non_tensor = {"uid": uids, **{k: np.array(v, dtype=object) for k, v in (extras or {}).items()}}
    return DataProto.from_dict(tensors=tensors, non_tensors=non_tensor)


def test_kept_group_rows_drops_groups_that_all_scored_alike():
    assert kept_group_rows([1, 1, 0, 1, 0, 0, 5], ["a", "a", "b", "b", "c", "c", "d"]) == [2, 3, 6]


def test_batches_are_collected_until_the_training_batch_is_full():
    sampler = DynamicSampler("seq_reward", max_num_gen_batches=0, train_batch_size=3, pad_token_id=0)
    assert sampler.collect(scored_batch([1, 1, 0, 1], tag="x")) == (None, {})  # 1 group kept
    assert sampler.collect(scored_batch([0, 0, 1, 1], tag="y")) == (None, {})  # none kept
    batch, metrics = sampler.collect(scored_batch([1, 0, 0.5, 0.5, 0, 1], prompt_width=5, tag="z"))
    assert metrics == {"train/num_gen_batches": 3.0}
    assert list(batch.non_tensor_batch["uid"]) == ["x1", "x1", "z0", "z0", "z2", "z2"]  # only mixed groups
    scores = batch.batch["token_level_scores"].sum(-1).tolist()
    assert all(scores[i] != scores[i + 1] for i in range(0, 6, 2))
    # the first batch's prompts were left-padded to the widest one; the mask marks the padding
    assert batch.batch["prompts"].shape == (6, 5) and batch.batch["input_ids"].shape == (6, 9)
    assert batch.batch["attention_mask"][:2, :2].sum() == 0 and batch.batch["attention_mask"][2:, :2].sum() == 8
    assert sampler.collect(scored_batch([1, 0], tag="w")) == (None, {})  # a fresh count after a full batch


def test_extra_groups_beyond_the_training_batch_are_dropped():
    sampler = DynamicSampler("seq_reward", 0, train_batch_size=2, pad_token_id=0)
    batch, metrics = sampler.collect(scored_batch([1, 0, 0, 1, 1, 0]))
    assert list(dict.fromkeys(batch.non_tensor_batch["uid"])) == ["b0", "b1"] and metrics["train/num_gen_batches"] == 1


def test_a_batch_that_never_fills_stops_after_max_num_gen_batches_with_the_numbers():
    sampler = DynamicSampler("acc", max_num_gen_batches=2, train_batch_size=4, pad_token_id=0)
    sampler.collect(scored_batch([1, 0, 1, 1], extras={"acc": [1, 0, 1, 1]}))
    with pytest.raises(
        DynamicSamplingError,
        match=r"after 2 generation batches \(max_num_gen_batches\) only 1 of "
        r"data.train_batch_size=4 prompt groups had responses with "
        r"different acc",
    ):
        sampler.collect(scored_batch([1, 1, 0, 0], extras={"acc": [1, 1, 0, 0]}))


def test_the_metric_comes_from_the_reward_function_output():
    sampler = DynamicSampler("acc", 0, train_batch_size=1, pad_token_id=0)
    # the scores differ but acc does not: the group is dropped
    assert sampler.collect(scored_batch([0.9, 0.1], extras={"acc": [1, 1]})) == (None, {})
    missing = DynamicSampler("pass_rate", 0, 1, 0)
    with pytest.raises(
        DynamicSamplingError,
        match=r"metric='pass_rate' is not in the reward function's output "
        r"\(it gave: \['acc'\]\)",
    ):
        missing.collect(scored_batch([1, 0], extras={"acc": [1, 0]}))


def test_an_unbounded_batch_that_never_fills_says_so_every_ten_generation_batches(capsys):
    sampler = DynamicSampler("seq_reward", max_num_gen_batches=0, train_batch_size=4, pad_token_id=0)
    for _ in range(25):  # verl's 0: no limit; a reward that never varies keeps nothing
        assert sampler.collect(scored_batch([1, 1, 0, 0])) == (None, {})
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 2 and lines[1].startswith(
        "hybridrl: dynamic sampling: 0 of data.train_batch_size=4 prompt groups kept after 20 generation batches ("
    )


def test_a_batch_that_never_fills_stops_after_timeout_s_naming_the_keys():
    import time

    sampler = DynamicSampler("seq_reward", 0, train_batch_size=4, pad_token_id=0, timeout_s=0.5)
    assert sampler.collect(scored_batch([1, 0, 1, 1])) == (None, {})  # the clock starts here
    time.sleep(0.6)
    with pytest.raises(DynamicSamplingError) as caught:
        sampler.collect(scored_batch([1, 1, 0, 0]))
    message = str(caught.value)
    assert "generation batches (timeout_s) only 1 of data.train_batch_size=4 prompt groups" in message
    assert "raise algorithm.filter_groups.max_num_gen_batches or algorithm.filter_groups.timeout_s" in message
    # the next training batch gets its own deadline
    assert sampler.collect(scored_batch([1, 1, 0, 0])) == (None, {})


def test_filter_groups_timeout_s_is_a_config_key_with_a_deadline_by_default():
    from hybridrl.algorithms.config import algo_config
    from hybridrl.config import load_config
    from hybridrl.trainer.ppo.stages import build_dynamic_sampler

    class Tokenizer:
        pad_token_id = 0

    assert algo_config(load_config([])).filter_groups.timeout_s == 3600
    config = load_config(["algorithm.filter_groups.enable=True", "algorithm.filter_groups.timeout_s=5"])
    assert build_dynamic_sampler(config, Tokenizer()).timeout_s == 5.0
