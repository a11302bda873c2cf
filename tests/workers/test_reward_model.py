"""The reward-model worker: the score read at the last token, its place on the last response
token, re-tokenisation for a reward model with another tokenizer, the Ray backend, the start-up
checks, and a PPO run that takes its reward from the worker."""

import json
import os

import pytest
import torch
from omegaconf import OmegaConf
from tiny_models import build_tiny_model

from hybridrl.config import ConfigError, load_config
from hybridrl.controller.local import LocalWorkerGroup
from hybridrl.data.preference_dataset import encode_rm_inputs
from hybridrl.models import load_tokenizer, load_value_model
from hybridrl.protocol import DataProto
from hybridrl.trainer.ppo.config_check import validate_ppo_config
from hybridrl.workers.fsdp_workers import RewardModelWorker
from hybridrl.workers.memory import MEMORY_METRICS
from hybridrl.workers.reward_model import expand_to_token_level, forward_sequence_scores, last_token_index

HH_DIR = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", "..", "shared", "data", "hh_rlhf"))
CHATS = [
    [{"role": "user", "content": "Is the sky blue?"}],
    [
        {"role": "user", "content": "Hi"},
        {"role": "assistant", "content": "Hello!"},
        {"role": "user", "content": "Tell me a joke about a fox"},
    ],
    [{"role": "user", "content": "Say nothing"}],
]
RESPONSES = ["Yes, on a clear day.", "A fox walks into a bar", ""]
ENDED = [True, False, True]  # row 1 was cut at the length limit; row 2 is only the EOS token
# A template unlike SmolLM2's, so a reward model that reads the policy's ids would be wrong.
OTHER_TEMPLATE = (
    "{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}assistant: {% endif %}"
)


def make_reward_model(src: str, out: str, seed: int = 0, chat_template: str | None = None) -> str:
    """``src`` + a random scalar head (bias 0, as hybridrl rm leaves it), saved as an HF folder."""
    model = load_value_model(src)
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        model.score.weight.copy_(torch.randn(model.score.weight.shape, generator=gen))
    model.save_pretrained(out)
    load_tokenizer(src, chat_template=chat_template).save_pretrained(out)
    return out


@pytest.fixture(scope="module")
def rm_dir(tiny_model_dir, tmp_path_factory):
    return make_reward_model(tiny_model_dir, str(tmp_path_factory.mktemp("rm")))


@pytest.fixture(scope="module")
def other_rm_dir(tokenizer, tmp_path_factory):
    """A reward model with its own tokenizer: another BPE vocabulary (300 tokens) and template."""
    corpus = [m["content"] for chat in CHATS for m in chat] + RESPONSES + ["user assistant system"] * 5
    other = tokenizer.train_new_from_iterator(corpus * 20, vocab_size=300)
    other.chat_template = OTHER_TEMPLATE
    tok_dir = tmp_path_factory.mktemp("other_tok")
    other.save_pretrained(tok_dir)
    model_dir = build_tiny_model(str(tok_dir), str(tmp_path_factory.mktemp("other_lm")))
    return make_reward_model(model_dir, str(tmp_path_factory.mktemp("other_rm")), seed=1)


