"""The memory plan (``hybridrl plan``): parameter counts against transformers, the arithmetic's
behaviour (sharding, offload, LoRA, checkpointing, chunking, SP, phases), the command's JSON and
its one-line errors. No weights are loaded: the models are config.json files."""

import json
import logging

import pytest
import torch

from hybridrl import cli
from hybridrl.trainer import main_ppo
from hybridrl.trainer.jobs import plan_config
from hybridrl.trainer.jobs.memory_plan import CPU_MALLOC_KEPT_GB, GiB, one_line
from hybridrl.trainer.jobs.model_shape import model_shape_from_dict
from hybridrl.trainer.jobs.plan_cli import _with, load_plan_config, suggest
from hybridrl.trainer.jobs.plan_config import build_plan


def _config(model_type, hidden, inter, layers, heads, kv_heads, vocab, tied, **extra) -> dict:
    """A config.json's contents."""
    return {
        "model_type": model_type,
        "hidden_size": hidden,
        "intermediate_size": inter,
        "num_hidden_layers": layers,
        "num_attention_heads": heads,
        "num_key_value_heads": kv_heads,
        "vocab_size": vocab,
        "tie_word_embeddings": tied,
        **extra,
    }


# Published shapes (the models' config.json); SmolLM2 is a Llama, Qwen2.5 a Qwen2.
SHAPES = {
    "SmolLM2-135M": _config("llama", 576, 1536, 30, 9, 3, 49152, True),
    "SmolLM2-360M": _config("llama", 960, 2560, 32, 15, 5, 49152, True),
    "SmolLM2-1.7B": _config("llama", 2048, 8192, 24, 32, 32, 49152, True),
    "Qwen2.5-0.5B": _config("qwen2", 896, 4864, 24, 14, 2, 151936, True),
    "Qwen2.5-7B": _config("qwen2", 3584, 18944, 28, 28, 4, 152064, False),
    "qwen3-small": _config("qwen3", 256, 512, 2, 4, 2, 1000, False, head_dim=96),
    "mistral-small": _config("mistral", 256, 512, 2, 8, 2, 1000, False),
    "llama-biases": _config("llama", 128, 256, 2, 4, 2, 500, False, attention_bias=True, mlp_bias=True),
}


def _meta_model(shape: dict):
    from transformers import AutoConfig, AutoModelForCausalLM

    fields = {k: v for k, v in shape.items() if k != "model_type"}
    config = AutoConfig.for_model(shape["model_type"], **fields)
    with torch.device("meta"):
        return AutoModelForCausalLM.from_config(config)


@pytest.mark.parametrize("name", sorted(SHAPES))
def test_param_count_matches_transformers(name):
    model = _meta_model(SHAPES[name])
    assert model_shape_from_dict(SHAPES[name]).param_count() == sum(p.numel() for p in model.parameters())


@pytest.mark.parametrize("targets,excluded", [("all-linear", None), (["q_proj", "v_proj", "down_proj"], ["v_proj"])])
def test_lora_param_count_matches_peft(targets, excluded):
    peft = pytest.importorskip("peft")
    shape = SHAPES["Qwen2.5-0.5B"]
    model = peft.get_peft_model(
        _meta_model(shape),
        peft.LoraConfig(r=16, target_modules=targets, exclude_modules=excluded, task_type="CAUSAL_LM"),
    )
    trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
    assert model_shape_from_dict(shape).lora_param_count(16, targets, excluded) == trainable


def _write_model(folder, **shape):
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(shape))
    return str(folder)


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return _write_model(tmp_path_factory.mktemp("plan") / "smollm2-360m", **SHAPES["SmolLM2-360M"])


def _overrides(model_dir):
    return [
        "algorithm.adv_estimator=grpo",
        "actor_rollout_ref.actor.use_kl_loss=true",
        "actor_rollout_ref.rollout.n=4",
        "data.train_batch_size=16",
        "actor_rollout_ref.actor.ppo_mini_batch_size=8",
        "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=2",
        "data.max_prompt_length=64",
        "data.max_response_length=128",
        "actor_rollout_ref.rollout.micro_batch_size=8",
        "trainer.device=cpu",
        "actor_rollout_ref.actor.fsdp_config.mixed_precision.param_dtype=bf16",
        "actor_rollout_ref.rollout.dtype=bf16",
        "trainer.n_gpus_per_node=2",
        f"actor_rollout_ref.model.path={model_dir}",
    ]


