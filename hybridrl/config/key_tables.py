"""The config keys this build ignores or refuses, and the engines that fall back to HF: plain
tables read by the start-up check (:mod:`hybridrl.trainer.config_check`) and its notes."""

from __future__ import annotations

ACTOR = "actor_rollout_ref.actor"
ROLLOUT = "actor_rollout_ref.rollout"
REF = "actor_rollout_ref.ref"

_HF_ENGINE = "the HF generate engine does not use it"
_FSDP_SINGLE = "FSDP sharding and offload need more than one worker; a single worker keeps the whole model"
_NOT_YET_SPEED = "not in this build yet (same results, only slower)"

# reason -> keys that mean nothing on this build. Noted when the value differs from the packaged
# default (and, for a key that copies another with ${...}, from that key). The one place that
# lists ignored keys; IGNORED_KEYS below is its key -> (reason, when) form.
_IGNORED: dict[str, tuple[str, ...]] = {
    "models load from their own path": (
        "data.use_shm", "actor_rollout_ref.model.use_shm", "critic.model.use_shm", "reward_model.model.use_shm"),
    "a reward model with another tokenizer re-templates the chat messages (data.return_raw_chat=True)": (
        "data.return_raw_input_ids",),
    "validation runs over the whole set in file order": ("data.validation_shuffle",),
    "prompts are filtered in this process": ("data.filter_overlong_prompts_workers",),
    "hybridrl has one trainer; its loop is verl's v1 trainer_mode=sync": ("trainer.use_v1",),
    "batches move between the driver and the workers directly": ("transfer_queue.enable",),
    "this build has no multimodal inputs": ("data.return_multi_modal_inputs",),
    "the tokenizer loads with actor_rollout_ref.model.trust_remote_code": ("data.trust_remote_code",),
    "prompts are padded to data.max_prompt_length": (f"{ROLLOUT}.prompt_length",),
    "the reference model is a copy of the actor in actor.fsdp_config.model_dtype": (
        f"{REF}.fsdp_config.model_dtype",),
    "actor and rollout always share one worker here": ("actor_rollout_ref.hybrid_engine",),
    "this build has no SGLang engine": (f"{ROLLOUT}.engine_kwargs.sglang.attention_backend",),
    "the whole state dict goes to the engine in one call": (f"{ROLLOUT}.update_weights_bucket_megabytes",),
    "the engine is woken up in one stage": (f"{ROLLOUT}.layered_summon", f"{ROLLOUT}.multi_stage_wake_up"),
    "the agent loops run as asyncio tasks in the rollout worker": (f"{ROLLOUT}.agent.num_workers",),
    "the prompt's own chat template is used": (f"{ROLLOUT}.multi_turn.use_inference_chat_template",),
    "agent loops append token ids turn by turn and never re-tokenise": (
        f"{ROLLOUT}.multi_turn.tokenization_sanity_check_mode",),
    "no rollout tracing in this build": (f"{ROLLOUT}.trace.backend", f"{ROLLOUT}.trace.token2text"),
    "no sequence parallelism here; each worker holds whole sequences": (
        f"{ACTOR}.ulysses_sequence_parallel_size", f"{REF}.ulysses_sequence_parallel_size",
        "critic.ulysses_sequence_parallel_size", "reward_model.ulysses_sequence_parallel_size"),
    "fsdp and fsdp2 both mean FSDP2 (fully_shard) here": (f"{ACTOR}.strategy", f"{REF}.strategy", "critic.strategy",
                                                           "reward_model.strategy"),
    "models run in eager mode": (f"{ACTOR}.use_torch_compile", f"{REF}.use_torch_compile"),
    "mini batches are taken in batch order": (f"{ACTOR}.shuffle", "critic.shuffle"),
    "checkpoints always hold model, optimizer and extra state (no HF-format copy)": (
        f"{ACTOR}.checkpoint.save_contents", f"{ACTOR}.checkpoint.load_contents",
        "critic.checkpoint.save_contents", "critic.checkpoint.load_contents"),
    "no Liger kernels in this build": ("actor_rollout_ref.model.use_liger",),
    "no fused kernels in this build": ("actor_rollout_ref.model.use_fused_kernels", "reward_model.model.use_fused_kernels",
                                       "actor_rollout_ref.model.fused_kernel_options.impl_backend"),
    "activations stay in memory": ("actor_rollout_ref.model.enable_activation_offload",
                                   "critic.model.enable_activation_offload"),
    "the critic reads the actor's token ids": ("critic.model.tokenizer_path",),
    "the manager named in reward_model.reward_manager scores (judge: a generative reward model)": (
        "reward_model.use_reward_loop",),
    "buffers stay in fsdp_config.model_dtype": (  # the ref copies the actor's mixed_precision
        f"{ACTOR}.fsdp_config.mixed_precision.buffer_dtype", "critic.model.fsdp_config.mixed_precision.buffer_dtype"),
    "no profiler integration": ("trainer.profile_steps",),
    "no elastic-instance deadline": ("trainer.esi_redundant_time",),
    "checkpoints are written to trainer.default_local_dir only": ("trainer.default_hdfs_dir",),
    "the loaded checkpoint is kept": ("trainer.del_local_ckpt_after_load",),
    "actor and critic share one step folder; trainer.max_actor_ckpt_to_keep governs both": (
        "trainer.max_critic_ckpt_to_keep",),
    "workers are ready when their constructor returns (no register center)": (
        "trainer.ray_wait_register_center_timeout",),
    "no Ray timeline dump": ("ray_init.timeline_json_file",),
    # Speed features that change no result. The actor, reference and critic have them; the
    # reward model's forward does not yet.
    _NOT_YET_SPEED + " for the reward model": ("reward_model.model.use_remove_padding",),
    _NOT_YET_SPEED + " for the reward model; its micro batches count rows": ("reward_model.use_dynamic_bsz",),
    "read only with reward_model.use_dynamic_bsz, which is not in this build yet": (
        "reward_model.forward_max_token_len_per_gpu",),
}
_IGNORED_HF: dict[str, tuple[str, ...]] = {  # as _IGNORED, noted only when the HF engine generates (vLLM reads them)
    "the HF engine has no KV-cache pool to size": (f"{ROLLOUT}.gpu_memory_utilization",),
    "the HF engine is not tensor-parallel; each worker generates with its own full copy": (
        f"{ROLLOUT}.tensor_model_parallel_size",),
    _HF_ENGINE + " (no CUDA graphs)": (f"{ROLLOUT}.enforce_eager",),
    _HF_ENGINE + " (no cache engine to free)": (f"{ROLLOUT}.free_cache_engine",),
    _HF_ENGINE + " (no token scheduler)": (f"{ROLLOUT}.max_num_batched_tokens",),
    _HF_ENGINE + " (no sequence scheduler)": (f"{ROLLOUT}.max_num_seqs",),
    _HF_ENGINE + "; lengths come from data.max_prompt_length and data.max_response_length": (
        f"{ROLLOUT}.max_model_len",),
    _HF_ENGINE: (f"{ROLLOUT}.enable_chunked_prefill", f"{ROLLOUT}.enable_prefix_caching",
                 f"{ROLLOUT}.disable_log_stats", f"{ROLLOUT}.kv_cache_memory_gb", f"{ROLLOUT}.seed",
                 f"{ROLLOUT}.engine_kwargs.vllm"),
    "weights go from the actor to the HF engine directly": (f"{ROLLOUT}.load_format",),
}
_IGNORED_SINGLE: dict[str, tuple[str, ...]] = {  # as _IGNORED, noted only when there is one worker
    "one worker has nothing to balance": ("trainer.balance_batch",),
    "one worker has no gradient all-reduce": (
        f"{ACTOR}.fsdp_config.mixed_precision.reduce_dtype", "critic.model.fsdp_config.mixed_precision.reduce_dtype"),
}
IGNORED_KEYS: dict[str, tuple[str, str]] = {
    key: (reason, when) for table, when in ((_IGNORED, "always"), (_IGNORED_SINGLE, "single"), (_IGNORED_HF, "hf"))
    for reason, keys in table.items() for key in keys}

