"""AgentLoopManager: the rollout's batch layout for agent trajectories, mixed agents in one
batch, loops running concurrently on one batched engine."""

import pytest
import torch

from hybridrl.agents.base import AgentLoopOutput
from hybridrl.agents.manager import AgentLoopManager, pad_trajectories
from hybridrl.protocol import DataProto
from tests.tiny_models import ppo_section

PAD = 0


def test_pad_trajectories_layout_by_hand():
    outputs = [
        AgentLoopOutput([11, 12], [21, 22, 90, 91, 23], [1, 1, 0, 0, 1]),
        AgentLoopOutput([13, 14, 15], [24], [1]),
    ]
    t = pad_trajectories(outputs, PAD, response_length=6)
    assert t["prompts"].tolist() == [[0, 11, 12], [13, 14, 15]]
    assert t["responses"].tolist() == [[21, 22, 90, 91, 23, 0], [24, 0, 0, 0, 0, 0]]
    assert t["response_mask"].tolist() == [[1, 1, 0, 0, 1, 0], [1, 0, 0, 0, 0, 0]]
    # observations are context: attended to and positioned like any token
    assert t["attention_mask"].tolist() == [[0, 1, 1, 1, 1, 1, 1, 1, 0], [1, 1, 1, 1, 0, 0, 0, 0, 0]]
    assert t["position_ids"].tolist() == [[0, 0, 1, 2, 3, 4, 5, 6, 6], [0, 1, 2, 3, 3, 3, 3, 3, 3]]
    assert t["input_ids"].tolist() == [[0, 11, 12, 21, 22, 90, 91, 23, 0], [13, 14, 15, 24, 0, 0, 0, 0, 0]]


class ScriptedRollout:
    """generate_token_ids answering by the row's first prompt id: a list of turns per row."""

    pad_token_id = PAD

    def __init__(self, scripts):
        self.scripts = {k: list(v) for k, v in scripts.items()}
        self.batch_sizes = []

    def generate_token_ids(self, prompt_ids, max_new_tokens, sampling_kwargs, stop_strings):
        self.batch_sizes.append(len(prompt_ids))
        return [self.scripts[p[0]].pop(0)[:max_new_tokens] for p in prompt_ids]


def test_mixed_agents_in_one_batch(tokenizer, bm25_retriever):
    def ids(text, eos=False):
        return tokenizer(text, add_special_tokens=False)["input_ids"] + ([tokenizer.eos_token_id] if eos else [])

    search_turns = [ids("<search> capital of France </search>"), ids("<answer> Paris </answer>")]
    rollout = ScriptedRollout({1: [ids("Hello there", eos=True)], 2: search_turns, 3: [ids("no action", eos=True)] * 4})
    cfg = ppo_section(
        "actor_rollout_ref.rollout",
        {
            "response_length": 160,
            "multi_turn": {"search": {"max_turns": 1, "max_obs_length": 64}},
            "agent": {"default_agent_loop": "search_agent"},
        },
        others={"retriever": {"topk": 1, "timeout": 5}},
    )
    manager = AgentLoopManager(rollout, tokenizer, cfg)
    manager._retriever = bm25_retriever
    prompts = DataProto.from_dict(
        tensors={
            "input_ids": torch.tensor([[0, 1, 5], [2, 6, 7], [3, 8, 9]]),
            "attention_mask": torch.tensor([[0, 1, 1], [1, 1, 1], [1, 1, 1]]),
        },
        non_tensors={"agent_name": ["single_turn_agent", "search_agent", None]},
    )
    out = manager.generate_sequences(prompts)
    # turn 1: one call per stop-string set (single turn: none; search: </search>, </answer>), then turn 2
    assert rollout.batch_sizes == [1, 2, 2]
    assert out.non_tensor_batch["__agent_name__"].tolist() == ["single_turn_agent", "search_agent", "search_agent"]
    assert out.non_tensor_batch["__num_turns__"].tolist() == [2, 4, 4]
    assert out.batch["prompts"].tolist() == [[0, 1, 5], [2, 6, 7], [3, 8, 9]]  # from the tensors, no padding
    mask, attn = out.batch["response_mask"], out.batch["attention_mask"][:, 3:]
    first = search_turns[0]
    n_obs = int((attn[1] - mask[1]).sum())
    assert n_obs > 0 and mask[1, : len(first)].all() and not mask[1, len(first) : len(first) + n_obs].any()
    assert '<information>Doc 1(Title: "Paris")' in tokenizer.decode(out.batch["responses"][1])
    assert out.batch["responses"][0, :3].tolist() == ids("Hello there", eos=True)
    assert int(mask[0].sum()) == int(attn[0].sum()) == 3
    metrics = out.non_tensor_batch["__agent_metrics__"]
    assert metrics[1]["searches"] == 1 and metrics[2]["valid_actions"] == 0


