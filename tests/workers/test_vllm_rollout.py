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

pytest.importorskip("vllm", reason="the vllm extra is not installed (pip install -e '.[vllm]')")

from vllm_helpers import (
    TEXTS,
    R,
    actor_log_probs,
    assert_greedy_matches,
    check_lora_sync,
    check_weight_sync,
    engine_config,
    grpo_overrides,
    length_reward_file,
    make_prompts,
)

from hybridrl.workers.rollout.base import RolloutEngineError
from hybridrl.workers.rollout.vllm import VLLMRollout


@pytest.fixture(scope="module")
def engine(vllm_model, tokenizer):
    return VLLMRollout(copy.deepcopy(vllm_model), engine_config(), tokenizer, vllm_model.generation_config)


def test_layout_and_rollout_log_probs_match_the_actor(engine, vllm_model, tokenizer):
    prompts = make_prompts(tokenizer, TEXTS, n=2)
    out = engine.generate_sequences(prompts).batch
    bs, P = prompts.batch["input_ids"].shape
    for key, width in (
        ("prompts", P),
        ("responses", R),
        ("response_mask", R),
        ("input_ids", P + R),
        ("attention_mask", P + R),
        ("position_ids", P + R),
        ("rollout_log_probs", R),
    ):
        assert out[key].shape == (bs, width), key
    assert torch.equal(out["input_ids"][:, :P], prompts.batch["input_ids"])
    mask = out["response_mask"].bool()
    assert torch.equal(out["attention_mask"][:, P:], out["response_mask"])
    assert (out["responses"][~mask] == tokenizer.pad_token_id).all()
    assert (out["rollout_log_probs"][~mask] == 0).all() and (out["rollout_log_probs"][mask] < 0).all()
    # fp32 on both sides: the engine's sampled-token log-probs are the actor's (measured max 1e-6)
    actor = actor_log_probs(vllm_model, out)
    torch.testing.assert_close(out["rollout_log_probs"][mask], actor[mask], atol=1e-4, rtol=0)


def test_greedy_equals_the_hf_model(engine, vllm_model, tokenizer):
    assert_greedy_matches(vllm_model, engine.generate_sequences(make_prompts(tokenizer, TEXTS, do_sample=False)).batch)


def test_sampled_first_tokens_follow_the_top_k_softmax(engine, vllm_model, tokenizer):
    """2,000 samples of one prompt's first token at T=0.7, top_k=5: frequencies match the
    renormalised top-5 softmax; rollout_log_probs are its log-probs."""
    n = 2000
    prompts = make_prompts(tokenizer, ["The"], n=n, temperature=0.7, top_k=5, response_length=1)
    out = engine.generate_sequences(prompts).batch
    with torch.no_grad():
        logits = vllm_model(input_ids=prompts.batch["input_ids"][:1]).logits[0, -1].float() / 0.7
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
    """The random vllm_model rarely samples its real EOS: the first greedy token of the first prompt is
    made the stop token, so each response must end at its first occurrence of it; with
    ignore_eos the full length is generated."""
    prompts = make_prompts(tokenizer, TEXTS, do_sample=False)
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


def test_sync_weights_changes_and_restores_greedy_output(engine, vllm_model, tokenizer):
    check_weight_sync(engine, vllm_model, tokenizer)


def test_lora_actor_syncs_its_merged_weights(engine, vllm_model, tokenizer):
    check_lora_sync(engine, vllm_model, tokenizer)


def test_token_ids_in_token_ids_out(engine, tokenizer):
    """Unpadded ids in, new ids out: greedily the same tokens generate_sequences gives, no padding."""
    out = engine.generate_token_ids(
        [tokenizer(t)["input_ids"] for t in TEXTS], max_new_tokens=R, sampling_kwargs={"do_sample": False}
    )
    batch = engine.generate_sequences(make_prompts(tokenizer, TEXTS, do_sample=False)).batch
    assert out == [row[mask.bool()].tolist() for row, mask in zip(batch["responses"], batch["response_mask"])]


def test_a_prompt_longer_than_max_model_len_is_one_line(engine, tokenizer):
    long = make_prompts(tokenizer, ["word " * 60])
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


@pytest.mark.slow
def test_an_architecture_vllm_cannot_run_is_one_line(tiny_model_dir, tokenizer):
    """The default tiny test vllm_model has head_dim 16, which vLLM's CPU attention refuses."""
    from hybridrl.models import load_causal_lm

    module = load_causal_lm(tiny_model_dir, dtype="fp32")
    with pytest.raises(RolloutEngineError, match=r"could not start an engine for LlamaForCausalLM: .*rollout.name=hf"):
        VLLMRollout(module, engine_config(), tokenizer, module.generation_config)


