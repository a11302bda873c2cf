"""SFTDataset: parquet rows -> chat-templated token ids with an assistant-only loss mask.

Two row layouts, as verl's SFT datasets read them:

* single-turn (``data.multiturn.enable=false``): a prompt column and a response column. The
  prompt is a string (sent as one user message) or a chat list ``[{role, content}, ...]``; a
  column holding dicts is followed down ``data.prompt_dict_keys`` / ``data.response_dict_keys``
  (so the GSM8K RL parquet, whose ``extra_info`` holds ``question`` and ``answer``, is SFT data
  as it is). The pair becomes the conversation ``prompt + [assistant: response]``.
* multi-turn (``data.multiturn.enable=true``, or verl's current spelling ``data.messages_key``,
  folded into it by the config): one column of ``[{role, content}, ...]``. When the file has a
  ``data.multiturn.tools_key`` column, each row's tool schemas go to the chat template as
  ``tools``; an ``enable_thinking_key`` column (else ``data.enable_thinking_default``) as
  ``enable_thinking``, as verl's ``MultiTurnSFTDataset`` does.

Either way the conversation goes through the tokenizer's chat template once, and exactly the
tokens the assistant says (each assistant message's text and its end-of-turn token, but not the
role header before it) get ``loss_mask = 1``. The spans are found by rendering prefixes of the
conversation, so any chat template works whose rendering of a prefix is a prefix of the whole.

Unlike verl, whose ``loss_mask`` is shifted by one (position t marks the label t+1), the mask
here is aligned with ``input_ids``: ``loss_mask[t] = 1`` means token t is a training label.
"""

from __future__ import annotations

import logging
import os
from typing import Any

import torch

from hybridrl.data.errors import DataError
from hybridrl.data.rl_dataset import truncate_ids

logger = logging.getLogger(__name__)

SFT_TRUNCATIONS = ("error", "left", "right")


def _as_list(value) -> list:
    if value is None:
        return []
    if isinstance(value, (str, os.PathLike)):
        return [os.fspath(value)]
    return [os.fspath(v) if isinstance(v, os.PathLike) else v for v in value]


def read_sft_columns(
    data_files, columns: dict[str, str], config_key: str = "data.train_files", optional: tuple[str, ...] = ()
) -> list[dict]:
    """Read ``columns`` of one or more parquet files into plain-Python row dicts.

    Args:
        data_files: a path or a list of paths (``~`` is expanded).
        columns: column name -> the config key that names it (for the error message).
        config_key: the config key the paths came from.
        optional: columns read when a file has them (a row of a file without one has None there).

    Returns:
        The rows of all files in order; each also has ``_source`` (file) and ``_row`` (row
        number in that file).

    Raises:
        DataError: no file given, a file missing or unreadable, or columns missing (all of them
            named, with the columns the file has).
    """
    import pyarrow as pa
    import pyarrow.parquet as pq

    files = [os.path.expanduser(f) for f in _as_list(data_files)]
    if not files:
        raise DataError(f"{config_key} is empty; set it to one or more parquet files")
    rows: list[dict] = []
    for path in files:
        if not os.path.isfile(path):
            raise DataError(
                f"{config_key}: file {path} does not exist; fix the path or write the parquet first "
                "(e.g. `hybridrl preprocess gsm8k --local_dir DIR`)"
            )
        try:
            names = pq.read_schema(path).names
            missing = [f"'{col}' ({key})" for col, key in columns.items() if col not in names]
            if missing:
                multi = "messages" in names and "data.prompt_key" in columns.values()
                hint = " (multi-turn rows: set data.messages_key=messages)" if multi else ""
                raise DataError(
                    f"{config_key}: {path} has no column {', '.join(missing)}; its columns are "
                    f"{', '.join(names)}; point those keys at the right columns{hint}"
                )
            present = [col for col in optional if col in names and col not in columns]
            table = pq.read_table(path, columns=list(dict.fromkeys([*columns, *present])))
        except (pa.ArrowException, OSError) as exc:
            raise DataError(f"{config_key}: {path} is not a readable parquet file ({exc})") from None
        for i, row in enumerate(table.to_pylist()):
            row["_source"], row["_row"] = path, i
            for col in optional:
                row.setdefault(col, None)
            rows.append(row)
    if not rows:
        raise DataError(f"{config_key}: the parquet file(s) {', '.join(files)} hold no rows")
    return rows


