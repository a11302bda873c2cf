"""Sample dumps: decoding a generated batch, atomic step files, validation collection, reading."""

import json
import os

import numpy as np
import pytest
import torch

from hybridrl.errors import ConfigError
from hybridrl.protocol import DataProto
from hybridrl.trainer.ppo.rollout_dump import (
    SampleDumpError,
    ValidationDump,
    dump_rollouts,
    list_steps,
    pick_generations,
    read_step,
    sample_records,
    write_step,
)
from hybridrl.trainer.run.tracking import VAL_GENERATIONS_KEY
from tests.tiny_models import ppo_section

PROMPTS = ["What is 2 + 3?", "Name a prime number larger than ten, please."]
RESPONSES = ["It is 5.", "Eleven"]


def _batch(tokenizer, scores=(1.0, 0.25)):
    """Left-padded prompts and right-padded responses as the rollout returns them, with the
    score on each response's last token (as the reward manager writes it). The second ground
    truth is a numpy array, as parquet returns a list column."""
    ground_truths = ("5", np.array(["11", "13"], dtype=object))
    pad = tokenizer.pad_token_id
    prompt_ids = [tokenizer.encode(p) for p in PROMPTS]
    response_ids = [tokenizer.encode(r) + [tokenizer.eos_token_id] for r in RESPONSES]
    width_p, width_r = max(map(len, prompt_ids)), max(map(len, response_ids)) + 2
    prompts = torch.tensor([[pad] * (width_p - len(p)) + p for p in prompt_ids])
    responses = torch.tensor([r + [pad] * (width_r - len(r)) for r in response_ids])
    mask_p = torch.tensor([[0] * (width_p - len(p)) + [1] * len(p) for p in prompt_ids])
    mask_r = torch.tensor([[1] * len(r) + [0] * (width_r - len(r)) for r in response_ids])
    token_level_scores = torch.zeros(responses.shape)
    for i, (r, s) in enumerate(zip(response_ids, scores)):
        token_level_scores[i, len(r) - 1] = s
    return DataProto.from_dict(
        tensors={
            "prompts": prompts,
            "responses": responses,
            "attention_mask": torch.cat([mask_p, mask_r], 1),
            "token_level_scores": token_level_scores,
        },
        non_tensors={
            "data_source": np.array(["openai/gsm8k", "primes"], dtype=object),
            "reward_model": np.array([{"style": "rule", "ground_truth": g} for g in ground_truths], dtype=object),
            "uid": np.array(["u0", "u1"], dtype=object),
        },
    )


def test_sample_records_decode_without_padding_and_sum_scores(tokenizer):
    extra = {"acc": np.array([True, False]), "score": [9, 9], "wrong_length": [1, 2, 3]}
    records = sample_records(_batch(tokenizer), tokenizer, step=7, reward_extra_info=extra)
    assert records == [
        {
            "input": PROMPTS[0],
            "output": RESPONSES[0],
            "score": 1.0,
            "ground_truth": "5",
            "step": 7,
            "data_source": "openai/gsm8k",
            "uid": "u0",
            "acc": True,
        },
        {
            "input": PROMPTS[1],
            "output": RESPONSES[1],
            "score": 0.25,
            "ground_truth": ["11", "13"],
            "step": 7,
            "data_source": "primes",
            "uid": "u1",
            "acc": False,
        },
    ]
    json.dumps(records)  # plain Python values only (the numpy ground truth became a list)


def test_sample_records_take_given_scores_and_need_the_tensors(tokenizer):
    batch = _batch(tokenizer)
    scores = torch.zeros(batch.batch["responses"].shape)
    scores[1, 0] = float("nan")
    assert [r["score"] for r in sample_records(batch, tokenizer, 0, scores=scores)] == [0.0, None]  # NaN: null
    batch.batch.pop("token_level_scores")
    with pytest.raises(SampleDumpError, match="token_level_scores"):
        sample_records(batch, tokenizer, 0)


def test_write_step_is_atomic_and_round_trips(tmp_path):
    records = [{"input": "é ⏎", "output": "x", "score": 1.0, "step": 3}]
    path = write_step(str(tmp_path / "dumps"), 3, records)
    assert path == str(tmp_path / "dumps" / "step_3.jsonl")
    assert read_step(path) == records
    assert "é" in open(path, encoding="utf-8").read()  # readable UTF-8, not \\u escapes
    write_step(str(tmp_path / "dumps"), 3, records[:0] + [{"step": 3, "score": 0.0}])  # a resumed run redoes step 3
    assert read_step(path) == [{"step": 3, "score": 0.0}]
    assert os.listdir(tmp_path / "dumps") == ["step_3.jsonl"]  # no temporary files left