_NO_KV_CACHE = (
    "No available memory for the cache blocks. Try increasing `gpu_memory_utilization` when initializing the engine"
)


@pytest.mark.parametrize(
    "error, device, overrides, key",
    [
        (ValueError(_NO_KV_CACHE), "cpu", {}, "actor_rollout_ref.rollout.kv_cache_memory_gb (now 0.05)"),
        (ValueError(_NO_KV_CACHE), "cuda", {"kv_cache_memory_gb": None}, "rollout.gpu_memory_utilization (now 0.5)"),
        (
            ValueError("User-specified max_model_len (40) is greater than the derived max_model_len (32)"),
            "cpu",
            {},
            "actor_rollout_ref.rollout.max_model_len (now 40 = prompt_length + response_length)",
        ),
        (
            RuntimeError("Engine core initialization failed. See root cause above."),
            "cpu",
            {"engine_kwargs": {"vllm": {"swap_space": 99}}},
            "actor_rollout_ref.rollout.engine_kwargs.vllm.swap_space (now 99)",
        ),
        (
            TypeError("EngineArgs.__init__() got an unexpected keyword argument 'swap_space'"),
            "cpu",
            {"engine_kwargs": {"vllm": {"swap_space": 4}}},
            "actor_rollout_ref.rollout.engine_kwargs.vllm.swap_space (now 4)",
        ),
        (
            ValueError("Bfloat16 is only supported on GPUs with compute capability of at least 8.0"),
            "cuda",
            {"dtype": "bf16"},
            "actor_rollout_ref.rollout.dtype (now bf16)",
        ),
    ],
)
def test_start_errors_name_the_key_at_fault(error, device, overrides, key):
    """A vLLM start-up error that points at a rollout key names that key, not rollout.name=hf."""
    import types

    if "engine_kwargs" in overrides and "root cause" in str(error):
        error.__cause__ = ValueError("unknown option swap_space")  # vLLM chains the engine core's error
    config = engine_config(**{"gpu_memory_utilization": 0.5, **overrides})
    fake = types.SimpleNamespace(
        architectures="LlamaForCausalLM", config=config, device=torch.device(device), max_model_len=40
    )
    message = str(VLLMRollout._start_error(fake, error))
    assert key in message and "rollout.name=hf" not in message and "\n" not in message, message
    assert message.startswith(
        "actor_rollout_ref.rollout.name=vllm: vLLM could not start an engine for LlamaForCausalLM"
    )


def test_a_start_error_naming_no_key_names_the_model():
    import types

    fake = types.SimpleNamespace(
        architectures="LlamaForCausalLM", config=engine_config(), device=torch.device("cpu"), max_model_len=40
    )
    message = str(VLLMRollout._start_error(fake, ValueError("Head size 16 is not supported by the CPU backend")))
    assert message.endswith(
        "if vLLM cannot run this model (actor_rollout_ref.model.path, LlamaForCausalLM), "
        "set actor_rollout_ref.rollout.name=hf"
    ), message


def _validation_error(message):
    """A pydantic ValidationError as vLLM's config dataclasses raise it (built without vLLM)."""
    import pydantic

    @pydantic.dataclasses.dataclass
    class SchedulerConfig:
        max_num_batched_tokens: int

        @pydantic.model_validator(mode="after")
        def _check(self):
            raise ValueError(message)

    try:
        SchedulerConfig(max_num_batched_tokens=352)
    except pydantic.ValidationError as exc:
        return exc
    raise AssertionError("no ValidationError")


_BATCHED = "max_num_batched_tokens (352) must be greater than or equal to max_num_seqs (1024)."


def test_a_validation_error_gives_vllms_own_reason_and_every_key_it_names():
    import types

    from hybridrl.errors import UserError
    from hybridrl.workers.rollout.vllm import EngineStartError

    error = _validation_error(_BATCHED)
    assert str(error).startswith("1 validation error for SchedulerConfig")  # what the old message showed
    config = engine_config(max_num_batched_tokens=256, max_num_seqs=1024, max_model_len=352)
    fake = types.SimpleNamespace(
        architectures="LlamaForCausalLM", config=config, device=torch.device("cpu"), max_model_len=352
    )
    err = VLLMRollout._start_error(fake, error)
    assert isinstance(err, EngineStartError) and isinstance(err, UserError) and isinstance(err, RolloutEngineError)
    assert str(err) == (
        "actor_rollout_ref.rollout.name=vllm: vLLM could not start an engine for LlamaForCausalLM: "
        f"{_BATCHED}; change actor_rollout_ref.rollout.max_num_batched_tokens (now 256, raised to "
        "max_model_len 352) or actor_rollout_ref.rollout.max_num_seqs (now 1024)"
    )


