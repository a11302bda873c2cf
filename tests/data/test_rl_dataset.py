"""RLHFDataset on a real GSM8K parquet with the real SmolLM2 tokenizer."""

import pandas as pd
import pytest
import torch

from hybridrl.data import DataError, RLHFDataset
from hybridrl.errors import ConfigError


def ref_ids(tokenizer, chat):
    """Reference token ids via the tokenizer's own (unbatched) chat-template path."""
    return tokenizer.apply_chat_template(chat, add_generation_prompt=True, tokenize=True, return_dict=False)


@pytest.fixture(scope="module")
def train_file(gsm8k_parquet):
    return str(gsm8k_parquet / "train.parquet")


@pytest.fixture(scope="module")
def chats(train_file):
    return [list(p) for p in pd.read_parquet(train_file)["prompt"]]


@pytest.fixture(scope="module")
def lengths(tokenizer, chats):
    return [len(ref_ids(tokenizer, c)) for c in chats]


def test_left_padding_mask_positions_and_decoded_prompt(tokenizer, train_file, chats):
    ds = RLHFDataset(train_file, tokenizer, {"max_prompt_length": 256})
    assert len(ds) == 64
    item = ds[3]
    expected = ref_ids(tokenizer, chats[3])
    n, pad = len(expected), 256 - len(expected)
    assert item["input_ids"].shape == (256,) and item["input_ids"].dtype == torch.long
    assert item["attention_mask"].tolist() == [0] * pad + [1] * n
    assert item["input_ids"][pad:].tolist() == expected == item["raw_prompt_ids"]
    assert (item["input_ids"][:pad] == tokenizer.pad_token_id).all()
    assert item["position_ids"].tolist() == [0] * pad + list(range(n))
    text = tokenizer.decode(item["raw_prompt_ids"])
    question = pd.read_parquet(train_file)["extra_info"][3]["question"]
    assert question in text and "<|im_start|>user" in text and text.endswith("<|im_start|>assistant\n")
    assert item["index"] == 3 and item["data_source"] == "openai/gsm8k" and item["ability"] == "math"
    assert item["reward_model"]["style"] == "rule" and item["extra_info"]["split"] == "train"
    assert item["tools_kwargs"] == {} and item["interaction_kwargs"] == {}
    assert "raw_prompt" not in item and "agent_name" not in item


def test_dictconfig_raw_chat_and_full_prompt(tokenizer, train_file, chats):
    from omegaconf import OmegaConf

    cfg = OmegaConf.create({"max_prompt_length": 256, "return_raw_chat": True, "return_full_prompt": True})
    item = RLHFDataset(train_file, tokenizer, cfg)[0]
    assert item["raw_prompt"] == chats[0]
    assert item["full_prompts"] == tokenizer.apply_chat_template(chats[0], add_generation_prompt=True, tokenize=False)


@pytest.mark.parametrize("mode", ["left", "right", "middle"])
def test_truncation_modes(tokenizer, train_file, chats, mode):
    ds = RLHFDataset(train_file, tokenizer, {"max_prompt_length": 40, "truncation": mode})
    full = ref_ids(tokenizer, chats[0])
    assert len(full) > 40
    want = {"left": full[-40:], "right": full[:40], "middle": full[:20] + full[-20:]}[mode]
    item = ds[0]
    assert item["raw_prompt_ids"] == want
    assert item["input_ids"].tolist() == want and item["attention_mask"].sum() == 40
    if mode == "left":  # the generation prompt survives left truncation
        assert tokenizer.decode(want).endswith("<|im_start|>assistant\n")


def test_overlong_prompt_with_truncation_error_names_row_length_and_fixes(tokenizer, train_file, lengths):
    with pytest.raises(DataError) as exc:
        RLHFDataset(train_file, tokenizer, {"max_prompt_length": 40})
    msg = str(exc.value)
    assert f"row 0 of {train_file} has a prompt of {lengths[0]} tokens" in msg
    for part in (
        "data.train_files",
        "data.max_prompt_length=40",
        "data.truncation=left|right",
        "data.filter_overlong_prompts=True",
    ):
        assert part in msg


