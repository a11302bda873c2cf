#!/usr/bin/env bash
# GRPO of a Search-R1 style search agent (think / <search> / <information> / <answer>) with the
# bundled SmolLM2-135M-Instruct, on CPU: Natural Questions (open) questions answered against
# Wikipedia lead sections through an in-process BM25 retriever. Metrics: num_turns/*,
# tool_calls/mean, search/valid_rate, search/searches/mean, search/errors, critic/score/mean
# (exact match, hybridrl.rewards.qa_em).
#
# SHARED_DATA: folder with nq_open/dev.jsonl and wiki/corpus.jsonl (default: ../shared/data).
# DATA_DIR: where the parquet goes; INDEX_DIR: where the BM25 index is saved (built once).
# RETRIEVER_URL: use a running retrieval server instead (hybridrl retriever serve ...).
# Extra key=value arguments are passed on to the trainer, e.g. trainer.total_training_steps=3.
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
SHARED_DATA=${SHARED_DATA:-$HERE/../../shared/data}
DATA_DIR=${DATA_DIR:-$HOME/data/search_r1_nq}
INDEX_DIR=${INDEX_DIR:-$HOME/data/wiki_bm25}
CORPUS=$SHARED_DATA/wiki/corpus.jsonl

# Keep the questions whose answer occurs in some passage: the corpus is a small slice of Wikipedia.
# The prompts show three solved examples first (483-502 tokens; a 135M model does not search
# from the bare instruction); add --no_example for Search-R1's plain prompt (under 170 tokens).
[ -f "$DATA_DIR/train.parquet" ] || hybridrl preprocess search_r1 \
    --input_file "$SHARED_DATA/nq_open/dev.jsonl" --corpus "$CORPUS" --answerable_only \
    --test_size 16 --local_dir "$DATA_DIR"

RETRIEVER=(retriever.corpus_path="$CORPUS" retriever.index_dir="$INDEX_DIR")
[ -n "${RETRIEVER_URL:-}" ] && RETRIEVER=(retriever.url="$RETRIEVER_URL")

hybridrl train \
    algorithm.adv_estimator=grpo \
    data.train_files="$DATA_DIR/train.parquet" \
    data.val_files="$DATA_DIR/test.parquet" \
    data.train_batch_size=4 \
    data.val_batch_size=16 \
    data.max_prompt_length=512 \
    data.max_response_length=256 \
    actor_rollout_ref.model.path=HuggingFaceTB/SmolLM2-135M-Instruct \
    actor_rollout_ref.model.enable_gradient_checkpointing=False \
    actor_rollout_ref.actor.optim.lr=1e-6 \
    actor_rollout_ref.actor.ppo_mini_batch_size=4 \
    actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=4 \
    actor_rollout_ref.actor.use_kl_loss=True \
    actor_rollout_ref.actor.kl_loss_coef=0.001 \
    actor_rollout_ref.actor.kl_loss_type=low_var_kl \
    actor_rollout_ref.actor.fsdp_config.mixed_precision.param_dtype=auto \
    actor_rollout_ref.rollout.n=4 \
    actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=8 \
    actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=8 \
    actor_rollout_ref.rollout.multi_turn.enable=True \
    actor_rollout_ref.rollout.multi_turn.max_tokens_per_turn=96 \
    actor_rollout_ref.rollout.multi_turn.search.max_turns=2 \
    actor_rollout_ref.rollout.multi_turn.search.max_obs_length=160 \
    retriever.topk=3 \
    "${RETRIEVER[@]}" \
    trainer.device=auto \
    trainer.logger="['console','file']" \
    trainer.project_name=hybridrl_examples \
    trainer.experiment_name=search_agent \
    trainer.total_training_steps=20 \
    trainer.val_before_train=True \
    trainer.test_freq=10 \
    trainer.save_freq=-1 \
    "$@"