def test_the_real_engine_generates_within_the_budget(tiny_model_dir, tokenizer):
    from hybridrl.models import load_causal_lm
    from hybridrl.workers.rollout.hf import HFRollout

    cfg = ppo_section(
        "actor_rollout_ref.rollout",
        {  # the engine reads the section as the run has it
            "dtype": "fp32",
            "response_length": 24,
            "do_sample": True,
            "temperature": 1.0,
            "top_p": 1.0,
            "top_k": -1,
            "multi_turn": {"max_tokens_per_turn": 6},
            "agent": {"default_agent_loop": "tool_agent"},
        },
    )
    rollout = HFRollout(load_causal_lm(tiny_model_dir), cfg, tokenizer)
    prompt = tokenizer.apply_chat_template(
        [{"role": "user", "content": "Hi"}], add_generation_prompt=True, tokenize=False
    )
    ids = tokenizer(prompt, add_special_tokens=False)["input_ids"]
    prompts = DataProto.from_dict(
        tensors={"input_ids": torch.tensor([ids, ids]), "attention_mask": torch.ones(2, len(ids), dtype=torch.long)},
        non_tensors={"raw_prompt_ids": [ids, ids]},
    )
    out = AgentLoopManager(rollout, tokenizer, cfg).generate_sequences(prompts)
    assert out.batch["responses"].shape == (2, 24) and out.batch["input_ids"].shape == (2, len(ids) + 24)
    assert (out.batch["response_mask"].sum(-1) <= 6).all()  # one turn of at most 6 tokens, no tools
    assert out.non_tensor_batch["__num_turns__"].tolist() == [2, 2]


LOOP_MODULE = '''
from hybridrl.agents import AgentLoopBase, AgentLoopOutput


class EchoOnce(AgentLoopBase):
    """One model turn, then the prompt's first token appended (marks that this class ran)."""

    async def run(self, sampling_params, **row):
        prompt = list(row["raw_prompt_ids"])
        sampled = list(await self.engine.generate(prompt, sampling_params, 2))
        return AgentLoopOutput(prompt, sampled + [prompt[0]], [1] * len(sampled) + [0])
'''


def test_loops_from_verls_agent_loop_config_file_run_for_their_rows(tokenizer, tmp_path, monkeypatch):
    """``rollout.agent.agent_loop_config_path`` (verl's key): a YAML list of {name, _target_}; the class
    is imported when a row names it; a bad file is one line naming the key."""
    from hybridrl.agents import known_agent_loops, register_agent_loops_from_file
    from hybridrl.agents.base import AGENT_LOOPS
    from hybridrl.agents.errors import AgentConfigError

    (tmp_path / "my_loops_30.py").write_text(LOOP_MODULE)
    monkeypatch.syspath_prepend(str(tmp_path))
    config_file = tmp_path / "agent.yaml"
    config_file.write_text("- name: echo_once\n  _target_: my_loops_30.EchoOnce\n")
    try:
        rollout = ScriptedRollout({4: [[7, 8]], 2: [[9, tokenizer.eos_token_id]]})
        cfg = ppo_section(
            "actor_rollout_ref.rollout",
            {"response_length": 8, "agent": {"agent_loop_config_path": str(config_file)}},
        )
        manager = AgentLoopManager(rollout, tokenizer, cfg)
        assert "echo_once" in known_agent_loops()
        prompts = DataProto.from_dict(
            tensors={"input_ids": torch.tensor([[4, 1, 5], [2, 6, 7]]), "attention_mask": torch.ones(2, 3).long()},
            non_tensors={"agent_name": ["echo_once", "single_turn_agent"]},
        )
        out = manager.generate_sequences(prompts)
        assert out.non_tensor_batch["__agent_name__"].tolist() == ["echo_once", "single_turn_agent"]
        assert out.batch["responses"][0, :3].tolist() == [7, 8, 4]  # the loop's own last token: its prompt's first
        assert out.batch["response_mask"][0, :3].tolist() == [1, 1, 0]
        (tmp_path / "bad.yaml").write_text("- name: x\n")
        with pytest.raises(AgentConfigError, match="agent_loop_config_path=.*entry 0 needs a name and a _target_"):
            register_agent_loops_from_file(str(tmp_path / "bad.yaml"))
        with pytest.raises(AgentConfigError, match="agent_loop_config_path=nowhere.yaml: file not found"):
            register_agent_loops_from_file("nowhere.yaml")
    finally:
        AGENT_LOOPS.unregister("echo_once")
