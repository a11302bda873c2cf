"""The ``data`` section of the PPO config, typed (verl's ``data`` keys; defaults of the packaged
``ppo_trainer.yaml``, kept equal by a test)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Dict, Optional

__all__ = ["DataConfig", "ClassRefConfig", "SamplerRefConfig"]


@dataclass
class ClassRefConfig:
    """A class or function by file ``path`` and ``name`` (null: none)."""

    path: Optional[str] = None
    name: Optional[str] = None


@dataclass
class SamplerRefConfig:
    """verl's custom sampler: a class by ``class_path`` and ``class_name``."""

    class_path: Optional[str] = None
    class_name: Optional[str] = None


@dataclass
class DataConfig:
    """``data``: the RL parquet files, prompt lengths and batch sizes.

    ``train_files`` / ``val_files`` are one path or a list of paths (verl's RL parquet format);
    lengths are in tokens; ``train_batch_size`` counts prompts (responses = x ``rollout.n``).
    """

    tokenizer: Optional[str] = None
    use_shm: bool = False
    train_files: Any = "~/data/rlhf/gsm8k/train.parquet"
    val_files: Any = "~/data/rlhf/gsm8k/test.parquet"
    prompt_key: str = "prompt"
    reward_fn_key: str = "data_source"
    max_prompt_length: int = 512
    max_response_length: int = 512
    train_batch_size: int = 1024
    gen_batch_size: Optional[int] = None
    val_batch_size: Optional[int] = None
    return_raw_input_ids: bool = False
    return_raw_chat: bool = False
    return_full_prompt: bool = False
    shuffle: bool = True
    validation_shuffle: bool = False
    seed: int = 1
    dataloader_num_workers: int = 0
    filter_overlong_prompts: bool = False
    filter_overlong_prompts_workers: int = 1
    truncation: str = "error"
    apply_chat_template_kwargs: Dict[str, Any] = field(default_factory=dict)
    image_key: str = "images"
    video_key: str = "videos"
    trust_remote_code: bool = False
    return_multi_modal_inputs: bool = True
    custom_cls: ClassRefConfig = field(default_factory=ClassRefConfig)
    sampler: SamplerRefConfig = field(default_factory=SamplerRefConfig)
    datagen: ClassRefConfig = field(default_factory=ClassRefConfig)
