"""hybridrl.registry.Registry: lazy built-ins, did-you-mean, duplicates, capabilities, error class."""

import sys
from enum import Enum

import pytest

from hybridrl.registry import Registry, RegistryError


class MyError(RegistryError):
    pass


def f():
    return "f"


def g():
    return "g"


def test_register_decorator_and_get():
    reg = Registry("widget", "section.widget")

    @reg.register("a")
    def a():
        return 1

    assert reg.register("b", f) is f
    assert reg.get("a") is a and reg.get("b") is f
    assert reg.names() == ["a", "b"] and "a" in reg and "c" not in reg and list(reg) == ["a", "b"]


def test_unknown_name_is_one_line_with_key_known_names_and_suggestion():
    reg = Registry("widget", "section.widget", error=MyError, hint="register yours with @register_widget")
    reg.register("grpo", f)
    reg.register("gae", g)
    with pytest.raises(MyError) as err:
        reg.get("grpoo")
    msg = str(err.value)
    assert msg == (
        "section.widget='grpoo' is not a known widget (did you mean 'grpo'?); known: gae, grpo; "
        "register yours with @register_widget"
    )
    assert isinstance(err.value, ValueError) and "\n" not in msg
    plain = Registry("widget", error=MyError)
    plain.register("gae", g)
    with pytest.raises(MyError, match=r"^'zzz' is not a known widget; known: gae$"):  # nothing close, no key
        plain.get("zzz")


def test_lazy_builtins_import_on_first_lookup():
    sys.modules.pop("json.tool", None)
    reg = Registry("codec", builtins={"tool": "json.tool:main", "dumps": "json:dumps"})
    assert "tool" in reg and reg.names() == ["dumps", "tool"]
    assert "json.tool" not in sys.modules  # nothing imported yet
    import json

    assert reg.get("dumps") is json.dumps
    assert reg.get("tool") is sys.modules["json.tool"].main
    assert reg.table["tool"] is reg.get("tool")  # cached after the first lookup


def test_lazy_target_errors():
    reg = Registry("codec", error=MyError, builtins={"gone": "json:no_such_attr"})
    with pytest.raises(MyError, match="'gone' points at json:no_such_attr, which does not exist"):
        reg.get("gone")
    with pytest.raises(MyError, match="must be a 'module:attr' string"):
        reg.register_lazy("bad", "json.dumps")
    with pytest.raises(ModuleNotFoundError):
        Registry("codec", builtins={"x": "no_such_module_xyz:f"}).get("x")


def test_duplicate_refused_same_object_allowed():
    reg = Registry("widget", error=MyError)
    reg.register("a", f)
    reg.register("a", f)  # a re-import registers the same object again: fine
    with pytest.raises(MyError) as err:
        reg.register("a", g)
    assert str(err.value) == (f"widget 'a' is already registered to {__name__}.f; pick another name for {__name__}.g")
    assert reg.get("a") is f


def test_duplicate_of_a_lazy_builtin_refused_unless_it_is_the_target():
    reg = Registry("codec", error=MyError, builtins={"dumps": "json:dumps"})
    with pytest.raises(MyError, match="'dumps' is already registered to json:dumps"):
        reg.register("dumps", f)
    import json

    assert reg.register("dumps", json.dumps) is json.dumps  # the module registering its own built-in
    reg.register_lazy("dumps", "json:dumps")  # the same target again: fine
    with pytest.raises(MyError, match="'dumps' is already registered to json:dumps"):
        reg.register_lazy("dumps", "json:loads")


def test_replace_registry_lets_a_later_registration_win():
    reg = Registry("scorer", replace=True, builtins={"dumps": "json:dumps"})
    reg.register("a", f)
    reg.register("a", g)
    reg.register("dumps", g)  # over a built-in too
    assert reg.get("a") is g and reg.get("dumps") is g


def test_capabilities_and_live_view():
    reg = Registry("estimator", error=MyError)
    reg.register("grpo", f, needs_group=True)
    reg.register("gae", g, needs_values=True)
    group = reg.having("needs_group")
    assert reg.capabilities("grpo") == {"needs_group": True}
    assert reg.capabilities("gae") == {"needs_values": True}
    assert set(group) == {"grpo"} and "grpo" in group and "gae" not in group
    assert {"grpo"} <= group and not {"gae"} & group
    reg.register("rloo", lambda: None, needs_group=True)  # the view follows later registrations
    assert set(group) == {"grpo", "rloo"}
    reg.register("grpo", f)  # re-registered without the flag
    assert "grpo" not in group
    reg.unregister("rloo")
    assert set(group) == set() and "rloo" not in reg
    with pytest.raises(MyError, match="not a known estimator"):
        reg.capabilities("nope")


