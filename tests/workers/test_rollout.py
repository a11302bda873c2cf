"""HFRollout and get_response_mask: output layout, EOS handling, greedy decoding against a
hand-written argmax loop, and weight sync into a bf16 copy."""

import copy
from types import SimpleNamespace

import pytest
import torch

from hybridrl.protocol import DataProto
from hybridrl.workers.rollout.base import eos_token_ids, get_response_mask
from hybridrl.workers.rollout.hf import HFRollout
from tests.tiny_models import ppo_section

R = 8  # response_length
TEXTS = ["Hello", "What is 2 + 3? Answer:", "The quick brown fox jumps"]


# ----------------------------------------------------------------------------- eos_token_ids


def test_eos_token_ids_generation_config_first_then_tokenizer_without_repeats():
    tokenizer = SimpleNamespace(eos_token_id=2)
    assert eos_token_ids(tokenizer, SimpleNamespace(eos_token_id=[7, 2, 7])) == [7, 2]
    assert eos_token_ids(tokenizer, SimpleNamespace(eos_token_id=5)) == [5, 2]
    assert eos_token_ids(tokenizer, None) == [2]


def test_eos_token_ids_refuses_a_tokenizer_without_eos():
    with pytest.raises(ValueError, match="no eos_token"):
        eos_token_ids(SimpleNamespace(eos_token_id=None), SimpleNamespace(eos_token_id=None))


# ----------------------------------------------------------------------------- get_response_mask


def test_response_mask_stops_after_first_eos():
    responses = torch.tensor(
        [
            [5, 2, 7, 2],  # eos at 1: keep it, drop the rest (a second eos changes nothing)
            [2, 9, 9, 9],  # eos first
            [4, 4, 4, 4],  # no eos: all ones
            [3, 8, 1, 2],  # 8 is an eos only in the two-id case
        ]
    )
    expected_one = torch.tensor([[1, 1, 0, 0], [1, 0, 0, 0], [1, 1, 1, 1], [1, 1, 1, 1]])
    expected_two = torch.tensor([[1, 1, 0, 0], [1, 0, 0, 0], [1, 1, 1, 1], [1, 1, 0, 0]])
    assert torch.equal(get_response_mask(responses, [2]), expected_one)
    assert torch.equal(get_response_mask(responses, [2, 8]), expected_two)
    assert torch.equal(get_response_mask(responses, [8, 2]), expected_two)
    assert torch.equal(get_response_mask(responses, [99]), torch.ones(4, 4, dtype=torch.long))
    assert not get_response_mask(responses, [2]).is_floating_point()


# ----------------------------------------------------------------------------- HFRollout


@pytest.fixture(scope="module")
def base_model(tiny_model_dir, device):
    from hybridrl.models import load_causal_lm

    return load_causal_lm(tiny_model_dir).to(device)


@pytest.fixture(scope="module")
def scrambled_model(base_model):
    """The tiny model with noisy layers: its greedy output varies (the random-init one only
    repeats its last input token), so an EOS can be met mid-response."""
    model = copy.deepcopy(base_model)
    gen = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if ".layers." in name and p.dim() == 2:
                p.add_(0.3 * torch.randn(p.shape, generator=gen).to(p.device))
    return model


@pytest.fixture(scope="module")
def prompts(tokenizer):
    """Real prompts, left-padded by hand (the shared tokenizer pads on the right)."""
    rows = [tokenizer(t)["input_ids"] for t in TEXTS]
    P = max(map(len, rows))
    pad = tokenizer.pad_token_id
    input_ids = torch.tensor([[pad] * (P - len(r)) + r for r in rows])
    attention_mask = torch.tensor([[0] * (P - len(r)) + [1] * len(r) for r in rows])
    assert len({len(r) for r in rows}) == len(rows)  # different lengths: real left padding
    position_ids = (attention_mask.cumsum(-1) - 1).clamp(min=0)
    return DataProto.from_dict(
        tensors={"input_ids": input_ids, "attention_mask": attention_mask, "position_ids": position_ids}
    )


def _rollout_config(dtype, do_sample=False, **extra):
    return ppo_section(
        "actor_rollout_ref.rollout",
        {
            "name": "hf",
            "dtype": dtype,
            "response_length": R,
            "do_sample": do_sample,
            "temperature": 1.0,
            "top_p": 1.0,
            "top_k": -1,
            **extra,
        },
    )


@torch.no_grad()
def _greedy_loop(model, input_ids, attention_mask, steps=R):
    """Plain argmax decoding with a KV cache (the same numerics as generate's decode loop), on
    the model's device; the tokens come back on the CPU, as the rollout's do."""
    from transformers import DynamicCache

    model.eval()
    input_ids, attention_mask = input_ids.to(model.device), attention_mask.to(model.device)
    cache, ids, mask, out = DynamicCache(), input_ids, attention_mask, []
    positions = (attention_mask.cumsum(-1) - 1).clamp(min=0)
    for _ in range(steps):
        logits = model(
            input_ids=ids, attention_mask=mask, position_ids=positions, past_key_values=cache, use_cache=True
        ).logits[:, -1]
        token = logits.float().argmax(-1, keepdim=True)
        out.append(token)
        mask = torch.cat([mask, torch.ones_like(token)], dim=1)
        ids, positions = token, positions[:, -1:] + 1
    return torch.cat(out, dim=1).cpu()