def test_filter_overlong_keeps_exactly_the_short_prompts(tokenizer, train_file, lengths):
    limit = sorted(lengths)[len(lengths) // 2]
    ds = RLHFDataset(train_file, tokenizer, {"max_prompt_length": limit, "filter_overlong_prompts": True})
    expected = [i for i, n in enumerate(lengths) if n <= limit]
    assert 0 < len(expected) < 64
    assert [ds[j]["index"] for j in range(len(ds))] == expected
    assert all(ds[j]["attention_mask"].sum() == lengths[i] for j, i in enumerate(expected))


def test_empty_after_filtering(tokenizer, train_file):
    with pytest.raises(DataError, match=r"data\.val_files: no rows left.*data\.max_prompt_length=10"):
        RLHFDataset(
            train_file,
            tokenizer,
            {"max_prompt_length": 10, "filter_overlong_prompts": True},
            config_key="data.val_files",
        )


def test_missing_file_names_key_path_and_preprocess(tokenizer, tmp_path):
    missing = str(tmp_path / "nope.parquet")
    with pytest.raises(DataError) as exc:
        RLHFDataset([missing], tokenizer, {}, config_key="data.val_files")
    msg = str(exc.value)
    assert "data.val_files" in msg and missing in msg and "examples/data_preprocess/" in msg


def test_missing_prompt_column_lists_columns(tokenizer, tmp_path):
    path = tmp_path / "q.parquet"
    pd.DataFrame({"question": ["a"], "answer": ["b"]}).to_parquet(path)
    msg = r"data\.prompt_key: column 'prompt' is not in .*\(its columns: question, answer\)"
    with pytest.raises(DataError, match=msg):
        RLHFDataset(str(path), tokenizer, {})


def test_prompt_that_is_not_a_chat_list(tokenizer, tmp_path):
    path = tmp_path / "s.parquet"
    pd.DataFrame({"prompt": ["plain text"]}).to_parquet(path)
    with pytest.raises(DataError, match=r"row 0 of .*holds str .*expected a non-empty chat list"):
        RLHFDataset(str(path), tokenizer, {})


def test_a_message_without_content_is_one_line(tokenizer, tmp_path):
    path = tmp_path / "m.parquet"
    pd.DataFrame({"prompt": [[{"role": "user", "content": "hi"}], [{"role": "user"}]]}).to_parquet(path)
    with pytest.raises(
        DataError,
        match=r"row 1 of .*message 0 of column 'prompt' is .*'role': 'user'.*; every "
        r"message needs a 'role' and a 'content'",
    ) as err:
        RLHFDataset(str(path), tokenizer, {})
    assert "\n" not in str(err.value)


def test_extra_info_that_is_not_a_dict_is_one_line(tokenizer, tmp_path):
    path = tmp_path / "e.parquet"
    pd.DataFrame({"prompt": [[{"role": "user", "content": "hi"}]], "extra_info": ["index 0"]}).to_parquet(path)
    with pytest.raises(DataError, match=r"row 0 of .*extra_info is str 'index 0', expected a dict"):
        RLHFDataset(str(path), tokenizer, {})


def test_bad_truncation_value(tokenizer, train_file):
    # the data section's own rule (DataConfig), run when the dataset types its section
    with pytest.raises(ConfigError, match=r"data\.truncation='top' is not one of error, left, right, middle"):
        RLHFDataset(train_file, tokenizer, {"truncation": "top"})


def test_several_files_and_home_expansion(tokenizer, gsm8k_parquet, monkeypatch):
    monkeypatch.setenv("HOME", str(gsm8k_parquet))
    ds = RLHFDataset(["~/train.parquet", "~/test.parquet"], tokenizer, {"max_prompt_length": 512})
    assert len(ds) == 96
    assert ds[64]["index"] == 0 and ds[64]["extra_info"]["split"] == "test"


def test_custom_columns_agent_name_kwargs_and_row_number_index(tokenizer, tmp_path):
    path = tmp_path / "agent.parquet"
    pd.DataFrame(
        {
            "messages": [[{"role": "user", "content": "2+2?"}], [{"role": "user", "content": "3+3?"}]],
            "agent_name": ["tool_agent", "single_turn_agent"],
            "extra_info": [{"tools_kwargs": {"calc": {"create_kwargs": {"answer": "4"}}}}, {"tools_kwargs": None}],
        }
    ).to_parquet(path)
    ds = RLHFDataset(str(path), tokenizer, {"prompt_key": "messages", "max_prompt_length": 64})
    first, second = ds[0], ds[1]
    assert first["agent_name"] == "tool_agent" and second["agent_name"] == "single_turn_agent"
    assert first["tools_kwargs"] == {"calc": {"create_kwargs": {"answer": "4"}}} and second["tools_kwargs"] == {}
    assert (first["index"], second["index"]) == (0, 1)  # no extra_info.index: the row number
    assert "3+3?" in tokenizer.decode(second["raw_prompt_ids"])


def test_max_samples_is_a_seeded_subset(tokenizer, train_file):
    a = RLHFDataset(train_file, tokenizer, {"max_prompt_length": 512, "seed": 7}, max_samples=10)
    b = RLHFDataset(train_file, tokenizer, {"max_prompt_length": 512, "seed": 7}, max_samples=10)
    idx = [a[i]["index"] for i in range(len(a))]
    assert len(a) == 10 and idx == [b[i]["index"] for i in range(10)]
    assert idx == sorted(set(idx)) and all(0 <= i < 64 for i in idx)


def test_the_runs_typed_section_and_a_mapping_give_the_same_rows_and_a_wrong_key_is_one_line(tokenizer, train_file):
    from hybridrl.config import ConfigError
    from tests.tiny_models import ppo_section

    # the PPO run hands its typed `data` section; `hybridrl generate` a mapping of a few keys
    typed = RLHFDataset(train_file, tokenizer, ppo_section("data", {"max_prompt_length": 256}))
    mapping = RLHFDataset(train_file, tokenizer, {"max_prompt_length": 256})
    assert torch.equal(typed.input_ids, mapping.input_ids) and typed.seed == mapping.seed == 1
    with pytest.raises(ConfigError, match=r"^data.max_prompt_len is not a key"):
        RLHFDataset(train_file, tokenizer, {"max_prompt_len": 256})
