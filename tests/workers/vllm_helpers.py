"""Helpers shared by the vLLM engine tests (sync and async mode)."""

import copy

import pytest
import torch

from hybridrl.protocol import DataProto
from tests.tiny_models import ppo_section

R = 10  # response length
TEXTS = ["The capital of France is", "1 + 1 =", "Once upon a time, in a land far"]


def engine_config(**overrides):
    cfg = {
        "name": "vllm",
        "dtype": "fp32",
        "prompt_length": 32,
        "response_length": R,
        "do_sample": True,
        "temperature": 1.0,
        "top_k": -1,
        "top_p": 1.0,
        "ignore_eos": False,
        "calculate_log_probs": True,
        "load_format": "dummy_dtensor",
        "kv_cache_memory_gb": 0.05,
        "max_num_seqs": 4096,
    }
    return ppo_section("actor_rollout_ref.rollout", {**cfg, **overrides})


def make_prompts(tokenizer, texts, n=1, **meta):
    """Left-padded prompt batch of ``texts``, each repeated ``n`` times (interleaved)."""
    ids = [tokenizer(t)["input_ids"] for t in texts]
    width = max(map(len, ids))
    input_ids = torch.tensor([[tokenizer.pad_token_id] * (width - len(i)) + i for i in ids]).repeat_interleave(n, 0)
    mask = torch.tensor([[0] * (width - len(i)) + [1] * len(i) for i in ids]).repeat_interleave(n, 0)
    return DataProto.from_dict(
        {"input_ids": input_ids, "attention_mask": mask, "position_ids": (mask.cumsum(1) - 1).clamp(min=0)},
        meta_info=meta,
    )


def actor_log_probs(model, batch):
    """Teacher-forced log-probs of the responses under the HF model, (bs, R)."""
    with torch.no_grad():
        logits = model(
            input_ids=batch["input_ids"], attention_mask=batch["attention_mask"], position_ids=batch["position_ids"]
        ).logits.float()
    width = batch["responses"].shape[1]
    return torch.log_softmax(logits[:, -width - 1 : -1], -1).gather(-1, batch["responses"][..., None]).squeeze(-1)


def assert_greedy_matches(model, out):
    """Greedy tokens equal the HF argmax tokens, except where the two top logits tie within 1e-4
    (kernels differ in the last bits; a near-tie may break either way)."""
    width = out["responses"].shape[1]
    with torch.no_grad():
        logits = (
            model(input_ids=out["input_ids"], attention_mask=out["attention_mask"], position_ids=out["position_ids"])
            .logits[:, -width - 1 : -1]
            .float()
        )
    top2 = logits.topk(2, dim=-1).values
    agrees = logits.argmax(-1) == out["responses"]
    assert (agrees | (top2[..., 0] - top2[..., 1] < 1e-4)).all()
    assert agrees.float().mean() > 0.9


def length_reward_file(tmp_path):
    path = tmp_path / "length_reward.py"
    path.write_text(
        "def length_reward(data_source, solution_str, ground_truth, extra_info=None):\n"
        "    return (len(solution_str) % 7) / 7.0\n"
    )
    return path


def grpo_overrides(data_dir, model_dir, out_dir, reward_path, *extra):
    """Two GRPO steps of the tiny vLLM-capable model in fp32 on GSM8K prompts."""
    return [
        f"data.train_files={data_dir}/train.parquet",
        f"data.val_files={data_dir}/test.parquet",
        "data.train_batch_size=4",
        "data.val_batch_size=8",
        "data.max_prompt_length=256",
        "data.filter_overlong_prompts=True",
        "data.max_response_length=12",
        f"actor_rollout_ref.model.path={model_dir}",
        "algorithm.adv_estimator=grpo",
        "actor_rollout_ref.actor.ppo_mini_batch_size=4",
        "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=4",
        "actor_rollout_ref.actor.optim.lr=1e-3",
        "actor_rollout_ref.actor.use_kl_loss=False",
        "actor_rollout_ref.rollout.n=2",
        "actor_rollout_ref.rollout.name=vllm",
        "actor_rollout_ref.rollout.kv_cache_memory_gb=0.1",
        "actor_rollout_ref.actor.fsdp_config.mixed_precision.param_dtype=fp32",
        "actor_rollout_ref.rollout.dtype=fp32",
        "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=8",
        f"custom_reward_function.path={reward_path}",
        "custom_reward_function.name=length_reward",
        "trainer.device=cpu",
        "trainer.logger=['console','file']",
        f"trainer.default_local_dir={out_dir}",
        "trainer.total_training_steps=2",
        "trainer.test_freq=2",
        "trainer.save_freq=-1",
        *extra,
    ]


def assert_log_probs_are_the_actors(engine, actor, tokenizer):
    """Every layer took the actor's weights, the tied output layer included: the engine's sampled
    log-probs are the actor's (fp32 on both sides)."""
    out = engine.generate_sequences(make_prompts(tokenizer, TEXTS, n=2)).batch
    mask = out["response_mask"].bool()
    torch.testing.assert_close(out["rollout_log_probs"][mask], actor_log_probs(actor, out)[mask], atol=1e-4, rtol=0)


def check_weight_sync(engine, model, tokenizer):
    """Perturbed weights change greedy outputs and reach every layer; the model's own weights
    restore the outputs exactly."""
    actor = copy.deepcopy(model)
    prompts = make_prompts(tokenizer, TEXTS, do_sample=False)
    before = engine.generate_sequences(prompts).batch["responses"]
    with torch.no_grad():
        for p in actor.parameters():
            p.add_(torch.randn_like(p) * 0.5)
    engine.sync_weights(actor)
    assert not torch.equal(engine.generate_sequences(prompts).batch["responses"], before)
    assert_log_probs_are_the_actors(engine, actor, tokenizer)
    engine.sync_weights(model)
    assert torch.equal(engine.generate_sequences(prompts).batch["responses"], before)


def check_lora_sync(engine, model, tokenizer):
    """A LoRA actor sends only its adapted layers, adapters merged; the engine keeps the others."""
    from hybridrl.models.lora import apply_lora

    lora = apply_lora(copy.deepcopy(model), lora_rank=4, lora_alpha=8, seed=0)
    with torch.no_grad():
        for name, p in lora.named_parameters():
            if "lora_B" in name:
                p.normal_(0, 0.5)  # a trained adapter (lora_B starts at zero)
    merged = copy.deepcopy(lora).merge_and_unload()
    try:
        engine.sync_weights(lora)
        assert_log_probs_are_the_actors(engine, merged, tokenizer)
        with pytest.raises(AssertionError):  # the base weights alone do not give these log-probs
            assert_log_probs_are_the_actors(engine, model, tokenizer)
    finally:
        engine.sync_weights(model)