def _follow_keys(value: Any, keys: list[str], column: str, key_name: str, where: str) -> Any:
    """``value[k1][k2]...`` for ``keys``; DataError naming the key that is missing."""
    for k in keys:
        if not isinstance(value, dict) or k not in value:
            have = sorted(value) if isinstance(value, dict) else type(value).__name__
            raise DataError(f"{where}: column '{column}' has no key '{k}' (it holds {have}); fix {key_name}")
        value = value[k]
    return value


def _check_chat(chat: Any, column: str, where: str) -> list[dict]:
    """A clean chat list: dicts with a str ``role`` and a str ``content`` (None fields dropped)."""
    ok = isinstance(chat, (list, tuple)) and len(chat) > 0
    messages = []
    for m in chat if ok else []:
        if not isinstance(m, dict) or not isinstance(m.get("role"), str) or not isinstance(m.get("content"), str):
            ok = False
            break
        messages.append({k: v for k, v in m.items() if v is not None})
    if not ok:
        raise DataError(
            f"{where}: column '{column}' holds {str(chat)[:80]!r}, expected a non-empty list of "
            "{'role': str, 'content': str} messages"
        )
    return messages


def row_to_messages(row: dict, config, where: str) -> list[dict]:
    """The conversation of one parquet row (see the module docstring for the layouts);
    ``config`` is the typed ``data`` section (as :class:`SFTDataset` takes it).

    Raises:
        DataError: a value of the wrong type or a missing dict key (naming row, file and key).
    """
    if config.multiturn.enable:
        key = config.multiturn.messages_key
        messages = _check_chat(row[key], key, where)
        if not any(m["role"] == "assistant" for m in messages):
            raise DataError(f"{where}: column '{key}' has no assistant message, so nothing to train on")
        return messages
    p_key, r_key = config.prompt_key, config.response_key
    prompt = _follow_keys(row[p_key], _as_list(config.prompt_dict_keys), p_key, "data.prompt_dict_keys", where)
    response = _follow_keys(row[r_key], _as_list(config.response_dict_keys), r_key, "data.response_dict_keys", where)
    if not isinstance(response, str):
        raise DataError(
            f"{where}: the response ('{r_key}') is {type(response).__name__}, expected str; "
            "set data.response_dict_keys to reach the text"
        )
    if isinstance(prompt, str):
        chat = [{"role": "user", "content": prompt}]
    elif isinstance(prompt, (list, tuple)):
        chat = _check_chat(prompt, p_key, where)
    else:
        raise DataError(
            f"{where}: the prompt ('{p_key}') is {type(prompt).__name__}, expected str or a chat "
            "list; set data.prompt_dict_keys to reach the text"
        )
    return chat + [{"role": "assistant", "content": response}]


