"""Shared helpers of the worker tests: hand-built left-padded prompt + response batches."""

import pytest
import torch

PAD = 2  # SmolLM2's pad == eos id (<|im_end|>)


def _build_batch(prompt_lens, response_lens, prompt_length=6, response_length=5, seed=0):
    """Tensors as the rollout hands them to the actor/critic.

    Row i: ``prompt_length - prompt_lens[i]`` pad tokens on the left, then random prompt ids;
    ``response_lens[i]`` valid response ids, then pad. ``attention_mask`` is the prompt mask
    followed by ``response_mask``; ``position_ids = clamp(cumsum(mask) - 1, 0)``.
    """
    gen = torch.Generator().manual_seed(seed)
    bs = len(prompt_lens)
    left_pad = torch.tensor([prompt_length - n for n in prompt_lens])[:, None]
    prompt_mask = (torch.arange(prompt_length) >= left_pad).long()
    response_mask = (torch.arange(response_length) < torch.tensor(response_lens)[:, None]).long()
    prompts = torch.randint(3, 2000, (bs, prompt_length), generator=gen).masked_fill(prompt_mask == 0, PAD)
    responses = torch.randint(3, 2000, (bs, response_length), generator=gen).masked_fill(response_mask == 0, PAD)
    attention_mask = torch.cat([prompt_mask, response_mask], dim=1)
    return {
        "prompts": prompts,
        "responses": responses,
        "response_mask": response_mask,
        "input_ids": torch.cat([prompts, responses], dim=1),
        "attention_mask": attention_mask,
        "position_ids": (attention_mask.cumsum(-1) - 1).clamp(min=0),
    }


@pytest.fixture(autouse=True, scope="module")
def _one_torch_thread():
    """The tiny model's ops are too small to gain from threads, and on a shared 2-core machine
    OpenMP spin-waiting made this folder ~6x slower (56 s vs 8 s); restored afterwards."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture
def make_batch():
    return _build_batch
