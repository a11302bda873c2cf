"""The vLLM engine (rollout.name=vllm) on a tiny fp32 model: the BaseRollout layout, greedy output
and log-probs against the HF model, the sampling distribution, weight sync (plain and LoRA), bad
input, and GRPO end to end. vLLM's CPU attention needs head_dim >= 32: the model here has 64.

vLLM keeps its parallel state in module globals: one engine per process, as in training. The
tests share one engine (tests that change its weights put the model's back); the engines built
by the last tests are the only others and come after every use of the shared one."""

import copy
import json
import os

import pytest
import torch
from omegaconf import OmegaConf

from hybridrl.protocol import DataProto

pytest.importorskip("vllm", reason="the vllm extra is not installed (pip install -e '.[vllm]')")

from hybridrl.workers.rollout.base import RolloutEngineError  # noqa: E402
from hybridrl.workers.rollout.vllm import VLLMRollout  # noqa: E402

R = 10  # response length


@pytest.fixture(scope="module")
def model_dir(tokenizer_dir, tmp_path_factory):
    from hybridrl.models import build_tiny_model

    return build_tiny_model(tokenizer_dir, str(tmp_path_factory.mktemp("tiny_vllm")), hidden_size=128,
                            num_heads=2, num_kv_heads=1, intermediate_size=256)


@pytest.fixture(scope="module")
def model(model_dir):
    from hybridrl.models import load_causal_lm

    return load_causal_lm(model_dir, dtype="fp32").eval()


def _config(**overrides):
    cfg = {"name": "vllm", "dtype": "fp32", "prompt_length": 32, "response_length": R, "do_sample": True,
           "temperature": 1.0, "top_k": -1, "top_p": 1.0, "ignore_eos": False, "calculate_log_probs": True,
           "load_format": "dummy_dtensor", "kv_cache_memory_gb": 0.05, "max_num_seqs": 4096}
    return OmegaConf.create({**cfg, **overrides})


@pytest.fixture(scope="module")
def engine(model, tokenizer):
    return VLLMRollout(copy.deepcopy(model), _config(), tokenizer, model.generation_config)


def _prompts(tokenizer, texts, n=1, **meta):
    ids = [tokenizer(t)["input_ids"] for t in texts]
    width = max(map(len, ids))
    input_ids = torch.tensor([[tokenizer.pad_token_id] * (width - len(i)) + i for i in ids]).repeat_interleave(n, 0)
    mask = torch.tensor([[0] * (width - len(i)) + [1] * len(i) for i in ids]).repeat_interleave(n, 0)
    return DataProto.from_dict({"input_ids": input_ids, "attention_mask": mask,
                                "position_ids": (mask.cumsum(1) - 1).clamp(min=0)}, meta_info=meta)


TEXTS = ["The capital of France is", "1 + 1 =", "Once upon a time, in a land far"]


def _actor_log_probs(model, batch):
    """Teacher-forced log-probs of the responses under the HF model, (bs, R)."""
    with torch.no_grad():
        logits = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"],
                       position_ids=batch["position_ids"]).logits.float()
    width = batch["responses"].shape[1]
    return torch.log_softmax(logits[:, -width - 1:-1], -1).gather(-1, batch["responses"][..., None]).squeeze(-1)


def test_layout_and_rollout_log_probs_match_the_actor(engine, model, tokenizer):
    prompts = _prompts(tokenizer, TEXTS, n=2)
    out = engine.generate_sequences(prompts).batch
    bs, P = prompts.batch["input_ids"].shape
    for key, width in (("prompts", P), ("responses", R), ("response_mask", R), ("input_ids", P + R),
                       ("attention_mask", P + R), ("position_ids", P + R), ("rollout_log_probs", R)):
        assert out[key].shape == (bs, width), key
    assert torch.equal(out["input_ids"][:, :P], prompts.batch["input_ids"])
    mask = out["response_mask"].bool()
    assert torch.equal(out["attention_mask"][:, P:], out["response_mask"])
    assert (out["responses"][~mask] == tokenizer.pad_token_id).all()
    assert (out["rollout_log_probs"][~mask] == 0).all() and (out["rollout_log_probs"][mask] < 0).all()
    # fp32 on both sides: the engine's sampled-token log-probs are the actor's (measured max 1e-6)
    actor = _actor_log_probs(model, out)
    torch.testing.assert_close(out["rollout_log_probs"][mask], actor[mask], atol=1e-4, rtol=0)


def test_greedy_equals_the_hf_model(engine, model, tokenizer):
    """Greedy tokens equal the HF argmax tokens, except where the two top logits tie within
    1e-4 (kernels differ in the last bits; a near-tie may break either way)."""
    prompts = _prompts(tokenizer, TEXTS, do_sample=False)
    out = engine.generate_sequences(prompts).batch
    with torch.no_grad():
        logits = model(input_ids=out["input_ids"], attention_mask=out["attention_mask"],
                       position_ids=out["position_ids"]).logits[:, -R - 1:-1].float()
    top2 = logits.topk(2, dim=-1).values
    agrees = logits.argmax(-1) == out["responses"]
    assert (agrees | (top2[..., 0] - top2[..., 1] < 1e-4)).all()
    assert agrees.float().mean() > 0.9