def policy_batch(tokenizer, prompt_length=96, response_length=12) -> DataProto:
    """A rollout batch as the HF engine returns it: left-padded templated prompts, right-padded
    responses (EOS where the response ended), plus ``raw_prompt`` (data.return_raw_chat)."""
    pad = tokenizer.pad_token_id
    rows = []
    for chat, text, ended in zip(CHATS, RESPONSES, ENDED):
        p = tokenizer(
            tokenizer.apply_chat_template(chat, add_generation_prompt=True, tokenize=False), add_special_tokens=False
        )["input_ids"]
        r = tokenizer(text, add_special_tokens=False)["input_ids"] + ([tokenizer.eos_token_id] if ended else [])
        rows.append((p, r))
    bs = len(rows)
    prompts = torch.full((bs, prompt_length), pad)
    responses = torch.full((bs, response_length), pad)
    mask = torch.zeros(bs, prompt_length + response_length, dtype=torch.long)
    for i, (p, r) in enumerate(rows):
        prompts[i, prompt_length - len(p) :] = torch.tensor(p)
        responses[i, : len(r)] = torch.tensor(r)
        mask[i, prompt_length - len(p) : prompt_length + len(r)] = 1
    return DataProto.from_dict(
        tensors={
            "prompts": prompts,
            "responses": responses,
            "input_ids": torch.cat([prompts, responses], 1),
            "attention_mask": mask,
            "position_ids": (mask.cumsum(-1) - 1).clamp(min=0),
            "response_mask": mask[:, prompt_length:],
        },
        non_tensors={"raw_prompt": CHATS},
    )


def rm_config(path, input_tokenizer=None, micro=2, **extra):
    cfg = load_config(
        [
            f"reward_model.model.path={path}",
            f"reward_model.micro_batch_size_per_gpu={micro}",
            "reward_model.model.fsdp_config.mixed_precision.param_dtype=fp32",
        ]
    )  # exact on every CPU
    rm = cfg.reward_model
    rm.model.input_tokenizer = input_tokenizer
    for key, value in extra.items():
        OmegaConf.update(rm, key, value)
    return rm


def score_alone(model, ids: list[int]) -> float:
    """The reward of one unpadded sequence: the head's output at its last token."""
    with torch.no_grad():
        return model(input_ids=torch.tensor([ids])).logits[0, -1, 0].item()


def test_last_token_index_and_placement_on_the_last_response_token():
    mask = torch.tensor([[0, 1, 1, 0], [1, 1, 1, 1], [0, 0, 0, 0]])
    assert last_token_index(mask).tolist() == [2, 3, 0]
    response_mask = torch.tensor([[1, 1, 0], [1, 0, 0], [0, 0, 0]])
    out = expand_to_token_level(torch.tensor([0.5, -2.0, 9.0]), response_mask)
    assert out.tolist() == [[0.0, 0.5, 0.0], [-2.0, 0.0, 0.0], [0.0, 0.0, 0.0]]  # no response: no score


def test_scores_are_read_at_the_last_token_whatever_the_padding(rm_dir):
    model = load_value_model(rm_dir)
    seqs = [[5, 6, 7, 8], [9, 10], [11, 12, 13]]
    expected = [score_alone(model, s) for s in seqs]
    for left in (True, False):
        ids, mask = torch.zeros(3, 6, dtype=torch.long), torch.zeros(3, 6, dtype=torch.long)
        for i, s in enumerate(seqs):
            cols = slice(6 - len(s), 6) if left else slice(0, len(s))
            ids[i, cols], mask[i, cols] = torch.tensor(s), 1
        got = forward_sequence_scores(model, ids, mask, (mask.cumsum(-1) - 1).clamp(min=0))
        torch.testing.assert_close(got, torch.tensor(expected), atol=1e-5, rtol=0)


@pytest.mark.cuda
def test_same_tokenizer_reads_the_policy_ids(rm_dir, tiny_model_dir, tokenizer, device):
    # the policy's tokenizer is the reward model's: no re-tokenisation, the batch ids are scored
    group = LocalWorkerGroup(RewardModelWorker, rm_config(rm_dir, input_tokenizer=tiny_model_dir), device=device)
    group.init_model()
    assert group.workers[0].reward_model.input_tokenizer is None  # same tokenizer: nothing to re-tokenise
    data = policy_batch(tokenizer)
    del data.non_tensor_batch["raw_prompt"]  # not needed then
    scored = group.compute_rm_score(data)
    rm_scores = scored.batch["rm_scores"]
    assert set(scored.meta_info["metrics"]) == set(MEMORY_METRICS)  # the worker's memory, one value per worker
    model = load_value_model(rm_dir)
    lengths = data.batch["response_mask"].sum(-1).tolist()
    for i, length in enumerate(lengths):
        ids = data.batch["input_ids"][i][data.batch["attention_mask"][i].bool()].tolist()
        assert rm_scores[i, length - 1].item() == pytest.approx(score_alone(model, ids), abs=1e-5)
        assert rm_scores[i].count_nonzero() == 1  # only on the last response token
    # and the ids are what the reward model is trained on: templated prompt + response (+ EOS)
    assert ids == encode_rm_inputs(tokenizer, [CHATS[-1]], [RESPONSES[-1]])[0]


