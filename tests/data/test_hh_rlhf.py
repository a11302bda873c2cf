"""HH-RLHF preprocess and the preference dataset, on the real shared data."""

import gzip
import json
import os

import pandas as pd
import pytest
from omegaconf import OmegaConf

from hybridrl.config.typed import to_dataclass
from hybridrl.data.errors import DataError
from hybridrl.data.preference_dataset import PreferenceDataset, encode_rm_inputs, pad_pairs
from hybridrl.data.preprocess import hh_rlhf
from hybridrl.trainer.jobs.supervised_config import RMDataConfig

HH_DIR = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", "..", "shared", "data", "hh_rlhf"))
HH_FILE = os.path.join(HH_DIR, "harmless-base-test.jsonl.gz")


def _data(keys: dict):
    """The ``data`` section as ``hybridrl rm`` hands it (typed, the packaged defaults) with ``keys`` set."""
    return OmegaConf.structured(to_dataclass(RMDataConfig, keys, "data"))


def test_split_pair_cuts_at_the_last_assistant_turn():
    chosen = "\n\nHuman: Hi\n\nAssistant: Hello!\n\nHuman: Tell me a joke\n\nAssistant: Why did the chicken..."
    rejected = "\n\nHuman: Hi\n\nAssistant: Hello!\n\nHuman: Tell me a joke\n\nAssistant: No."
    messages, good, bad = hh_rlhf.split_pair(chosen, rejected)
    assert messages == [
        {"role": "user", "content": "Hi"},
        {"role": "assistant", "content": "Hello!"},
        {"role": "user", "content": "Tell me a joke"},
    ]
    assert (good, bad) == ("Why did the chicken...", "No.")
    # different contexts or identical answers: no clean preference
    assert hh_rlhf.split_pair(chosen, "\n\nHuman: Bye\n\nAssistant: No.") is None
    assert hh_rlhf.split_pair(chosen, chosen) is None
    with pytest.raises(DataError, match="no '.*Assistant:' turn"):
        hh_rlhf.split_pair("\n\nHuman: only a question", rejected)


@pytest.fixture(scope="module")
def hh_parquet(tmp_path_factory):
    out = tmp_path_factory.mktemp("hh")
    hh_rlhf.main(["--input_dir", HH_DIR, "--local_dir", str(out)])
    return out


def test_real_file_becomes_rm_and_rl_parquet(hh_parquet):
    train, test = pd.read_parquet(hh_parquet / "train.parquet"), pd.read_parquet(hh_parquet / "test.parquet")
    with gzip.open(HH_FILE, "rt") as f:
        n_pairs = sum(1 for _ in f)
    assert n_pairs == 2312
    assert len(test) == round(n_pairs * 0.1)  # only a test file: 10% held out, seeded
    assert len(train) == n_pairs - len(test) - 5  # 5 train pairs have different prompts
    row = train.iloc[0]
    assert row["data_source"] == "Anthropic/hh-rlhf" and row["ability"] == "alignment"
    assert dict(row["reward_model"]) == {"style": "model", "ground_truth": row["chosen"]}
    assert [m["role"] for m in row["prompt"]][-1] == "user"
    assert (train["chosen"] != train["rejected"]).all()
    # the hold-out never overlaps the train split
    pairs = [set(zip(df["chosen"], df["rejected"])) for df in (train, test)]
    assert not pairs[0] & pairs[1]
    # the prompt + response is the original dialogue again
    with gzip.open(HH_FILE, "rt") as f:
        originals = {json.loads(line)["chosen"] for line in f}
    speaker = {"user": "Human", "assistant": "Assistant"}
    rebuilt = "".join(f"\n\n{speaker[m['role']]}: {m['content']}" for m in row["prompt"])
    assert any(o.startswith(rebuilt) and o.strip().endswith(row["chosen"]) for o in originals)


def test_preprocess_errors_are_one_line(tmp_path):
    with pytest.raises(SystemExit, match="hh_rlhf preprocess: error: --input_dir: .* is not a folder"):
        hh_rlhf.main(["--input_dir", str(tmp_path / "missing"), "--local_dir", str(tmp_path)])
    (tmp_path / "in").mkdir()
    (tmp_path / "in" / "train.jsonl").write_text('{"chosen": "x"}\n')
    with pytest.raises(SystemExit, match="train.jsonl:1: expected an object with 'chosen' and 'rejected'"):
        hh_rlhf.main(["--input_dir", str(tmp_path / "in"), "--local_dir", str(tmp_path)])


