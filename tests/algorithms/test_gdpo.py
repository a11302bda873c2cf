"""GDPO against its formula: each reward component normalised in its group, weighted, summed,
then whitened over the batch; missing components and mismatched weights are one line."""

import numpy as np
import pytest
import torch

from hybridrl.algorithms import get_adv_estimator_fn
from hybridrl.algorithms.errors import AlgorithmConfigError, AlgorithmInputError
from hybridrl.algorithms.functional import masked_whiten

INDEX = np.array(["a", "a", "a", "b", "b", "b"], dtype=object)
MASK = torch.tensor([[1, 1, 0], [1, 1, 1], [1, 0, 0], [1, 1, 1], [1, 1, 0], [1, 1, 1]], dtype=torch.float32)
# a large-variance component and a small one
ACC = [1.0, 0.0, 1.0, 0.0, 0.0, 1.0]
FMT = [0.1, 0.2, 0.1, 0.2, 0.1, 0.1]


def group_norm(values):
    v = torch.tensor(values, dtype=torch.float64)
    out = torch.empty_like(v)
    for rows in ([0, 1, 2], [3, 4, 5]):
        g = v[rows]
        out[rows] = (g - g.mean()) / (g.std() + 1e-6)
    return out


def test_components_are_normalised_apart_then_weighted_and_whitened():
    adv, returns = get_adv_estimator_fn("gdpo")(
        token_level_rewards=torch.zeros(6, 3),
        response_mask=MASK,
        index=INDEX,
        gdpo_reward_keys=["acc", "fmt"],
        gdpo_reward_weights=[1.0, 0.5],
        non_tensor_batch={"acc": np.array(ACC, dtype=object), "fmt": np.array(FMT, dtype=object), "uid": INDEX},
    )
    per_response = group_norm(ACC) + 0.5 * group_norm(FMT)
    expected = masked_whiten(per_response.float().unsqueeze(-1) * MASK, MASK) * MASK
    assert torch.allclose(adv, expected, atol=1e-5) and torch.equal(adv, returns)
    # summing first (GRPO on acc + fmt) gives another ranking: fmt's signal is lost in acc's variance
    grpo, _ = get_adv_estimator_fn("grpo")(
        token_level_rewards=torch.tensor(ACC).unsqueeze(-1) * MASK[:, :1]
        + torch.tensor(FMT).unsqueeze(-1) * MASK[:, :1] * 0.5,
        response_mask=MASK[:, :1],
        index=INDEX,
    )
    assert not torch.allclose(adv[:, 0], masked_whiten(grpo, MASK[:, :1])[:, 0], atol=1e-3)


def test_missing_components_and_bad_weights_are_one_line():
    fn = get_adv_estimator_fn("gdpo")
    with pytest.raises(
        AlgorithmInputError,
        match=r"gdpo_reward_keys \['fmt'\] are not in the reward function's "
        r"output \(it gave: \['acc'\]\)",
    ):
        fn(
            token_level_rewards=torch.zeros(6, 3),
            response_mask=MASK,
            index=INDEX,
            gdpo_reward_keys=["acc", "fmt"],
            non_tensor_batch={"acc": np.array(ACC), "uid": INDEX},
        )
    with pytest.raises(AlgorithmConfigError, match=r"has 1 values for 2 gdpo_reward_keys"):
        fn(
            token_level_rewards=torch.zeros(6, 3),
            response_mask=MASK,
            index=INDEX,
            gdpo_reward_keys=["acc", "fmt"],
            gdpo_reward_weights=[1.0],
            non_tensor_batch={"acc": np.array(ACC), "fmt": np.array(FMT), "uid": INDEX},
        )