def assistant_char_spans(
    tokenizer, messages: list[dict], where: str = "conversation", **template_kwargs
) -> tuple[str, list[tuple[int, int]]]:
    """The templated text of ``messages`` and the ``[start, end)`` character spans the assistant says.

    A span runs from the end of the generation prompt before an assistant message to the end of
    that message's rendering, trailing whitespace excluded: the message text plus the template's
    end-of-turn token, without the role header (which the rollout gets as part of the prompt).

    Raises:
        DataError: the first message is the assistant's (no prompt to condition on), or the chat
            template renders a prefix of the conversation differently from the whole, so the
            assistant's tokens cannot be located.
    """

    def render(msgs, gen):
        return tokenizer.apply_chat_template(msgs, tokenize=False, add_generation_prompt=gen, **template_kwargs)

    text = render(messages, False)
    spans = []
    for i, message in enumerate(messages):
        if message["role"] != "assistant":
            continue
        if i == 0:
            raise DataError(
                f"{where}: message 0 is an assistant message; start the conversation with a system or user message"
            )
        head, upto = render(messages[:i], True), render(messages[: i + 1], False)
        if not (upto.startswith(head) and text.startswith(upto)):
            raise DataError(
                f"{where}: the chat template renders a prefix of the conversation differently from the "
                "whole (e.g. it drops earlier turns' reasoning), so the assistant's tokens cannot be "
                "located; set data.chat_template to a template without that behaviour"
            )
        spans.append((len(head), len(upto.rstrip())))
    return text, spans


def mask_from_offsets(offsets: list[tuple[int, int]], spans: list[tuple[int, int]]) -> list[int]:
    """1 for each token whose characters ``[start, end)`` overlap one of ``spans``, else 0.

    Overlap rather than containment: a token that merges the header's last character with the
    reply's first (e.g. "Ġ"+"Hello" after "assistant:") is still the assistant's to predict.
    """
    return [int(any(start < e and end > s for s, e in spans)) for start, end in offsets]


