"""SFTDataset: assistant-only loss masks, single/multi-turn rows, truncation, clear errors."""

import copy

import pandas as pd
import pytest
import torch
from omegaconf import OmegaConf

from hybridrl.config.typed import to_dataclass
from hybridrl.data.errors import DataError
from hybridrl.data.sft_dataset import SFTDataset, assistant_char_spans
from hybridrl.trainer.jobs.supervised_config import SFTDataConfig

CONVERSATION = [
    {"role": "system", "content": "S"},
    {"role": "user", "content": "Hi"},
    {"role": "assistant", "content": "Hello there"},
    {"role": "user", "content": "Q2"},
    {"role": "assistant", "content": "A2"},
]


def _parquet(tmp_path, rows, name="data.parquet"):
    path = tmp_path / name
    pd.DataFrame(rows).to_parquet(path, index=False)
    return str(path)


def _data(keys: dict):
    """The ``data`` section as ``hybridrl sft`` hands it (typed, the packaged defaults) with ``keys`` set."""
    return OmegaConf.structured(to_dataclass(SFTDataConfig, keys, "data"))


def _unpadded(ds, i):
    item = ds[i]
    n = int(item["attention_mask"].sum())
    return item["input_ids"][:n].tolist(), item["loss_mask"][:n].tolist()


def test_multiturn_mask_is_exactly_the_assistant_tokens(tokenizer, tmp_path):
    path = _parquet(tmp_path, [{"messages": CONVERSATION}])
    ds = SFTDataset(
        path, tokenizer, _data({"multiturn": {"enable": True, "messages_key": "messages"}, "max_length": 64})
    )
    ids, mask = _unpadded(ds, 0)
    # SmolLM2's ChatML, tokenised by hand: role headers, system and user turns and the newline
    # after each <|im_end|> are 0; the assistant's words and its <|im_end|> are 1.
    expected = [
        ("<|im_start|>", 0),
        ("system", 0),
        ("Ċ", 0),
        ("S", 0),
        ("<|im_end|>", 0),
        ("Ċ", 0),
        ("<|im_start|>", 0),
        ("user", 0),
        ("Ċ", 0),
        ("Hi", 0),
        ("<|im_end|>", 0),
        ("Ċ", 0),
        ("<|im_start|>", 0),
        ("ass", 0),
        ("istant", 0),
        ("Ċ", 0),
        ("Hello", 1),
        ("Ġthere", 1),
        ("<|im_end|>", 1),
        ("Ċ", 0),
        ("<|im_start|>", 0),
        ("user", 0),
        ("Ċ", 0),
        ("Q", 0),
        ("2", 0),
        ("<|im_end|>", 0),
        ("Ċ", 0),
        ("<|im_start|>", 0),
        ("ass", 0),
        ("istant", 0),
        ("Ċ", 0),
        ("A", 1),
        ("2", 1),
        ("<|im_end|>", 1),
        ("Ċ", 0),
    ]
    assert list(zip(tokenizer.convert_ids_to_tokens(ids), mask)) == expected
    item = ds[0]
    assert item["input_ids"].shape == (64,) and item["attention_mask"].sum() == len(expected)
    assert item["loss_mask"][len(expected) :].sum() == 0  # padding is never a label
    assert item["position_ids"][: len(expected)].tolist() == list(range(len(expected)))


def test_single_turn_is_the_prompt_template_then_response_and_eos(tokenizer, tmp_path):
    path = _parquet(tmp_path, [{"question": "What is 2+3?", "answer": "It is 5."}])
    ds = SFTDataset(path, tokenizer, _data({"prompt_key": "question", "response_key": "answer", "max_length": 128}))
    ids, mask = _unpadded(ds, 0)
    prompt_ids = tokenizer.apply_chat_template(
        [{"role": "user", "content": "What is 2+3?"}], add_generation_prompt=True, tokenize=True, return_dict=False
    )
    response_ids = tokenizer("It is 5." + tokenizer.eos_token, add_special_tokens=False)["input_ids"]
    n_p, n_r = len(prompt_ids), len(response_ids)
    assert ids[:n_p] == list(prompt_ids) and ids[n_p : n_p + n_r] == response_ids
    assert mask[:n_p] == [0] * n_p and mask[n_p : n_p + n_r] == [1] * n_r
    assert mask[n_p + n_r :] == [0] * (len(ids) - n_p - n_r)  # template text after the turn (a newline)


