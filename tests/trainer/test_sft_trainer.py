"""SFT trainer: the loss goes down on real GSM8K, micro batches add up to the whole batch, LoRA
checkpoints merge and feed `hybridrl train`, resume continues exactly, bad input is one line."""

import json
import os

import pytest
import torch

from hybridrl.trainer.sft_trainer import main
from hybridrl.workers.memory import MEMORY_METRICS
from hybridrl.workers.supervised_worker import accumulate_gradients

# End to end through the command's main(): every test builds the workers or trains (the slow tier).
pytestmark = pytest.mark.slow


def _overrides(data_dir, model_dir, out_dir, *extra):
    """GSM8K RL parquet read as SFT data the way verl's gsm8k SFT example reads it."""
    return [
        f"data.train_files={data_dir}/train.parquet",
        f"data.val_files={data_dir}/test.parquet",
        "data.prompt_key=extra_info",
        "data.response_key=extra_info",
        "data.prompt_dict_keys=[question]",
        "data.response_dict_keys=[answer]",
        "data.train_batch_size=4",
        "data.micro_batch_size_per_gpu=2",
        "data.max_length=128",
        "data.truncation=right",
        f"model.partial_pretrain={model_dir}",
        "model.enable_gradient_checkpointing=False",
        "optim.lr=1e-2",
        "optim.lr_scheduler=constant",
        "optim.warmup_steps_ratio=0",
        "trainer.device=cpu",
        "trainer.logger=[file]",
        f"trainer.default_local_dir={out_dir}",
        *extra,
    ]


def _metrics(out_dir):
    with open(os.path.join(out_dir, "metrics.jsonl")) as f:
        return {row["step"]: row for row in map(json.loads, f)}


def test_sft_lowers_the_validation_loss_on_gsm8k(gsm8k_parquet, tiny_model_dir, tmp_path):
    import pandas as pd

    val = tmp_path / "val.parquet"  # 8 real test rows keep the two validations cheap
    pd.read_parquet(f"{gsm8k_parquet}/test.parquet").head(8).to_parquet(val)
    out = tmp_path / "run"
    assert (
        main(
            _overrides(
                gsm8k_parquet,
                tiny_model_dir,
                out,
                f"data.val_files={val}",
                "data.train_batch_size=2",
                "optim.lr=2e-2",
                "trainer.total_training_steps=8",
                "trainer.test_freq=8",
            )
        )
        == 0
    )
    rows = _metrics(out)
    assert sorted(rows) == list(range(9))  # validation at step 0, then 8 steps
    start, end = rows[0]["val/loss"], rows[8]["val/loss"]
    assert start > 10.0  # a random model: about ln(vocab) = 10.8 nats per token
    assert end < start - 2.0, (start, end)
    assert all(rows[s]["train/loss_tokens"] > 0 and rows[s]["train/lr"] == pytest.approx(2e-2) for s in range(1, 9))
    assert all(rows[s]["perf/max_memory_allocated_gb"] >= rows[s]["perf/cpu_memory_used_gb"] > 0 for s in range(1, 9))
    assert all(key in rows[8] for key in MEMORY_METRICS)


def test_micro_batches_accumulate_to_the_whole_batch_gradient(gsm8k_parquet, tiny_model_dir):
    from omegaconf import OmegaConf

    from hybridrl.data.collate import collate_fn
    from hybridrl.data.sft_dataset import SFTDataset
    from hybridrl.models import load_causal_lm, load_tokenizer
    from hybridrl.trainer.jobs.supervised_config import SFTDataConfig

    cfg = OmegaConf.structured(
        SFTDataConfig(
            prompt_key="extra_info",
            response_key="extra_info",
            max_length=48,
            prompt_dict_keys=["question"],
            response_dict_keys=["answer"],
            truncation="left",
        )
    )
    ds = SFTDataset(f"{gsm8k_parquet}/test.parquet", load_tokenizer(tiny_model_dir), cfg)
    batch = collate_fn([ds[i] for i in range(4)])
    batch["loss_mask"][0, 30:] = 0  # rows with different token counts: per-micro means would differ
    model = load_causal_lm(tiny_model_dir)

    def grads(micro):
        model.zero_grad(set_to_none=True)
        loss = accumulate_gradients(model, batch, micro)
        return loss, [p.grad.clone() for p in model.parameters()]

    # reference: mean cross-entropy over every label token of the batch, in one pass
    model.zero_grad(set_to_none=True)
    logits = model(
        input_ids=batch["input_ids"], attention_mask=batch["attention_mask"], position_ids=batch["position_ids"]
    ).logits
    labels = batch["input_ids"][:, 1:].masked_fill(batch["loss_mask"][:, 1:] == 0, -100)
    ref_loss = torch.nn.functional.cross_entropy(logits[:, :-1].flatten(0, 1), labels.flatten())
    ref_loss.backward()
    ref = [p.grad.clone() for p in model.parameters()]

    for micro in (1, 3, 4):
        loss, got = grads(micro)
        assert loss == pytest.approx(ref_loss.item(), rel=1e-5)
        for g, r in zip(got, ref):
            torch.testing.assert_close(g, r, rtol=1e-4, atol=1e-7)


