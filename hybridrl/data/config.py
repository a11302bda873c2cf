"""The ``data`` section of the PPO config, typed (verl's ``data`` keys; defaults of the packaged
``ppo_trainer.yaml``, kept equal by a test)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Dict, Optional

from hybridrl.config.rules import at_least, one_of
from hybridrl.config.typed import ignored, refused
from hybridrl.errors import ConfigError

__all__ = ["DataConfig", "ClassRefConfig", "SamplerRefConfig", "TRUNCATIONS"]

TRUNCATIONS = ("error", "left", "right", "middle")  # of a prompt over data.max_prompt_length


@dataclass
class ClassRefConfig:
    """A class or function by file ``path`` and ``name`` (null: none)."""

    path: Optional[str] = None
    name: Optional[str] = None


@dataclass
class SamplerRefConfig:
    """verl's custom sampler: the class ``class_name`` of ``class_path`` (a .py file or
    ``pkg://<module>``), :mod:`hybridrl.data.sampler`."""

    class_path: Optional[str] = None
    class_name: Optional[str] = None


@dataclass
class DataConfig:
    """``data``: the RL parquet files, prompt lengths and batch sizes.

    ``train_files`` / ``val_files`` are one path or a list of paths (verl's RL parquet format);
    lengths are in tokens; ``train_batch_size`` counts prompts (responses = x ``rollout.n``).
    """

    tokenizer: Optional[str] = None
    use_shm: bool = ignored(False, "models load from their own path")
    train_files: Any = "~/data/rlhf/gsm8k/train.parquet"
    val_files: Any = "~/data/rlhf/gsm8k/test.parquet"
    prompt_key: str = "prompt"
    reward_fn_key: str = "data_source"
    max_prompt_length: int = 512
    max_response_length: int = 512
    train_batch_size: int = 1024
    gen_batch_size: Optional[int] = None
    val_batch_size: Optional[int] = None
    return_raw_input_ids: bool = ignored(
        False, "a reward model with another tokenizer re-templates the chat messages (data.return_raw_chat=True)"
    )
    return_raw_chat: bool = False
    return_full_prompt: bool = False
    shuffle: bool = True
    validation_shuffle: bool = ignored(False, "validation runs over the whole set in file order")
    seed: int = 1
    dataloader_num_workers: int = 0
    filter_overlong_prompts: bool = False
    filter_overlong_prompts_workers: int = ignored(1, "prompts are filtered in this process")
    truncation: str = "error"
    apply_chat_template_kwargs: Dict[str, Any] = field(default_factory=dict)
    image_key: str = refused("images", "image inputs (multimodal data)")
    video_key: str = refused("videos", "video inputs (multimodal data)")
    trust_remote_code: bool = ignored(False, "the tokenizer loads with actor_rollout_ref.model.trust_remote_code")
    return_multi_modal_inputs: bool = ignored(True, "this build has no multimodal inputs")
    # your own torch Dataset class in place of RLHFDataset (hybridrl.data.rl_dataset.create_rl_dataset)
    custom_cls: ClassRefConfig = field(default_factory=ClassRefConfig)
    sampler: SamplerRefConfig = field(default_factory=SamplerRefConfig)
    datagen: ClassRefConfig = refused(factory=ClassRefConfig, subkeys={"path": "dynamic data generation"})

    def __post_init__(self):
        for name in ("train_batch_size", "max_prompt_length", "max_response_length"):
            at_least(f"data.{name}", getattr(self, name), 1)
        if self.gen_batch_size is not None:
            at_least("data.gen_batch_size", self.gen_batch_size, 1)
        one_of("data.truncation", self.truncation, TRUNCATIONS)
        if self.sampler.class_path and not self.sampler.class_name:
            raise ConfigError(
                f"data.sampler.class_name is not set (data.sampler.class_path={self.sampler.class_path!r}); "
                "set it to your Sampler class's name"
            )
        if self.custom_cls.path and not self.custom_cls.name:
            raise ConfigError(
                f"data.custom_cls.name is not set (data.custom_cls.path={self.custom_cls.path!r}); "
                "set it to the name of your Dataset class in that file"
            )
