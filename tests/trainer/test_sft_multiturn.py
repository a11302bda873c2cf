"""A verl engine-style SFT command line (data.messages_key multi-turn rows, model.path,
optim.lr_scheduler_type ...) trains through `hybridrl sft` on the tiny test model."""

import json
import os

import pandas as pd
import pytest

from hybridrl.trainer.sft_trainer import main

pytestmark = pytest.mark.slow  # a training run: the slow tier (tests/conftest.py)

CONVERSATIONS = [
    [
        {"role": "user", "content": "What is 2 + 3?"},
        {"role": "assistant", "content": "2 + 3 = 5."},
        {"role": "user", "content": "And times 4?"},
        {"role": "assistant", "content": "5 * 4 = 20."},
    ],
    [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Capital of France?"},
        {"role": "assistant", "content": "Paris."},
    ],
]


def test_a_verl_engine_sft_command_trains_multi_turn_rows(tiny_model_dir, tmp_path):
    data = tmp_path / "multiturn.parquet"
    pd.DataFrame({"messages": CONVERSATIONS * 2}).to_parquet(data, index=False)
    out = tmp_path / "run"
    code = main(
        [
            f"data.train_files={data}",
            "data.val_files=null",
            "data.messages_key=messages",
            "data.train_batch_size=4",
            "data.micro_batch_size_per_gpu=2",
            "data.max_length=128",
            "data.use_dynamic_bsz=true",  # verl's engine default: the same update here
            f"model.path={tiny_model_dir}",
            f"model.tokenizer_path={tiny_model_dir}",
            "+model.override_config.attention_dropout=0.0",  # as verl command lines add it
            "model.enable_gradient_checkpointing=false",
            "optim.lr=1e-3",
            "optim.lr_warmup_steps_ratio=0",
            "optim.lr_scheduler_type=cosine",
            "optim.min_lr_ratio=0.5",
            "trainer.total_training_steps=2",
            "trainer.device=cpu",
            "trainer.logger=[file]",
            f"trainer.default_local_dir={out}",
        ]
    )
    assert code == 0
    with open(os.path.join(out, "metrics.jsonl")) as f:
        steps = [json.loads(line) for line in f]
    assert [s["step"] for s in steps] == [1, 2]
    # the assistant's tokens of the 4 rows: 4 replies of the first conversation's kind, 2 of the second
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    replies = [m["content"] for c in CONVERSATIONS * 2 for m in c if m["role"] == "assistant"]
    expected = sum(len(tok(r + "<|im_end|>", add_special_tokens=False)["input_ids"]) for r in replies)
    assert steps[0]["train/loss_tokens"] == expected
    assert 0 < steps[0]["train/loss"] < 20
    # cosine from lr down to lr x min_lr_ratio over 2 steps: 1e-3 at step 1, then 5e-4 + 5e-4 x cos(pi/2)
    assert steps[0]["train/lr"] == 1e-3 and abs(steps[1]["train/lr"] - 7.5e-4) < 1e-12
