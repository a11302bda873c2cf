"""RLHFDataset: verl's RL parquet (one prompt per row) -> left-padded prompt tensors.

The whole file is tokenised once at construction: one batched ``apply_chat_template`` call
and one batched tokenizer call (about a second for 10k GSM8K rows), so ``__getitem__`` only
slices precomputed tensors.
"""

import inspect
import os
from typing import Any

import numpy as np
import torch

from hybridrl.config.typed import to_dataclass
from hybridrl.config.user_file import import_user_file, user_file_path
from hybridrl.data.config import TRUNCATIONS, DataConfig
from hybridrl.data.errors import DataError
from hybridrl.errors import ConfigError

_PREPROCESS_HINT = "create it with `python examples/data_preprocess/gsm8k.py --local_dir DIR` (or fix the path)"


def _as_list(data_files) -> list[str]:
    if isinstance(data_files, (str, os.PathLike)):
        return [os.fspath(data_files)]
    return [os.fspath(f) for f in data_files]  # list, tuple, omegaconf ListConfig


def read_parquet_rows(data_files, prompt_key: str = "prompt", config_key: str = "data.train_files") -> list[dict]:
    """Read one or more verl RL parquet files into a list of plain-Python row dicts.

    Args:
        data_files: a path or a list of paths (``~`` is expanded).
        prompt_key: the column that must hold the chat list (``data.prompt_key``).
        config_key: the config key the paths came from, named in errors.

    Returns:
        list[dict]: the rows of all files in order, each with a ``"_source"`` key (the file).

    Raises:
        DataError: no file given, a file missing or not parquet, or without ``prompt_key``.
    """
    import pyarrow as pa
    import pyarrow.parquet as pq

    files = [os.path.expanduser(f) for f in _as_list(data_files)]
    if not files:
        raise DataError(f"{config_key} is empty; set it to one or more parquet files ({_PREPROCESS_HINT})")
    rows: list[dict] = []
    for path in files:
        if not os.path.isfile(path):
            raise DataError(f"{config_key}: file {path} does not exist; {_PREPROCESS_HINT}")
        try:
            table = pq.read_table(path)
        except (pa.ArrowException, OSError) as exc:
            raise DataError(
                f"{config_key}: {path} is not a readable parquet file ({exc}); {_PREPROCESS_HINT}"
            ) from None
        if prompt_key not in table.column_names:
            raise DataError(
                f"data.prompt_key: column '{prompt_key}' is not in {path} (its columns: "
                f"{', '.join(table.column_names)}); set data.prompt_key to the column holding the chat list"
            )
        for row in table.to_pylist():
            row["_source"] = path
            rows.append(row)
    return rows


def _clean_chat(chat: Any, row: int, prompt_key: str, source: str) -> list[dict]:
    """Check one prompt is a chat list; drop None fields that parquet adds to merged structs."""
    if not isinstance(chat, (list, tuple)) or not chat or not all(isinstance(m, dict) for m in chat):
        raise DataError(
            f"data.prompt_key: row {row} of {source}: column '{prompt_key}' holds {type(chat).__name__} "
            f"{str(chat)[:60]!r}, expected a non-empty chat list [{{'role', 'content'}}, ...]; "
            "rewrite the parquet with a data_preprocess script or point data.prompt_key at the chat column"
        )
    messages = [{k: v for k, v in message.items() if v is not None} for message in chat]
    for j, message in enumerate(messages):
        if not isinstance(message.get("role"), str) or not isinstance(message.get("content"), (str, list)):
            raise DataError(
                f"data.prompt_key: row {row} of {source}: message {j} of column '{prompt_key}' is "
                f"{str(message)[:80]!r}; "
                "every message needs a 'role' and a 'content' (text); fix the data set"
            )
    return messages


def check_extra_info(rows: list[dict], config_key: str) -> None:
    """``extra_info`` is a mapping (or absent) in every row: scorers and the sampler read keys of it."""
    for row in rows:
        extra = row.get("extra_info")
        if extra is not None and not isinstance(extra, dict):
            raise DataError(
                f"{config_key}: row {row['_row']} of {row['_source']}: extra_info is "
                f"{type(extra).__name__} {str(extra)[:60]!r}, expected a dict (e.g. {{'index': 0}}) or "
                "nothing; fix the data set"
            )


