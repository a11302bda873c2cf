"""reward.num_workers: scoring in a pool of processes gives the serial results, a late call's
process is killed and replaced, on_error works as in the driver, and custom reward files load."""

import functools
import os
import threading
import time

import numpy as np
import pytest
import torch

from hybridrl.protocol import DataProto
from hybridrl.rewards.custom import RewardConfigError, load_custom_reward_fn
from hybridrl.rewards.load import load_reward_manager
from hybridrl.rewards.manager import NaiveRewardManager, RewardFunctionError
from hybridrl.rewards.pool import RewardPool, RewardPoolError, build_reward_pool, check_num_workers
from hybridrl.trainer.ppo.stages import apply_reward_failures
from tests.rewards.test_reward_manager import make_batch
from tests.tiny_models import ppo_config_with

SCORERS = """
import os
import time


def tricky(data_source, solution_str, ground_truth, extra_info=None, bonus=0.0):
    if solution_str.startswith("hang"):
        with open(ground_truth, "w") as f:  # the test reads the pid of the stuck process here
            f.write(str(os.getpid()))
        time.sleep(3600)
    if solution_str == "boom":
        raise ValueError("cannot parse this response")
    if solution_str == "die":
        os._exit(3)
    if solution_str == "flaky" and not os.path.exists(ground_truth):
        open(ground_truth, "w").close()  # fails once, then scores
        raise ConnectionError("judge unavailable")
    return {"score": 1.0 + bonus, "length": len(solution_str)}


def sandbox_timeout(data_source, solution_str, ground_truth, extra_info=None):
    from hybridrl.rewards.sandbox import current_sandbox

    return current_sandbox().limits.timeout_s
"""


@pytest.fixture(scope="module")
def scorer_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("pool_reward") / "pool_scorers.py"
    path.write_text(SCORERS)
    return str(path)


@pytest.fixture(scope="module")
def pool(scorer_file):
    with build_reward_pool(2, reward_file=scorer_file) as pool:
        yield pool


def several_sources(tokenizer):
    responses = [
        "#### 18",
        "so #### 7",
        r"it is \boxed{\frac{1}{2}}",
        r"\boxed{3}",
        "Answer: 12",
        "<answer>Paris</answer>",
        "<answer>Rome</answer>",
        "no idea",
    ]
    sources = [
        "openai/gsm8k",
        "gsm8k",
        "lighteval/MATH",
        "HuggingFaceH4/MATH-500",
        "arithmetic",
        "nq",
        "nq",
        "openai/gsm8k",
    ]
    truths = ["18", "8", "0.5", "4", "12", {"target": ["Paris"]}, {"target": ["Paris"]}, "1"]
    return make_batch(tokenizer, ["Q?"] * 8, responses, sources, truths)[0]


def test_parallel_scores_equal_serial_scores_over_several_data_sources(tokenizer, pool):
    data = several_sources(tokenizer)
    serial = NaiveRewardManager(tokenizer, 0)(data, return_dict=True)
    parallel = NaiveRewardManager(tokenizer, 0, pool=pool)(data, return_dict=True)
    assert torch.equal(serial["reward_tensor"], parallel["reward_tensor"])
    assert serial["reward_extra_info"] == parallel["reward_extra_info"]
    assert serial["reward_tensor"].sum(-1).tolist() == [1.0, 0.0, 1.0, 0.0, 1.0, 1.0, 0.0, 0.0]
    assert set(serial["reward_extra_info"]) >= {"acc", "pred"}  # the math scorer's dict


def _pid_gone(pid: int, within_s: float) -> bool:
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return True
        time.sleep(0.05)
    return False


def test_a_hung_scorer_is_killed_under_zero_and_the_pool_goes_on(tokenizer, pool, scorer_file, tmp_path):
    fn = load_custom_reward_fn(scorer_file, "tricky")
    pid_file = str(tmp_path / "hung.pid")
    data, lengths = make_batch(tokenizer, ["q"] * 3, ["ok", "hang", "fine"], ["a"] * 3, ["x", pid_file, "x"])
    manager = NaiveRewardManager(tokenizer, 0, compute_score=fn, on_error="zero", timeout_s=1.0, pool=pool)
    started = time.perf_counter()
    out = manager(data, return_dict=True)
    assert time.perf_counter() - started < 10
    info = out["reward_extra_info"]
    assert info["reward_error"] == [0.0, 1.0, 0.0] and info["reward_timeout"] == [0.0, 1.0, 0.0]
    assert info["length"] == [2, None, 4] and out["reward_tensor"].sum(-1).tolist() == [1.0, 0.0, 1.0]
    assert _pid_gone(int(open(pid_file).read()), within_s=5.0)  # the stuck call was stopped, not abandoned
    # the killed worker was replaced: the next batches score on both workers
    for _ in range(2):
        data, _ = make_batch(tokenizer, ["q"] * 4, ["a", "bb", "ccc", "dddd"], ["a"] * 4, ["x"] * 4)
        assert manager(data, return_dict=True)["reward_extra_info"]["length"] == [1, 2, 3, 4]


