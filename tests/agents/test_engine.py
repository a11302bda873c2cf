"""AsyncBatchEngine: concurrent loops share one batched generate; HFRollout.generate_token_ids:
token-in/token-out generation cut at EOS and stop strings."""

import asyncio
import threading

import pytest
import torch

from hybridrl.agents.engine import AsyncBatchEngine
from hybridrl.workers.rollout.hf import HFRollout, _trim_new_ids


class RecordingRollout:
    """generate_token_ids that answers each prompt with ``[len(prompt), 100, 101, ...]``."""

    def __init__(self, fail=False):
        self.batches = []
        self.fail = fail
        self.thread_ids = set()

    def generate_token_ids(self, prompt_ids, max_new_tokens, sampling_kwargs, stop_strings):
        self.thread_ids.add(threading.get_ident())
        self.batches.append((len(prompt_ids), max_new_tokens, sampling_kwargs, stop_strings))
        if self.fail:
            raise RuntimeError("engine broke")
        return [[len(p)] + list(range(100, 100 + max_new_tokens - 1)) for p in prompt_ids]


async def _loop(engine, prompt, max_new, sampling=None, stop=None, busy_s=0.0):
    async with engine.session():
        if busy_s:
            await asyncio.sleep(busy_s)  # e.g. waiting for a tool
        return await engine.generate(prompt, sampling, max_new, stop)


def test_ready_loops_are_batched_into_one_call_and_each_gets_its_own_length():
    rollout = RecordingRollout()

    async def main():
        engine = AsyncBatchEngine(rollout)
        out = await asyncio.gather(_loop(engine, [1, 2], 3), _loop(engine, [1, 2, 3], 5), _loop(engine, [7], 1))
        engine.close()
        return out

    out = asyncio.run(main())
    assert rollout.batches == [(3, 5, {}, None)]  # one call; the longest request sets max_new_tokens
    assert out == [[2, 100, 101], [3, 100, 101, 102, 103], [1]]
    assert threading.get_ident() not in rollout.thread_ids  # generation runs off the event loop


def test_different_sampling_or_stop_strings_go_in_separate_calls():
    rollout = RecordingRollout()

    async def main():
        engine = AsyncBatchEngine(rollout)
        await asyncio.gather(
            _loop(engine, [1], 2, {"temperature": 0.5}),
            _loop(engine, [2], 2, {"temperature": 0.5}),
            _loop(engine, [3], 2, {"do_sample": False}),
            _loop(engine, [4], 2, stop=["</s>"]),
        )
        engine.close()

    asyncio.run(main())
    assert sorted((b[0], tuple(b[2].items()), tuple(b[3] or ())) for b in rollout.batches) == [
        (1, (), ("</s>",)),
        (1, (("do_sample", False),), ()),
        (2, (("temperature", 0.5),), ()),
    ]


def test_a_loop_busy_with_a_tool_joins_the_next_batch_instead_of_stalling_this_one():
    rollout = RecordingRollout()

    async def main():
        engine = AsyncBatchEngine(rollout, max_wait_s=0.05)
        await asyncio.gather(_loop(engine, [1], 2, busy_s=0.5), _loop(engine, [2], 2), _loop(engine, [3], 2))
        engine.close()

    asyncio.run(main())
    assert [b[0] for b in rollout.batches] == [2, 1]


def test_errors_reach_every_waiting_loop_and_zero_tokens_need_no_call():
    rollout = RecordingRollout(fail=True)

    async def main():
        engine = AsyncBatchEngine(rollout)
        empty = await engine.generate([1], None, 0)
        results = await asyncio.gather(_loop(engine, [1], 2), _loop(engine, [2], 2), return_exceptions=True)
        engine.close()
        return empty, results

    empty, results = asyncio.run(main())
    assert empty == [] and len(rollout.batches) == 1
    assert all(isinstance(r, RuntimeError) and "engine broke" in str(r) for r in results)


# ---------------------------------------------------------------- HFRollout.generate_token_ids


def test_trim_cuts_at_the_first_eos_or_the_token_completing_a_stop_string(tokenizer):
    eos = tokenizer.eos_token_id
    head = tokenizer("<search> capital of France </search>", add_special_tokens=False)["input_ids"]
    tail = tokenizer(" more text", add_special_tokens=False)["input_ids"]
    # generate pads a sequence finished by a stop string with the pad (= EOS) id: cut before it
    assert _trim_new_ids(head + [eos, eos], [eos], ["</search>", "</answer>"], tokenizer) == head
    assert _trim_new_ids(head + tail, [eos], ["</search>"], tokenizer) == head
    assert _trim_new_ids(tail + [eos] + head, [eos], ["</search>"], tokenizer) == tail + [eos]
    assert _trim_new_ids(tail + [eos, eos], [eos], None, tokenizer) == tail + [eos]
    assert _trim_new_ids(tail, [eos], ["</answer>"], tokenizer) == tail


@pytest.fixture(scope="module")
def rollout(tiny_model_dir, tokenizer):
    from hybridrl.models import load_causal_lm

    model = load_causal_lm(tiny_model_dir)
    gen = torch.Generator().manual_seed(0)
    with torch.no_grad():  # noisy layers, so greedy output varies with the context
        for name, p in model.named_parameters():
            if ".layers." in name and p.dim() == 2:
                p.add_(0.3 * torch.randn(p.shape, generator=gen))
    from tests.tiny_models import ppo_section

    cfg = ppo_section(
        "actor_rollout_ref.rollout",
        {  # the engine reads the section as the run has it
            "dtype": "fp32",
            "response_length": 8,
            "do_sample": False,
            "temperature": 1.0,
            "top_p": 1.0,
            "top_k": -1,
            "micro_batch_size": 2,
        },
    )
    return HFRollout(model, cfg, tokenizer)


def test_generate_token_ids_matches_greedy_decoding_one_sequence_at_a_time(rollout, tokenizer):
    prompts = [tokenizer(t)["input_ids"] for t in ("Hello", "What is 2 + 3? Answer:", "The quick brown fox")]
    batched = rollout.generate_token_ids(prompts, 6, {"do_sample": False})
    assert len(batched) == 3 and all(1 <= len(ids) <= 6 for ids in batched)
    for prompt, ids in zip(prompts, batched):  # left padding changes nothing
        assert rollout.generate_token_ids([prompt], 6, {"do_sample": False}) == [ids]
        ids_ = list(prompt)
        with torch.no_grad():
            for _ in range(len(ids)):
                logits = rollout.module(torch.tensor([ids_])).logits[0, -1]
                ids_.append(int(logits.argmax()))
        assert ids_[len(prompt) :] == ids
