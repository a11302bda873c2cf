#!/usr/bin/env bash
# SFT of the bundled SmolLM2-135M-Instruct on GSM8K solutions, then (optionally) GRPO from it.
# The GSM8K RL parquet is SFT data as it is: the prompt is its `prompt` chat list (the same text
# the RL run will see) and the response is `extra_info.answer` (the worked solution).
# CPU is slow for this: a step of 8 rows took 2-5 minutes on 2 busy shared cores (val/loss
# 1.43 -> 1.30 after 3 such steps); on a GPU a step takes seconds: raise STEPS there.
# LORA_RANK=32 trains LoRA adapters instead of the whole model.
# GSM8K_JSONL: a folder with GSM8K train.jsonl/test.jsonl (default: ../shared/data/gsm8k).
# Extra key=value arguments are passed on to the trainer (they win over the ones below).
set -euo pipefail
GSM8K_JSONL=${GSM8K_JSONL:-$(dirname "$0")/../../shared/data/gsm8k}
DATA_DIR=${DATA_DIR:-$HOME/data/gsm8k}
TEST_SIZE=${TEST_SIZE:-64}
STEPS=${STEPS:-10}
LORA_RANK=${LORA_RANK:-0}
OUT=${OUT:-checkpoints/hybridrl_examples/gsm8k_sft}
[ -f "$DATA_DIR/train.parquet" ] || hybridrl preprocess gsm8k \
    --input_dir "$GSM8K_JSONL" --local_dir "$DATA_DIR" --test_size "$TEST_SIZE"

hybridrl sft \
    data.train_files="$DATA_DIR/train.parquet" \
    data.val_files="$DATA_DIR/test.parquet" \
    data.prompt_key=prompt \
    data.response_key=extra_info \
    data.response_dict_keys="['answer']" \
    data.max_length=640 \
    data.truncation=error \
    data.train_batch_size=16 \
    data.micro_batch_size_per_gpu=4 \
    model.partial_pretrain=HuggingFaceTB/SmolLM2-135M-Instruct \
    model.enable_gradient_checkpointing=False \
    model.fsdp_config.mixed_precision.param_dtype=auto \
    model.lora_rank="$LORA_RANK" \
    model.lora_alpha=16 \
    optim.lr=1e-5 \
    optim.warmup_steps_ratio=0.1 \
    optim.lr_scheduler=cosine \
    trainer.device=auto \
    trainer.logger="['console','file']" \
    trainer.project_name=hybridrl_examples \
    trainer.experiment_name=gsm8k_sft \
    trainer.default_local_dir="$OUT" \
    trainer.total_training_steps="$STEPS" \
    trainer.test_freq="$STEPS" \
    trainer.save_freq="$STEPS" \
    trainer.max_ckpt_to_keep=1 \
    "$@"

echo "SFT model: $OUT/global_step_$(cat "$OUT/latest_checkpointed_iteration.txt")/huggingface"
echo "GRPO from it: bash examples/run_gsm8k_grpo.sh actor_rollout_ref.model.path=<that folder>"