def _truncate_at_eos(tokens, eos_ids, pad):
    """Hand rule: keep tokens up to and including the first eos, pad after."""
    out = tokens.clone()
    for row in out:
        hits = [i for i, t in enumerate(row.tolist()) if t in eos_ids]
        if hits:
            row[hits[0] + 1 :] = pad
    return out


@pytest.fixture(scope="module")
def greedy_reference(base_model, prompts):
    """``{dtype name: (bs, R) argmax tokens}`` of the plain loop, computed once per dtype."""
    cache = {}

    def get(dtype):
        if dtype not in cache:
            model = copy.deepcopy(base_model).to(getattr(torch, dtype))
            cache[dtype] = _greedy_loop(model, prompts.batch["input_ids"], prompts.batch["attention_mask"])
        return cache[dtype]

    return get


def _check_layout(out, prompts, tokenizer):
    """Keys, shapes, EOS/pad rule, attention mask and positions of a rollout's output."""
    bs, P = prompts.batch["input_ids"].shape
    b = out.batch
    assert {"prompts", "responses", "input_ids", "attention_mask", "position_ids", "response_mask"} <= set(b.keys())
    assert b["prompts"].shape == (bs, P) and torch.equal(b["prompts"], prompts.batch["input_ids"])
    assert b["responses"].shape == b["response_mask"].shape == (bs, R)
    for key in ("input_ids", "attention_mask", "position_ids"):
        assert b[key].shape == (bs, P + R), key
    assert torch.equal(b["input_ids"], torch.cat([b["prompts"], b["responses"]], dim=1))
    assert torch.equal(b["attention_mask"][:, :P], prompts.batch["attention_mask"])
    assert torch.equal(b["attention_mask"][:, P:], b["response_mask"].to(b["attention_mask"].dtype))
    assert (b["responses"][b["response_mask"] == 0] == tokenizer.pad_token_id).all()
    # positions: the prompt's own, then last prompt position + 1, + 2, ... on valid tokens
    assert torch.equal(b["position_ids"][:, :P], prompts.batch["position_ids"])
    expected = prompts.batch["attention_mask"].sum(-1, keepdim=True) + torch.arange(R)
    valid = b["response_mask"].bool()
    assert torch.equal(b["position_ids"][:, P:][valid], expected[valid])


@pytest.mark.cuda
def test_repetition_penalty_changes_greedy_output(base_model, prompts, greedy_reference):
    """Sensitivity of the next test: a repetition penalty of 1.5 changes greedy decoding here."""
    from transformers import GenerationConfig

    ids, mask = prompts.batch["input_ids"].to(base_model.device), prompts.batch["attention_mask"].to(base_model.device)
    penalised = base_model.generate(
        input_ids=ids,
        attention_mask=mask,
        generation_config=GenerationConfig(
            max_new_tokens=R, do_sample=False, repetition_penalty=1.5, eos_token_id=None, pad_token_id=2
        ),
    )
    assert not torch.equal(penalised[:, ids.shape[1] :].cpu(), greedy_reference("float32"))


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.cuda
def test_greedy_equals_argmax_loop_despite_model_generation_defaults(
    base_model, prompts, tokenizer, greedy_reference, dtype
):
    module = copy.deepcopy(base_model)
    module.generation_config.repetition_penalty = 1.5  # a model default that must not leak in
    rollout = HFRollout(module, _rollout_config(dtype), tokenizer, module.generation_config)
    out = rollout.generate_sequences(prompts)
    _check_layout(out, prompts, tokenizer)
    expected = _truncate_at_eos(greedy_reference(dtype), {tokenizer.eos_token_id}, tokenizer.pad_token_id)
    assert torch.equal(out.batch["responses"], expected)


@pytest.mark.cuda
def test_sampling_with_top_k_1_is_greedy(base_model, prompts, tokenizer, greedy_reference):
    rollout = HFRollout(copy.deepcopy(base_model), _rollout_config("float32", do_sample=True), tokenizer)
    sampled = DataProto.from_dict(tensors=dict(prompts.batch.items()), meta_info={"top_k": 1, "temperature": 0.9})
    out = rollout.generate_sequences(sampled)
    _check_layout(out, prompts, tokenizer)
    expected = _truncate_at_eos(greedy_reference("float32"), {tokenizer.eos_token_id}, tokenizer.pad_token_id)
    assert torch.equal(out.batch["responses"], expected)


@pytest.mark.cuda
def test_sampling_bf16_layout(scrambled_model, prompts, tokenizer):
    torch.manual_seed(0)
    rollout = HFRollout(copy.deepcopy(scrambled_model), _rollout_config("bfloat16", do_sample=True), tokenizer)
    _check_layout(rollout.generate_sequences(prompts), prompts, tokenizer)