PPO_ONE_STEP = [
    "data.train_batch_size=2",
    "data.val_batch_size=4",
    "data.max_prompt_length=256",
    "data.filter_overlong_prompts=True",
    "data.max_response_length=8",
    "algorithm.adv_estimator=grpo",
    "actor_rollout_ref.actor.ppo_mini_batch_size=2",
    "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=2",
    "actor_rollout_ref.rollout.n=2",
    "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=4",
    "trainer.device=cpu",
    "trainer.logger=[file]",
    "trainer.total_training_steps=1",
    "trainer.val_before_train=False",
    "trainer.test_freq=-1",
]


def test_lora_checkpoint_has_adapter_and_merged_model_that_ppo_trains_from(
    gsm8k_parquet, tiny_model_dir, tmp_path, capsys
):
    from peft import PeftModel

    from hybridrl.models import load_causal_lm
    from hybridrl.trainer import main_ppo

    out = tmp_path / "sft"
    lora = _overrides(
        gsm8k_parquet,
        tiny_model_dir,
        out,
        "data.val_files=null",
        "model.lora_rank=4",
        "model.lora_alpha=8",
        "trainer.save_freq=1",
    )
    assert main(lora + ["trainer.total_training_steps=1"]) == 0
    assert main(lora + ["trainer.total_training_steps=2"]) == 0  # resumes the adapter at step 1
    assert "resumed from" in capsys.readouterr().out
    step = out / "global_step_2"
    for name in (
        "model/lora_adapter/adapter_config.json",
        "model/lora_adapter/adapter_model.safetensors",
        "huggingface/config.json",
        "huggingface/model.safetensors",
        "huggingface/tokenizer.json",
    ):
        assert (step / name).is_file(), name
    assert json.loads((step / "model/lora_adapter/adapter_config.json").read_text())["r"] == 4
    assert main(lora + ["model.lora_rank=0", "trainer.total_training_steps=3"]) == 2  # cannot resume as full
    assert "was written with model.lora_rank=4 but this run has lora_rank=0" in capsys.readouterr().err

    # the merged folder is the base model plus the adapter's update
    ids = torch.tensor([[1, 500, 1000, 1500, 2000]])
    merged = load_causal_lm(str(step / "huggingface"))(input_ids=ids).logits
    base = load_causal_lm(tiny_model_dir)
    base_logits = base(input_ids=ids).logits
    with_adapter = PeftModel.from_pretrained(base, str(step / "model/lora_adapter"))(input_ids=ids).logits
    torch.testing.assert_close(merged, with_adapter, rtol=1e-4, atol=1e-4)
    assert (merged - base_logits).abs().max() > 1e-3  # training moved the adapter off its zero start

    ppo = [
        f"data.train_files={gsm8k_parquet}/train.parquet",
        f"data.val_files={gsm8k_parquet}/test.parquet",
        f"actor_rollout_ref.model.path={step / 'huggingface'}",
        f"trainer.default_local_dir={tmp_path / 'ppo'}",
    ]
    assert main_ppo.main(ppo + PPO_ONE_STEP) == 0
    with open(tmp_path / "ppo" / "metrics.jsonl") as f:
        assert json.loads(f.readline())["step"] == 1


def test_resume_continues_at_the_next_step_as_if_never_stopped(gsm8k_parquet, tiny_model_dir, tmp_path, capsys):
    import shutil

    from safetensors.torch import load_file

    out = tmp_path / "run"
    argv = _overrides(
        gsm8k_parquet,
        tiny_model_dir,
        out,
        "data.val_files=null",
        "data.max_length=64",
        "data.truncation=left",
        "optim.lr_scheduler=cosine",
        "optim.warmup_steps_ratio=0.34",
        "trainer.total_training_steps=3",
        "trainer.save_freq=1",
    )
    assert main(argv) == 0
    expected = _metrics(out)[3]
    expected_weights = load_file(out / "global_step_3" / "huggingface" / "model.safetensors")
    # as if the run had died during step 3: its checkpoint never appeared
    shutil.rmtree(out / "global_step_3")
    (out / "latest_checkpointed_iteration.txt").write_text("2")
    assert main(argv) == 0
    resumed = _metrics(out)
    assert sorted(resumed) == [1, 2, 3]
    for key in ("train/loss", "train/grad_norm", "train/lr", "train/loss_tokens"):
        assert resumed[3][key] == pytest.approx(expected[key], rel=1e-6), key
    weights = load_file(out / "global_step_3" / "huggingface" / "model.safetensors")
    assert weights.keys() == expected_weights.keys()
    for name, tensor in weights.items():
        torch.testing.assert_close(tensor, expected_weights[name], rtol=0, atol=0)
    # the finished run launched again: one line says so, nothing trains
    capsys.readouterr()
    assert main(argv) == 0
    assert "hybridrl: the run is complete: its checkpoint is at step 3 of trainer.total_training_steps=3" in (
        capsys.readouterr().out
    )
    assert _metrics(out) == resumed and not (out / "global_step_4").exists()