@pytest.mark.cuda
def test_other_tokenizer_retokenises_with_its_own_template(other_rm_dir, tiny_model_dir, tokenizer, device):
    group = LocalWorkerGroup(RewardModelWorker, rm_config(other_rm_dir, input_tokenizer=tiny_model_dir), device=device)
    group.init_model()
    assert group.workers[0].reward_model.input_tokenizer is not None
    data = policy_batch(tokenizer)
    rm_scores = group.compute_rm_score(data).batch["rm_scores"]
    rm_tok, model = load_tokenizer(other_rm_dir), load_value_model(other_rm_dir)
    assert rm_tok.chat_template == OTHER_TEMPLATE and len(rm_tok) == 300
    expected_ids = encode_rm_inputs(rm_tok, CHATS, RESPONSES, ENDED)
    assert rm_tok.decode(expected_ids[0]) == "user: Is the sky blue?\nassistant: Yes, on a clear day.<|im_end|>"
    for i, length in enumerate(data.batch["response_mask"].sum(-1).tolist()):
        assert rm_scores[i, length - 1].item() == pytest.approx(score_alone(model, expected_ids[i]), abs=1e-5)
    # max_length keeps the end of a long input, where the score is read
    short = LocalWorkerGroup(RewardModelWorker, rm_config(other_rm_dir, tiny_model_dir, max_length=5), device=device)
    short.init_model()
    cut = short.compute_rm_score(data).batch["rm_scores"]
    assert cut[0].sum().item() == pytest.approx(score_alone(model, expected_ids[0][-5:]), abs=1e-5)
    # without the chat messages it cannot re-template: one line that says what to set
    del data.non_tensor_batch["raw_prompt"]
    with pytest.raises(ConfigError, match="set data.return_raw_chat=True"):
        group.compute_rm_score(data)


def test_tokenizers_differ_by_vocabulary_or_chat_template_not_by_padding_side(tokenizer_dir, other_rm_dir):
    from hybridrl.workers.reward_model import same_tokenizer

    policy = load_tokenizer(tokenizer_dir, padding_side="left")
    assert same_tokenizer(policy, load_tokenizer(tokenizer_dir, padding_side="right"))
    assert not same_tokenizer(policy, load_tokenizer(tokenizer_dir, chat_template=OTHER_TEMPLATE))
    assert not same_tokenizer(policy, load_tokenizer(other_rm_dir))


@pytest.mark.cuda
def test_a_plain_causal_lm_is_refused_as_reward_model(tiny_model_dir, device):
    group = LocalWorkerGroup(RewardModelWorker, rm_config(tiny_model_dir), device=device)
    with pytest.raises(ConfigError, match="no trained reward head"):
        group.init_model()


@pytest.mark.slow
def test_two_sharded_ray_workers_score_like_one(ray_cluster, rm_dir, tokenizer):
    from hybridrl.controller.ray import RayClassWithInitArgs, RayResourcePool, RayWorkerGroup

    data = policy_batch(tokenizer)
    local = LocalWorkerGroup(RewardModelWorker, rm_config(rm_dir, micro=1), device="cpu")
    local.init_model()
    expected = local.compute_rm_score(data).batch["rm_scores"]
    group = RayWorkerGroup(
        RayResourcePool([1, 1]), RayClassWithInitArgs(RewardModelWorker, rm_config(rm_dir, micro=1), device="cpu")
    )
    try:
        group.init_model()
        torch.testing.assert_close(group.compute_rm_score(data).batch["rm_scores"], expected, atol=1e-5, rtol=0)
    finally:
        group.shutdown()