@pytest.mark.cuda
def test_model_top_k_default_does_not_truncate_sampling(scrambled_model, prompts, tokenizer):
    """``model.generation_config.top_k = 1`` would make sampling greedy if it leaked in."""
    module = copy.deepcopy(scrambled_model)
    ids, mask = prompts.batch["input_ids"], prompts.batch["attention_mask"]
    with torch.no_grad():
        first = torch.softmax(
            module(input_ids=ids.to(module.device), attention_mask=mask.to(module.device)).logits[:, -1].float(), -1
        )
    assert first.max() < 0.5  # not peaked: 3 rows x 8 samples all equal to the argmax is ~impossible
    greedy = _greedy_loop(module, ids, mask)
    module.generation_config.top_k = 1
    rollout = HFRollout(module, _rollout_config("float32", do_sample=True), tokenizer, module.generation_config)
    torch.manual_seed(0)
    out = rollout.generate_sequences(prompts)
    greedy = _truncate_at_eos(greedy, {tokenizer.eos_token_id}, tokenizer.pad_token_id)
    assert not torch.equal(out.batch["responses"], greedy)


def _mid_sequence_token(reference):
    """(row, step) of a token first emitted at step >= 2 of its row."""
    return next(
        (r, s)
        for r in range(len(reference))
        for s in range(2, R - 1)
        if reference[r, s].item() not in reference[r, :s].tolist()
    )


@pytest.mark.cuda
def test_eos_ends_response_and_pads_after(scrambled_model, prompts, tokenizer):
    """Declare as EOS a token the greedy loop emits mid-sequence: the rollout must stop there."""
    base_model = scrambled_model
    reference = _greedy_loop(base_model, prompts.batch["input_ids"], prompts.batch["attention_mask"])
    row, step = _mid_sequence_token(reference)
    eos = {reference[row, step].item(), tokenizer.eos_token_id}
    pad = tokenizer.pad_token_id
    rollout = HFRollout(
        copy.deepcopy(base_model),
        _rollout_config("float32"),
        tokenizer,
        SimpleNamespace(eos_token_id=[reference[row, step].item()]),
    )
    out = rollout.generate_sequences(prompts)
    _check_layout(out, prompts, tokenizer)
    out = out.batch
    assert torch.equal(out["responses"], _truncate_at_eos(reference, eos, pad))
    assert out["response_mask"][row].tolist() == [1] * (step + 1) + [0] * (R - step - 1)
    assert (out["responses"][row, step + 1 :] == pad).all()

    # Every row stops at its first token: generate returns 1 column, padded back to R.
    first = [t for t in reference[:, 0].tolist()]
    rollout = HFRollout(
        copy.deepcopy(base_model), _rollout_config("float32"), tokenizer, SimpleNamespace(eos_token_id=first)
    )
    out = rollout.generate_sequences(prompts).batch
    assert out["responses"].shape == (len(first), R)
    assert torch.equal(out["responses"][:, 0], reference[:, 0])
    assert (out["responses"][:, 1:] == pad).all()
    assert out["response_mask"].tolist() == [[1] + [0] * (R - 1)] * len(first)


@pytest.mark.cuda
def test_sync_weights_copies_updated_actor_into_bf16_rollout(base_model, tokenizer):
    actor = copy.deepcopy(base_model)
    rollout = HFRollout(actor, _rollout_config("bfloat16"), tokenizer)
    assert rollout.module is not actor
    assert all(p.dtype == torch.bfloat16 for p in rollout.module.parameters())

    gen = torch.Generator().manual_seed(0)
    with torch.no_grad():  # stands in for an optimizer step on the fp32 actor
        for p in actor.parameters():
            p.add_(0.05 * torch.randn(p.shape, generator=gen).to(p.device))
    stale = dict(rollout.module.named_parameters())
    assert any(not torch.equal(stale[n], p.to(torch.bfloat16)) for n, p in actor.named_parameters())

    before = {n: p.detach().clone() for n, p in actor.named_parameters()}
    rollout.sync_weights(actor)
    synced = dict(rollout.module.state_dict())
    for name, p in actor.state_dict().items():
        assert synced[name].dtype == torch.bfloat16, name
        assert torch.equal(synced[name], p.to(torch.bfloat16)), name
    for name, p in actor.named_parameters():  # the actor's fp32 master weights are untouched
        assert p.dtype == torch.float32 and torch.equal(p, before[name]), name


@pytest.mark.cuda
def test_ignore_eos_generates_full_length(scrambled_model, prompts, tokenizer):
    reference = _greedy_loop(scrambled_model, prompts.batch["input_ids"], prompts.batch["attention_mask"])
    row, step = _mid_sequence_token(reference)
    rollout = HFRollout(
        copy.deepcopy(scrambled_model),
        _rollout_config("float32", ignore_eos=True),
        tokenizer,
        SimpleNamespace(eos_token_id=[reference[row, step].item()]),
    )
    out = rollout.generate_sequences(prompts).batch
    assert torch.equal(out["response_mask"], torch.ones(len(reference), R, dtype=out["response_mask"].dtype))
    assert torch.equal(out["responses"], reference)  # the EOS is an ordinary token: decoding goes on