def test_sampled_first_tokens_follow_the_top_k_softmax(engine, model, tokenizer):
    """2,000 samples of one prompt's first token at T=0.7, top_k=5: frequencies match the
    renormalised top-5 softmax; rollout_log_probs are its log-probs."""
    n = 2000
    prompts = _prompts(tokenizer, ["The"], n=n, temperature=0.7, top_k=5, response_length=1)
    out = engine.generate_sequences(prompts).batch
    with torch.no_grad():
        logits = model(input_ids=prompts.batch["input_ids"][:1]).logits[0, -1].float() / 0.7
    top = logits.topk(5)
    probs = torch.softmax(top.values, -1)
    first = out["responses"][:, 0]
    assert set(first.tolist()) <= set(top.indices.tolist())
    freq = torch.stack([(first == t).float().mean() for t in top.indices])
    torch.testing.assert_close(freq, probs, atol=0.035, rtol=0)  # 3.5 sigma at n=2000
    expected = {t: p for t, p in zip(top.indices.tolist(), probs.log().tolist())}
    got = out["rollout_log_probs"][:, 0]
    assert all(abs(g - expected[t]) < 1e-4 for t, g in zip(first.tolist(), got.tolist()))


def test_stop_tokens_end_a_response_and_ignore_eos_overrides_them(engine, tokenizer):
    """The random model rarely samples its real EOS: the first greedy token of the first prompt is
    made the stop token, so each response must end at its first occurrence of it; with
    ignore_eos the full length is generated."""
    prompts = _prompts(tokenizer, TEXTS, do_sample=False)
    free = engine.generate_sequences(prompts).batch["responses"]
    stop = int(free[0, 0])
    saved = engine.eos_token_ids
    engine.eos_token_ids = [stop]
    try:
        stopped = engine.generate_sequences(prompts).batch
        engine.config.ignore_eos = True
        ignored = engine.generate_sequences(prompts).batch
    finally:
        engine.eos_token_ids, engine.config.ignore_eos = saved, False
    for row, mask, out in zip(free.tolist(), stopped["response_mask"].tolist(), stopped["responses"].tolist()):
        end = row.index(stop) + 1 if stop in row else R  # up to and including the stop token
        assert mask == [1] * end + [0] * (R - end)
        assert out == row[:end] + [tokenizer.pad_token_id] * (R - end)
    assert stopped["response_mask"][0].tolist() == [1] + [0] * (R - 1)
    assert ignored["response_mask"].all() and torch.equal(ignored["responses"], free)


def test_sync_weights_changes_and_restores_greedy_output(engine, model, tokenizer):
    actor = copy.deepcopy(model)
    prompts = _prompts(tokenizer, TEXTS, do_sample=False)
    before = engine.generate_sequences(prompts).batch["responses"]
    saved = copy.deepcopy(actor.state_dict())
    with torch.no_grad():
        for p in actor.parameters():
            p.add_(torch.randn_like(p) * 0.5)
    engine.sync_weights(actor)
    perturbed = engine.generate_sequences(prompts).batch["responses"]
    assert not torch.equal(perturbed, before)
    actor.load_state_dict(saved)
    engine.sync_weights(actor)
    assert torch.equal(engine.generate_sequences(prompts).batch["responses"], before)


def test_lora_actor_syncs_its_merged_weights(engine, model, tokenizer):
    from hybridrl.models.lora import apply_lora

    lora = apply_lora(copy.deepcopy(model), lora_rank=4, lora_alpha=8, seed=0)
    with torch.no_grad():
        for name, p in lora.named_parameters():
            if "lora_B" in name:
                p.normal_(0, 0.5)  # a trained adapter (lora_B starts at zero)
    merged = copy.deepcopy(lora).merge_and_unload()
    try:
        engine.sync_weights(lora)
        out = engine.generate_sequences(_prompts(tokenizer, TEXTS, n=2)).batch
    finally:
        engine.sync_weights(model)
    mask = out["response_mask"].bool()
    torch.testing.assert_close(out["rollout_log_probs"][mask], _actor_log_probs(merged, out)[mask], atol=1e-4, rtol=0)
    assert not torch.allclose(_actor_log_probs(model, out)[mask], out["rollout_log_probs"][mask], atol=1e-2)


def test_token_ids_in_token_ids_out(engine, tokenizer):
    """Unpadded ids in, new ids out: greedily the same tokens generate_sequences gives, no padding."""
    out = engine.generate_token_ids([tokenizer(t)["input_ids"] for t in TEXTS], max_new_tokens=R,
                                    sampling_kwargs={"do_sample": False})
    batch = engine.generate_sequences(_prompts(tokenizer, TEXTS, do_sample=False)).batch
    assert out == [row[mask.bool()].tolist() for row, mask in zip(batch["responses"], batch["response_mask"])]