@pytest.mark.parametrize(
    "overrides, message",
    [
        (["reward_model.model.path=null"], "reward_model.model.path: Incompatible value 'None'"),  # the typed config
        (["reward_model.model.path=/nonexistent/rm"], "reward_model.model.path='/nonexistent/rm' does not exist"),
        (["reward_model.micro_batch_size_per_gpu=null"], "reward_model.micro_batch_size_per_gpu is not set"),
        (["reward_model.micro_batch_size_per_gpu=0"], "reward_model.micro_batch_size_per_gpu=0 must be"),
        (["reward_model.max_length=1"], "reward_model.max_length=1 must be"),
    ],
)
def test_start_up_checks_of_the_reward_model_keys(rm_dir, overrides, message):
    base = [
        "algorithm.adv_estimator=grpo",
        "data.train_batch_size=4",
        "actor_rollout_ref.rollout.n=2",
        "actor_rollout_ref.actor.ppo_mini_batch_size=2",
        "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=2",
        "reward_model.enable=True",
        f"reward_model.model.path={rm_dir}",
        "reward_model.micro_batch_size_per_gpu=2",
    ]
    validate_ppo_config(load_config(base))  # the base is fine
    with pytest.raises(ConfigError, match=message):
        validate_ppo_config(load_config(base + overrides))


@pytest.fixture(scope="module")
def hh_parquet(tmp_path_factory):
    from hybridrl.data.preprocess import hh_rlhf

    out = tmp_path_factory.mktemp("hh_ppo")
    hh_rlhf.main(["--input_dir", HH_DIR, "--local_dir", str(out), "--train_size", "32", "--test_size", "4"])
    return out


@pytest.mark.slow
@pytest.mark.cuda
def test_ppo_step_takes_its_reward_from_the_reward_model(hh_parquet, tiny_model_dir, rm_dir, tmp_path, device):
    from hybridrl.trainer.main_ppo import main

    out = tmp_path / "run"
    A = "actor_rollout_ref.actor"
    assert (
        main(
            [
                f"data.train_files={hh_parquet}/train.parquet",
                f"data.val_files={hh_parquet}/test.parquet",
                "data.train_batch_size=4",
                "data.max_prompt_length=192",
                "data.filter_overlong_prompts=True",
                "data.max_response_length=8",
                f"actor_rollout_ref.model.path={tiny_model_dir}",
                f"{A}.ppo_mini_batch_size=2",
                f"{A}.ppo_micro_batch_size_per_gpu=2",
                "actor_rollout_ref.rollout.n=2",
                "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=4",
                "algorithm.adv_estimator=grpo",
                "reward_model.enable=True",
                f"reward_model.model.path={rm_dir}",
                "reward_model.micro_batch_size_per_gpu=4",
                f"trainer.device={device}",
                "trainer.logger=['file']",
                f"trainer.default_local_dir={out}",
                "trainer.total_training_steps=1",
                "trainer.test_freq=1",
                "trainer.val_before_train=False",
            ]
        )
        == 0
    )
    with open(out / "metrics.jsonl") as f:
        row = [json.loads(line) for line in f][-1]
    assert row["rm/score/min"] < row["rm/score/mean"] < row["rm/score/max"]  # the random head tells rows apart
    # HH-RLHF has no rule scorer: the reward is the reward model's score alone
    for stat in ("mean", "max", "min"):
        assert row[f"critic/score/{stat}"] == pytest.approx(row[f"rm/score/{stat}"], abs=1e-6)
    assert row["critic/advantages/max"] > 0 > row["critic/advantages/min"]
    assert "val-core/Anthropic/hh-rlhf/reward/mean@1" in row
    assert all(row[key] > 0 for key in MEMORY_METRICS)