def truncate_ids(ids: list[int], max_length: int, mode: str) -> list[int]:
    """Cut ``ids`` to ``max_length`` tokens: ``left`` keeps the end, ``right`` the start,
    ``middle`` the first ``max_length // 2`` and the last ``max_length - max_length // 2``."""
    if len(ids) <= max_length:
        return ids
    if mode == "left":
        return ids[-max_length:]
    if mode == "right":
        return ids[:max_length]
    if mode == "middle":
        head = max_length // 2
        return ids[:head] + ids[len(ids) - (max_length - head) :]
    raise DataError(f"data.truncation={mode!r} is not one of {', '.join(TRUNCATIONS)}; pick one of them")


class RLHFDataset(torch.utils.data.Dataset):
    """Prompts of verl's RL parquet, chat-templated, tokenised and left-padded.

    Args:
        data_files: parquet path or list of paths (``~`` allowed).
        tokenizer: a Hugging Face tokenizer with a chat template.
        config: the ``data`` section (:class:`~hybridrl.data.config.DataConfig`; a DictConfig or
            a mapping of some of its keys, the others taking the packaged defaults). Keys read:
            ``prompt_key``, ``max_prompt_length``, ``truncation`` ("error" | "left" | "right" |
            "middle"), ``filter_overlong_prompts``, ``return_raw_chat``, ``return_full_prompt``,
            ``apply_chat_template_kwargs``, ``seed`` (picks the ``max_samples`` subset).
        processor: verl's multimodal processor; None (multimodal inputs are not in this build).
        max_samples: keep a seeded random subset of this many rows (-1: all).
        config_key: the key ``data_files`` came from, named in errors ("data.val_files" ...).

    verl's signature and order (``data_files, tokenizer, config, processor, max_samples``), so a
    subclass written for verl (``data.custom_cls``, :func:`create_rl_dataset`) works unchanged.

    ``__getitem__(i)`` returns ``input_ids``, ``attention_mask``, ``position_ids`` (LongTensors
    of shape ``(max_prompt_length,)``, left padded; positions are ``cumsum(mask) - 1``
    clipped at 0), ``raw_prompt_ids`` (list[int], unpadded), ``index`` (``extra_info.index``
    or the row number), ``data_source``, ``reward_model``, ``extra_info``, ``ability``,
    ``tools_kwargs``, ``interaction_kwargs``, ``agent_name`` (if the column exists),
    ``raw_prompt`` (if return_raw_chat) and ``full_prompts`` (the templated text, if
    return_full_prompt).

    Raises:
        DataError: missing/unreadable file, no prompt column, malformed prompt, bad
            ``truncation``, a prompt over ``max_prompt_length`` with ``truncation="error"``,
            or no rows left.
    """

    def __init__(
        self,
        data_files,
        tokenizer,
        config=None,
        processor=None,
        max_samples: int = -1,
        config_key: str = "data.train_files",
    ):
        if processor is not None:
            raise DataError(
                f"{config_key}: a multimodal processor was given; image and video inputs are not in this build"
            )
        # Typed once here: the PPO run hands its typed ``data`` section, ``hybridrl generate`` a
        # mapping of the four keys its own ``data`` section shares with it.
        cfg = to_dataclass(DataConfig, config, "data")
        self.tokenizer = tokenizer
        self.config_key = config_key
        self.prompt_key = cfg.prompt_key
        self.max_prompt_length = cfg.max_prompt_length
        self.truncation = cfg.truncation
        self.filter_overlong_prompts = cfg.filter_overlong_prompts
        self.return_raw_chat = cfg.return_raw_chat
        self.return_full_prompt = cfg.return_full_prompt
        self.apply_chat_template_kwargs = dict(cfg.apply_chat_template_kwargs)
        self.seed = cfg.seed
        self._check_config()

        rows = read_parquet_rows(data_files, self.prompt_key, config_key)
        for i, row in enumerate(rows):
            row["_row"] = i
        if 0 < max_samples < len(rows):
            keep = np.sort(np.random.default_rng(self.seed).choice(len(rows), size=max_samples, replace=False))
            rows = [rows[i] for i in keep]
        if not rows:
            raise DataError(f"{config_key}: the parquet file(s) hold no rows; {_PREPROCESS_HINT}")
        check_extra_info(rows, config_key)
        self.rows = rows
        self._tokenize_all()

    def _check_config(self) -> None:
        if self.truncation not in TRUNCATIONS:
            raise DataError(
                f"data.truncation={self.truncation!r} is not one of {', '.join(TRUNCATIONS)}; pick one of them"
            )
        if self.max_prompt_length <= 0:
            raise DataError(f"data.max_prompt_length={self.max_prompt_length} must be a positive number of tokens")
        if getattr(self.tokenizer, "chat_template", None) is None:
            raise DataError(
                "tokenizer has no chat_template, so RLHFDataset cannot format the chat prompts; "
                "use an instruct model's tokenizer or set tokenizer.chat_template"
            )
        pad = self.tokenizer.pad_token_id
        self.pad_token_id = pad if pad is not None else self.tokenizer.eos_token_id
        if self.pad_token_id is None:
            raise DataError("tokenizer has neither pad_token_id nor eos_token_id; set tokenizer.pad_token")

    def _tokenize_all(self) -> None:
        """Template + tokenise every row in two batched calls, then filter/truncate and pad."""
        chats = [_clean_chat(r[self.prompt_key], r["_row"], self.prompt_key, r["_source"]) for r in self.rows]
        texts = self.tokenizer.apply_chat_template(
            chats, add_generation_prompt=True, tokenize=False, **self.apply_chat_template_kwargs
        )
        all_ids = self.tokenizer(texts, add_special_tokens=False)["input_ids"]
        limit = self.max_prompt_length
        keep = [i for i, ids in enumerate(all_ids) if len(ids) <= limit]
        if self.filter_overlong_prompts:
            if not keep:
                longest = max(len(ids) for ids in all_ids)
                raise DataError(
                    f"{self.config_key}: no rows left after data.filter_overlong_prompts removed every prompt "
                    f"longer than data.max_prompt_length={limit} (shortest has {min(len(i) for i in all_ids)}, "
                    f"longest {longest} tokens); raise data.max_prompt_length"
                )
        else:
            keep = list(range(len(all_ids)))
            if self.truncation == "error":
                for i, ids in enumerate(all_ids):
                    if len(ids) > limit:
                        row = self.rows[i]
                        raise DataError(
                            f"{self.config_key}: row {row['_row']} of {row['_source']} has a prompt of {len(ids)} "
                            f"tokens > data.max_prompt_length={limit}; raise data.max_prompt_length, set "
                            "data.truncation=left|right or data.filter_overlong_prompts=True"
                        )
        self.rows = [self.rows[i] for i in keep]
        self.chats = [chats[i] for i in keep]
        self.full_prompts = [texts[i] for i in keep]
        self.raw_prompt_ids = [truncate_ids(all_ids[i], limit, self.truncation) for i in keep]
        self.input_ids = torch.full((len(keep), limit), self.pad_token_id, dtype=torch.long)
        self.attention_mask = torch.zeros((len(keep), limit), dtype=torch.long)
        for j, ids in enumerate(self.raw_prompt_ids):
            if ids:  # left padding: the prompt sits at the right end
                self.input_ids[j, limit - len(ids) :] = torch.tensor(ids, dtype=torch.long)
                self.attention_mask[j, limit - len(ids) :] = 1
        self.has_agent_name = any("agent_name" in r for r in self.rows)

    def __len__(self) -> int:
        return len(self.rows)

    def __getitem__(self, item: int) -> dict:
        row = self.rows[item]
        mask = self.attention_mask[item].clone()
        extra_info = row.get("extra_info") or {}
        index = extra_info.get("index")
        out = {
            "input_ids": self.input_ids[item].clone(),
            "attention_mask": mask,
            "position_ids": (mask.cumsum(-1) - 1).clamp(min=0),
            "raw_prompt_ids": list(self.raw_prompt_ids[item]),
            "index": row["_row"] if index is None else index,
            "data_source": row.get("data_source"),
            "reward_model": row.get("reward_model"),
            "extra_info": extra_info,
            "ability": row.get("ability"),
            "tools_kwargs": extra_info.get("tools_kwargs") or {},
            "interaction_kwargs": extra_info.get("interaction_kwargs") or {},
        }
        if self.has_agent_name:
            out["agent_name"] = row.get("agent_name")
        if self.return_raw_chat:
            out["raw_prompt"] = self.chats[item]
        if self.return_full_prompt:
            out["full_prompts"] = self.full_prompts[item]
        return out


