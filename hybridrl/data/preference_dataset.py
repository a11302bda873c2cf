"""Preference pairs for reward-model training: (prompt, chosen, rejected) -> token ids.

The reward model must see a (prompt, response) exactly as it will in PPO: the prompt
chat-templated with the generation prompt, the response tokens, then the EOS token the policy
ends its answer with. :func:`encode_rm_inputs` is that one format; the reward-model worker uses
it too when it re-tokenises a batch for a reward model with another tokenizer.

Accepted rows (parquet, or ``.jsonl`` / ``.jsonl.gz``):
  * ``prompt`` (chat messages, or a string) + ``chosen`` + ``rejected`` (strings, or one
    assistant message each), as ``examples/data_preprocess/hh_rlhf.py`` writes them;
  * only ``chosen`` and ``rejected`` holding whole dialogues: Anthropic HH-RLHF strings
    (``"\\n\\nHuman: ...\\n\\nAssistant: ..."``) or message lists whose last message is the
    assistant's answer. The shared beginning is the prompt.
"""

from __future__ import annotations

import logging
import os
from typing import Any

import numpy as np
import torch

from hybridrl.data.errors import DataError
from hybridrl.data.preprocess.hh_rlhf import parse_dialogue, split_pair

logger = logging.getLogger(__name__)

PREFERENCE_TRUNCATIONS = ("left", "drop", "error")


def encode_rm_inputs(
    tokenizer, chats: list[list[dict]], responses: list[str], ended: list[bool] | None = None, **chat_template_kwargs
) -> list[list[int]]:
    """Token ids the reward model reads for each (chat, response): templated prompt + response + EOS.

    Args:
        tokenizer: the reward model's tokenizer (with a chat template).
        chats: ``n`` prompts as chat messages ``[{"role", "content"}, ...]``.
        responses: ``n`` response strings.
        ended: per response, whether it ended (gets the EOS token); None: all ended. A response
            cut at the length limit did not end, and in PPO carries no EOS either.
        **chat_template_kwargs: passed to ``apply_chat_template``.

    Returns:
        ``n`` lists of token ids.

    Raises:
        DataError: the tokenizer has no chat template or no EOS token.
    """
    if getattr(tokenizer, "chat_template", None) is None:
        raise DataError(
            "the reward model's tokenizer has no chat_template, so prompts cannot be formatted; "
            "use an instruct/chat tokenizer or set a custom chat template"
        )
    if tokenizer.eos_token_id is None:
        raise DataError("the reward model's tokenizer has no eos_token; set one in its tokenizer_config.json")
    texts = tokenizer.apply_chat_template(chats, add_generation_prompt=True, tokenize=False, **chat_template_kwargs)
    prompt_ids = tokenizer(list(texts), add_special_tokens=False)["input_ids"]
    response_ids = tokenizer(list(responses), add_special_tokens=False)["input_ids"] if responses else []
    ended = [True] * len(responses) if ended is None else ended
    eos = [tokenizer.eos_token_id]
    return [p + r + (eos if e else []) for p, r, e in zip(prompt_ids, response_ids, ended)]


def read_table_rows(data_files, config_key: str) -> list[dict]:
    """Rows of parquet / jsonl / jsonl.gz files as plain dicts, each with ``_source`` and ``_row``.

    Raises:
        DataError: no file, a missing, unreadable or empty file.
    """
    import pandas as pd

    files = [data_files] if isinstance(data_files, (str, os.PathLike)) else list(data_files or [])
    if not files:
        raise DataError(
            f"{config_key} is empty; set it to parquet files of preference pairs "
            "(e.g. from examples/data_preprocess/hh_rlhf.py)"
        )
    rows = []
    for path in (os.path.expanduser(os.fspath(f)) for f in files):
        if not os.path.isfile(path):
            raise DataError(
                f"{config_key}: file {path} does not exist; create it with "
                "`python examples/data_preprocess/hh_rlhf.py --local_dir DIR` (or fix the path)"
            )
        try:
            is_json = path.endswith((".jsonl", ".jsonl.gz", ".json"))
            lines = path.endswith((".jsonl", ".jsonl.gz"))
            frame = pd.read_json(path, lines=lines) if is_json else pd.read_parquet(path)
        except (ValueError, OSError) as exc:
            raise DataError(
                f"{config_key}: {path} is not readable as {'JSON lines' if is_json else 'parquet'} "
                f"({' '.join(str(exc).split())[:120]}); pass parquet or .jsonl(.gz) files"
            ) from None
        if len(frame) == 0:
            raise DataError(
                f"{config_key}: {path} holds no row; write preference pairs into it "
                f"(e.g. with examples/data_preprocess/hh_rlhf.py) or remove it from {config_key}"
            )
        for i, row in enumerate(frame.to_dict("records")):
            rows.append({**row, "_source": path, "_row": i})
    return rows


