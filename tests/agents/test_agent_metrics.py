"""compute_agent_metrics: turn, tool and search statistics, hand-computed."""

import pytest
import torch

from hybridrl.protocol import DataProto
from hybridrl.trainer.ppo.metrics import compute_agent_metrics


def test_agent_metrics_by_hand():
    per_row = [
        {"assistant_turns": 3, "valid_actions": 2, "searches": 2, "search_errors": 1, "tool_calls": 2},
        {"assistant_turns": 1, "valid_actions": 1, "searches": 0, "search_errors": 0, "tool_calls": 0},
        {"assistant_turns": 2, "tool_calls": 3, "tool_errors": 1},
    ]
    scores = torch.zeros(3, 4)
    scores[0, 2], scores[1, 0], scores[2, 3] = 1.0, 0.0, 0.5
    batch = DataProto.from_dict(
        tensors={"token_level_scores": scores},
        non_tensors={
            "__num_turns__": [6, 2, 4],
            "__agent_name__": ["search_agent", "search_agent", "tool_agent"],
            "__agent_metrics__": per_row,
        },
    )
    m = compute_agent_metrics(batch)
    assert m["num_turns/mean"] == pytest.approx(4.0) and m["num_turns/max"] == 6 and m["num_turns/min"] == 2
    assert m["tool_calls/mean"] == pytest.approx(5 / 3) and m["tool_calls/max"] == 3
    assert m["tool_errors/sum"] == 1
    assert m["search/valid_rate"] == pytest.approx(3 / 4)  # 3 valid actions in 4 search-agent turns
    assert m["search/searches/mean"] == pytest.approx(1.0) and m["search/errors"] == 1
    assert m["agent/search_agent/reward/mean"] == pytest.approx(0.5) and m["agent/search_agent/count"] == 2
    assert m["agent/tool_agent/reward/mean"] == pytest.approx(0.5) and m["agent/tool_agent/count"] == 1


def test_no_agent_rollout_no_agent_metrics():
    batch = DataProto.from_dict(tensors={"token_level_scores": torch.zeros(2, 3)})
    assert compute_agent_metrics(batch) == {}