def test_unwritable_dump_folder_names_the_key(tmp_path):
    (tmp_path / "file").write_text("")
    with pytest.raises(ConfigError, match=r"^trainer.validation_data_dir=.*file/sub: cannot write"):
        write_step(str(tmp_path / "file" / "sub"), 1, [], config_key="trainer.validation_data_dir")


def _trainer(**values):
    """The run's ``trainer`` section with ``values`` set."""
    return ppo_section("trainer", values)


def test_dump_rollouts_only_when_configured(tokenizer, tmp_path):
    batch = _batch(tokenizer)
    assert dump_rollouts(_trainer(rollout_data_dir=None), batch, tokenizer, 1) is None
    path = dump_rollouts(_trainer(rollout_data_dir=str(tmp_path)), batch, tokenizer, 2, {"acc": [1, 0]})
    assert [(r["step"], r["output"], r["acc"]) for r in read_step(path)] == [(2, RESPONSES[0], 1), (2, RESPONSES[1], 0)]
    with pytest.raises(ConfigError, match="rollout_data_dir and trainer.validation_data_dir"):
        dump_rollouts(
            _trainer(rollout_data_dir=str(tmp_path), validation_data_dir=str(tmp_path) + "/"), batch, tokenizer, 2
        )


def test_validation_dump_collects_batches_into_one_file_and_picks_samples(tokenizer, tmp_path):
    dump = ValidationDump(_trainer(validation_data_dir=str(tmp_path), log_val_generations=3), tokenizer, step=4)
    for scores in ((1.0, 0.0), (0.5, 0.5)):
        batch = _batch(tokenizer, scores)
        dump.add(batch, batch.batch["token_level_scores"])
    metrics = dump.finish({"val-core/x/reward/mean@1": 0.5})
    records = read_step(str(tmp_path / "step_4.jsonl"))
    assert [r["score"] for r in records] == [1.0, 0.0, 0.5, 0.5]
    samples = metrics[VAL_GENERATIONS_KEY]
    assert metrics["val-core/x/reward/mean@1"] == 0.5 and len(samples) == 3
    assert all(s in records for s in samples)


def test_validation_dump_does_nothing_when_off(tokenizer, tmp_path):
    dump = ValidationDump(_trainer(validation_data_dir=None, log_val_generations=0), tokenizer, step=1)
    dump.add(DataProto.from_dict(tensors={"x": torch.zeros(2, 1)}), None)  # not decoded: would raise
    assert dump.finish({"a": 1.0}) == {"a": 1.0}


def test_bad_log_val_generations(tokenizer):
    with pytest.raises(ConfigError, match=r"^trainer.log_val_generations=-1.*whole number >= 0"):
        ValidationDump(_trainer(log_val_generations=-1), tokenizer, step=0)


@pytest.mark.parametrize("value", [True, 1.5])
def test_log_val_generations_of_another_type_is_refused_by_the_typed_config(value):
    with pytest.raises(ConfigError, match=r"^trainer.log_val_generations: .* could not be converted to Integer"):
        _trainer(log_val_generations=value)


def test_pick_generations_is_stable_across_validations():
    records = [{"input": f"prompt {i}", "output": str(i)} for i in range(10)]
    first = pick_generations(records, 4)
    assert len(first) == 4 and len({r["input"] for r in first}) == 4
    assert pick_generations(list(reversed(records)), 4) == first  # same prompts whatever the batch order
    assert sorted(pick_generations(records, 50), key=lambda r: r["input"]) == records


def test_list_steps_sorts_numerically_and_accepts_verl_names(tmp_path):
    for name in ("step_10.jsonl", "step_9.jsonl", "3.jsonl", "notes.txt", "step_x.jsonl", ".step_2.abc.tmp"):
        (tmp_path / name).write_text("")
    assert list(list_steps(str(tmp_path))) == [3, 9, 10]
    with pytest.raises(FileNotFoundError, match="no such folder"):
        list_steps(str(tmp_path / "missing"))


def test_read_step_names_the_bad_line(tmp_path):
    path = tmp_path / "step_1.jsonl"
    path.write_text('{"score": 1}\n\n[1, 2]\n')
    with pytest.raises(SampleDumpError, match=r"step_1.jsonl:3: expected a JSON object"):
        read_step(str(path))
