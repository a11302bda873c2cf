"""load_config: verl command lines, Hydra override grammar, did-you-mean for typos."""

import subprocess
import sys

import pytest
from omegaconf import OmegaConf

from hybridrl.config import ConfigError, load_config
from hybridrl.trainer.ppo.config import typed_ppo_config
from hybridrl.trainer.ppo.config_check import validate_ppo_config

# verl examples/grpo_trainer/run_qwen2-7b.sh, as the shell hands it to Python (quotes removed).
VERL_GRPO_QWEN2_7B = [
    "algorithm.adv_estimator=grpo",
    "data.train_files=/root/data/gsm8k/train.parquet",
    "data.val_files=/root/data/gsm8k/test.parquet",
    "data.train_batch_size=1024",
    "data.max_prompt_length=512",
    "data.max_response_length=1024",
    "data.filter_overlong_prompts=True",
    "data.truncation=error",
    "actor_rollout_ref.model.path=Qwen/Qwen2-7B-Instruct",
    "actor_rollout_ref.actor.optim.lr=1e-6",
    "actor_rollout_ref.model.use_remove_padding=True",
    "actor_rollout_ref.actor.ppo_mini_batch_size=256",
    "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=16",
    "actor_rollout_ref.actor.use_kl_loss=True",
    "actor_rollout_ref.actor.kl_loss_coef=0.001",
    "actor_rollout_ref.actor.kl_loss_type=low_var_kl",
    "actor_rollout_ref.actor.entropy_coeff=0",
    "actor_rollout_ref.model.enable_gradient_checkpointing=True",
    "actor_rollout_ref.actor.fsdp_config.param_offload=False",
    "actor_rollout_ref.actor.fsdp_config.optimizer_offload=False",
    "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=16",
    "actor_rollout_ref.rollout.tensor_model_parallel_size=2",
    "actor_rollout_ref.rollout.name=vllm",
    "actor_rollout_ref.rollout.gpu_memory_utilization=0.6",
    "actor_rollout_ref.rollout.n=5",
    "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=16",
    "actor_rollout_ref.ref.fsdp_config.param_offload=True",
    "algorithm.use_kl_in_reward=False",
    "trainer.critic_warmup=0",
    "trainer.logger=[console,wandb]",
    "trainer.project_name=verl_grpo_example_gsm8k",
    "trainer.experiment_name=qwen2_7b_function_rm",
    "trainer.n_gpus_per_node=8",
    "trainer.nnodes=1",
    "trainer.save_freq=20",
    "trainer.test_freq=5",
    "trainer.total_epochs=15",
]