def test_a_prompt_longer_than_max_model_len_is_one_line(engine, tokenizer):
    long = _prompts(tokenizer, ["word " * 60])
    with pytest.raises(RolloutEngineError, match=r"does not fit actor_rollout_ref.rollout.max_model_len=42"):
        engine.generate_sequences(long)


def test_vllm_missing_is_one_line_naming_the_extra(monkeypatch):
    import builtins

    from hybridrl.workers.rollout import vllm as engine_module

    real_import = builtins.__import__

    def no_vllm(name, *args, **kwargs):
        if name == "vllm" or name.startswith("vllm."):
            raise ImportError("No module named 'vllm'")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_vllm)
    with pytest.raises(RolloutEngineError, match=r"pip install -e '\.\[vllm\]'") as err:
        engine_module.import_vllm()
    assert "\n" not in str(err.value)


def test_an_architecture_vllm_cannot_run_is_one_line(tiny_model_dir, tokenizer):
    """The default tiny test model has head_dim 16, which vLLM's CPU attention refuses."""
    from hybridrl.models import load_causal_lm

    module = load_causal_lm(tiny_model_dir, dtype="fp32")
    with pytest.raises(RolloutEngineError, match=r"could not start an engine for LlamaForCausalLM: .*rollout.name=hf"):
        VLLMRollout(module, _config(), tokenizer, module.generation_config)


@pytest.mark.slow
def test_grpo_two_steps_with_vllm_log_mismatch_metrics(gsm8k_parquet, model_dir, tmp_path):
    from hybridrl.trainer.main_ppo import main

    out = tmp_path / "run"
    args = [f"data.train_files={gsm8k_parquet}/train.parquet", f"data.val_files={gsm8k_parquet}/test.parquet",
            "data.train_batch_size=4", "data.val_batch_size=8", "data.max_prompt_length=256",
            "data.filter_overlong_prompts=True", "data.max_response_length=12", f"actor_rollout_ref.model.path={model_dir}",
            "algorithm.adv_estimator=grpo", "actor_rollout_ref.actor.ppo_mini_batch_size=4",
            "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=4", "actor_rollout_ref.actor.optim.lr=1e-3",
            "actor_rollout_ref.actor.use_kl_loss=False", "actor_rollout_ref.rollout.n=2",
            "actor_rollout_ref.rollout.name=vllm", "actor_rollout_ref.rollout.kv_cache_memory_gb=0.1",
            "actor_rollout_ref.actor.fsdp_config.mixed_precision.param_dtype=fp32",
            "actor_rollout_ref.rollout.dtype=fp32", "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=8",
            "custom_reward_function.path=" + str(_length_reward(tmp_path)), "custom_reward_function.name=length_reward",
            "trainer.device=cpu", "trainer.logger=['console','file']", f"trainer.default_local_dir={out}",
            "trainer.total_training_steps=2", "trainer.test_freq=2", "trainer.save_freq=-1"]
    assert main(args) == 0
    rows = [json.loads(line) for line in open(os.path.join(out, "metrics.jsonl"))]
    steps = [r for r in rows if "training/rollout_probs_diff_max" in r]
    assert [r["step"] for r in steps] == [1, 2]
    for r in steps:  # fp32 engine and fp32 actor: the same distribution up to kernel rounding
        assert r["training/rollout_probs_diff_max"] < 1e-3
        assert r["training/rollout_actor_probs_pearson_corr"] > 0.999
    assert any("val-core/" in k for k in rows[-1])


def _length_reward(tmp_path):
    path = tmp_path / "length_reward.py"
    path.write_text("def length_reward(data_source, solution_str, ground_truth, extra_info=None):\n"
                    "    return (len(solution_str) % 7) / 7.0\n")
    return path


@pytest.mark.slow
def test_hybridrl_generate_with_vllm_samples_n_responses(gsm8k_parquet, model_dir, tmp_path):
    import pandas as pd

    from hybridrl.config import load_config
    from hybridrl.trainer.main_generation import run_generation

    prompts = tmp_path / "prompts.parquet"
    pd.read_parquet(gsm8k_parquet / "test.parquet").head(3).to_parquet(prompts, index=False)
    out = tmp_path / "out.parquet"
    cfg = load_config([f"data.path={prompts}", f"data.output_path={out}", f"model.path={model_dir}",
                       "data.n_samples=2", "data.batch_size=3", "rollout.response_length=6", "rollout.prompt_length=256",
                       "rollout.dtype=float32", "rollout.name=vllm", "rollout.kv_cache_memory_gb=0.05",
                       "trainer.device=cpu"], config_name="generation")
    assert run_generation(cfg) == str(out)
    responses = pd.read_parquet(out)["responses"].tolist()
    assert len(responses) == 3 and all(len(r) == 2 for r in responses)
    assert any(r[0] != r[1] for r in responses)  # n samples per prompt, not copies