def _messages(value: Any) -> list[dict] | None:
    """A chat list (list / numpy array of dicts with None fields dropped), or None if not one."""
    if isinstance(value, (list, tuple, np.ndarray)) and len(value) and all(isinstance(m, dict) for m in value):
        return [{k: v for k, v in m.items() if v is not None} for m in value]
    return None


def _response(value: Any, where: str) -> str:
    if isinstance(value, str):
        return value
    messages = _messages(value)
    if messages is not None and len(messages) == 1 and messages[0].get("role") == "assistant":
        return str(messages[0].get("content", ""))
    raise DataError(f"{where}: expected a string or one assistant message, got {str(value)[:60]!r}")


def row_to_pair(row: dict, keys: dict[str, str]) -> tuple[list[dict], str, str] | None:
    """One data row -> ``(prompt messages, chosen, rejected)``; None for a whole-dialogue pair
    without a clean preference (see :func:`hybridrl.data.preprocess.hh_rlhf.split_pair`).

    Raises:
        DataError: a column is missing or holds something that is not a prompt/response.
    """
    where = f"row {row['_row']} of {row['_source']}"
    for name in ("chosen_key", "rejected_key"):
        if keys[name] not in row:
            raise DataError(
                f"data.{name}: column '{keys[name]}' is not in {row['_source']} (columns: "
                f"{', '.join(k for k in row if not k.startswith('_'))}); set data.{name}"
            )
    chosen, rejected = row[keys["chosen_key"]], row[keys["rejected_key"]]
    if keys["prompt_key"] in row:
        prompt = row[keys["prompt_key"]]
        messages = _messages(prompt)
        if messages is None and isinstance(prompt, str):
            is_hh = prompt.startswith("\n\nHuman:")
            messages = parse_dialogue(prompt) if is_hh else [{"role": "user", "content": prompt}]
        if messages is None:
            raise DataError(
                f"{where}: data.prompt_key column '{keys['prompt_key']}' holds {str(prompt)[:60]!r}; "
                "expected chat messages [{'role', 'content'}, ...] or a string"
            )
        return messages, _response(chosen, f"{where}, chosen"), _response(rejected, f"{where}, rejected")
    if isinstance(chosen, str) and isinstance(rejected, str):
        return split_pair(chosen, rejected)
    chosen_msgs, rejected_msgs = _messages(chosen), _messages(rejected)
    if chosen_msgs is None or rejected_msgs is None:
        raise DataError(
            f"{where}: without a '{keys['prompt_key']}' column, chosen/rejected must be whole dialogues "
            "(HH-RLHF strings or message lists); set data.prompt_key to the prompt column"
        )
    if chosen_msgs[:-1] != rejected_msgs[:-1] or len(chosen_msgs) < 2 or chosen_msgs[-1] == rejected_msgs[-1]:
        return None
    return chosen_msgs[:-1], str(chosen_msgs[-1].get("content", "")), str(rejected_msgs[-1].get("content", ""))