class SFTDataset(torch.utils.data.Dataset):
    """Chat-templated SFT rows, right-padded to ``data.max_length``.

    Args:
        data_files: parquet path or list of paths (``~`` allowed).
        tokenizer: a fast Hugging Face tokenizer with a chat template.
        config: the typed ``data`` section of ``sft_trainer``
            (``hybridrl.trainer.jobs.supervised_config.SFTDataConfig``). Keys read: ``prompt_key``,
            ``response_key``, ``prompt_dict_keys``, ``response_dict_keys``, ``multiturn.enable``,
            ``multiturn.messages_key``, ``multiturn.tools_key``, ``multiturn.enable_thinking_key``,
            ``enable_thinking_default``, ``apply_chat_template_kwargs``, ``max_length``,
            ``truncation`` (error|left|right).
        config_key: the key ``data_files`` came from, named in errors ("data.val_files" ...).
        max_samples: keep the first ``max_samples`` rows of the files (``data.train_max_samples`` /
            ``data.val_max_samples``, as verl without shuffling); -1: all.

    ``__getitem__(i)`` returns LongTensors of shape ``(max_length,)``: ``input_ids`` (padded with
    the pad token), ``attention_mask`` (1 on real tokens), ``position_ids`` (``0..len-1``, then
    0) and ``loss_mask`` (1 on the assistant's tokens, aligned with ``input_ids``).

    Raises:
        DataError: missing/unreadable file or column, a malformed row, a chat template that
            cannot be split into turns, a bad ``truncation``, or a row longer than
            ``max_length`` with ``truncation=error`` (naming file, row, length and limit).
    """

    def __init__(self, data_files, tokenizer, config, config_key: str = "data.train_files", max_samples: int = -1):
        self.config, self.config_key = config, config_key
        self.max_length = config.max_length
        self.truncation = config.truncation
        self.tokenizer = tokenizer
        self._check_setup()
        multi = config.multiturn
        optional: tuple[str, ...] = ()
        if multi.enable:
            columns = {multi.messages_key: "data.multiturn.messages_key"}
            optional = (multi.tools_key, multi.enable_thinking_key)
        else:
            columns = {config.prompt_key: "data.prompt_key", config.response_key: "data.response_key"}
        rows = read_sft_columns(data_files, columns, config_key, optional)
        if max_samples > 0:
            rows = rows[:max_samples]
        self.input_ids, self.loss_masks = self._tokenize(rows)

    def _template_kwargs(self, row: dict) -> dict:
        """The chat template's extra arguments for ``row``: ``data.apply_chat_template_kwargs``, and
        for multi-turn rows its ``tools`` and ``enable_thinking`` (verl's ``MultiTurnSFTDataset``)."""
        kwargs = dict(self.config.apply_chat_template_kwargs)
        multi = self.config.multiturn
        if not multi.enable:
            return kwargs
        if row[multi.tools_key] is not None:
            kwargs["tools"] = row[multi.tools_key]
        thinking = row[multi.enable_thinking_key]
        if thinking is None and self.config.enable_thinking_default != "none":
            thinking = self.config.enable_thinking_default
        if thinking is not None:
            kwargs["enable_thinking"] = bool(thinking)
        return kwargs

    def _check_setup(self) -> None:
        if self.truncation not in SFT_TRUNCATIONS:
            raise DataError(f"data.truncation={self.truncation!r} is not one of {', '.join(SFT_TRUNCATIONS)}")
        if self.max_length <= 0:
            raise DataError(f"data.max_length={self.max_length} must be a positive number of tokens")
        if getattr(self.tokenizer, "chat_template", None) is None:
            raise DataError(
                "the tokenizer has no chat_template; use an instruct model's tokenizer or set data.chat_template"
            )
        if not getattr(self.tokenizer, "is_fast", False):
            raise DataError(
                "SFTDataset needs a fast tokenizer (it maps tokens to characters to find the "
                "assistant's tokens); load the model's tokenizer.json"
            )
        self.pad_token_id = self.tokenizer.pad_token_id
        if self.pad_token_id is None:
            self.pad_token_id = self.tokenizer.eos_token_id
        if self.pad_token_id is None:
            raise DataError("the tokenizer has neither a pad nor an eos token; set tokenizer.pad_token")

    def _tokenize(self, rows: list[dict]) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
        texts, spans = [], []
        for row in rows:
            where = f"{self.config_key}: row {row['_row']} of {row['_source']}"
            messages = row_to_messages(row, self.config, where)
            text, row_spans = assistant_char_spans(self.tokenizer, messages, where, **self._template_kwargs(row))
            texts.append(text)
            spans.append(row_spans)
        enc = self.tokenizer(texts, add_special_tokens=False, return_offsets_mapping=True)
        all_ids, all_masks, empty = [], [], 0
        for row, ids, offsets, row_spans in zip(rows, enc["input_ids"], enc["offset_mapping"], spans):
            mask = mask_from_offsets(offsets, row_spans)
            if len(ids) > self.max_length:
                if self.truncation == "error":
                    raise DataError(
                        f"{self.config_key}: row {row['_row']} of {row['_source']} is {len(ids)} tokens long, "
                        f"more than data.max_length={self.max_length}; raise data.max_length or set "
                        "data.truncation=left|right"
                    )
                ids = truncate_ids(ids, self.max_length, self.truncation)
                mask = truncate_ids(mask, self.max_length, self.truncation)
            empty += sum(mask) == 0
            all_ids.append(torch.tensor(ids, dtype=torch.long))
            all_masks.append(torch.tensor(mask, dtype=torch.long))
        if empty:
            logger.warning(
                "%s: %d of %d rows have no assistant token left after truncation to %d tokens; "
                "they add nothing to the loss",
                self.config_key,
                empty,
                len(rows),
                self.max_length,
            )
        return all_ids, all_masks

    def __len__(self) -> int:
        return len(self.input_ids)

    def __getitem__(self, item: int) -> dict:
        ids, mask = self.input_ids[item], self.loss_masks[item]
        n, pad = ids.shape[0], self.max_length - ids.shape[0]
        attention_mask = torch.cat([torch.ones(n, dtype=torch.long), torch.zeros(pad, dtype=torch.long)])
        return {
            "input_ids": torch.cat([ids, torch.full((pad,), self.pad_token_id, dtype=torch.long)]),
            "attention_mask": attention_mask,
            "position_ids": torch.cat([torch.arange(n), torch.zeros(pad, dtype=torch.long)]),
            "loss_mask": torch.cat([mask, torch.zeros(pad, dtype=torch.long)]),
        }
