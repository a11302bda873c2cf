"""Ulysses sequence parallelism (hybridrl.models.ulysses, hybridrl.workers.sequence_parallel).

One process: the layout helpers (split / all-to-all / gather round trips, simulated exchange),
the block-diagonal mask against transformers' own, what a model must have to be split, and the
start-up rules. Two CPU processes (torch.multiprocessing spawn, Gloo): the collectives and their
gradients, a model with fewer KV heads than SP ranks, and the real workers: SP=2 on 2 workers
gives the log-probs, losses, gradients and updated weights of one worker without SP (actor,
reference, critic), to 1e-5 in fp32.
"""

import os
import socket
import sys

import pytest
import torch

from hybridrl.config import load_config
from hybridrl.errors import ConfigError
from hybridrl.models.attention import use_ulysses_attention
from hybridrl.models.padding import pack_sequences
from hybridrl.models.ulysses import (
    SequenceParallelError,
    assemble,
    from_receive_buffer,
    heads_problem,
    packed_causal_mask,
    send_buffer,
    split_packed,
)
from hybridrl.protocol import DataProto
from tests.tiny_models import actor_batch_sizes

A = "actor_rollout_ref.actor"
ATOL = 1e-5
PROMPT_LENS = [6, 3, 1, 4, 5, 2, 6, 2]
RESPONSE_LENS = [5, 2, 4, 1, 3, 5, 1, 2]


# ---- one process: layouts -----------------------------------------------------------------------


def _simulated_all_to_all(inputs: list[torch.Tensor], scatter_dim: int, gather_dim: int) -> list[torch.Tensor]:
    """What all_to_all_single does between len(inputs) ranks, with the module's own buffers."""
    sends = [send_buffer(x, len(inputs), scatter_dim) for x in inputs]
    return [from_receive_buffer(torch.stack([send[r] for send in sends]), gather_dim) for r in range(len(inputs))]


