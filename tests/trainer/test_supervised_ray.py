"""``hybridrl sft`` and ``hybridrl rm`` on 2 Ray workers (FSDP2): each worker trains on half of
the batch, and the update equals one worker's on the whole batch; a checkpoint written by 2
workers resumes on 1."""

import json
import os

import pytest
import torch

from hybridrl.cli import main

pytest.importorskip("ray")

HH_DIR = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", "..", "shared", "data", "hh_rlhf"))
FP32 = "model.fsdp_config.mixed_precision.param_dtype=fp32"  # the same arithmetic sharded and whole
TWO_WORKERS = ["trainer.backend=ray", "trainer.nnodes=1", "trainer.n_gpus_per_node=2"]


def _rows(out_dir):
    with open(os.path.join(out_dir, "metrics.jsonl")) as f:
        return {row["step"]: row for row in map(json.loads, f)}


def _weights(folder):
    from safetensors.torch import load_file

    return load_file(os.path.join(folder, "model.safetensors"))


def _assert_same_run(one, two, keys, rel):
    rows_one, rows_two = _rows(one), _rows(two)
    assert sorted(rows_one) == sorted(rows_two)
    for step in rows_one:
        for key in keys:
            if key in rows_one[step]:
                assert rows_two[step][key] == pytest.approx(rows_one[step][key], rel=rel), (step, key)


@pytest.mark.slow
def test_sft_on_two_ray_workers_matches_one_worker(ray_cluster, gsm8k_parquet, tiny_model_dir, tmp_path):
    def sft(out, *extra):
        return main(
            [
                "sft",
                f"data.train_files={gsm8k_parquet}/train.parquet",
                f"data.val_files={gsm8k_parquet}/test.parquet",
                "data.prompt_key=extra_info",
                "data.response_key=extra_info",
                "data.prompt_dict_keys=[question]",
                "data.response_dict_keys=[answer]",
                "data.train_batch_size=4",
                "data.micro_batch_size_per_gpu=1",
                "data.max_length=128",
                "data.truncation=right",
                f"model.partial_pretrain={tiny_model_dir}",
                "model.enable_gradient_checkpointing=False",
                FP32,
                "optim.lr=1e-2",
                "optim.warmup_steps_ratio=0",
                "trainer.device=cpu",
                "trainer.logger=[file]",
                "trainer.total_training_steps=2",
                "trainer.test_freq=2",
                "trainer.save_freq=2",
                f"trainer.default_local_dir={out}",
                *extra,
            ]
        )

    one, two = tmp_path / "one", tmp_path / "two"
    assert sft(one, "data.val_files=null") == 0 and sft(two, "data.val_files=null", *TWO_WORKERS) == 0
    assert (two / "global_step_2" / "model" / "extra_state_world_size_2_rank_1.pt").is_file()
    # the two rows of each worker are sharded and summed across processes: fp32 rounding only
    _assert_same_run(one, two, ("train/loss", "train/grad_norm", "train/loss_tokens", "train/lr"), rel=1e-4)
    assert _rows(two)[2]["train/loss"] < _rows(two)[1]["train/loss"]
    a, b = _weights(one / "global_step_2" / "huggingface"), _weights(two / "global_step_2" / "huggingface")
    assert a.keys() == b.keys()
    for name in a:
        torch.testing.assert_close(b[name], a[name], rtol=1e-3, atol=1e-5, msg=name)


@pytest.mark.slow
def test_rm_on_two_ray_nodes_then_resume_on_one_worker(ray_cluster, tiny_model_dir, tmp_path):
    from hybridrl.data.preprocess import hh_rlhf

    data = tmp_path / "hh"
    hh_rlhf.main(["--input_dir", HH_DIR, "--local_dir", str(data), "--test_ratio", "0.4"])

    def rm(out, *extra):
        return main(
            [
                "rm",
                f"model.path={tiny_model_dir}",
                f"data.train_files={data}/train.parquet",
                f"data.val_files={data}/test.parquet",
                "data.train_max_samples=24",
                "data.val_max_samples=10",
                "data.max_length=32",
                "data.train_batch_size=8",
                "data.micro_batch_size_per_gpu=2",
                FP32,
                "optim.lr=1e-2",
                "optim.lr_scheduler=constant",
                "optim.warmup_steps_ratio=0",
                "trainer.device=cpu",
                "trainer.logger=[file]",
                "trainer.val_before_train=False",
                f"trainer.default_local_dir={out}",
                *extra,
            ]
        )

    one, two = tmp_path / "one", tmp_path / "two"
    assert rm(one, "trainer.total_training_steps=3") == 0
    assert (
        rm(
            two,
            "trainer.total_training_steps=2",
            "trainer.save_freq=2",
            "trainer.backend=ray",
            "trainer.nnodes=2",
            "trainer.n_gpus_per_node=1",
        )
        == 0
    )
    assert (two / "global_step_2" / "model" / "extra_state_world_size_2_rank_1.pt").is_file()
    assert rm(two, "trainer.total_training_steps=3") == 0  # resumes the 2-worker checkpoint on one
    keys = ("train/loss", "train/accuracy", "train/grad_norm", "val/accuracy", "val/loss")
    _assert_same_run(one, two, keys, rel=1e-3)
    state = json.loads((two / "global_step_3" / "trainer_state.json").read_text())
    assert state["val/accuracy"] == _rows(two)[3]["val/accuracy"]
