"""Fixtures for the data tests: the real GSM8K files and a small parquet written from them."""

import os

import pytest

# The shared data sits beside the repository: <repo>/../shared/data (see its README).
GSM8K_DIR = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", "..", "shared", "data", "gsm8k"))


@pytest.fixture(scope="session")
def gsm8k_dir():
    assert os.path.isfile(os.path.join(GSM8K_DIR, "train.jsonl")), f"GSM8K jsonl files not found in {GSM8K_DIR}"
    return GSM8K_DIR


@pytest.fixture(scope="session")
def gsm8k_parquet(gsm8k_dir, tmp_path_factory):
    """Folder with train.parquet (64 rows) and test.parquet (32 rows) from the gsm8k preprocess."""
    from hybridrl.data.preprocess import gsm8k

    out = tmp_path_factory.mktemp("gsm8k_parquet")
    gsm8k.main(["--input_dir", gsm8k_dir, "--local_dir", str(out), "--train_size", "64", "--test_size", "32"])
    return out