@pytest.mark.parametrize("policy", ["mask_sample", "drop_group"])
def test_going_on_policies_flag_exactly_the_failing_rows(tokenizer, pool, scorer_file, tmp_path, policy):
    fn = load_custom_reward_fn(scorer_file, "tricky")
    responses = ["ok", "boom", "fine", "good", "die", "yes"]
    truths = ["x", "x", "x", "x", "x", "x"]
    data, _ = make_batch(tokenizer, ["q"] * 6, responses, ["a"] * 6, truths)
    parallel = NaiveRewardManager(tokenizer, 0, compute_score=fn, on_error=policy, timeout_s=5.0, pool=pool)
    info = parallel(data, return_dict=True)["reward_extra_info"]
    assert info["reward_error"] == [0.0, 1.0, 0.0, 0.0, 1.0, 0.0]  # raised; killed its process (os._exit)
    assert info["reward_timeout"] == [0.0] * 6
    without_die, _ = make_batch(
        tokenizer, ["q"] * 6, [r if r != "die" else "boom" for r in responses], ["a"] * 6, truths
    )
    serial = NaiveRewardManager(tokenizer, 0, compute_score=fn, on_error=policy, timeout_s=5.0)
    assert serial(without_die, return_dict=True)["reward_extra_info"]["reward_error"] == info["reward_error"]
    batch = DataProto.from_dict(
        tensors={"response_mask": torch.ones(6, 2, dtype=torch.long)},
        non_tensors={
            "uid": np.array(["g0", "g0", "g1", "g1", "g2", "g2"], dtype=object),
            "reward_error": np.array(info["reward_error"], dtype=object),
        },
    )
    batch, _ = apply_reward_failures(batch, policy, drop_rows=False)
    expected = [2, 0, 2, 2, 0, 2] if policy == "mask_sample" else [0, 0, 2, 2, 0, 0]
    assert batch.batch["response_mask"].sum(-1).tolist() == expected


def test_raise_and_retry_in_the_pool(tokenizer, pool, scorer_file, tmp_path):
    fn = load_custom_reward_fn(scorer_file, "tricky")
    data, _ = make_batch(tokenizer, ["q"] * 2, ["ok", "boom"], ["a", "b"], ["x", "x"])
    with pytest.raises(RewardFunctionError, match=r"sample 1 .*'b'.*ValueError: cannot parse this response"):
        NaiveRewardManager(tokenizer, 0, compute_score=fn, pool=pool)(data)
    data, lengths = make_batch(tokenizer, ["q"] * 2, ["ok", "flaky"], ["a", "b"], ["x", str(tmp_path / "seen")])
    out = NaiveRewardManager(tokenizer, 0, compute_score=fn, on_error="retry", retries=1, pool=pool)(data)
    assert out[1, lengths[1] - 1] == 1.0  # failed once in a worker, scored on the second attempt


@pytest.mark.parametrize("start_method", ["forkserver", "spawn"])
def test_a_custom_reward_file_with_kwargs_scores_in_the_pool(tokenizer, scorer_file, start_method):
    config = ppo_config_with(
        {
            "custom_reward_function": {"path": scorer_file, "name": "tricky", "reward_kwargs": {"bonus": 2.0}},
            "reward_model": {"on_error": "raise"},
        }
    )
    with RewardPool(2, reward_files=[scorer_file], start_method=start_method) as pool:
        manager = load_reward_manager(config, tokenizer, pool=pool)  # checks that every worker loads it
        assert manager.pool is pool and isinstance(manager.compute_score, functools.partial)
        data, lengths = make_batch(tokenizer, ["q"] * 3, ["a", "bb", "ccc"], ["s"] * 3, ["x"] * 3)
        out = manager(data, return_dict=True)
    assert [out["reward_tensor"][i, lengths[i] - 1].item() for i in range(3)] == [3.0, 3.0, 3.0]
    assert out["reward_extra_info"]["length"] == [1, 2, 3]