def test_dict_columns_and_chat_list_prompts(tokenizer, tmp_path):
    """The GSM8K RL parquet layout: question/answer inside extra_info, the chat list in prompt."""
    rows = [
        {"prompt": [{"role": "user", "content": "Q?"}], "extra_info": {"question": "Q?", "answer": "A.", "index": 0}}
    ]
    path = _parquet(tmp_path, rows)
    via_dict = SFTDataset(
        path,
        tokenizer,
        _data(
            {
                "prompt_key": "extra_info",
                "response_key": "extra_info",
                "prompt_dict_keys": ["question"],
                "response_dict_keys": ["answer"],
            }
        ),
    )
    via_chat = SFTDataset(
        path, tokenizer, _data({"prompt_key": "prompt", "response_key": "extra_info", "response_dict_keys": ["answer"]})
    )
    conversation = [{"role": "user", "content": "Q?"}, {"role": "assistant", "content": "A."}]
    as_messages = SFTDataset(
        _parquet(tmp_path, [{"messages": conversation}], "m.parquet"), tokenizer, _data({"multiturn": {"enable": True}})
    )
    assert _unpadded(via_dict, 0) == _unpadded(via_chat, 0) == _unpadded(as_messages, 0)


@pytest.mark.parametrize("mode", ["left", "right"])
def test_truncation_keeps_the_end_or_the_start(tokenizer, tmp_path, mode):
    rows = [{"question": "Add the numbers one two three four five six.", "answer": "The sum is twenty one."}]
    path = _parquet(tmp_path, rows)
    full = SFTDataset(path, tokenizer, _data({"prompt_key": "question", "response_key": "answer", "max_length": 512}))
    full_ids, full_mask = _unpadded(full, 0)
    limit = len(full_ids) - 7
    ds = SFTDataset(
        path,
        tokenizer,
        _data({"prompt_key": "question", "response_key": "answer", "max_length": limit, "truncation": mode}),
    )
    ids, mask = _unpadded(ds, 0)
    kept = slice(-limit, None) if mode == "left" else slice(0, limit)
    assert ids == full_ids[kept] and mask == full_mask[kept]
    assert ds[0]["input_ids"].shape == (limit,)


def test_too_long_row_with_truncation_error_names_file_row_length_and_limit(tokenizer, tmp_path):
    rows = [{"question": "short", "answer": "ok"}, {"question": "long " * 40, "answer": "ok"}]
    path = _parquet(tmp_path, rows)
    long_len = len(
        tokenizer(
            assistant_char_spans(
                tokenizer, [{"role": "user", "content": "long " * 40}, {"role": "assistant", "content": "ok"}]
            )[0]
        )["input_ids"]
    )
    with pytest.raises(DataError) as err:
        SFTDataset(
            path,
            tokenizer,
            _data({"prompt_key": "question", "response_key": "answer", "max_length": 40}),
            config_key="data.val_files",
        )
    message = str(err.value)
    for part in ("data.val_files", path, "row 1", f"{long_len} tokens", "data.max_length=40", "data.truncation"):
        assert part in message, part
    assert "\n" not in message


def test_missing_columns_are_all_named(tokenizer, tmp_path):
    path = _parquet(tmp_path, [{"q": "x", "a": "y"}])
    with pytest.raises(DataError, match=r"'question' \(data.prompt_key\), 'answer' \(data.response_key\).*q, a"):
        SFTDataset(path, tokenizer, _data({"prompt_key": "question", "response_key": "answer"}))
    with pytest.raises(DataError, match=r"'messages' \(data.multiturn.messages_key\)"):
        SFTDataset(path, tokenizer, _data({"multiturn": {"enable": True}}))


def test_bad_rows_get_clear_errors(tokenizer, tmp_path):
    path = _parquet(tmp_path, [{"extra_info": {"question": "x"}, "answer": "y"}])
    with pytest.raises(DataError, match=r"row 0 of .*no key 'problem'.*data.prompt_dict_keys"):
        SFTDataset(
            path,
            tokenizer,
            _data({"prompt_key": "extra_info", "response_key": "answer", "prompt_dict_keys": ["problem"]}),
        )
    no_assistant = _parquet(tmp_path, [{"messages": [{"role": "user", "content": "x"}]}], "n.parquet")
    with pytest.raises(DataError, match="no assistant message"):
        SFTDataset(no_assistant, tokenizer, _data({"multiturn": {"enable": True}}))
    bad = _data({})
    bad.truncation = "middle"  # past the section's own check: the dataset guards its input too
    with pytest.raises(DataError, match="data.truncation='middle'"):
        SFTDataset(path, tokenizer, bad)


