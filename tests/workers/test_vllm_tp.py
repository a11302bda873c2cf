"""Tensor parallelism inside the vLLM engine (``rollout.tensor_model_parallel_size``, issue 30): an
engine whose two TP ranks split every layer generates what the one-rank engine generates (fp32:
greedy tokens, and sampled log-probs that are the actor's within 1e-4), and takes new weights whole,
sharding them as it loads them. The group around it (rows gathered on the leader, weights drained
on the followers) runs end to end in tests/trainer/test_e2e_ray.py."""

import copy

import pytest
import torch

pytest.importorskip("vllm", reason="the vllm extra is not installed (pip install -e '.[vllm]')")

from vllm_helpers import TEXTS, assert_greedy_matches, assert_log_probs_are_the_actors, check_weight_sync, make_prompts

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def tp_engine(vllm_model, tokenizer):
    from hybridrl.workers.rollout.vllm_async import AsyncVLLMRollout
    from tests.workers.vllm_helpers import engine_config

    engine = AsyncVLLMRollout(
        copy.deepcopy(vllm_model),
        # 30 MB buckets: the engine starts from two weight files (embedding + layers, output layer)
        engine_config(
            mode="async", tensor_model_parallel_size=2, checkpoint_engine={"update_weights_bucket_megabytes": 30}
        ),
        tokenizer,
        vllm_model.generation_config,
    )
    yield engine
    engine.shutdown()


def test_two_tp_ranks_generate_what_one_engine_generates(tp_engine, async_vllm_engine, vllm_model, tokenizer):
    assert tp_engine.llm.vllm_config.parallel_config.tensor_parallel_size == 2
    assert len(tp_engine.llm.engine_core.resources.engine_manager.processes) == 1  # one engine core
    greedy = make_prompts(tokenizer, TEXTS, do_sample=False)
    split, whole = tp_engine.generate_sequences(greedy).batch, async_vllm_engine.generate_sequences(greedy).batch
    assert_greedy_matches(vllm_model, split)
    mask = split["response_mask"].bool() & whole["response_mask"].bool()
    same = (split["responses"] == whole["responses"]).cumprod(-1).bool() & mask  # up to the first difference
    assert same[:, 0].all()
    torch.testing.assert_close(split["rollout_log_probs"][same], whole["rollout_log_probs"][same], atol=1e-4, rtol=0)
    assert_log_probs_are_the_actors(tp_engine, vllm_model, tokenizer)


def test_weights_reach_both_tp_ranks(tp_engine, vllm_model, tokenizer):
    check_weight_sync(tp_engine, vllm_model, tokenizer)