def load_dataset_class(path: str, name: str) -> type:
    """The class ``data.custom_cls.name`` of the file ``data.custom_cls.path``: a subclass of
    ``torch.utils.data.Dataset`` (verl's rule).

    Raises:
        ConfigError: no such file, the file does not import, no such name in it, or not a
            Dataset class (one line naming the key and the file).
    """
    full = user_file_path("data.custom_cls.path", path, f"your Dataset class {name}")
    module = import_user_file(full, "data.custom_cls.path")
    cls = getattr(module, name, None) if name else None
    if cls is None:
        defined = sorted(k for k, v in vars(module).items() if isinstance(v, type) and v.__module__ == module.__name__)
        raise ConfigError(
            f"data.custom_cls.name={name!r} is not defined in {full}; classes defined there: {defined or 'none'}; "
            "set data.custom_cls.name to one of them"
        )
    if not (isinstance(cls, type) and issubclass(cls, torch.utils.data.Dataset)):
        raise ConfigError(
            f"data.custom_cls.name={name!r} in {full} is not a torch.utils.data.Dataset subclass; derive it from "
            "hybridrl.data.RLHFDataset (or torch.utils.data.Dataset)"
        )
    return cls


def create_rl_dataset(data_files, data_config, tokenizer, config_key: str = "data.train_files"):
    """The dataset of ``data_files`` (verl's ``create_rl_dataset``): :class:`RLHFDataset`, or the
    user's class ``data.custom_cls.{path,name}`` constructed as verl constructs it,
    ``cls(data_files=, tokenizer=, processor=None, config=data_config, max_samples=-1)``
    (``max_samples`` left out for a class written before verl passed it). Its items go through
    :func:`hybridrl.data.collate.collate_fn` like RLHFDataset's, so they need the keys the run
    reads (``input_ids``, ``attention_mask``, ``position_ids``, ``raw_prompt_ids``, ``data_source``,
    ``reward_model``, ...: see :class:`RLHFDataset`).

    Args:
        data_files: the parquet path(s) (``data.train_files`` / ``data.val_files``).
        data_config: the ``data`` section (typed, or a DictConfig), handed to the class as ``config``.
        tokenizer: the run's tokenizer.
        config_key: the key ``data_files`` came from, for RLHFDataset's messages.

    Raises:
        ConfigError: the class cannot be loaded (:func:`load_dataset_class`) or its constructor does
            not take verl's keyword arguments.
    """
    custom = data_config.custom_cls
    if not custom.path:
        return RLHFDataset(data_files, tokenizer, data_config, config_key=config_key)
    cls = load_dataset_class(custom.path, custom.name)
    kwargs = dict(data_files=data_files, tokenizer=tokenizer, processor=None, config=data_config, max_samples=-1)
    try:
        inspect.signature(cls).bind(**kwargs)
    except TypeError:
        del kwargs["max_samples"]  # verl's classes before max_samples
        try:
            inspect.signature(cls).bind(**kwargs)
        except TypeError as exc:
            raise ConfigError(
                f"data.custom_cls.name={custom.name!r}: its constructor does not take verl's arguments ({exc}); "
                "define __init__(self, data_files, tokenizer, config, processor=None, max_samples=-1)"
            ) from exc
    return cls(**kwargs)
