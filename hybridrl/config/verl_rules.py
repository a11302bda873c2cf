"""The rules that answer verl's PPO config keys hybridrl's own config lacks (:data:`RULES`), as
data: each says why a key means nothing here (``ignored``: accepted with one note) or which
feature it asks for and what to use instead (``refused``: a value other than verl's default stops
the run). :mod:`hybridrl.config.verl_compat` applies them."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

__all__ = ["Answer", "RULES"]


@dataclass(frozen=True)
class Answer:
    """``kind``: ``ignored`` (``text`` says why it means nothing here) or ``refused`` (``text`` names
    the feature and what to use instead)."""

    kind: Literal["ignored", "refused"]
    text: str


def _ign(text: str) -> Answer:
    return Answer("ignored", text)


def _ref(text: str) -> Answer:
    return Answer("refused", text)


_ROLES = ("actor_rollout_ref.actor", "actor_rollout_ref.ref", "critic", "reward_model")
_MULTIMODAL = _ref("multimodal inputs (images, video, audio) are not in hybridrl; train on text prompts")
_TORCH_TRACES = "global_profiler.tool=torch with global_profiler.steps writes torch.profiler traces"
_PROFILER_TOOLS = ("npu", "precision_debugger")
_ENGINE_COPY = (
    "verl's engine workers' copy of the role's keys; hybridrl reads the role's own key "
    "(actor.<key>, model.<key>) - set that one"
)

# (patterns, answer): the first rule whose fnmatch pattern matches a key answers it.
RULES: list[tuple[tuple[str, ...], Answer]] = [
    # other training engines
    (
        ("*.megatron.*", "*.megatron"),
        _ref("strategy megatron is not in hybridrl; it trains with FSDP2 - drop the megatron.* keys"),
    ),
    (("*.veomni.*",), _ref("the VeOmni engine is not in hybridrl; it trains with FSDP2 - drop the veomni.* keys")),
    (
        ("*.torchtitan.*",),
        _ref("the TorchTitan engine is not in hybridrl; it trains with FSDP2 - drop the torchtitan.* keys"),
    ),
    (
        ("*.turbo_config.*",),
        _ref("verl's turbo FSDP plan (expert parallelism) is not in hybridrl; drop the turbo_config.* keys"),
    ),
    (("*.qat.*", "*.qat"), _ref("quantization-aware training (QAT) is not in hybridrl; drop the qat.* keys")),
    (("*.mtp.*", "*.mtp"), _ref("multi-token prediction (MTP) is not in hybridrl; drop the mtp.* keys")),
    (
        ("*.router_replay.*", "*.rollout.enable_rollout_routing_replay", "*.rollout.router_config_path"),
        _ref("MoE routing replay is not in hybridrl; drop the router_replay keys"),
    ),
    (
        ("*.model.lora.*",),
        _ref(
            "model.lora.* is verl's Megatron LoRA section, not in hybridrl; LoRA here is "
            "model.lora_rank / lora_alpha / target_modules / exclude_modules"
        ),
    ),
    (
        ("critic.model.lora_adapter_path", "reward_model.model.lora_adapter_path"),
        _ref(
            "starting the critic from a saved LoRA adapter is not in hybridrl (the policy's "
            "actor_rollout_ref.model.lora_adapter_path is); resume from a checkpoint (trainer.resume_mode)"
        ),
    ),
    (
        ("*.model.hf_config_path",),
        _ref("a model config from another folder is not in hybridrl; put config.json into model.path"),
    ),
    (
        ("actor_rollout_ref.model.tokenizer_path",),
        _ref("actor_rollout_ref.model.tokenizer_path is not in hybridrl; set data.tokenizer"),
    ),
    (("*.model.tiled_mlp.*",), _ign("tiled MLP only saves activation memory; the MLP runs whole (same results)")),
    (
        ("critic.model.custom_chat_template",),
        _ign("the critic reads the prompts templated by the actor's tokenizer"),
    ),
    (
        ("critic.model.use_fused_kernels", "critic.model.use_liger", "critic.model.fused_kernel_options.*"),
        _ign("fused and Liger kernels are not used; the model's own forward runs (same results)"),
    ),
    # multimodal
    (
        (
            "data.audio_key",
            "data.image_patch_size",
            "data.mm_processor_kwargs",
            "*.freeze_vision_tower",
            "*.rollout.limit_images",
        ),
        _MULTIMODAL,
    ),
    # the rollout engine
    (
        ("*.rollout.expert_parallel_size",),
        _ref("expert parallelism in the rollout engine (MoE) is not in hybridrl; leave rollout.expert_parallel_size 1"),
    ),
    (
        ("*.rollout.data_parallel_size",),
        _ref(
            "data parallelism inside one rollout engine is not in hybridrl; each worker runs its own engine - "
            "add workers (trainer.n_gpus_per_node, trainer.nnodes)"
        ),
    ),
    (
        ("*.rollout.pipeline_model_parallel_size",),
        _ref("pipeline parallelism in the rollout engine is not in hybridrl; leave it 1"),
    ),
    (
        ("*.rollout.quantization", "*.rollout.quantization_config_file"),
        _ref("quantized rollout (fp8) is not in hybridrl; the engine generates in rollout.dtype"),
    ),
    (
        ("*.rollout.disaggregation.*",),
        _ref("prefill/decode disaggregation is not in hybridrl; drop the rollout.disaggregation.* keys"),
    ),
    (
        ("*.rollout.logprobs_mode",),
        _ref(
            "rollout log-probs other than verl's processed_logprobs (of the sampling distribution) are not in hybridrl"
        ),
    ),
    (
        ("*.rollout.over_sample_rate",),
        _ref(
            "over-sampling (aborting the slowest rollouts) is not in hybridrl; "
            "trainer.v1.trainer_mode runs asynchronous training (docs/async.md)"
        ),
    ),
    (
        ("*.rollout.skip_rollout", "*.rollout.skip_dump_dir", "skip.*"),
        _ref("reusing dumped rollouts (skip) is not in hybridrl; trainer.rollout_data_dir dumps each step's samples"),
    ),
    (
        (
            "*.rollout.cudagraph_capture_sizes",
            "*.rollout.full_determinism",
            "*.rollout.scheduling_policy",
            "*.rollout.skip_tokenizer_init",
            "*.rollout.moe_load_balance_metrics_interval",
            "*.rollout.layer_name_map.*",
        ),
        _ign("a vLLM/SGLang engine setting hybridrl's engines do not take (see rollout.engine_kwargs.vllm)"),
    ),
    (
        ("*.rollout.sglang_rollout_mode", "*.rollout.server", "*.rollout.server.*"),
        _ign(
            "verl's SGLang server settings (and its retired server | spmd switch); there is no SGLang server here: "
            "the engine is rollout.name, its mode rollout.mode"
        ),
    ),
    (
        ("*.rollout.prometheus.*",),
        _ign("no Prometheus server is started; the rollout metrics go to trainer.logger"),
    ),
    (
        (
            "*.rollout.trace.project_name",
            "*.rollout.trace.experiment_name",
            "*.rollout.trace.max_samples_per_step_per_worker",
        ),
        _ign("rollout tracing (weave, mlflow traces) is not written here"),
    ),
    (
        ("*.rollout.engine_kwargs.trtllm", "*.rollout.engine_kwargs.trtllm.*"),
        _ign("there is no TensorRT-LLM engine here; the rollout engine is rollout.name (hf | vllm)"),
    ),
    (
        ("*.rollout.multi_turn.function_tool_path", "data.function_tool_path"),
        _ref(
            "tools from verl's function files are not in hybridrl; describe them in "
            "rollout.multi_turn.tool_config_path (docs/agents.md)"
        ),
    ),
    (("data.tool_config_path",), _ign("a copy of rollout.multi_turn.tool_config_path, which hybridrl reads")),
    (
        ("*.rollout.multi_turn.num_repeat_rollouts",),
        _ign("responses per prompt are rollout.n; SGLang's repeat count is not used"),
    ),
    # per-role worker plumbing verl fills in itself
    (
        ("*.load_weight", "actor_rollout_ref.*.rollout_n", "*.calculate_entropy", "*.data_loader_seed"),
        _ign("set by verl's trainer for its workers; hybridrl's workers take these from the run"),
    ),
    (
        ("*.pad_to_length", "*.pad_to_length_bucket", "*.forward_only", "*.fsdp_config.seed", "*.fsdp_config.dtype"),
        _ign(_ENGINE_COPY),
    ),
    (
        ("*.entropy_from_logits_chunk_size",),
        _ign("the entropy chunking (entropy_from_logits_with_chunking) projects a fixed ~680 tokens at a time"),
    ),
    (("*.sum_pi_squared_checkpointing",), _ign("sum_pi_squared is computed without a checkpointed softmax")),
    (("*.use_prefix_grouper",), _ign("shared prompt prefixes are not grouped in the forward (same results)")),
    (("actor_rollout_ref.actor.use_fused_kernels",), _ign("fused kernels are not used (same results)")),
    (
        ("actor_rollout_ref.actor.use_remove_padding",),
        _ign("hybridrl reads actor_rollout_ref.model.use_remove_padding"),
    ),
    (("*.fsdp_config.full_determinism",), _ign("the forward is deterministic for a seed as it is")),
    (
        ("*.fsdp_config.use_no_sync_for_gradient_accumulation",),
        _ign("FSDP2 reduces the gradient of each micro batch; there is no FSDP1 no_sync context"),
    ),
    (
        ("*.fsdp_config.use_torch_compile",),
        _ign("models run in eager mode (actor.use_torch_compile compiles the log-prob/entropy on CUDA)"),
    ),
    (("*.fsdp_config.strategy",), _ign(_ENGINE_COPY)),
    (("*.fsdp_config.entropy_from_logits_with_chunking",), _ign(_ENGINE_COPY)),
    (("actor_rollout_ref.ref.fsdp_config.optimizer_offload",), _ign("the reference model has no optimizer")),
    (
        ("critic.fsdp.*",),
        _ign("verl's engine-worker copy of critic.model.fsdp_config; hybridrl reads critic.model.fsdp_config"),
    ),
    (
        ("*.checkpoint.async_save", "*.checkpoint.mbridge_config", "*.checkpoint.strict"),
        _ign("checkpoints are written by DCP at the save step and checked at load"),
    ),
    (("actor_rollout_ref.ref.optim.*",), _ign("the reference model is not trained")),
    # the optimizer: Megatron's scheduler and other optimizers
    (
        (
            "*.optim.decay_type",
            "*.optim.lr_decay_ratio",
            "*.optim.lr_decay_style",
            "*.optim.lr_min",
            "*.optim.lr_start",
            "*.optim.lr_warmup_init",
            "*.optim.lr_wsd_decay_steps",
            "*.optim.lr_wsd_decay_style",
            "*.optim.min_lr_factor",
            "*.optim.weight_decay_incr_style",
            "*.optim.use_checkpoint_opt_param_scheduler",
            "*.optim.main_grads_dtype",
            "*.optim.exp_avg_dtype",
            "*.optim.exp_avg_sq_dtype",
            "*.optim.use_precision_aware_optimizer",
            "*.optim.use_layer_wise_distributed_optimizer",
            "*.optim.muon_*",
            "*.optim.name",
        ),
        _ref(
            "a Megatron / VeOmni / TorchTitan optimizer key is not in hybridrl; the FSDP optimizer is AdamW with "
            "optim.lr_scheduler_type, lr_warmup_steps, min_lr_ratio, num_cycles"
        ),
    ),
    (
        ("*.optim.optimizer", "*.optim.optimizer_impl", "*.optim.override_optimizer_config"),
        _ref("optimizers other than torch.optim.AdamW are not in hybridrl; drop optim.optimizer*"),
    ),
    (("*.optim.eps",), _ref("AdamW's eps other than 1e-8 is not in hybridrl")),
    # profilers: the torch tool's keys are hybridrl's (workers/config/profiler.py); the other tools' are not
    *(
        (
            (f"*.profiler.tool_config.{tool}.*", f"global_profiler.global_tool_config.{tool}.*"),
            _ref(f"verl's {tool} profiler is not in hybridrl; {_TORCH_TRACES}"),
        )
        for tool in _PROFILER_TOOLS
    ),
    (
        ("*.profiler.tool_config.nsys.*", "global_profiler.global_tool_config.nsys.*"),
        _ign(
            "nsys records each chosen step as one capture range (torch.cuda.profiler.start / stop around the "
            "step); run the trainer under `nsys profile --capture-range=cudaProfilerApi`"
        ),
    ),
    (
        ("*.profiler.tool_config.torch_memory.*", "global_profiler.global_tool_config.torch_memory.*"),
        _ref(
            "torch_memory settings other than verl's defaults (100000 allocator events, stacks 32 deep) are not "
            "in hybridrl; drop them"
        ),
    ),
    (
        ("*.profiler.*", "global_profiler.*"),
        _ref(
            "verl's profiler finish hooks, result relocation and torch schedule are not in hybridrl; "
            "each chosen step's trace is <save_path>/step_<n>/<roles>_rank<r>.json"
        ),
    ),
    # the reward settings of other verl versions
    (
        ("reward_model.reward_loop_*",),
        _ref("a reward loop class of your own is not in hybridrl; register a reward manager (docs/rewards.md)"),
    ),
    (
        ("reward_manager.*", "sandbox_fusion.*"),
        _ref("this spelling of the reward settings is not read; use reward.reward_manager.* / reward.sandbox_fusion.*"),
    ),
    (
        ("reward.reward_model.rollout.*",),
        _ref("reward.reward_model.rollout takes only the keys hybridrl copies; set reward_model.rollout.<key>"),
    ),
    (
        (
            "reward.reward_model.*",
            "reward_model.enable_resource_pool",
            "reward_model.nnodes",
            "reward_model.n_gpus_per_node",
        ),
        _ign("the reward model runs in the trainer's workers; it has no resource pool of its own"),
    ),
    (("reward_model.model.override_config",), _ref("overriding the reward model's HF config is not in hybridrl")),
    # trainer, data, algorithm
    (("trainer.use_legacy_worker_impl",), _ign("hybridrl has one worker implementation")),
    (
        ("trainer.tensorboard_dir",),
        _ign(
            "verl does not read it either; the tensorboard logger writes to $TENSORBOARD_DIR, "
            "else <trainer.default_local_dir>/tensorboard"
        ),
    ),
    (
        ("trainer.rl_logging_board_dir",),
        _ign("a recipe's own key, which verl's trainer does not read; trainer.rollout_data_dir dumps the samples"),
    ),
    (("trainer.checkpoint_callback_class",), _ref("a checkpoint callback class is not in hybridrl")),
    (
        ("trainer.v1.sync", "trainer.v1.sync.*", "trainer.v1.sampler.sampler_kwargs"),
        _ign("trainer.v1.trainer_mode=sync needs no settings; the sampler takes max_off_policy_* only"),
    ),
    (
        ("trainer.v1.sampler.custom_sampler.*", "trainer.v1.sampler.sync_refill_failed_groups"),
        _ref("a custom v1 sampler is not in hybridrl; trainer.v1.sampler.max_off_policy_* bound the staleness"),
    ),
    (
        ("trainer.v1.separate_async.hybrid_rollout.*",),
        _ref("switching trainer GPUs into rollout (hybrid_rollout) is not in hybridrl"),
    ),
    (("transfer_queue.*",), _ign("batches move between driver and workers directly")),
    (
        ("algorithm.filter_groups.max_inflight_gen_batches",),
        _ign("dynamic sampling generates one batch at a time"),
    ),
    (
        ("critic.enable",),
        _ref("critic.enable is not read; the critic is built when algorithm.adv_estimator needs values (gae)"),
    ),
    (
        ("data.train_max_samples", "data.val_max_samples"),
        _ref("taking the first N rows of a file is not in hybridrl; write the parquet with N rows"),
    ),
]
