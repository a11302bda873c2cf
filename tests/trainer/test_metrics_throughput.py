"""compute_throughout_metrics (verl's name and arguments) and compute_throughput_metrics: values
worked out by hand, and errors that name the function called and its own argument."""

import pytest

from hybridrl.protocol import DataProto
from hybridrl.trainer.ppo.metrics import MetricsInputError, compute_throughout_metrics, compute_throughput_metrics


def test_throughout_takes_verls_n_gpus_by_keyword_and_position():
    batch = DataProto(meta_info={"global_token_num": [100, 200, 300]})
    by_keyword = compute_throughout_metrics(batch=batch, timing_raw={"step": 2.0}, n_gpus=2)
    assert by_keyword == {"perf/total_num_tokens": 600, "perf/time_per_step": 2.0, "perf/throughput": 150.0}
    assert compute_throughout_metrics(batch, {"step": 2.0}, 1)["perf/throughput"] == 300.0


@pytest.mark.parametrize("n_gpus", [0, -1, True, "2", None])
def test_a_bad_n_gpus_names_n_gpus_and_verls_function(n_gpus):
    batch = DataProto(meta_info={"global_token_num": [100]})
    with pytest.raises(MetricsInputError, match=rf"^compute_throughout_metrics: n_gpus={n_gpus!r}; .*>= 1$"):
        compute_throughout_metrics(batch, {"step": 1.0}, n_gpus=n_gpus)
    with pytest.raises(MetricsInputError, match=r"^compute_throughput_metrics: n_devices="):
        compute_throughput_metrics(batch, {"step": 1.0}, n_devices=n_gpus)


def test_a_missing_step_names_the_function_called():
    batch = DataProto(meta_info={"global_token_num": [100]})
    with pytest.raises(MetricsInputError, match=r"^compute_throughout_metrics: timing_raw has no 'step'"):
        compute_throughout_metrics(batch, {"gen": 1.0}, n_gpus=1)