def test_the_dapo_manager_scores_in_the_pool_too(tokenizer, pool):
    manager = load_reward_manager(ppo_config_with({"reward_model": {"reward_manager": "dapo"}}), tokenizer, pool=pool)
    assert manager.pool is pool
    data = several_sources(tokenizer)
    assert manager(data, return_dict=True)["reward_extra_info"]["acc"][:2] == [1.0, 0.0]


def test_workers_take_over_the_drivers_code_sandbox(tokenizer, scorer_file):
    from hybridrl.rewards.sandbox import LocalSandbox, SandboxLimits, current_sandbox, set_sandbox

    before = current_sandbox()
    set_sandbox(LocalSandbox(SandboxLimits(timeout_s=7.5)))
    try:
        pool = build_reward_pool(2, reward_file=scorer_file)
    finally:
        set_sandbox(before)
    with pool:
        fn = load_custom_reward_fn(scorer_file, "sandbox_timeout")
        data, lengths = make_batch(tokenizer, ["q"] * 2, ["a", "b"], ["s"] * 2, ["x"] * 2)
        out = NaiveRewardManager(tokenizer, 0, compute_score=fn, pool=pool)(data)
    assert out.sum().item() == 15.0


def test_bad_settings_and_unloadable_functions_are_one_line(tokenizer):
    assert check_num_workers(None) == check_num_workers(1) == 0 and check_num_workers(3) == 3
    assert build_reward_pool(1) is None
    with pytest.raises(RewardConfigError, match=r"reward.num_workers=-1 must be a whole number >= 0"):
        build_reward_pool(-1)
    with pytest.raises(RewardConfigError, match=r"reward.num_workers='2'"):
        check_num_workers("2")
    with RewardPool(2) as pool:
        with pytest.raises(RewardPoolError, match=r"cannot be sent to the scoring processes .*top level") as err:
            pool.check_started(lambda **kw: 1.0)
        assert "\n" not in str(err.value)
    with RewardPool(2, worker_init=[functools.partial(os.chdir, "/no/such/dir")]) as pool:
        with pytest.raises(RewardPoolError, match=r"did not start: FileNotFoundError.*/no/such/dir"):
            pool.check_started(len)


def test_closing_kills_a_call_still_running_after_its_deadline(scorer_file, tmp_path):
    fn = load_custom_reward_fn(scorer_file, "tricky")
    pool = build_reward_pool(2, reward_file=scorer_file)
    pid_file = tmp_path / "hung.pid"
    job = {"data_source": "a", "solution_str": "hang", "ground_truth": str(pid_file), "extra_info": None}
    errors = []

    def score():
        try:
            list(pool.calls(fn, [job], timeout_s=3600))
        except RewardPoolError as exc:
            errors.append(str(exc))

    thread = threading.Thread(target=score, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not (pid_file.exists() and pid_file.read_text()) and time.monotonic() < deadline:
        time.sleep(0.05)
    started = time.perf_counter()
    pool.close(timeout_s=0.5)
    assert time.perf_counter() - started < 5
    assert _pid_gone(int(pid_file.read_text()), within_s=5.0)
    thread.join(5)
    assert errors and "no result for a scoring call: the pool was closed" in errors[0]


# ------------------------------------------------------------------ timeout_limit (verl's decorator)
def test_timeout_limit_returns_raises_and_times_out_like_verls():
    import threading
    import time

    from hybridrl.rewards.pool import ScoreTimeoutError, timeout_limit

    @timeout_limit(seconds=0.5)
    def quick(x, y=1):
        return x + y

    @timeout_limit(seconds=0.2, use_signals=True)  # verl's deprecated flag: accepted, same behaviour
    def slow():
        time.sleep(1.0)
        return "finished"

    def fails():
        raise ValueError("from the task")

    assert quick(1, y=2) == 3 and quick.__name__ == "quick"
    with pytest.raises(TimeoutError, match=r"^slow timed out after 0\.2 seconds$") as err:
        slow()
    assert isinstance(err.value, ScoreTimeoutError)
    with pytest.raises(ValueError, match="^from the task$"):
        timeout_limit(seconds=0.5)(fails)()

    caught = []  # in a thread other than the main one (where signals cannot work)

    def in_thread():
        try:
            slow()
        except TimeoutError as exc:
            caught.append(exc)

    thread = threading.Thread(target=in_thread)
    thread.start()
    thread.join(2.0)
    assert len(caught) == 1
