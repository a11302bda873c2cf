"""hybridrl.models.lora: wrapping, the adapter-disabled reference, merged weights for the
rollout (checked against the LoRA formula by hand), the adapter folder round trip, and the
start-up checks of the LoRA keys."""

import copy

import pytest
import torch
from omegaconf import OmegaConf

pytest.importorskip("peft")

from hybridrl.config import ConfigError, load_config
from hybridrl.models import load_causal_lm
from hybridrl.models.lora import (
    AdapterDisabled,
    apply_lora,
    is_lora_model,
    lora_settings,
    merge_lora_adapter,
    merged_lora_weights,
    save_lora_adapter,
    saved_lora_rank,
)
from hybridrl.trainer.ppo.config_check import validate_ppo_config

RANK, ALPHA = 4, 8


@pytest.fixture(scope="module")
def base(tiny_model_dir):
    return load_causal_lm(tiny_model_dir)


@pytest.fixture(scope="module")
def inputs():
    gen = torch.Generator().manual_seed(0)
    ids = torch.randint(3, 2000, (3, 7), generator=gen)
    mask = torch.ones_like(ids)
    mask[0, :2] = 0  # left padding on one row
    return {"input_ids": ids, "attention_mask": mask}


def _logits(model, inputs):
    with torch.no_grad():
        return model(**inputs).logits.float()


def _trained_lora(base):
    """A LoRA copy of ``base`` whose adapters are non-zero (as after some updates)."""
    model = apply_lora(copy.deepcopy(base), RANK, ALPHA, "all-linear")
    gen = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.copy_(0.2 * torch.randn(p.shape, generator=gen))
    return model


def test_fresh_adapter_changes_nothing_and_only_it_trains(base, inputs):
    model = apply_lora(copy.deepcopy(base), RANK, ALPHA, "all-linear")
    assert is_lora_model(model) and not is_lora_model(base)
    torch.testing.assert_close(_logits(model, inputs), _logits(base, inputs), atol=0, rtol=0)
    trainable = [n for n, p in model.named_parameters() if p.requires_grad]
    assert trainable and all("lora_A" in n or "lora_B" in n for n in trainable)
    # all-linear: the 7 projections of each of the 2 layers, never the output head
    assert len({n.rsplit(".lora_", 1)[0] for n in trainable}) == 7 * 2
    assert not any("lm_head" in n for n in trainable)


def test_adapter_disabled_is_the_base_model(base, inputs):
    model = _trained_lora(base)
    with_adapter = _logits(model, inputs)
    assert (with_adapter - _logits(base, inputs)).abs().max() > 1e-3  # the adapter matters
    ref = AdapterDisabled(model)
    torch.testing.assert_close(_logits(ref, inputs), _logits(base, inputs), atol=1e-6, rtol=0)
    torch.testing.assert_close(_logits(model, inputs), with_adapter, atol=0, rtol=0)  # on again afterwards


def test_merged_weights_follow_the_lora_formula(base, inputs):
    model = _trained_lora(base)
    merged = dict(merged_lora_weights(model))  # one layer at a time
    assert len(merged) == 14 and all(k.startswith("model.layers.") and k.endswith(".weight") for k in merged)
    layer = model.base_model.model.model.layers[1].self_attn.q_proj
    a, b = layer.lora_A["default"].weight, layer.lora_B["default"].weight
    by_hand = base.model.layers[1].self_attn.q_proj.weight + (ALPHA / RANK) * b @ a
    torch.testing.assert_close(merged["model.layers.1.self_attn.q_proj.weight"], by_hand, atol=1e-6, rtol=0)
    plain = copy.deepcopy(base)  # a rollout copy of the base model
    missing, unexpected = plain.load_state_dict(merged, strict=False)
    assert not unexpected
    torch.testing.assert_close(_logits(plain, inputs), _logits(model, inputs), atol=1e-5, rtol=0)


def test_adapter_folder_round_trip_and_merge(base, inputs, tmp_path, tiny_model_dir):
    model = _trained_lora(base)
    save_lora_adapter(model, str(tmp_path))
    assert (tmp_path / "lora_adapter" / "adapter_model.safetensors").is_file()
    assert saved_lora_rank(str(tmp_path)) == RANK and saved_lora_rank(str(tmp_path / "nothing")) == 0
    folded = merge_lora_adapter(load_causal_lm(tiny_model_dir), str(tmp_path / "lora_adapter"))
    assert not is_lora_model(folded)
    assert set(folded.state_dict()) == set(base.state_dict())
    torch.testing.assert_close(_logits(folded, inputs), _logits(model, inputs), atol=1e-5, rtol=0)