# Keys of verl's ppo_trainer.yaml that a verl command line may set (a sample of every section).
VERL_KEYS = """
data.tokenizer data.train_files data.val_files data.prompt_key data.reward_fn_key
data.max_prompt_length data.max_response_length data.train_batch_size data.val_batch_size
data.return_raw_input_ids data.return_raw_chat data.return_full_prompt data.shuffle data.seed
data.filter_overlong_prompts data.filter_overlong_prompts_workers data.truncation
data.dataloader_num_workers data.custom_cls.path data.custom_cls.name
actor_rollout_ref.hybrid_engine actor_rollout_ref.model.path
actor_rollout_ref.model.custom_chat_template actor_rollout_ref.model.external_lib
actor_rollout_ref.model.override_config actor_rollout_ref.model.enable_gradient_checkpointing
actor_rollout_ref.model.use_remove_padding actor_rollout_ref.model.trust_remote_code
actor_rollout_ref.model.lora_rank actor_rollout_ref.model.lora_alpha
actor_rollout_ref.model.target_modules
actor_rollout_ref.actor.strategy actor_rollout_ref.actor.ppo_mini_batch_size
actor_rollout_ref.actor.ppo_micro_batch_size actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu
actor_rollout_ref.actor.use_dynamic_bsz actor_rollout_ref.actor.ppo_max_token_len_per_gpu
actor_rollout_ref.actor.grad_clip actor_rollout_ref.actor.clip_ratio
actor_rollout_ref.actor.clip_ratio_low actor_rollout_ref.actor.clip_ratio_high
actor_rollout_ref.actor.clip_ratio_c actor_rollout_ref.actor.loss_agg_mode
actor_rollout_ref.actor.entropy_coeff actor_rollout_ref.actor.use_kl_loss
actor_rollout_ref.actor.use_torch_compile actor_rollout_ref.actor.kl_loss_coef
actor_rollout_ref.actor.kl_loss_type actor_rollout_ref.actor.ppo_epochs
actor_rollout_ref.actor.shuffle actor_rollout_ref.actor.ulysses_sequence_parallel_size
actor_rollout_ref.actor.policy_loss.loss_mode actor_rollout_ref.actor.checkpoint.save_contents
actor_rollout_ref.actor.checkpoint.load_contents actor_rollout_ref.actor.optim.lr
actor_rollout_ref.actor.optim.lr_warmup_steps actor_rollout_ref.actor.optim.lr_warmup_steps_ratio
actor_rollout_ref.actor.optim.min_lr_ratio actor_rollout_ref.actor.optim.num_cycles
actor_rollout_ref.actor.optim.warmup_style actor_rollout_ref.actor.optim.total_training_steps
actor_rollout_ref.actor.optim.weight_decay actor_rollout_ref.actor.optim.betas
actor_rollout_ref.actor.fsdp_config.param_offload actor_rollout_ref.actor.fsdp_config.optimizer_offload
actor_rollout_ref.actor.fsdp_config.model_dtype actor_rollout_ref.actor.fsdp_config.mixed_precision
actor_rollout_ref.ref.log_prob_micro_batch_size actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu
actor_rollout_ref.ref.log_prob_use_dynamic_bsz actor_rollout_ref.ref.log_prob_max_token_len_per_gpu
actor_rollout_ref.ref.fsdp_config.param_offload
actor_rollout_ref.rollout.name actor_rollout_ref.rollout.mode actor_rollout_ref.rollout.temperature
actor_rollout_ref.rollout.top_k actor_rollout_ref.rollout.top_p actor_rollout_ref.rollout.prompt_length
actor_rollout_ref.rollout.response_length actor_rollout_ref.rollout.dtype
actor_rollout_ref.rollout.gpu_memory_utilization actor_rollout_ref.rollout.ignore_eos
actor_rollout_ref.rollout.enforce_eager actor_rollout_ref.rollout.free_cache_engine
actor_rollout_ref.rollout.load_format actor_rollout_ref.rollout.tensor_model_parallel_size
actor_rollout_ref.rollout.max_num_batched_tokens actor_rollout_ref.rollout.max_model_len
actor_rollout_ref.rollout.max_num_seqs actor_rollout_ref.rollout.log_prob_micro_batch_size
actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu
actor_rollout_ref.rollout.log_prob_use_dynamic_bsz actor_rollout_ref.rollout.log_prob_max_token_len_per_gpu
actor_rollout_ref.rollout.do_sample actor_rollout_ref.rollout.n actor_rollout_ref.rollout.engine_kwargs
actor_rollout_ref.rollout.val_kwargs.top_k actor_rollout_ref.rollout.val_kwargs.top_p
actor_rollout_ref.rollout.val_kwargs.temperature actor_rollout_ref.rollout.val_kwargs.n
actor_rollout_ref.rollout.val_kwargs.do_sample actor_rollout_ref.rollout.multi_turn.enable
actor_rollout_ref.rollout.multi_turn.max_assistant_turns actor_rollout_ref.rollout.multi_turn.max_user_turns
actor_rollout_ref.rollout.multi_turn.tool_config_path actor_rollout_ref.rollout.calculate_log_probs
critic.strategy critic.optim.lr critic.model.path critic.model.tokenizer_path critic.model.override_config
critic.model.external_lib critic.model.enable_gradient_checkpointing critic.model.use_remove_padding
critic.model.trust_remote_code critic.model.fsdp_config.param_offload critic.ppo_mini_batch_size
critic.ppo_micro_batch_size critic.ppo_micro_batch_size_per_gpu critic.forward_micro_batch_size
critic.forward_micro_batch_size_per_gpu critic.use_dynamic_bsz critic.ppo_max_token_len_per_gpu
critic.forward_max_token_len_per_gpu critic.ppo_epochs critic.shuffle critic.grad_clip
critic.cliprange_value critic.loss_agg_mode critic.checkpoint.save_contents critic.rollout_n
reward_model.enable reward_model.strategy reward_model.model.input_tokenizer reward_model.model.path
reward_model.model.external_lib reward_model.model.trust_remote_code reward_model.model.fsdp_config
reward_model.micro_batch_size reward_model.micro_batch_size_per_gpu reward_model.max_length
reward_model.use_dynamic_bsz reward_model.forward_max_token_len_per_gpu reward_model.reward_manager
reward_model.launch_reward_fn_async reward_model.reward_kwargs reward_model.sandbox_fusion.url
custom_reward_function.path custom_reward_function.name
algorithm.gamma algorithm.lam algorithm.adv_estimator algorithm.norm_adv_by_std_in_grpo
algorithm.use_kl_in_reward algorithm.kl_penalty algorithm.kl_ctrl.type algorithm.kl_ctrl.kl_coef
algorithm.kl_ctrl.horizon algorithm.kl_ctrl.target_kl algorithm.use_pf_ppo
trainer.balance_batch trainer.total_epochs trainer.total_training_steps trainer.project_name
trainer.experiment_name trainer.logger trainer.log_val_generations trainer.rollout_data_dir
trainer.validation_data_dir trainer.nnodes trainer.n_gpus_per_node trainer.save_freq
trainer.resume_mode trainer.resume_from_path trainer.val_before_train trainer.test_freq
trainer.critic_warmup trainer.default_hdfs_dir trainer.del_local_ckpt_after_load
trainer.default_local_dir trainer.max_actor_ckpt_to_keep trainer.max_critic_ckpt_to_keep
trainer.ray_wait_register_center_timeout trainer.device
ray_init.num_cpus ray_init.timeline_json_file ray_kwargs.ray_init
""".split()