def test_engine_error_text_follows_a_root_cause_wrapper_and_keeps_one_line():
    from hybridrl.workers.rollout.vllm import engine_error_text

    wrapper = RuntimeError("Engine core initialization failed. See root cause above. Failed core proc(s): {}")
    wrapper.__cause__ = _validation_error("max_model_len 4096 exceeds the model's 2048.\nsecond line")
    assert engine_error_text(wrapper) == (
        "Engine core initialization failed. See root cause above. Failed core proc(s): {}; "
        "max_model_len 4096 exceeds the model's 2048. second line"
    )
    assert engine_error_text(ValueError("\n  first real line\nmore")) == "first real line"
    assert engine_error_text(ValueError()) == "ValueError"


@pytest.mark.slow
def test_a_real_engine_start_refused_by_vllms_validation_names_the_keys(vllm_model, tokenizer):
    """vLLM 0.3x validates its SchedulerConfig before loading anything: max_num_batched_tokens
    (raised by hybridrl to max_model_len = 42) must be >= max_num_seqs (4096 in engine_config)."""
    from hybridrl.workers.rollout.vllm import EngineStartError

    config = engine_config(max_num_batched_tokens=16)
    with pytest.raises(EngineStartError) as err:
        VLLMRollout(copy.deepcopy(vllm_model), config, tokenizer, vllm_model.generation_config)
    message = str(err.value)
    assert "max_num_batched_tokens (42) must be greater than or equal to max_num_seqs (4096)" in message, message
    assert "actor_rollout_ref.rollout.max_num_batched_tokens (now 16, raised to max_model_len 42)" in message
    assert "actor_rollout_ref.rollout.max_num_seqs (now 4096)" in message
    assert "validation error for" not in message and "rollout.name=hf" not in message and "\n" not in message


@pytest.mark.slow
def test_grpo_two_steps_with_vllm_log_mismatch_metrics(gsm8k_parquet, vllm_model_dir, tmp_path):
    from hybridrl.trainer.main_ppo import main

    out = tmp_path / "run"
    args = grpo_overrides(gsm8k_parquet, vllm_model_dir, out, length_reward_file(tmp_path))
    assert main(args) == 0
    rows = [json.loads(line) for line in open(os.path.join(out, "metrics.jsonl"))]
    steps = [r for r in rows if "training/rollout_probs_diff_max" in r]
    assert [r["step"] for r in steps] == [1, 2]
    for r in steps:  # fp32 engine and fp32 actor: the same distribution up to kernel rounding
        assert r["training/rollout_probs_diff_max"] < 1e-3 and r["rollout_corr/log_ppl_abs_diff"] < 1e-4
        assert r["training/rollout_actor_probs_pearson_corr"] > 0.999
    assert any("val-core/" in k for k in rows[-1])


@pytest.mark.slow
def test_hybridrl_generate_with_vllm_samples_n_responses(gsm8k_parquet, vllm_model_dir, tmp_path):
    import pandas as pd

    from hybridrl.config import load_config
    from hybridrl.trainer.main_generation import run_generation

    prompts = tmp_path / "prompts.parquet"
    pd.read_parquet(gsm8k_parquet / "test.parquet").head(3).to_parquet(prompts, index=False)
    out = tmp_path / "out.parquet"
    cfg = load_config(
        [
            f"data.path={prompts}",
            f"data.output_path={out}",
            f"model.path={vllm_model_dir}",
            "data.n_samples=2",
            "data.batch_size=3",
            "rollout.response_length=6",
            "rollout.prompt_length=256",
            "rollout.dtype=float32",
            "rollout.name=vllm",
            "rollout.kv_cache_memory_gb=0.05",
            "trainer.device=cpu",
        ],
        config_name="generation",
    )
    assert run_generation(cfg) == str(out)
    responses = pd.read_parquet(out)["responses"].tolist()
    assert len(responses) == 3 and all(len(r) == 2 for r in responses)
    assert any(r[0] != r[1] for r in responses)  # n samples per prompt, not copies