def test_a_template_that_rewrites_earlier_turns_is_refused(tokenizer, tmp_path):
    """A template that renders the last assistant turn differently from earlier ones (as
    reasoning templates that drop old thinking do) cannot be split into turns by prefixes."""
    template = (
        "{% for m in messages %}{% if m.role == 'assistant' and loop.last %}<final>{% endif %}"
        "{{ m.role }}: {{ m.content }}\n{% endfor %}{% if add_generation_prompt %}assistant: {% endif %}"
    )
    tok = type(tokenizer).from_pretrained(tokenizer.name_or_path)
    tok.chat_template = template
    with pytest.raises(DataError, match="renders a prefix of the conversation differently"):
        assistant_char_spans(tok, CONVERSATION[1:], where="row 0")


def test_loss_mask_rows_collate_to_batches(tokenizer, tmp_path):
    from hybridrl.data.collate import collate_fn

    path = _parquet(tmp_path, [{"question": "a", "answer": "b"}, {"question": "c d e f", "answer": "g h i"}])
    ds = SFTDataset(path, tokenizer, _data({"prompt_key": "question", "response_key": "answer", "max_length": 48}))
    batch = collate_fn([ds[0], ds[1]])
    assert batch["input_ids"].shape == batch["loss_mask"].shape == (2, 48)
    assert batch["input_ids"].dtype == torch.long
    assert (batch["loss_mask"] <= batch["attention_mask"]).all()


# A template that shows what reaches it: the tool names, enable_thinking and an extra argument.
_SHOWING_TEMPLATE = (
    "{% if tools %}TOOLS {% for t in tools %}{{ t.name }} {% endfor %}\n{% endif %}"
    "{% if enable_thinking is defined %}THINK {{ enable_thinking }}\n{% endif %}"
    "{% if greeting is defined %}{{ greeting }}\n{% endif %}"
    "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def _texts(ds):
    return [ds.tokenizer.decode(ids) for ids in ds.input_ids]


def test_verl_multiturn_columns_reach_the_chat_template(tokenizer, tmp_path):
    """verl's MultiTurnSFTDataset: a tools column goes to the template as `tools`, an
    enable_thinking column (else data.enable_thinking_default) as `enable_thinking`, and
    data.apply_chat_template_kwargs to every row; the loss stays on the assistant's tokens."""
    tokenizer = copy.deepcopy(tokenizer)
    tokenizer.chat_template = _SHOWING_TEMPLATE
    tools = [{"name": "search", "description": "d"}]
    rows = [
        {"conv": CONVERSATION, "tools": tools, "think": True},
        {"conv": CONVERSATION, "tools": None, "think": None},
    ]
    path = _parquet(tmp_path, rows)
    config = {"messages_key": "conv", "enable_thinking_key": "think", "max_length": 128}
    config["apply_chat_template_kwargs"] = {"greeting": "HELLO"}
    first, second = _texts(SFTDataset(path, tokenizer, _data(config)))
    assert first.startswith("TOOLS search THINK True\nHELLO\n<|im_start|>system")
    assert second.startswith("HELLO\n<|im_start|>system")  # no tools, no enable_thinking
    with_default = _texts(SFTDataset(path, tokenizer, _data({**config, "enable_thinking_default": False})))
    assert with_default[1].startswith("THINK False\n")
    # a file without those columns trains as before (verl reads them only when present)
    plain = _parquet(tmp_path, [{"conv": CONVERSATION}], "plain.parquet")
    ds = SFTDataset(plain, tokenizer, _data({"messages_key": "conv", "max_length": 128}))
    ids, mask = _unpadded(ds, 0)
    said = tokenizer.decode([i for i, m in zip(ids, mask) if m])
    assert said == "Hello there<|im_end|>A2<|im_end|>"


def test_max_samples_keeps_the_first_rows(tokenizer, tmp_path):
    rows = [{"question": f"q{i}", "answer": f"a{i}"} for i in range(5)]
    a = _parquet(tmp_path, rows[:3], "a.parquet")
    b = _parquet(tmp_path, rows[3:], "b.parquet")
    config = _data({"prompt_key": "question", "response_key": "answer", "max_length": 64})
    ds = SFTDataset([a, b], tokenizer, config, max_samples=4)
    assert len(ds) == 4 and "q3" in _texts(ds)[3]
    assert len(SFTDataset([a, b], tokenizer, config, max_samples=-1)) == 5


def test_a_multiturn_file_read_as_single_turn_says_which_key_to_set(tokenizer, tmp_path):
    path = _parquet(tmp_path, [{"messages": CONVERSATION}])
    with pytest.raises(DataError, match=r"\(multi-turn rows: set data.messages_key=messages\)"):
        SFTDataset(path, tokenizer, _data({}))