@pytest.fixture(scope="module")
def base(model_dir):
    """The typed config of the overrides above (loaded once; each test changes keys with ``_with``)."""
    config, _ = load_plan_config(_overrides(model_dir))
    return config


def _plan(base, device_memory_gb=100.0, **changes):
    return build_plan(_with(base, {k.replace("__", "."): v for k, v in changes.items()}), device_memory_gb)


A = "actor_rollout_ref"
SHAPE_360M = model_shape_from_dict(SHAPES["SmolLM2-360M"])


def test_weights_are_the_param_count_sharded_in_fp32(base):
    plan = _plan(base)
    assert plan.roles["actor"]["weights"] * GiB == pytest.approx(SHAPE_360M.param_count() * 4 / 2)
    assert plan.roles["reference"]["weights"] * GiB == pytest.approx(SHAPE_360M.param_count() * 2 / 2)  # bf16
    assert plan.roles["actor"]["optimizer_states"] == pytest.approx(2 * plan.roles["actor"]["weights"])
    assert plan.roles["rollout"]["weights"] * GiB == pytest.approx(SHAPE_360M.param_count() * 2)  # unsharded bf16


def test_doubling_workers_halves_the_sharded_parts_not_the_rollout_copy(base):
    two, four = _plan(base), _plan(base, **{"trainer.n_gpus_per_node": 4})
    for role, component in [
        ("actor", "weights"),
        ("actor", "gradients"),
        ("actor", "optimizer_states"),
        ("reference", "weights"),
    ]:
        assert four.roles[role][component] == pytest.approx(two.roles[role][component] / 2)
    assert four.roles["rollout"]["weights"] == two.roles["rollout"]["weights"]
    assert four.roles["process"]["baseline"] == two.roles["process"]["baseline"]
    assert four.per_device_gb < two.per_device_gb


def test_hybrid_sharding_divides_by_fsdp_size(base):
    plan = _plan(base, **{"trainer.n_gpus_per_node": 4, f"{A}.actor.fsdp_config.fsdp_size": 2})
    assert plan.roles["actor"]["weights"] * GiB == pytest.approx(SHAPE_360M.param_count() * 4 / 2)


def test_offload_on_cuda_moves_shards_to_the_host(base):
    cuda = _with(base, {"trainer.device": "cuda"})
    plain = build_plan(cuda, 80.0)
    offload = build_plan(
        _with(cuda, {f"{A}.actor.fsdp_config.param_offload": True, f"{A}.actor.fsdp_config.optimizer_offload": True}),
        80.0,
    )
    assert offload.roles["actor"]["optimizer_states"] == 0 and offload.roles["actor"]["weights"] == 0
    assert offload.host_gb["actor"]["optimizer_states"] == pytest.approx(plain.roles["actor"]["optimizer_states"])
    resident_saved = plain.roles["actor"]["weights"] + plain.roles["actor"]["optimizer_states"]
    assert offload.phases["generate"] == pytest.approx(plain.phases["generate"] - resident_saved)


def test_optimizer_offload_alone_keeps_the_moments_for_the_update_only(base):
    cuda = _with(base, {"trainer.device": "cuda"})
    plain = build_plan(cuda, 80.0)
    offload = build_plan(_with(cuda, {f"{A}.actor.fsdp_config.optimizer_offload": True}), 80.0)
    moments = plain.roles["actor"]["optimizer_states"]
    for phase in ("generate", "old_log_prob", "ref_log_prob"):
        assert offload.phases[phase] == pytest.approx(plain.phases[phase] - moments)
    for phase in ("update_actor", "actor_step"):  # back on the device for the update
        assert offload.phases[phase] == pytest.approx(plain.phases[phase])


def test_offload_on_cpu_saves_nothing_and_says_so(base):
    plain = _plan(base)
    offload = _plan(
        base, **{f"{A}.actor.fsdp_config.param_offload": True, f"{A}.actor.fsdp_config.optimizer_offload": True}
    )
    assert offload.per_device_gb == pytest.approx(plain.per_device_gb)
    assert any("saves nothing" in note for note in offload.notes)