@pytest.fixture(scope="module")
def default_cfg():
    return load_config()


def test_every_verl_key_is_present(default_cfg):
    missing = [k for k in VERL_KEYS if OmegaConf.select(default_cfg, k, default="<absent>") == "<absent>"]
    assert missing == []


def test_hybridrl_defaults_and_resolved_interpolations(default_cfg):
    cfg = default_cfg
    assert cfg.trainer.device == "auto" and cfg.trainer.backend == "auto"
    assert cfg.actor_rollout_ref.rollout.name == "hf"
    assert cfg.data.dataloader_num_workers == 0
    assert list(cfg.trainer.logger) == ["console", "file"]
    assert cfg.reward_model.on_error == "raise"
    # interpolations are resolved: plain values, no "${...}" left
    assert cfg.actor_rollout_ref.rollout.prompt_length == cfg.data.max_prompt_length
    assert cfg.trainer.default_local_dir == "checkpoints/hybridrl/gsm8k"
    assert "${" not in OmegaConf.to_yaml(cfg)


def test_verl_grpo_command_line_loads_and_validates():
    cfg = load_config(VERL_GRPO_QWEN2_7B)
    assert cfg.algorithm.adv_estimator == "grpo"
    assert list(cfg.trainer.logger) == ["console", "wandb"]
    assert cfg.data.filter_overlong_prompts is True
    # overrides reach the keys that interpolate them
    assert cfg.critic.rollout_n == 5
    assert cfg.actor_rollout_ref.rollout.response_length == 1024
    assert cfg.critic.model.tokenizer_path == "Qwen/Qwen2-7B-Instruct"
    assert cfg.trainer.default_local_dir == "checkpoints/verl_grpo_example_gsm8k/qwen2_7b_function_rm"

    # vLLM with tensor parallelism inside the engine: 4 engines of 2 workers each, nothing to note
    notes = validate_ppo_config(cfg, world_size=8)
    assert not any("tensor_model_parallel_size" in n for n in notes)
    # rollout.mode left unset, as verl's command does: verl's async on its 8 workers
    assert cfg.actor_rollout_ref.rollout.mode is None
    assert typed_ppo_config(cfg).actor_rollout_ref.rollout.mode == "async"
    cfg.actor_rollout_ref.rollout.mode = "sync"  # the same engines, batch by batch
    validate_ppo_config(cfg, world_size=8)
    cfg.actor_rollout_ref.rollout.tensor_model_parallel_size = 1
    notes = validate_ppo_config(cfg, world_size=1)
    text = "\n".join(notes)
    assert "gpu_memory_utilization" not in text  # vLLM reads it
    cfg.actor_rollout_ref.rollout.name = "hf"
    cfg.actor_rollout_ref.rollout.tensor_model_parallel_size = 2
    hf_text = "\n".join(validate_ppo_config(cfg, world_size=8))
    assert "actor_rollout_ref.rollout.tensor_model_parallel_size=2 is ignored" in hf_text
    assert "actor_rollout_ref.rollout.gpu_memory_utilization=0.6 is ignored" in hf_text
    # 8 workers: the sharding keys mean something; offload means nothing on the CPU, however many workers
    assert "actor_rollout_ref.ref.fsdp_config.param_offload=True is ignored: offload" in hf_text
    assert "fsdp_config" not in hf_text.replace("actor_rollout_ref.ref.fsdp_config.param_offload", "")
    single = "\n".join(validate_ppo_config(cfg, world_size=1))
    assert "actor_rollout_ref.ref.fsdp_config.param_offload=True is ignored" in single