@pytest.mark.parametrize("size", [2, 4])
def test_seq_to_heads_layout_and_round_trip(size):
    full = torch.randn(2, 8, 12, 3)  # (rows, heads, seq, dim)
    seq = 12 // size
    slices = [full[:, :, r * seq : (r + 1) * seq] for r in range(size)]
    heads = _simulated_all_to_all(slices, scatter_dim=1, gather_dim=2)
    for r, h in enumerate(heads):  # rank r: heads block r of the whole sequence
        torch.testing.assert_close(h, full[:, r * 8 // size : (r + 1) * 8 // size], rtol=0, atol=0)
    back = _simulated_all_to_all(heads, scatter_dim=2, gather_dim=1)
    for r in range(size):
        torch.testing.assert_close(back[r], slices[r], rtol=0, atol=0)


def test_pack_pad_split_gather_round_trip():
    gen = torch.Generator().manual_seed(0)
    mask = (torch.arange(7) >= torch.tensor([2, 0, 5, 1])[:, None]).long()
    ids = torch.randint(3, 100, (4, 7), generator=gen) * mask
    packed = pack_sequences(ids, mask, (mask.cumsum(-1) - 1).clamp(min=0), max_row_tokens=9, row_multiple=4)
    rows, row_len = packed.input_ids.shape
    assert row_len % 4 == 0 and rows >= 2
    positions = packed.token_index[mask.bool()]  # every valid token
    parts = [split_packed(packed.input_ids, packed.position_ids, positions, r, 4) for r in range(4)]
    torch.testing.assert_close(torch.cat([p[0] for p in parts], dim=1), packed.input_ids, rtol=0, atol=0)
    torch.testing.assert_close(torch.cat([p[1] for p in parts], dim=1), packed.position_ids, rtol=0, atol=0)
    owner = parts[0][3]
    local_values = []
    for r, (local_ids, _, local_positions, _) in enumerate(parts):
        local_values.append(local_ids.flatten()[local_positions])  # each rank reads its own tokens
        torch.testing.assert_close(local_values[-1], ids[mask.bool()][owner == r], rtol=0, atol=0)
    padded = [torch.nn.functional.pad(v, (0, 3)) for v in local_values]  # as the all-gather pads
    torch.testing.assert_close(assemble(padded, owner), ids[mask.bool()], rtol=0, atol=0)


def test_packed_mask_is_the_one_transformers_builds():
    from transformers import LlamaConfig
    from transformers.masking_utils import create_causal_mask

    config = LlamaConfig(vocab_size=64, hidden_size=32, num_hidden_layers=1, num_attention_heads=4)
    config._attn_implementation = "sdpa"
    position_ids = torch.tensor([[0, 1, 2, 0, 1, 0, 1, 2, 3, 4], [0, 1, 2, 3, 0, 1, 2, 0, 1, 2]])
    theirs = create_causal_mask(
        config=config,
        inputs_embeds=torch.zeros(2, 10, 32),
        attention_mask=None,
        past_key_values=None,
        position_ids=position_ids,
    )
    torch.testing.assert_close(packed_causal_mask(position_ids), theirs, rtol=0, atol=0)


def test_one_sequence_per_row_needs_no_mask():
    """Plain causal attention (SDPA without a dense L x L mask) when no row holds two sequences;
    the same attention as the block-diagonal mask would give."""
    position_ids = torch.arange(6).expand(2, -1)
    assert packed_causal_mask(position_ids) is None
    assert packed_causal_mask(torch.tensor([[0, 1, 2, 0, 1, 2]])) is not None  # two sequences
    q, k, v = (torch.randn(2, 4, 6, 8, generator=torch.Generator().manual_seed(i)) for i in range(3))
    causal = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
    masked = torch.nn.functional.scaled_dot_product_attention(
        q, k, v, attn_mask=torch.ones(6, 6, dtype=torch.bool).tril()
    )
    torch.testing.assert_close(causal, masked)


# ---- one process: what can be split ------------------------------------------------------------


def test_heads_rules():
    assert heads_problem(4, 2, 2) is None
    assert heads_problem(4, 2, 4) is None  # 2 KV heads repeated to 4
    assert heads_problem(8, 1, 2) is None
    assert "num_attention_heads (4)" in heads_problem(4, 2, 3)
    assert "num_key_value_heads (3)" in heads_problem(6, 3, 2)


def test_use_ulysses_attention_switches_a_llama_and_refuses_others():
    from transformers import BloomConfig, BloomForCausalLM, LlamaConfig, LlamaForCausalLM

    llama = LlamaForCausalLM(
        LlamaConfig(
            vocab_size=64,
            hidden_size=32,
            num_hidden_layers=1,
            num_attention_heads=4,
            num_key_value_heads=2,
            intermediate_size=32,
        )
    )
    use_ulysses_attention(llama, 2, "k")
    assert llama.config._attn_implementation == "hybridrl"
    with pytest.raises(SequenceParallelError, match=r"k=3: it must divide the model's num_attention_heads \(4\)"):
        use_ulysses_attention(llama, 3, "k")
    bloom = BloomForCausalLM(BloomConfig(vocab_size=64, hidden_size=32, n_layer=1, n_head=4))
    with pytest.raises(SequenceParallelError, match="BloomForCausalLM does not use transformers' attention interface"):
        use_ulysses_attention(bloom, 2, "k")


# ---- one process: start-up rules ---------------------------------------------------------------


def _check(world_size, model_dir, size, *more):
    """The start-up check of a small valid GRPO config (6 prompts x 2 responses, mini batch 3)."""
    from hybridrl.trainer.ppo.config_check import validate_ppo_config

    overrides = [
        "algorithm.adv_estimator=grpo",
        "data.train_batch_size=6",
        f"{A}.ppo_mini_batch_size=3",
        f"{A}.ppo_micro_batch_size_per_gpu=1",
        "actor_rollout_ref.rollout.n=2",
        f"actor_rollout_ref.model.path={model_dir}",
        f"{A}.ulysses_sequence_parallel_size={size}",
        *more,
    ]
    return validate_ppo_config(load_config(overrides), world_size=world_size)


def test_sequence_parallel_is_noted_once(tiny_model_dir):
    notes = [n for n in _check(2, tiny_model_dir, 2) if "ulysses" in n]
    assert len(notes) == 1 and "Ulysses sequence parallelism on; 2 workers form 1 group(s) of 2" in notes[0]
    assert not [n for n in _check(2, tiny_model_dir, 1) if "ulysses" in n]


def test_size_must_divide_the_workers(tiny_model_dir):
    with pytest.raises(ConfigError, match=r"ulysses_sequence_parallel_size=2 must divide the number of workers \(3"):
        _check(3, tiny_model_dir, 2)


def test_size_must_divide_the_heads(tiny_model_dir):
    with pytest.raises(ConfigError, match=r"=3: it must divide the model's num_attention_heads \(4\)"):
        _check(3, tiny_model_dir, 3)


def test_size_needs_remove_padding(tiny_model_dir):
    with pytest.raises(ConfigError, match="needs actor_rollout_ref.model.use_remove_padding=true"):
        _check(2, tiny_model_dir, 2, "actor_rollout_ref.model.use_remove_padding=false")


def test_size_needs_a_splittable_architecture(tmp_path):
    from transformers import BloomConfig

    BloomConfig(vocab_size=64, hidden_size=32, n_layer=1, n_head=4, architectures=["BloomForCausalLM"]).save_pretrained(
        tmp_path
    )
    with pytest.raises(ConfigError, match="BloomForCausalLM does not use transformers' attention interface"):
        _check(2, str(tmp_path), 2)


def test_size_below_one_and_a_different_reference_size(tiny_model_dir):
    with pytest.raises(ConfigError, match=r"ulysses_sequence_parallel_size=0 must be >= 1"):
        _check(2, tiny_model_dir, 0)
    with pytest.raises(ConfigError, match="ref.ulysses_sequence_parallel_size=1 must equal"):
        _check(2, tiny_model_dir, 2, "actor_rollout_ref.ref.ulysses_sequence_parallel_size=1")


def test_critic_size_rules(tiny_model_dir):
    with pytest.raises(
        ConfigError,
        match="critic.ulysses_sequence_parallel_size=2 splits packed sequences: it "
        "needs critic.model.use_remove_padding=true",
    ):
        _check(
            2,
            tiny_model_dir,
            1,
            "algorithm.adv_estimator=gae",
            "critic.ppo_micro_batch_size_per_gpu=1",
            "critic.ulysses_sequence_parallel_size=2",
            "critic.model.use_remove_padding=false",
        )


# ---- two processes: SP=2 on 2 workers against one worker ----------------------------------------


def _actor_config(model_dir: str, sp: int):
    """4 prompts x 2 responses, one mini batch, micro batches of 2 rows; entropy bonus and KL loss on
    (more gradient paths through the gathered outputs); fp32."""
    cfg = load_config(
        [
            f"actor_rollout_ref.model.path={model_dir}",
            "data.train_batch_size=4",
            f"{A}.fsdp_config.mixed_precision.param_dtype=fp32",
            f"{A}.ppo_mini_batch_size=4",
            f"{A}.ppo_micro_batch_size_per_gpu=2",
            f"{A}.optim.lr=1e-2",
            f"{A}.entropy_coeff=0.01",
            f"{A}.use_kl_loss=true",
            f"{A}.ulysses_sequence_parallel_size={sp}",
            "actor_rollout_ref.rollout.n=2",
            "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=2",
            f"critic.model.path={model_dir}-value",
            "critic.ppo_micro_batch_size_per_gpu=2",
            "critic.model.fsdp_config.mixed_precision.param_dtype=fp32",
            "critic.optim.lr=1e-3",
            f"critic.ulysses_sequence_parallel_size={sp}",
        ]
    )
    return cfg.actor_rollout_ref, cfg.critic


def _batch() -> DataProto:
    sys.path.insert(0, os.path.dirname(__file__))
    from conftest import _build_batch

    b = _build_batch(PROMPT_LENS, RESPONSE_LENS, seed=0)
    gen = torch.Generator().manual_seed(1)
    mask = b["response_mask"]
    b["advantages"] = torch.randn(mask.shape, generator=gen) * mask
    b["values"] = torch.randn(mask.shape, generator=gen) * mask
    b["returns"] = torch.randn(mask.shape, generator=gen) * mask
    return DataProto.from_dict(tensors=b)


def _capture_grads(module, optimizer) -> dict:
    """The whole gradient of every parameter at each optimizer step (after clipping), by name."""
    grads = {}
    step = optimizer.step

    def capturing_step(*args, **kwargs):
        for name, p in module.named_parameters():
            if p.grad is not None:
                grads[name] = (p.grad.full_tensor() if hasattr(p.grad, "full_tensor") else p.grad).detach().clone()
        return step(*args, **kwargs)

    optimizer.step = capturing_step
    return grads


def _run_workers(sp: int, model_dir: str, rank: int = 0) -> dict:
    """The actor (with its reference) and the critic through their registered methods, on this
    rank's share of the batch as the driver's dispatch splits it (all of it with one worker)."""
    from hybridrl.config import worker_batch_sizes
    from hybridrl.controller.decorator import Dispatch, dispatch_args
    from hybridrl.models.materialize import iter_full_weights
    from hybridrl.workers.fsdp_workers import ActorRolloutRefWorker, CriticWorker

    actor_cfg, critic_cfg = _actor_config(model_dir, sp)
    world = 2 if sp > 1 else 1
    per_rank_args, _, _ = dispatch_args(Dispatch.DP_COMPUTE_PROTO, world, (_batch(),), {})
    (mine,) = per_rank_args[rank]
    actor = ActorRolloutRefWorker(actor_cfg, actor_batch_sizes(actor_cfg, world), role="actor_ref", device="cpu")
    actor.init_model()
    out = {"log_probs": actor.compute_log_prob(mine).batch, "ref": actor.compute_ref_log_prob(mine).batch}
    # ratio 1 and a small KL: no token is clipped, so the gradient has norm ~1 (random old log-probs
    # clip most tokens and leave a gradient of ~1e-4, below what a 1e-5 comparison can tell apart)
    mine.batch["old_log_probs"] = out["log_probs"]["old_log_probs"]
    mine.batch["ref_log_prob"] = out["ref"]["ref_log_prob"] - 0.1 * mine.batch["response_mask"]
    grads = _capture_grads(actor.actor.actor_module, actor.actor_optimizer)
    out["actor_metrics"] = actor.update_actor(mine).meta_info["metrics"]
    out["actor_grads"] = grads
    out["actor_weights"] = dict(iter_full_weights(actor.actor.actor_module))
    critic = CriticWorker(critic_cfg, worker_batch_sizes(critic_cfg, 2, world), device="cpu")
    critic.init_model()
    out["values"] = critic.compute_values(mine).batch["values"]
    grads = _capture_grads(critic.critic.critic_module, critic.critic_optimizer)
    out["critic_metrics"] = critic.update_critic(mine).meta_info["metrics"]
    out["critic_grads"] = grads
    out["values_after"] = critic.compute_values(mine).batch["values"]
    out["sp_sizes"] = (actor.actor.sp_size, actor.ref_policy.sp_size, critic.critic.sp_size)
    return out


def _kv_repeat_check() -> dict:
    """A model with 1 KV head at SP=2 (the KV head is repeated before the exchange): log-probs,
    entropies and the gradient (averaged over the ranks, as FSDP does) against one whole forward."""
    import copy

    import torch.distributed as dist
    from transformers import LlamaConfig, LlamaForCausalLM

    from hybridrl.workers.model_forward import ForwardOptions, forward_response
    from hybridrl.workers.sequence_parallel import sequence_parallel_group

    torch.manual_seed(0)
    model = LlamaForCausalLM(
        LlamaConfig(
            vocab_size=2048,
            hidden_size=32,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=1,
            intermediate_size=64,
        )
    )
    split = copy.deepcopy(model)
    sp = sequence_parallel_group(2, "k")
    use_ulysses_attention(split, 2, "k")
    batch = _batch().select(batch_keys=["responses", "input_ids", "attention_mask", "position_ids"])
    diffs = {}
    results = []
    for module, options in (
        (model, ForwardOptions(use_remove_padding=True)),
        (split, ForwardOptions(use_remove_padding=True, sequence_parallel=sp)),
    ):
        out = forward_response(module, batch, 0.7, torch.float32, options, calculate_entropy=True)
        grads = torch.autograd.grad(out.log_probs.sum() + out.entropy.sum(), list(module.parameters()))
        results.append((out, grads))
    (whole, whole_grads), (parts, part_grads) = results
    diffs["log_probs"] = (whole.log_probs - parts.log_probs).abs().max().item()
    diffs["entropy"] = (whole.entropy - parts.entropy).abs().max().item()
    grad_diff = 0.0
    for g_whole, g_part in zip(whole_grads, part_grads):
        dist.all_reduce(g_part)
        grad_diff = max(grad_diff, (g_whole - g_part / 2).abs().max().item())
    diffs["grads"] = grad_diff
    return diffs


def _two_worker_process(rank: int, port: int, model_dir: str, out_dir: str) -> None:
    os.environ.update(
        RANK=str(rank),
        WORLD_SIZE="2",
        LOCAL_RANK=str(rank),
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(port),
        HYBRIDRL_DIST_TIMEOUT_S="120",
    )
    torch.set_num_threads(1)
    import torch.distributed as dist

    dist.init_process_group("gloo")
    out = {"kv_repeat": _kv_repeat_check()}
    out.update(_run_workers(2, model_dir, rank))
    torch.save(out, os.path.join(out_dir, f"rank{rank}.pt"))
    dist.destroy_process_group()  # else Gloo's threads may abort the process as the interpreter exits


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def runs(tiny_model_dir, tmp_path_factory):
    """SP=2 on two spawned worker processes (Gloo) and SP=1 on one worker in this process."""
    from hybridrl.models import load_value_model

    value = load_value_model(tiny_model_dir)  # a random value head, so that the backbone gets gradients
    gen = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for name, p in value.named_parameters():
            if not name.startswith(value.base_model_prefix + "."):
                p.copy_(torch.randn(p.shape, generator=gen))
    value.save_pretrained(f"{tiny_model_dir}-value")
    out_dir = str(tmp_path_factory.mktemp("ulysses"))
    torch.multiprocessing.start_processes(
        _two_worker_process, args=(_free_port(), tiny_model_dir, out_dir), nprocs=2, start_method="spawn"
    )
    ranks = [torch.load(os.path.join(out_dir, f"rank{r}.pt"), weights_only=False) for r in range(2)]
    return {"one": _run_workers(1, tiny_model_dir), "ranks": ranks}


def _rows(runs, key, column):
    """A per-row result of the two ranks, concatenated as the driver collects it."""
    return torch.cat([r[key][column] if column else r[key] for r in runs["ranks"]])


def _max_diff(a: dict, b: dict) -> float:
    assert a.keys() == b.keys()
    return max((a[k] - b[k]).abs().max().item() for k in a)


@pytest.mark.slow
def test_fewer_kv_heads_than_ranks(runs):
    for rank in runs["ranks"]:
        assert max(rank["kv_repeat"].values()) < ATOL, rank["kv_repeat"]


@pytest.mark.slow
def test_the_workers_split_their_sequences(runs):
    assert runs["one"]["sp_sizes"] == (1, 1, 1)
    assert [r["sp_sizes"] for r in runs["ranks"]] == [(2, 2, 2), (2, 2, 2)]


@pytest.mark.slow
def test_actor_and_reference_log_probs(runs):
    one = runs["one"]
    for column in ("old_log_probs", "entropys"):
        torch.testing.assert_close(_rows(runs, "log_probs", column), one["log_probs"][column], atol=ATOL, rtol=0)
    torch.testing.assert_close(_rows(runs, "ref", "ref_log_prob"), one["ref"]["ref_log_prob"], atol=ATOL, rtol=0)


@pytest.mark.slow
def test_actor_update_gives_the_same_loss_gradients_and_weights(runs):
    one, ranks = runs["one"], runs["ranks"]
    for key in ("actor/pg_loss", "actor/entropy_loss", "actor/kl_loss", "actor/grad_norm"):
        per_rank = [r["actor_metrics"][key][0] for r in ranks]
        assert sum(per_rank) / 2 == pytest.approx(one["actor_metrics"][key][0], abs=ATOL), key  # the driver averages
    for rank in ranks:
        assert _max_diff(rank["actor_grads"], one["actor_grads"]) < ATOL  # gradient norm ~3
        # Adam's first step moves a weight by lr * g / (|g| + eps): where |g| is near eps (1e-8) a
        # 1e-9 change of g moves it by ~1e-4 (FSDP alone, without SP, shows the same), so the
        # weights are compared where the gradient is well above eps
        for name, grad in one["actor_grads"].items():  # every trained parameter (lm_head is tied to the embedding)
            resolved = grad.abs() > 1e-6
            torch.testing.assert_close(
                rank["actor_weights"][name][resolved], one["actor_weights"][name][resolved], atol=ATOL, rtol=0, msg=name
            )


@pytest.mark.slow
def test_critic_values_and_update(runs):
    one, ranks = runs["one"], runs["ranks"]
    torch.testing.assert_close(_rows(runs, "values", None), one["values"], atol=ATOL, rtol=0)
    for key in ("critic/vf_loss", "critic/grad_norm"):
        assert sum(r["critic_metrics"][key][0] for r in ranks) / 2 == pytest.approx(
            one["critic_metrics"][key][0], abs=ATOL
        ), key
    for rank in ranks:
        assert _max_diff(rank["critic_grads"], one["critic_grads"]) < ATOL
    torch.testing.assert_close(_rows(runs, "values_after", None), one["values_after"], atol=ATOL, rtol=0)