def test_target_modules_that_match_nothing(base):
    with pytest.raises(ConfigError, match=r"actor_rollout_ref\.model\.target_modules=\['nope_proj'\]"):
        apply_lora(copy.deepcopy(base), RANK, ALPHA, ["nope_proj"], config_key="actor_rollout_ref.model")


def test_lora_settings_of_a_config_section():
    from tests.tiny_models import ppo_section

    assert lora_settings(ppo_section("actor_rollout_ref.model", {"lora_rank": 0})) is None
    section = ppo_section(
        "actor_rollout_ref.model", {"lora_rank": 8, "lora_alpha": 32, "target_modules": ["q_proj", "v_proj"]}
    )
    assert lora_settings(section) == {
        "lora_rank": 8,
        "lora_alpha": 32,
        "target_modules": ["q_proj", "v_proj"],
        "exclude_modules": None,
    }


# ----------------------------------------------------------------------------- start-up checks

M = "actor_rollout_ref.model"


@pytest.fixture(scope="module")
def grpo_cfg():
    return load_config(
        [
            "algorithm.adv_estimator=grpo",
            "data.train_batch_size=8",
            "actor_rollout_ref.rollout.n=2",
            "actor_rollout_ref.actor.ppo_mini_batch_size=4",
            "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=2",
        ]
    )


def _with(cfg, **changes):
    cfg = copy.deepcopy(cfg)
    for key, value in changes.items():
        OmegaConf.update(cfg, key, value, merge=False)
    return cfg


def test_lora_keys_are_accepted(grpo_cfg):
    assert validate_ppo_config(_with(grpo_cfg, **{f"{M}.lora_rank": 8, f"{M}.target_modules": ["q_proj"]})) == []


@pytest.mark.parametrize(
    "key, value, expected",
    [
        ("lora_rank", -1, "lora_rank=-1 must be 0"),
        (
            "lora_rank",
            2.5,
            "lora_rank: Value '2.5' of type 'float' could not be converted to Integer",
        ),  # the typed config
        ("lora_alpha", 0, "lora_alpha=0.0 must be a number > 0"),
        ("target_modules", [], "target_modules=[] must be all-linear or a list"),
        ("target_modules", [3], "target_modules=[3] must be all-linear or a list"),
    ],
)
def test_bad_lora_keys_fail_at_start_up(grpo_cfg, key, value, expected):
    changes = {f"{M}.lora_rank": 8, f"{M}.{key}": value}
    with pytest.raises(ConfigError) as err:
        validate_ppo_config(_with(grpo_cfg, **changes))
    assert f"{M}.{expected}" in str(err.value) and "\n" not in str(err.value)


def test_critic_lora_keys_checked_only_with_a_critic(grpo_cfg):
    bad = {"critic.model.lora_rank": 4, "critic.model.lora_alpha": -1}
    assert validate_ppo_config(_with(grpo_cfg, **bad)) == []  # GRPO has no critic
    with pytest.raises(ConfigError, match=r"critic\.model\.lora_alpha=-1"):
        validate_ppo_config(
            _with(grpo_cfg, **bad, **{"algorithm.adv_estimator": "gae", "critic.ppo_micro_batch_size_per_gpu": 2})
        )


def test_a_saved_adapter_is_trained_on_and_a_missing_one_is_one_line(base, inputs, tmp_path):
    """``actor_rollout_ref.model.lora_adapter_path`` (verl's key): the saved adapter's own weights,
    trainable, and its own rank; lora_settings picks it over lora_rank."""
    from hybridrl.models.lora import fill_saved_adapter, load_lora_adapter

    trained = _trained_lora(base)
    trained.save_pretrained(str(tmp_path / "adapter"))
    model = load_lora_adapter(copy.deepcopy(base), str(tmp_path / "adapter"), "actor_rollout_ref.model")
    fill_saved_adapter(model, str(tmp_path / "adapter"), "actor_rollout_ref.model")
    torch.testing.assert_close(_logits(model, inputs), _logits(trained, inputs), atol=1e-6, rtol=0)
    trainable = [n for n, p in model.named_parameters() if p.requires_grad]
    assert trainable and all("lora_A" in n or "lora_B" in n for n in trainable)
    cfg = OmegaConf.create({"lora_rank": 0, "lora_adapter_path": str(tmp_path / "adapter")})
    assert lora_settings(cfg) == {"adapter_path": str(tmp_path / "adapter")}
    with pytest.raises(ConfigError, match="actor_rollout_ref.model.lora_adapter_path=.*no adapter_config.json") as err:
        load_lora_adapter(copy.deepcopy(base), str(tmp_path), "actor_rollout_ref.model")
    assert "\n" not in str(err.value)
    load_config([f"actor_rollout_ref.model.lora_adapter_path={tmp_path / 'adapter'}"])  # verl's key: accepted