def test_quoted_list_override_like_an_unquoted_shell():
    cfg = load_config(["trainer.logger=['console','wandb']", "data.truncation='left'"])
    assert list(cfg.trainer.logger) == ["console", "wandb"]
    assert cfg.data.truncation == "left"


def test_interpolated_keys_follow_overrides():
    cfg = load_config(
        [
            "data.max_prompt_length=256",
            "actor_rollout_ref.actor.checkpoint.save_contents=[model]",
            "actor_rollout_ref.actor.ppo_mini_batch_size=32",
        ]
    )
    assert cfg.actor_rollout_ref.rollout.prompt_length == 256
    assert list(cfg.actor_rollout_ref.actor.checkpoint.load_contents) == ["model"]
    assert cfg.critic.ppo_mini_batch_size == 32


def test_add_force_add_and_delete():
    cfg = load_config(
        [
            "+trainer.my_tag=abc",
            "++trainer.device=cpu",
            "~trainer.val_only",
            "+actor_rollout_ref.model.override_config.attention_dropout=0.1",
        ]
    )
    assert cfg.trainer.my_tag == "abc"
    assert cfg.trainer.device == "cpu"
    assert "val_only" not in cfg.trainer
    assert cfg.actor_rollout_ref.model.override_config.attention_dropout == 0.1


@pytest.mark.parametrize(
    "override, expected",
    [
        (
            "actor_rollout_ref.actor.ppo_mini_bach_size=3",
            "unknown key 'actor_rollout_ref.actor.ppo_mini_bach_size'; "
            "did you mean 'actor_rollout_ref.actor.ppo_mini_batch_size'?",
        ),
        ("actor_rollout_ref.actr.ppo_epochs=2", "did you mean 'actor_rollout_ref.actor.ppo_epochs'?"),
        ("~trainer.n_gpu_per_node", "did you mean 'trainer.n_gpus_per_node'?"),
    ],
)
def test_typo_gets_did_you_mean(override, expected):
    with pytest.raises(ConfigError) as err:
        load_config([override])
    assert expected in str(err.value)
    assert "\n" not in str(err.value)


def test_unknown_key_without_close_match_suggests_plus():
    with pytest.raises(ConfigError, match=r"unknown key 'trainer\.zzz'.*'\+trainer\.zzz=\.\.\.'"):
        load_config(["trainer.zzz=1"])


def test_adding_an_existing_key_sets_it():
    # verl's '+key' adds a key verl's config lacks; where hybridrl's config has it, it sets it
    cfg = load_config(["+trainer.device=cpu", "+actor_rollout_ref.rollout.n=3"])
    assert cfg.trainer.device == "cpu" and cfg.actor_rollout_ref.rollout.n == 3


def test_bad_override_syntax():
    with pytest.raises(ConfigError, match=r"cannot parse the override 'trainer\.logger=\[console'"):
        load_config(["trainer.logger=[console"])


def test_hydra_state_is_cleared_and_reload_works():
    from hydra.core.global_hydra import GlobalHydra

    load_config(["data.seed=3"])
    assert not GlobalHydra.instance().is_initialized()
    assert load_config().data.seed == 1  # no state carried from the previous call


def test_user_config_dir_extends_the_packaged_config(tmp_path):
    (tmp_path / "my_grpo.yaml").write_text(
        "hydra:\n  searchpath:\n    - file://verl/trainer/config\n"
        "defaults:\n  - ppo_trainer\n  - _self_\n"
        "data:\n  max_prompt_length: 64\nactor_rollout_ref:\n  rollout:\n    n: 4\n"
    )
    cfg = load_config(["data.train_batch_size=8"], config_name="my_grpo", config_dir=str(tmp_path))
    assert cfg.data.max_prompt_length == 64 and cfg.actor_rollout_ref.rollout.prompt_length == 64
    assert cfg.critic.rollout_n == 4 and cfg.data.train_batch_size == 8
    with pytest.raises(ConfigError, match="'nope.yaml' is not in"):
        load_config([], config_name="nope", config_dir=str(tmp_path))


def test_import_is_light():
    code = (
        "import sys, hybridrl.config; "
        "heavy = [m for m in sys.modules if m.split('.')[0] in ('hydra', 'omegaconf', 'torch', "
        "'transformers', 'ray')]; print(heavy); assert not heavy"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.returncode == 0, out.stdout + out.stderr