def test_encode_matches_the_policy_prompt_plus_response_plus_eos(tokenizer):
    chat = [{"role": "user", "content": "Is the sky blue?"}]
    ids = encode_rm_inputs(tokenizer, [chat], ["Yes."])[0]
    prompt = tokenizer.apply_chat_template(chat, add_generation_prompt=True, tokenize=False)
    expected = [
        *tokenizer(prompt, add_special_tokens=False)["input_ids"],
        *tokenizer("Yes.", add_special_tokens=False)["input_ids"],
    ]
    assert ids == expected + [tokenizer.eos_token_id]
    assert encode_rm_inputs(tokenizer, [chat], ["Yes."], ended=[False])[0] == expected  # cut off: no EOS


def test_dataset_reads_both_row_forms_the_same(hh_parquet, tokenizer, tmp_path):
    from_parquet = PreferenceDataset(str(hh_parquet / "test.parquet"), tokenizer, _data({"max_length": 4096}))
    # the same pairs as whole HH dialogues (no prompt column), in a jsonl file
    test = pd.read_parquet(hh_parquet / "test.parquet")
    speaker = {"user": "Human", "assistant": "Assistant"}
    lines = []
    for _, row in test.iterrows():
        context = "".join(f"\n\n{speaker[m['role']]}: {m['content']}" for m in row["prompt"])
        lines.append(
            {
                "chosen": f"{context}\n\nAssistant: {row['chosen']}",
                "rejected": f"{context}\n\nAssistant: {row['rejected']}",
            }
        )
    path = tmp_path / "whole.jsonl"
    path.write_text("\n".join(json.dumps(line) for line in lines))
    from_dialogues = PreferenceDataset(str(path), tokenizer, _data({"max_length": 4096}))
    assert from_dialogues.chosen == from_parquet.chosen and from_dialogues.rejected == from_parquet.rejected


def test_truncation_keeps_the_end_or_drops_or_fails(hh_parquet, tokenizer):
    path = str(hh_parquet / "test.parquet")
    full = PreferenceDataset(path, tokenizer, _data({"max_length": 4096}))
    cut = PreferenceDataset(path, tokenizer, _data({"max_length": 64}))
    assert len(cut) == len(full)
    for whole, short in zip(full.chosen, cut.chosen):
        assert short == whole[-64:]
    dropped = PreferenceDataset(path, tokenizer, _data({"max_length": 64, "truncation": "drop"}))
    assert len(dropped) == sum(max(len(c), len(r)) <= 64 for c, r in zip(full.chosen, full.rejected))
    with pytest.raises(DataError, match="data.max_length=64"):
        PreferenceDataset(path, tokenizer, _data({"max_length": 64, "truncation": "error"}))


def test_margin_column_and_bad_rows(tokenizer, tmp_path):
    rows = pd.DataFrame({"prompt": ["Q1", "Q2"], "chosen": ["a", "b"], "rejected": ["c", "d"], "gap": [1.5, 0.0]})
    rows.to_parquet(tmp_path / "m.parquet")
    ds = PreferenceDataset(str(tmp_path / "m.parquet"), tokenizer, _data({"margin_key": "gap"}))
    assert ds.margins == [1.5, 0.0] and ds[0]["margin"] == 1.5
    with pytest.raises(DataError, match="data.chosen_key: column 'better'"):
        PreferenceDataset(str(tmp_path / "m.parquet"), tokenizer, _data({"chosen_key": "better"}))
    with pytest.raises(DataError, match="data.train_files: file .* does not exist"):
        PreferenceDataset(str(tmp_path / "none.parquet"), tokenizer, _data({}))


def test_pad_pairs_puts_chosen_first_and_right_pads():
    batch = pad_pairs([[5, 6, 7], [8]], [[9, 10], [11, 12, 13, 14]], pad_token_id=0)
    assert batch["input_ids"].tolist() == [[5, 6, 7, 0], [8, 0, 0, 0], [9, 10, 0, 0], [11, 12, 13, 14]]
    assert batch["attention_mask"].sum(-1).tolist() == [3, 1, 2, 4]
    assert batch["position_ids"][1].tolist() == [0, 0, 0, 0] and batch["position_ids"][3].tolist() == [0, 1, 2, 3]
