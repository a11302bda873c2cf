"""Precision by capability: ``auto`` dtypes become bf16 only where the CPU computes bf16 natively."""

import pytest
from omegaconf import OmegaConf

from hybridrl.config import precision
from hybridrl.config.precision import cpu_native_bf16, read_cpu_flags, resolve_auto_dtype, resolve_precision

ZEN3_FLAGS = {"fpu", "sse4_2", "avx", "avx2", "fma"}
ZEN4_FLAGS = ZEN3_FLAGS | {"avx512f", "avx512bw", "avx512_bf16"}
SAPPHIRE_RAPIDS_FLAGS = ZEN3_FLAGS | {"avx512f", "amx_tile", "amx_bf16", "avx512_bf16"}
SKYLAKE_X_FLAGS = ZEN3_FLAGS | {"avx512f", "avx512bw"}  # AVX-512 without the bf16 instructions


def _never(*_):
    raise AssertionError("the probe must not run when the CPU flags are known")


@pytest.mark.parametrize(
    "flags, expected",
    [(ZEN3_FLAGS, "fp32"), (SKYLAKE_X_FLAGS, "fp32"), (ZEN4_FLAGS, "bf16"), (SAPPHIRE_RAPIDS_FLAGS, "bf16")],
)
def test_auto_is_bf16_only_with_native_bf16_instructions(flags, expected):
    dtype, reason = resolve_auto_dtype("cpu", flags=flags, probe=_never)
    assert dtype == expected
    assert ("AVX512_BF16" in reason or "AMX_BF16" in reason) == (expected == "bf16")


@pytest.mark.parametrize("fast, expected", [(True, True), (False, False)])
def test_the_timing_probe_decides_when_no_flags_can_be_read(monkeypatch, fast, expected):
    monkeypatch.setattr(precision, "read_cpu_flags", lambda: None)
    native, reason = cpu_native_bf16(probe=lambda: fast)
    assert native is expected
    assert "probe" in reason


def test_cpu_flags_are_read_from_a_cpuinfo_file(tmp_path):
    info = tmp_path / "cpuinfo"
    info.write_text(
        "processor\t: 0\nflags\t\t: fpu avx2 avx512_bf16\n\nprocessor\t: 1\nflags\t\t: fpu avx2 avx512_bf16\n"
    )
    assert read_cpu_flags(str(info)) == {"fpu", "avx2", "avx512_bf16"}
    assert read_cpu_flags(str(tmp_path / "missing")) is None


def test_resolve_precision_replaces_only_auto_dtype_keys():
    cfg = OmegaConf.create(
        {
            "actor": {"fsdp_config": {"mixed_precision": {"param_dtype": "auto", "reduce_dtype": "fp32"}}},
            "rollout": {"dtype": "auto", "name": "auto"},
            "critic": {"fsdp_config": {"mixed_precision": {"param_dtype": "fp32"}}},  # explicit: kept
        }
    )
    line = resolve_precision(cfg, "cpu", flags=ZEN3_FLAGS)
    assert cfg.actor.fsdp_config.mixed_precision.param_dtype == "fp32"
    assert cfg.rollout.dtype == "fp32" and cfg.rollout.name == "auto"  # only dtype keys
    assert "auto -> fp32" in line and "rollout.dtype" in line and "critic" not in line

    cfg = OmegaConf.create({"rollout": {"dtype": "auto"}, "critic": {"param_dtype": "fp32"}})
    resolve_precision(cfg, "cpu", flags=ZEN4_FLAGS)
    assert cfg.rollout.dtype == "bf16" and cfg.critic.param_dtype == "fp32"
    assert resolve_precision(cfg, "cpu", flags=ZEN4_FLAGS) is None  # nothing left to resolve


def test_an_unresolved_auto_reaching_a_loader_says_what_to_call():
    from hybridrl.models import ModelConfigError, to_torch_dtype

    with pytest.raises(ModelConfigError, match="resolve_precision"):
        to_torch_dtype("auto")