def test_a_cpu_plan_counts_kept_freed_memory_only_when_malloc_keeps_it(base):
    kept, released = (
        _plan(base, **{"trainer.cpu_malloc_reuse": True}),
        _plan(base, **{"trainer.cpu_malloc_reuse": False}),
    )
    assert any("cpu_malloc_reuse=true" in note for note in kept.notes)
    assert not any("cpu_malloc_reuse" in note for note in released.notes)
    assert kept.roles["process"]["malloc_kept"] == pytest.approx(CPU_MALLOC_KEPT_GB)
    assert "malloc_kept" not in released.roles["process"]
    assert kept.per_device_gb == pytest.approx(released.per_device_gb + CPU_MALLOC_KEPT_GB)


def test_lora_trains_only_the_adapters_and_the_reference_is_no_copy(base):
    full, lora = _plan(base), _plan(base, **{f"{A}.model.lora_rank": 16})
    adapters = SHAPE_360M.lora_param_count(16)
    assert lora.roles["actor"]["gradients"] * GiB == pytest.approx(adapters * 4 / 2)
    assert lora.roles["actor"]["optimizer_states"] * GiB == pytest.approx(2 * adapters * 4 / 2)
    assert lora.roles["actor"]["gradients"] < full.roles["actor"]["gradients"] / 10
    assert lora.roles["reference"]["weights"] == 0 and full.roles["reference"]["weights"] > 0


def test_gradient_checkpointing_shrinks_activations(base):
    on, off = _plan(base), _plan(base, **{f"{A}.model.enable_gradient_checkpointing": False})
    assert off.roles["actor"]["activations"] > 3 * on.roles["actor"]["activations"]


def test_chunked_logits_shrink_the_logits(base):
    plain = _plan(base, **{f"{A}.actor.ppo_micro_batch_size_per_gpu": 16})
    chunked = _plan(
        base, **{f"{A}.actor.ppo_micro_batch_size_per_gpu": 16, f"{A}.actor.entropy_from_logits_with_chunking": True}
    )
    tokens = 16 * 128  # micro batch x response length: the head runs on response tokens only
    assert plain.roles["actor"]["logits"] * GiB == pytest.approx(tokens * SHAPE_360M.vocab_size * 8)  # fp32 + grad
    assert chunked.roles["actor"]["logits"] < plain.roles["actor"]["logits"] / 2


def test_sequence_parallel_divides_the_activations(base):
    one = _plan(base)
    two = _plan(base, **{f"{A}.actor.ulysses_sequence_parallel_size": 2})
    assert two.roles["actor"]["activations"] == pytest.approx(one.roles["actor"]["activations"] / 2)
    assert two.roles["actor"]["logits"] == pytest.approx(one.roles["actor"]["logits"] / 2)
    assert two.roles["actor"]["weights"] == one.roles["actor"]["weights"]


def test_micro_batch_scales_activations(base):
    small, large = _plan(base), _plan(base, **{f"{A}.actor.ppo_micro_batch_size_per_gpu": 4})
    assert large.roles["actor"]["activations"] == pytest.approx(2 * small.roles["actor"]["activations"])


def test_hf_kv_cache_is_micro_batch_by_length_by_layers(base):
    plan = _plan(base)
    expected = 8 * (64 + 128) * SHAPE_360M.num_hidden_layers * 2 * SHAPE_360M.kv_dim * 2  # bf16
    assert plan.roles["rollout"]["kv_cache"] * GiB == pytest.approx(expected)


def test_vllm_on_cuda_takes_its_share_of_the_device(base):
    plan = build_plan(
        _with(
            base, {"trainer.device": "cuda", f"{A}.rollout.name": "vllm", f"{A}.rollout.gpu_memory_utilization": 0.4}
        ),
        80.0,
    )
    assert plan.roles["rollout"]["engine_weights_and_kv_cache"] == pytest.approx(32.0)
    assert "generate" in plan.when["rollout"]["engine_weights_and_kv_cache"]  # asleep between generations


def test_peak_is_the_largest_phase_not_the_sum(base):
    plan = _plan(base)
    assert plan.per_device_gb == max(plan.phases.values()) == plan.phases[plan.peak_phase]
    assert plan.per_device_gb < sum(sum(parts.values()) for parts in plan.roles.values())
    assert sum(plan.peak_by_role.values()) == pytest.approx(plan.per_device_gb)
    assert plan.fits and not _plan(base, device_memory_gb=plan.per_device_gb * 0.9).fits