class PreferenceDataset(torch.utils.data.Dataset):
    """Tokenised preference pairs; ``__getitem__`` gives ``chosen_input_ids``,
    ``rejected_input_ids`` (lists of ids) and ``margin`` (float, 0 without ``margin_key``).

    Args:
        data_files: parquet / jsonl(.gz) path or list of paths.
        tokenizer: the reward model's tokenizer (with a chat template).
        config: the typed ``data`` section of ``rm_trainer``
            (``hybridrl.trainer.jobs.supervised_config.RMDataConfig``). Keys read: ``prompt_key``,
            ``chosen_key``, ``rejected_key``, ``margin_key`` (null: no margin), ``max_length``
            (tokens per side), ``truncation`` ("left": keep the last ``max_length`` tokens, where
            the score is read; "drop": drop the pair; "error"), ``seed`` (picks the
            ``max_samples`` subset).
        config_key: the key ``data_files`` came from, named in errors.
        max_samples: keep a seeded random subset of this many pairs (-1: all).

    Raises:
        DataError: unreadable files, missing columns, malformed rows, ``truncation="error"``
            with an over-long pair, or no pair left.
    """

    def __init__(
        self, data_files, tokenizer, config, config_key: str = "data.train_files", max_samples: int = -1
    ) -> None:
        keys = {"prompt_key": config.prompt_key, "chosen_key": config.chosen_key, "rejected_key": config.rejected_key}
        self.margin_key = config.margin_key
        self.max_length = config.max_length
        self.truncation = config.truncation
        if self.truncation not in PREFERENCE_TRUNCATIONS:
            raise DataError(f"data.truncation={self.truncation!r} is not one of {', '.join(PREFERENCE_TRUNCATIONS)}")
        if self.max_length < 2:
            raise DataError(f"data.max_length={self.max_length} must be at least 2 tokens")
        rows = read_table_rows(data_files, config_key)
        if 0 < max_samples < len(rows):
            rng = np.random.default_rng(config.seed)
            keep = np.sort(rng.choice(len(rows), max_samples, replace=False))
            rows = [rows[i] for i in keep]
        pairs = [(row, row_to_pair(row, keys)) for row in rows]
        unclean = sum(pair is None for _, pair in pairs)
        if unclean:
            logger.warning(
                "%s: %d pairs without a clean preference (different prompts or identical responses) were skipped",
                config_key,
                unclean,
            )
        pairs = [(row, pair) for row, pair in pairs if pair is not None]
        self._tokenize(pairs, tokenizer, config_key)

    def _tokenize(self, pairs: list, tokenizer, config_key: str) -> None:
        chats = [pair[0] for _, pair in pairs]
        chosen = encode_rm_inputs(tokenizer, chats, [pair[1] for _, pair in pairs])
        rejected = encode_rm_inputs(tokenizer, chats, [pair[2] for _, pair in pairs])
        self.chosen, self.rejected, self.margins = [], [], []
        for (row, _), c_ids, r_ids in zip(pairs, chosen, rejected):
            longest = max(len(c_ids), len(r_ids))
            if longest > self.max_length:
                if self.truncation == "drop":
                    continue
                if self.truncation == "error":
                    raise DataError(
                        f"{config_key}: row {row['_row']} of {row['_source']} has {longest} tokens > "
                        f"data.max_length={self.max_length}; raise data.max_length or set data.truncation=left|drop"
                    )
                c_ids, r_ids = c_ids[-self.max_length :], r_ids[-self.max_length :]
            self.chosen.append(c_ids)
            self.rejected.append(r_ids)
            self.margins.append(self._margin(row))
        if not self.chosen:
            raise DataError(
                f"{config_key}: no preference pair left (data.truncation={self.truncation}, "
                f"data.max_length={self.max_length}); check the file or raise data.max_length"
            )

    def _margin(self, row: dict) -> float:
        if not self.margin_key:
            return 0.0
        value = row.get(self.margin_key)
        if isinstance(value, bool) or not isinstance(value, (int, float, np.number)) or not np.isfinite(value):
            raise DataError(
                f"data.margin_key: row {row['_row']} of {row['_source']} has {self.margin_key}="
                f"{value!r}; it must be a finite number (or set data.margin_key=null)"
            )
        return float(value)

    def __len__(self) -> int:
        return len(self.chosen)

    def __getitem__(self, item: int) -> dict:
        return {
            "chosen_input_ids": self.chosen[item],
            "rejected_input_ids": self.rejected[item],
            "margin": self.margins[item],
        }


def right_pad(sequences: list[list[int]], pad_token_id: int) -> dict[str, torch.Tensor]:
    """``input_ids``, ``attention_mask``, ``position_ids`` ``(n, longest)``, right-padded."""
    longest = max(len(s) for s in sequences)
    input_ids = torch.full((len(sequences), longest), pad_token_id, dtype=torch.long)
    attention_mask = torch.zeros((len(sequences), longest), dtype=torch.long)
    for i, ids in enumerate(sequences):
        input_ids[i, : len(ids)] = torch.tensor(ids, dtype=torch.long)
        attention_mask[i, : len(ids)] = 1
    position_ids = (attention_mask.cumsum(-1) - 1).clamp(min=0)
    return {"input_ids": input_ids, "attention_mask": attention_mask, "position_ids": position_ids}


def pad_pairs(chosen: list[list[int]], rejected: list[list[int]], pad_token_id: int) -> dict[str, torch.Tensor]:
    """``B`` pairs -> one right-padded batch of ``2B`` sequences, chosen rows first, then the
    rejected ones, so both sides go through the model in one forward pass."""
    return right_pad(list(chosen) + list(rejected), pad_token_id)