# Keys that change what is trained and that this build does not have yet: an error, not a note.
NOT_YET_SUPPORTED: dict[str, str] = {
    f"{ROLLOUT}.multi_turn.completion_callback": "custom multi-turn completion callbacks",
    f"{ROLLOUT}.use_fire_sampling": "FIRE sampling (arXiv:2410.21236)",
    f"{ROLLOUT}.agent.custom_async_server.path": "a custom async rollout server",
    "reward.reward_manager.module.path": ("a reward manager class loaded from a file (register yours with "
                                          "@register_reward_manager in a module named by "
                                          "actor_rollout_ref.model.external_lib)"),
    "distillation.enabled": "on-policy distillation from a teacher model",
    "data.custom_cls.path": "custom dataset classes",
    "data.sampler.class_path": "custom samplers",
    "data.datagen.path": "dynamic data generation",
    "data.image_key": "image inputs (multimodal data)",
    "data.video_key": "video inputs (multimodal data)",
    "algorithm.use_pf_ppo": "preference-feedback PPO reweighting",
}
_FSDP_ALL = ("param_offload", "optimizer_offload", "offload_policy", "reshard_after_forward",
             "fsdp_size", "forward_prefetch", "wrap_policy.min_num_params")
_FSDP_LEAVES = {  # the fsdp_config keys each role has (as in verl: no optimizer for ref / RM)
    f"{ACTOR}.fsdp_config": _FSDP_ALL,
    "critic.model.fsdp_config": _FSDP_ALL,
    f"{REF}.fsdp_config": ("param_offload", "reshard_after_forward", "forward_prefetch",
                           "wrap_policy.min_num_params"),
    "reward_model.model.fsdp_config": ("param_offload", "reshard_after_forward", "fsdp_size",
                                       "forward_prefetch", "wrap_policy.min_num_params"),
}
_FSDP_FIXED = {  # fsdp_config keys whose behaviour is fixed in this build, with any number of workers
    "forward_prefetch": "FSDP2 prefetches with its default schedule",
    "offload_policy": "param_offload selects FSDP2's CPU offload",
    "wrap_policy.min_num_params": "every decoder block (the model's _no_split_modules) is one FSDP unit",
}
for _prefix, _leaves in _FSDP_LEAVES.items():
    for _leaf in _leaves:
        IGNORED_KEYS[f"{_prefix}.{_leaf}"] = (_FSDP_FIXED[_leaf], "always") if _leaf in _FSDP_FIXED \
            else (_FSDP_SINGLE, "single")