def test_critic_only_when_the_estimator_needs_values(base):
    assert "critic" not in _plan(base).roles
    gae = _plan(base, **{"algorithm.adv_estimator": "gae", "critic.ppo_micro_batch_size_per_gpu": 2})
    assert gae.roles["critic"]["weights"] * GiB == pytest.approx(SHAPE_360M.scalar_head_param_count() * 4 / 2)
    assert gae.roles["critic"].get("logits", 0) == 0  # a scalar head


def test_suggestions_lower_the_peak_and_name_keys(base):
    plan = _plan(base, device_memory_gb=2.0)
    assert not plan.fits
    found = suggest(base, plan)
    assert found and all(s["per_device_gb"] < plan.per_device_gb for s in found)
    assert all(isinstance(key, str) and "." in key for s in found for key in s["set"])


def _run(argv, capsys):
    code = cli.main(["plan", *argv])
    out, err = capsys.readouterr()
    return code, out, err


def test_json_has_the_documented_keys(model_dir, capsys):
    code, out, _ = _run([*_overrides(model_dir), "--json", "--device-memory", "1.5"], capsys)
    assert code == 0
    plan = json.loads(out)
    assert isinstance(plan["per_device_gb"], float) and isinstance(plan["device_memory_gb"], float)
    assert isinstance(plan["fits"], bool) and plan["fits"] is False
    assert all(isinstance(v, float) for parts in plan["roles"].values() for v in parts.values())
    assert {"actor", "rollout", "reference", "process"} <= set(plan["roles"])
    assert plan["suggestions"] and {"set", "per_device_gb", "fits"} <= set(plan["suggestions"][0])


def test_table_output(model_dir, capsys):
    code, out, _ = _run([*_overrides(model_dir), "--device-memory", "40"], capsys)
    assert code == 0 and "memory plan:" in out and "fits" in out and "kv_cache" in out


def _one_error_line(code, err):
    lines = err.strip().splitlines()
    assert code == 2 and len(lines) == 1 and lines[0].startswith("hybridrl: error:"), err
    return lines[0]


@pytest.mark.parametrize(
    "shape,expected",
    [
        (dict(SHAPES["mistral-small"], model_type="gpt2"), "'gpt2' is not supported"),
        (dict(SHAPES["Qwen2.5-0.5B"], model_type="qwen2", num_experts=8), "num_experts=8"),
        ({k: v for k, v in SHAPES["mistral-small"].items() if k != "intermediate_size"}, "intermediate_size=None"),
    ],
)
def test_bad_model_is_one_line_naming_the_key(tmp_path, capsys, shape, expected, model_dir):
    folder = _write_model(tmp_path / "m", **shape)
    line = _one_error_line(*_run([*_overrides(model_dir), f"{A}.model.path={folder}"], capsys)[::2])
    assert "actor_rollout_ref.model.path" in line and expected in line
    assert "llama, qwen2, qwen3, mistral" in line or "must be an integer" in line


def test_model_folder_without_config_json_is_one_line(tmp_path, capsys, model_dir):
    (tmp_path / "empty").mkdir()
    line = _one_error_line(*_run([*_overrides(model_dir), f"{A}.model.path={tmp_path / 'empty'}"], capsys)[::2])
    assert "actor_rollout_ref.model.path" in line and "config.json" in line


@pytest.mark.parametrize(
    "argv,key",
    [
        (["--device-memory", "0"], "--device-memory"),
        (["--device-memory", "-4"], "--device-memory"),
        (["data.max_response_length=0"], "data.max_response_length"),
        ([f"{A}.actor.ppo_micro_batch_size_per_gpu=0"], "ppo_micro_batch_size_per_gpu"),
        ([f"{A}.rollout.micro_batch_size=0"], f"{A}.rollout.micro_batch_size"),
        ([f"{A}.rollout.log_prob_micro_batch_size_per_gpu=0"], "log_prob_micro_batch_size_per_gpu"),
        (["trainer.n_gpus_per_node=0"], "trainer.n_gpus_per_node"),
    ],
)
def test_sizes_that_make_no_sense_are_one_line_naming_the_key(argv, key, capsys, model_dir):
    line = _one_error_line(*_run([*_overrides(model_dir), *argv], capsys)[::2])
    assert key in line


