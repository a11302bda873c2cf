"""The data_source → scorer registry and default_compute_score."""

import subprocess
import sys

import pytest

import hybridrl.rewards as rewards
from hybridrl.rewards import (
    ScorerRegistrationError,
    UnknownDataSourceError,
    default_compute_score,
    get_scorer,
    known_data_sources,
    register_scorer,
)


@pytest.fixture(autouse=True)
def _restore_registry(monkeypatch):
    monkeypatch.setattr(rewards.SCORERS, "table", dict(rewards.SCORERS.table))


def test_builtin_sources_are_known_and_dispatch():
    assert {"openai/gsm8k", "gsm8k", "arithmetic"} <= set(known_data_sources())
    assert default_compute_score("openai/gsm8k", "so #### 18", "18") == 1.0
    assert default_compute_score("gsm8k", "so #### 17", "18") == 0.0
    # kwargs reach the scorer; extra_info is dropped for scorers that do not take it
    assert default_compute_score("gsm8k", "it is 18", "18", extra_info={"index": 0}, method="flexible") == 1.0


def test_arithmetic_resolves_lazily_to_its_module():
    fn = get_scorer("arithmetic")
    assert fn.__module__ == "hybridrl.rewards.arithmetic" and fn.__name__ == "compute_score"


def test_unknown_source_error_lists_known_and_the_fix():
    with pytest.raises(UnknownDataSourceError) as info:
        default_compute_score("my/data", "x", "y")
    msg = str(info.value)
    assert "'my/data'" in msg and "openai/gsm8k" in msg
    assert "custom_reward_function.path" in msg and "register_scorer" in msg
    assert "\n" not in msg
    assert isinstance(info.value, ValueError)


def test_register_scorer_with_extra_info_and_dict_result():
    seen = {}

    @register_scorer("toy", "toy2")
    def toy(solution_str, ground_truth, extra_info=None, bonus=0.0):
        seen["extra_info"] = extra_info
        return {"score": float(solution_str == ground_truth) + bonus, "len": len(solution_str)}

    assert "toy" in known_data_sources() and "toy2" in known_data_sources()
    out = default_compute_score("toy2", "ab", "ab", extra_info={"split": "test"}, bonus=0.5)
    assert out == {"score": 1.5, "len": 2}
    assert seen["extra_info"] == {"split": "test"}


def test_registration_overrides_builtin():
    @register_scorer("gsm8k")
    def always_one(solution_str, ground_truth):
        return 1

    result = default_compute_score("gsm8k", "nothing", "18")
    assert result == 1.0 and isinstance(result, float)


def test_register_scorer_needs_names():
    with pytest.raises(ScorerRegistrationError):
        register_scorer()
    with pytest.raises(ScorerRegistrationError):
        register_scorer(lambda s, g: 0.0)  # used without parentheses


def test_import_stays_light():
    code = (
        "import sys, hybridrl.rewards, hybridrl.rewards.custom, hybridrl.rewards.gsm8k;"
        "print(sorted(m for m in ('torch', 'transformers', 'omegaconf', 'ray') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