@pytest.mark.parametrize(
    "bad, message",
    [
        (["data.max_length=64", "data.truncation=error"], "tokens long, more than data.max_length=64"),
        (["data.prompt_key=problem"], "'problem' (data.prompt_key)"),
        (["data.response_dict_keys=[solution]"], "no key 'solution'"),
        (["optim.lr_scheduler=linear"], "optim.lr_scheduler='linear' is not one of constant, cosine, wsd"),
        (["data.micro_batch_size_per_gpu=8"], "data.micro_batch_size_per_gpu=8 is larger than data.train_batch_size=4"),
        (
            ["trainer.n_gpus_per_node=3"],
            "data.train_batch_size=4 does not split over trainer.nnodes x trainer.n_gpus_per_node",
        ),
        (["data.max_length=long"], "data.max_length: Value 'long' of type 'str' could not be converted to Integer"),
        (["model.lora_rank=4", "model.target_modules=[nope_proj]"], "model.target_modules"),
        (["data.train_files=/nonexistent/train.parquet"], "data.train_files: file /nonexistent/train.parquet"),
        (["trainer.resume_mode=resume_path"], "trainer.resume_from_path"),
        (
            ["trainer.resume_mode=resume_path", "trainer.resume_from_path=/nonexistent/global_step_1"],
            "/nonexistent/global_step_1 is not a complete checkpoint",
        ),
    ],
)
def test_bad_input_gets_one_line(gsm8k_parquet, tiny_model_dir, tmp_path, capsys, bad, message):
    from hybridrl.cli import main as cli_main

    argv = _overrides(gsm8k_parquet, tiny_model_dir, tmp_path, "data.val_files=null", *bad)
    assert cli_main(["sft", *argv]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    errors = [line for line in err if line.startswith("hybridrl: error:")]  # (transformers' progress bars aside)
    assert len(errors) == 1 and errors[0] == err[-1] and message in errors[0], err


def test_too_long_row_message_names_the_row_and_the_limit(gsm8k_parquet, tiny_model_dir, tmp_path, capsys):
    argv = _overrides(gsm8k_parquet, tiny_model_dir, tmp_path, "data.max_length=64", "data.truncation=error")
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert f"row 0 of {gsm8k_parquet}/train.parquet is " in err and "more than data.max_length=64" in err


def test_a_second_run_on_the_same_folder_stops_at_once_with_one_line(gsm8k_parquet, tiny_model_dir, tmp_path, capsys):
    from hybridrl.trainer.run.checkpoint_lock import run_folder_lock

    out = tmp_path / "run"
    with run_folder_lock(str(out)):  # as a running `hybridrl sft` holds it
        assert main(_overrides(gsm8k_parquet, tiny_model_dir, out, "trainer.total_training_steps=1")) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"hybridrl: error: trainer.default_local_dir={out} is in use"), err
    assert f"pid {os.getpid()}" in err[0] and not (out / "metrics.jsonl").exists()


def test_after_each_epoch_validates_and_saves_at_every_epochs_end(gsm8k_head, tiny_model_dir, tmp_path):
    """verl's SFT trainer spelling: ``trainer.test_freq=after_each_epoch`` (and ``save_freq``) is
    one epoch's steps: 4 rows in batches of 2 are 2 steps an epoch."""
    data, out = gsm8k_head(4), tmp_path / "run"
    extra = ["data.train_batch_size=2", "trainer.total_epochs=2", "trainer.val_before_train=False"]
    freq = ["trainer.test_freq=after_each_epoch", "trainer.save_freq=after_each_epoch"]
    assert main(_overrides(data, tiny_model_dir, out, *extra, *freq)) == 0
    rows = _metrics(out)
    assert sorted(rows) == [1, 2, 3, 4]
    assert [s for s in rows if "val/loss" in rows[s]] == [2, 4]
    assert sorted(p.name for p in out.glob("global_step_*")) == ["global_step_2", "global_step_4"]
