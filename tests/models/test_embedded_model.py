"""The embedded SmolLM2-135M-Instruct: the real GGUF -> HF conversion and its cache.

The conversion (~20-60 s on 2 cores) happens once into the persistent cache (`smollm2_dir`
fixture); the reference GGUF load in the logits test costs ~20 s on every run.
"""

import os
import time

import pytest
import torch

from hybridrl.models import embedded_model_gguf, load_causal_lm, load_tokenizer, resolve_model_path


def test_cache_hit_does_not_reconvert(smollm2_dir):
    weights = os.path.join(smollm2_dir, "model.safetensors")
    mtime = os.stat(weights).st_mtime_ns
    start = time.perf_counter()
    again = resolve_model_path("smollm2-135m-instruct")
    assert again == smollm2_dir
    assert time.perf_counter() - start < 1.0
    assert os.stat(weights).st_mtime_ns == mtime


def test_converted_folder_is_a_complete_hf_model(smollm2_dir):
    names = set(os.listdir(smollm2_dir))
    assert {"config.json", "model.safetensors", "generation_config.json", "tokenizer.json"} <= names
    tok = load_tokenizer(smollm2_dir)
    assert tok.eos_token == "<|im_end|>" and tok.pad_token_id is not None
    chat = [{"role": "user", "content": "Hi"}]
    prompt = tok.apply_chat_template(chat, tokenize=False, add_generation_prompt=True)
    assert prompt.endswith("<|im_start|>assistant\n")


@pytest.mark.slow
def test_converted_logits_equal_the_gguf_model(smollm2_dir):
    from transformers import AutoModelForCausalLM

    gguf = embedded_model_gguf()
    folder, name = os.path.split(gguf)
    reference = AutoModelForCausalLM.from_pretrained(folder, gguf_file=name)
    converted = AutoModelForCausalLM.from_pretrained(smollm2_dir)
    assert converted.config.tie_word_embeddings
    assert not hasattr(converted.config, "quantization_config")
    input_ids = torch.tensor([[1, 504, 3458, 282, 4649, 314, 2]])
    with torch.no_grad():
        expected = reference(input_ids=input_ids).logits
        got = converted(input_ids=input_ids).logits
        trainable = load_causal_lm(smollm2_dir)(input_ids=input_ids).logits
    assert got.shape == (1, 7, 49152)
    torch.testing.assert_close(got, expected, rtol=0, atol=1e-5)
    torch.testing.assert_close(trainable, expected, rtol=0, atol=1e-4)