def test_enum_member_stands_for_its_value():
    class Kind(str, Enum):
        GRPO = "grpo"

    reg = Registry("estimator")
    reg.register(Kind.GRPO, f)
    assert reg.get("grpo") is f and reg.get(Kind.GRPO) is f and Kind.GRPO in reg


def test_error_class_and_bad_names():
    with pytest.raises(TypeError, match="must be a subclass of RegistryError"):
        Registry("widget", error=ValueError)
    reg = Registry("widget", error=MyError)
    for bad in ("", None, 3):
        with pytest.raises(MyError, match="must be a non-empty string"):
            reg.register(bad, f)
    with pytest.raises(MyError, match=r"^\[1\] is not a known widget; known: \(none\)$"):
        reg.get([1])  # unhashable: still the one-line message


def test_migrated_registries_raise_their_callers_error_types():
    from hybridrl.algorithms import get_adv_estimator_fn, get_policy_loss_fn
    from hybridrl.algorithms.errors import UnknownAlgorithmError
    from hybridrl.rewards import UnknownDataSourceError, get_scorer
    from hybridrl.rewards.custom import RewardConfigError
    from hybridrl.rewards.manager import get_reward_manager_cls

    with pytest.raises(UnknownAlgorithmError, match=r"algorithm.adv_estimator='grpoo' .*did you mean 'grpo'\?"):
        get_adv_estimator_fn("grpoo")
    with pytest.raises(UnknownAlgorithmError, match="actor_rollout_ref.actor.policy_loss.loss_mode='vanila'"):
        get_policy_loss_fn("vanila")
    with pytest.raises(UnknownDataSourceError, match="did you mean 'openai/gsm8k'"):
        get_scorer("openai/gsm8")
    with pytest.raises(RewardConfigError, match="did you mean 'naive'") as err:
        get_reward_manager_cls("naiv")
    assert isinstance(err.value, RegistryError)


def test_more_migrated_registries_suggest_the_closest_name():
    from hybridrl.agents import get_agent_loop_cls
    from hybridrl.agents.errors import AgentConfigError
    from hybridrl.trainer.run.tracking import Tracking, TrackingError
    from hybridrl.workers.rollout import get_rollout_cls

    with pytest.raises(AgentConfigError, match="agent_name='tool_agnt' .*did you mean 'tool_agent'"):
        get_agent_loop_cls("tool_agnt")
    with pytest.raises(TrackingError, match="trainer.logger='consol' .*did you mean 'console'"):
        Tracking("p", "e", ["console", "consol"])
    with pytest.raises(ValueError, match="rollout.name='vllmm' is not a known rollout engine .*did you mean 'vllm'"):
        get_rollout_cls("vllmm")


def test_register_adv_est_with_a_plain_enum_registers_under_its_value():
    """verl's TestRegisterAdvEst facts: a plain Enum member (not a str Enum) registers under its value."""
    from hybridrl.algorithms import ADV_ESTIMATOR_REGISTRY, get_adv_estimator_fn, register_adv_est
    from hybridrl.algorithms.advantages.base import ADV_ESTIMATORS

    class AdvantageEstimator(Enum):
        TEST = "test_plain_enum_estimator"

    def fn(**kwargs):
        return None

    def other(**kwargs):
        return None

    try:
        assert register_adv_est(AdvantageEstimator.TEST)(fn) is fn
        assert ADV_ESTIMATOR_REGISTRY["test_plain_enum_estimator"] is fn
        assert AdvantageEstimator.TEST not in ADV_ESTIMATOR_REGISTRY  # the key is the value, not the member
        assert get_adv_estimator_fn(AdvantageEstimator.TEST) is fn is get_adv_estimator_fn("test_plain_enum_estimator")
        register_adv_est(AdvantageEstimator.TEST)(fn)  # the same function again: fine
        with pytest.raises(ValueError, match="'test_plain_enum_estimator' is already registered"):
            register_adv_est("test_plain_enum_estimator")(other)
    finally:
        ADV_ESTIMATORS.unregister("test_plain_enum_estimator")
