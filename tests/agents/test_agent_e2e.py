"""Two GRPO steps of the search agent (in-process BM25 on a handmade corpus) and of the GSM8K
tool agent (tools + interaction from examples/config), tiny random model, through the entry
point users call; plus the start-up checks of the agent config keys."""

import json
import os

import pytest

from hybridrl.config import ConfigError, load_config
from hybridrl.trainer.main_ppo import main
from hybridrl.trainer.ppo.config_check import validate_ppo_config

EXAMPLES = os.path.join(os.path.dirname(__file__), "..", "..", "examples", "config")
QA = [
    ("What is the capital of France?", "Paris"),
    ("What is the capital of Germany?", "Berlin"),
    ("What is the highest mountain?", "Mount Everest"),
    ("Which river flows in northeastern Africa?", "Nile"),
] * 2


@pytest.fixture(scope="module")
def search_data(tmp_path_factory, corpus_file):
    from hybridrl.agents import search_r1_data as search_r1

    folder = tmp_path_factory.mktemp("search_data")
    qa = folder / "qa.jsonl"
    qa.write_text("".join(json.dumps({"question": q, "answer": [a]}) + "\n" for q, a in QA))
    search_r1.convert(str(qa), None, str(folder), test_size=2)
    return folder


@pytest.fixture(scope="module")
def gsm8k_tool_data(gsm8k_dir, tmp_path_factory):
    from hybridrl.data.preprocess import gsm8k_tool

    folder = tmp_path_factory.mktemp("gsm8k_tool")
    gsm8k_tool.convert(gsm8k_dir, str(folder), train_size=4, test_size=2, interaction=True)
    return folder


def _overrides(data_dir, model_dir, out_dir, *extra):
    return [
        f"data.train_files={data_dir}/train.parquet",
        f"data.val_files={data_dir}/test.parquet",
        "data.train_batch_size=2",
        "data.max_prompt_length=512",
        "data.max_response_length=96",
        f"actor_rollout_ref.model.path={model_dir}",
        "actor_rollout_ref.actor.ppo_mini_batch_size=2",
        "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=4",
        "actor_rollout_ref.actor.use_kl_loss=True",
        "actor_rollout_ref.rollout.n=2",
        "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=4",
        "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=4",
        "algorithm.adv_estimator=grpo",
        "actor_rollout_ref.rollout.multi_turn.max_tokens_per_turn=8",
        "actor_rollout_ref.actor.entropy_coeff=0.01",
        "trainer.device=cpu",
        "trainer.logger=['file']",
        f"trainer.default_local_dir={out_dir}",
        "trainer.total_training_steps=2",
        "trainer.test_freq=2",
        *extra,
    ]


def _metrics(out_dir):
    with open(os.path.join(out_dir, "metrics.jsonl")) as f:
        return [json.loads(line) for line in f]


@pytest.mark.slow
def test_search_agent_two_grpo_steps(search_data, tiny_model_dir, corpus_file, tmp_path):
    out = tmp_path / "run"
    assert main(_overrides(search_data, tiny_model_dir, out, f"retriever.corpus_path={corpus_file}")) == 0
    rows = _metrics(out)
    assert [r["step"] for r in rows] == [0, 1, 2]
    assert "val-core/nq/reward/mean@1" in rows[0]
    for row in rows[1:]:
        # 8-token turns never hold a valid action for the random model: every episode gets
        # Search-R1's "invalid action" observation (54 tokens) before its next turn
        assert row["num_turns/min"] >= 4 and row["num_turns/max"] >= row["num_turns/mean"] >= row["num_turns/min"]
        assert 0.0 <= row["search/valid_rate"] <= 1.0 and row["search/errors"] == 0
        assert row["tool_calls/mean"] == row["search/searches/mean"] >= 0
        assert row["agent/search_agent/count"] == 4 and "agent/search_agent/reward/mean" in row
        assert row["response_length/max"] <= 96 and row["actor/grad_norm"] > 0