def test_train_prints_the_one_line_total_and_warns_when_it_does_not_fit(base, capsys, caplog, monkeypatch):
    main_ppo.print_memory_plan(base)
    out = capsys.readouterr().out
    assert out.startswith("hybridrl: memory plan: ") and "per device at peak" in out
    monkeypatch.setattr(plan_config, "default_device_memory_gb", lambda config, device: 0.1)
    with caplog.at_level(logging.WARNING, logger=main_ppo.__name__):
        main_ppo.print_memory_plan(base)
    assert "does NOT fit" in capsys.readouterr().out
    assert any("will not fit" in r.getMessage() for r in caplog.records)


def test_a_plan_that_cannot_be_made_never_stops_training(base, tmp_path, capsys, caplog):
    broken = _with(base, {f"{A}.model.path": str(tmp_path / "nowhere")})
    with caplog.at_level(logging.DEBUG, logger=main_ppo.__name__):
        main_ppo.print_memory_plan(broken)
    assert capsys.readouterr().out == ""
    assert any("memory plan: not made" in r.getMessage() for r in caplog.records)


def test_one_line_names_the_peak_phase_and_roles(base):
    line = one_line(_plan(base))
    assert line.startswith("memory plan: ") and "actor" in line and "rollout" in line and line.endswith("fits")


def test_a_vllm_share_that_cannot_hold_the_weights_does_not_fit(base):
    plan = build_plan(
        _with(
            base, {"trainer.device": "cuda", f"{A}.rollout.name": "vllm", f"{A}.rollout.gpu_memory_utilization": 0.1}
        ),
        4.0,
    )
    weights_gb = SHAPE_360M.param_count() * 2 / GiB  # bf16, more than 0.1 x 4 GB
    assert plan.roles["rollout"]["engine_weights_and_kv_cache"] == pytest.approx(weights_gb)
    assert not plan.fits and any("cannot hold the weights" in note for note in plan.notes)


def test_a_distillation_teacher_is_one_more_frozen_role_sharded_like_the_reference(base, model_dir, tmp_path):
    """issue 32: each teacher's weights in its inference dtype over the workers, and a log-prob pass
    of its own (its vocabulary's logits) in the teacher_log_prob phase."""
    big = _write_model(tmp_path / "teacher-1.7b", **SHAPES["SmolLM2-1.7B"])
    D = "distillation"
    plan = _plan(
        base,
        **{
            f"{D}.enabled": True,
            f"{D}.teacher_models.teacher_model.model_path": big,
            f"{D}.teacher_models.teacher_model.inference.dtype": "bf16",
        },
    )
    teacher = plan.roles["teacher:teacher_model"]
    shape = model_shape_from_dict(SHAPES["SmolLM2-1.7B"])
    assert teacher["weights"] * GiB == pytest.approx(shape.param_count() * 2 / 2)  # bf16, 2 workers
    assert plan.phases["teacher_log_prob"] > plan.phases["ref_log_prob"]  # a larger model's pass
    assert "teacher:teacher_model" not in _plan(base).roles
    pooled = _plan(
        base,
        **{
            f"{D}.enabled": True,
            f"{D}.teacher_models.teacher_model.model_path": big,
            f"{D}.nnodes": 1,  # a Ray pool of its own: not in the trainer's workers
        },
    )
    assert "teacher:teacher_model" not in pooled.roles and "teacher_log_prob" not in pooled.phases
    assert any("teachers run on a pool of their own (distillation.nnodes=1" in note for note in pooled.notes)


def test_the_weight_sync_holds_one_bucket_in_an_engine_of_its_own_process(base):
    """issue 30: vLLM on 2 workers runs its engine in a process of its own and takes the weights in
    buckets of checkpoint_engine.update_weights_bucket_megabytes, at most the whole model; an
    engine in the worker's process counts the 512 MB it was calibrated with."""
    R = f"{A}.rollout"

    def bucket_gb(**changes):
        return _plan(base, **changes).roles["rollout"]["weight_sync_bucket"]

    whole = SHAPE_360M.param_count() * 2 / GiB  # bf16
    assert bucket_gb(**{f"{R}.name": "vllm"}) == pytest.approx(whole)  # 2048 MB > the model
    assert bucket_gb(**{f"{R}.name": "vllm", f"{R}.checkpoint_engine.update_weights_bucket_megabytes": 128}) == (
        pytest.approx(128 / 1024)
    )
    assert bucket_gb() == pytest.approx(0.5)  # the HF engine
