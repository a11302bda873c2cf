"""The distillation teacher in the policy worker (issue 32 items 3 and 4): routing samples to
teachers, the teacher's sampled-token and top-k scores (padded and packed alike), the tokenizer
check, and the actor's update on the distillation loss with verl's metric names."""

import copy

import numpy as np
import pytest
import torch

from hybridrl.algorithms.distillation import DistillationLossConfig
from hybridrl.config import ConfigError
from hybridrl.protocol import DataProto
from hybridrl.workers.actor import PPOActor
from hybridrl.workers.pass_specs import LogProbSpec
from hybridrl.workers.teacher import check_same_vocabulary, route_rows, slots_to_rows, teacher_scores
from tests.tiny_models import ppo_section
from tests.workers.specs_helpers import update_spec_of

PROMPT_LENS, RESPONSE_LENS = [6, 3, 1, 4], [5, 2, 4, 1]


def _rows(sources):
    return DataProto.from_dict(
        tensors={"x": torch.zeros(len(sources), 1)},
        non_tensors={"data_source": np.array(sources, dtype=object)},
    )


def test_one_teacher_scores_every_row_and_several_route_by_key():
    data = _rows(["gsm8k", "math", "gsm8k"])
    assert route_rows(data, "data_source", {"default": None})["default"].tolist() == [0, 1, 2]
    routes = route_rows(data, "data_source", ["gsm8k", "math"])
    assert routes["gsm8k"].tolist() == [0, 2] and routes["math"].tolist() == [1]


def test_a_sample_without_a_teacher_is_one_line_naming_it():
    with pytest.raises(ConfigError) as info:
        route_rows(_rows(["gsm8k", "geo"]), "data_source", ["gsm8k", "math"])
    assert "sample 1 has data_source='geo'" in str(info.value) and "\n" not in str(info.value)
    with pytest.raises(ConfigError, match="no 'task' column"):
        route_rows(_rows(["gsm8k"]), "task", ["gsm8k", "math"])


def test_slots_to_rows_places_packed_values():
    slots = torch.tensor([[True, False, True], [False, True, False]])
    values = torch.arange(6.0).reshape(3, 2)
    out = slots_to_rows(values, slots)
    assert out.shape == (2, 3, 2) and out[0, 2].tolist() == [2.0, 3.0] and out[0, 1].tolist() == [0.0, 0.0]


class _Tok:
    def __init__(self, vocab):
        self.vocab = vocab

    def get_vocab(self):
        return self.vocab

    def __len__(self):
        return len(self.vocab)


def test_a_teacher_with_another_tokenizer_is_one_line():
    with pytest.raises(ConfigError) as info:
        check_same_vocabulary("t1", "/m", _Tok({"a": 0}), _Tok({"a": 0, "b": 1}), 2, 2, False)
    assert "distillation teacher t1 (/m): its tokenizer differs" in str(info.value)
    with pytest.raises(ConfigError, match="top-k ids"):
        check_same_vocabulary("t1", "/m", _Tok({"a": 0}), _Tok({"a": 0}), 64, 32, True)
    check_same_vocabulary("t1", "/m", _Tok({"a": 0}), _Tok({"a": 0}), 64, 32, False)  # a note only


@pytest.fixture(scope="module")
def student(tiny_model_dir):
    from hybridrl.models import load_causal_lm

    return load_causal_lm(tiny_model_dir)


def _ref_config():
    return ppo_section("actor_rollout_ref.ref", {"log_prob_micro_batch_size_per_gpu": 2})


def test_teacher_scores_padded_and_packed_agree(student, make_batch):
    b = make_batch(PROMPT_LENS, RESPONSE_LENS, seed=3)
    teacher = PPOActor(_ref_config(), copy.deepcopy(student).requires_grad_(False))
    data = DataProto.from_dict(tensors=dict(b))
    padded = teacher_scores(teacher, data, LogProbSpec(micro_batch_size=2), topk=4)
    packed = teacher_scores(teacher, data, LogProbSpec(micro_batch_size=3, use_remove_padding=True), topk=4)
    plain = teacher_scores(teacher, data, LogProbSpec(micro_batch_size=2), topk=None)
    mask = b["response_mask"].bool()
    for key in ("teacher_log_prob", "teacher_topk_log_probs"):
        torch.testing.assert_close(padded[key][mask], packed[key][mask], rtol=1e-4, atol=1e-5)
    assert torch.equal(padded["teacher_topk_ids"][mask], packed["teacher_topk_ids"][mask])
    torch.testing.assert_close(plain["teacher_log_prob"], padded["teacher_log_prob"])
    top = padded["teacher_topk_log_probs"]
    assert top.shape == (*mask.shape, 4)
    assert (top[mask][:, 0] >= padded["teacher_log_prob"][mask] - 1e-5).all()  # the best beats the sampled


def _actor_config():
    return ppo_section(
        "actor_rollout_ref.actor",
        {"ppo_mini_batch_size": 4, "ppo_micro_batch_size_per_gpu": 2, "ppo_epochs": 1, "entropy_coeff": 0.0},
    )


@pytest.mark.parametrize(
    "loss",
    [
        DistillationLossConfig(loss_mode="k1", use_policy_gradient=True, use_task_rewards=False),
        DistillationLossConfig(loss_mode="forward_kl_topk", topk=4, use_policy_gradient=False),
    ],
    ids=["k1-pg", "forward_kl_topk"],
)
def test_update_on_the_distillation_loss_reports_verls_metrics(student, make_batch, loss):
    b = make_batch(PROMPT_LENS, RESPONSE_LENS, seed=3)
    data = DataProto.from_dict(tensors=dict(b))
    teacher = PPOActor(_ref_config(), copy.deepcopy(student).requires_grad_(False))
    scores = teacher_scores(teacher, data, LogProbSpec(micro_batch_size=2), topk=loss.topk if loss.topk else None)
    data = data.union(DataProto.from_dict(tensors=scores))
    data.batch["old_log_probs"] = scores["teacher_log_prob"]  # the student is the teacher
    data.batch["advantages"] = torch.zeros_like(scores["teacher_log_prob"])
    module = copy.deepcopy(student)
    cfg = _actor_config()
    actor = PPOActor(cfg, module, torch.optim.SGD(module.parameters(), lr=0.0), distillation=loss)
    metrics, _ = actor.update_policy(data, update_spec_of(cfg))
    for key in ("distillation/loss", "distillation/loss_min", "distillation/loss_max"):
        assert key in metrics and all(np.isfinite(metrics[key])), key
    assert len(metrics["distillation/loss_min"]) == 1  # reduced to the minimum, as verl's MIN
    assert max(abs(v) for v in metrics["distillation/loss"]) < 1e-4  # the student is the teacher
    if loss.loss_mode == "forward_kl_topk":
        assert metrics["distillation/overlap_ratio"] == pytest.approx([1.0, 1.0])
        assert "distillation/student_mass" in metrics and "distillation/teacher_mass" in metrics
    else:
        assert "distillation/abs_loss" in metrics