@pytest.mark.slow
def test_search_agent_grpo_step_on_the_async_vllm_engine(search_data, vllm_model_dir, corpus_file, tmp_path):
    """rollout.mode=async: every turn of every episode is its own vLLM request; the trajectories
    carry the engine's log-probs, so the mismatch metrics are logged for agent batches too."""
    pytest.importorskip("vllm", reason="the vllm extra is not installed")
    out = tmp_path / "run"
    extra = [
        f"retriever.corpus_path={corpus_file}",
        "actor_rollout_ref.rollout.name=vllm",
        "actor_rollout_ref.rollout.mode=async",
        "actor_rollout_ref.rollout.kv_cache_memory_gb=0.1",
        "actor_rollout_ref.rollout.dtype=fp32",
        "actor_rollout_ref.actor.fsdp_config.mixed_precision.param_dtype=fp32",
        "trainer.total_training_steps=1",
        "trainer.val_before_train=False",
    ]
    assert main(_overrides(search_data, vllm_model_dir, out, *extra)) == 0
    (row,) = _metrics(out)
    assert row["num_turns/min"] >= 4 and row["agent/search_agent/count"] == 4 and row["search/errors"] == 0
    # fp32 on both sides: the engine's log-probs of the model tokens are the actor's
    assert row["rollout_corr/log_ppl_abs_diff"] < 1e-4 and row["actor/grad_norm"] > 0


@pytest.mark.slow
def test_gsm8k_tool_agent_with_interaction_two_grpo_steps(gsm8k_tool_data, tiny_model_dir, tmp_path):
    out = tmp_path / "run"
    extra = [
        "data.return_raw_chat=True",
        "actor_rollout_ref.rollout.multi_turn.enable=True",
        f"actor_rollout_ref.rollout.multi_turn.tool_config_path={EXAMPLES}/gsm8k_tool_config.yaml",
        f"actor_rollout_ref.rollout.multi_turn.interaction_config_path={EXAMPLES}/gsm8k_interaction_config.yaml",
        "actor_rollout_ref.rollout.multi_turn.max_user_turns=2",
        "trainer.val_before_train=False",
    ]
    assert main(_overrides(gsm8k_tool_data, tiny_model_dir, out, *extra)) == 0
    rows = _metrics(out)
    assert [r["step"] for r in rows] == [1, 2]
    for row in rows:
        # the teacher answers every wrong turn ("try again") until max_user_turns: 3 model turns, 2 replies
        assert row["num_turns/min"] == row["num_turns/max"] == 6
        assert "tool_calls/mean" in row and row["agent/tool_agent/count"] == 4
    assert "val-core/openai/gsm8k/reward/mean@1" in rows[1]


# ---------------------------------------------------------------- start-up checks

BASE = [
    "algorithm.adv_estimator=grpo",
    "data.train_batch_size=8",
    "actor_rollout_ref.actor.ppo_mini_batch_size=4",
    "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=2",
    "actor_rollout_ref.rollout.n=2",
]
MT = "actor_rollout_ref.rollout.multi_turn"


@pytest.mark.parametrize(
    "overrides, expected",
    [
        ([f"{MT}.tool_config_path=/no/such/tools.yaml"], f"{MT}.tool_config_path=/no/such/tools.yaml: file not found"),
        (["retriever.corpus_path=/no/corpus.jsonl"], "retriever.corpus_path=/no/corpus.jsonl: file not found"),
        ([f"{MT}.max_parallel_calls=0"], f"{MT}.max_parallel_calls=0 must be an integer >= 1"),
        ([f"{MT}.tool_response_truncate_side=top"], "is not one of left, middle, right"),
        ([f"{MT}.format=json"], f"{MT}.format='json' is not one of hermes"),
        ([f"{MT}.search.max_obs_length=0"], "max_obs_length=0 must be an integer >= 1"),
        (["retriever.topk=0"], "retriever.topk=0 must be an integer >= 1"),
        (["retriever.timeout=0"], "retriever.timeout=0.0 must be a number of seconds > 0"),
        (["actor_rollout_ref.rollout.agent.default_agent_loop=robot"], "default_agent_loop='robot' is unknown"),
        (
            [f"{MT}.enable=True", f"{MT}.tool_config_path={EXAMPLES}/gsm8k_tool_config.yaml"],
            "set data.return_raw_chat=True",
        ),
    ],
)
def test_agent_config_errors(overrides, expected):
    with pytest.raises(ConfigError) as err:
        validate_ppo_config(load_config(BASE + overrides))
    assert expected in str(err.value) and "\n" not in str(err.value)


def test_a_good_agent_config_passes_and_the_retriever_reaches_the_rollout_section(corpus_file):
    cfg = load_config(
        BASE
        + [
            f"{MT}.enable=True",
            "data.return_raw_chat=True",
            f"retriever.corpus_path={corpus_file}",
            f"{MT}.tool_config_path={EXAMPLES}/gsm8k_tool_config.yaml",
        ]
    )
    assert validate_ppo_config(cfg) == []
    assert cfg.actor_rollout_ref.rollout.multi_turn.retriever.corpus_path == corpus_file
