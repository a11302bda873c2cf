"""reward_model.reward_manager=judge: the LLM-judge reward manager, with a scripted judge (the
manager's logic) and with the tiny random model behind the HF engine (end to end)."""

import threading
import time
from types import SimpleNamespace

import pytest
import torch

from hybridrl.config import ConfigError, load_config
from hybridrl.protocol import DataProto
from hybridrl.rewards.custom import RewardConfigError
from hybridrl.rewards.load import load_reward_manager
from hybridrl.rewards.manager import RewardFunctionError
from hybridrl.trainer.ppo.config_check import validate_ppo_config
from hybridrl.workers.llm_judge import JudgeBusyError, JudgeEngine, JudgeRewardManager
from tests.tiny_models import ppo_config_with

P, R = 24, 12
QUESTIONS = ["What is 2 + 2?", "Name a primary colour.", "What is the capital of Italy?", "How many legs has a cat?"]
ANSWERS = ["4", "Red", "Rome", "Four"]


def make_batch(tokenizer, responses, truths=None, questions=None):
    """Chat-templated questions left-padded to P, responses right-padded to R (with EOS); the
    questions default to QUESTIONS and their answers ANSWERS (the ground truths), cycled."""
    bs, pad = len(responses), tokenizer.pad_token_id
    questions = questions or [QUESTIONS[i % 4] for i in range(bs)]
    prompts = torch.full((bs, P), pad, dtype=torch.long)
    resp = torch.full((bs, R), pad, dtype=torch.long)
    mask = torch.zeros(bs, P + R, dtype=torch.long)
    for i, text in enumerate(responses):
        chat = tokenizer.apply_chat_template(
            [{"role": "user", "content": questions[i]}], tokenize=False, add_generation_prompt=True
        )
        p = tokenizer.encode(chat, add_special_tokens=False)[-P:]
        r = tokenizer.encode(text)[: R - 1] + [tokenizer.eos_token_id]
        prompts[i, P - len(p) :] = torch.tensor(p)
        resp[i, : len(r)] = torch.tensor(r)
        mask[i, P - len(p) : P + len(r)] = 1
    truths = truths if truths is not None else [ANSWERS[i % 4] for i in range(bs)]
    non_tensors = {
        "data_source": ["judge_test"] * bs,
        "reward_model": [{"style": "model", "ground_truth": t} for t in truths],
        "extra_info": [{"question": q} for q in questions],
    }
    return DataProto.from_dict(
        tensors={"prompts": prompts, "responses": resp, "attention_mask": mask}, non_tensors=non_tensors
    )


class ScriptedJudge:
    """Answers each prompt with the next scripted text for the answer it holds; records the calls."""

    def __init__(self, tokenizer, answers: dict, delay_s: float = 0.0):
        self.tokenizer, self.answers, self.delay_s, self.calls, self.prompts = tokenizer, answers, delay_s, [], []

    def generate(self, prompt_ids):
        self.calls.append(len(prompt_ids))
        time.sleep(self.delay_s)
        out = []
        for ids in prompt_ids:
            text = self.tokenizer.decode(ids)
            self.prompts.append(text)
            key = next(k for k in self.answers if f"Answer:\n{k}\n" in text or f"rate:\n{k}\n" in text)
            script = self.answers[key]
            out.append(script.pop(0) if isinstance(script, list) else script)
        return out


def judge_config(model_path="m", device="cpu", **judge):
    rollout = {
        "name": "hf",
        "prompt_length": 1024,
        "response_length": 8,
        "micro_batch_size": 8,
        "dtype": "fp32",
        "do_sample": False,
    }
    rollout.update(judge.pop("rollout", {}))
    return {
        "reward_model": {"model": {"path": model_path}, "rollout": rollout, "judge": judge},
        "trainer": {"device": device},
    }


def manager(tokenizer, judge, on_error="zero", retries=2, **settings):
    return JudgeRewardManager(
        tokenizer,
        num_examine=0,
        on_error=on_error,
        retries=retries,
        config=ppo_config_with(judge_config(**settings)),
        judge=judge,
    )


def test_scores_come_from_one_batched_call_and_land_on_the_last_token(tokenizer):
    judge = ScriptedJudge(
        tokenizer, {"4": "Score: 10", "Blue": "I rate it 3/10", "Rome": "<score>7</score>", "Five": "Score: 2"}
    )
    data = make_batch(tokenizer, ["4", "Blue", "Rome", "Five"])
    out = manager(tokenizer, judge)(data, return_dict=True)
    assert judge.calls == [4]  # one call for the whole batch
    lengths = data.batch["attention_mask"][:, P:].sum(-1)
    scores = out["reward_tensor"][torch.arange(4), lengths - 1]
    assert scores.tolist() == pytest.approx([1.0, 0.3, 0.7, 0.2])
    assert out["reward_tensor"].sum().item() == pytest.approx(2.2)  # nothing elsewhere
    info = out["reward_extra_info"]
    assert info["judge_text"] == ["Score: 10", "I rate it 3/10", "<score>7</score>", "Score: 2"]
    assert info["judge_score"] == [10, 3, 7, 2] and info["reward_error"] == [0.0] * 4
    # the default template with a reference section: question, reference and answer reached the judge
    assert "What is 2 + 2?" in judge.prompts[0] and "Reference answer:\n4\n" in judge.prompts[0]


def test_unparseable_answers_follow_on_error(tokenizer):
    data = make_batch(tokenizer, ["4", "Blue", "Rome", "Five"])
    answers = {"4": "Score: 9", "Blue": "hmm", "Rome": "Score: 12", "Five": "Score: 1"}
    out = manager(tokenizer, ScriptedJudge(tokenizer, dict(answers)), on_error="mask_sample")(data, return_dict=True)
    info = out["reward_extra_info"]
    assert info["reward_error"] == [0.0, 1.0, 1.0, 0.0] and info["reward_timeout"] == [0.0] * 4
    assert info["judge_text"] == ["Score: 9", "hmm", "Score: 12", "Score: 1"]  # failed rows keep their text
    assert out["reward_tensor"].sum(-1).tolist() == pytest.approx([0.9, 0.0, 0.0, 0.1])
    with pytest.raises(
        RewardFunctionError,
        match=r"sample 1 of the batch .*JudgeParseError: no score in the "
        r"judge's answer 'hmm'",
    ):
        manager(tokenizer, ScriptedJudge(tokenizer, dict(answers)), on_error="raise")(data)
    everything_fails = {k: "no idea" for k in answers}
    with pytest.raises(RewardFunctionError, match="failed on all 4 samples"):
        manager(tokenizer, ScriptedJudge(tokenizer, everything_fails), on_error="zero")(data)


def test_retry_asks_again_only_for_unparseable_rows_batched(tokenizer):
    judge = ScriptedJudge(
        tokenizer,
        {"4": "Score: 8", "Blue": ["?", "still ?", "Score: 4"], "Rome": "Score: 6", "Five": ["?", "Score: 1"]},
    )
    out = manager(tokenizer, judge, on_error="retry", retries=2)(
        make_batch(tokenizer, ["4", "Blue", "Rome", "Five"]), return_dict=True
    )
    assert judge.calls == [4, 2, 1]
    assert out["reward_tensor"].sum(-1).tolist() == pytest.approx([0.8, 0.4, 0.6, 0.1])
    judge = ScriptedJudge(tokenizer, {"4": "Score: 8", "Blue": "?", "Rome": "Score: 6", "Five": "Score: 1"})
    with pytest.raises(RewardFunctionError, match=r"sample 1 .*after 3 attempts"):
        manager(tokenizer, judge, on_error="retry", retries=2)(make_batch(tokenizer, ["4", "Blue", "Rome", "Five"]))
    assert judge.calls == [4, 1, 1]


def test_a_late_judge_fails_the_rows_as_timeouts(tokenizer):
    judge = ScriptedJudge(tokenizer, {"4": "Score: 8", "Blue": "Score: 8"}, delay_s=2.0)
    data = make_batch(tokenizer, ["4", "Blue"])
    started = time.perf_counter()
    with pytest.raises(
        RewardFunctionError,
        match=r"ScoreTimeoutError: the judge answered none of 2 prompts within "
        r"reward_model.judge.timeout_s=0.3 s",
    ):
        manager(tokenizer, judge, timeout_s=0.3)(data)
    assert time.perf_counter() - started < 1.5


def test_template_errors_and_long_prompts_fail_their_rows_only(tokenizer):
    judge = ScriptedJudge(tokenizer, {"4": "Score: 8", "Blue": "Score: 5"})
    data = make_batch(tokenizer, ["4", "Blue"], truths=["4", None])
    out = manager(tokenizer, judge, prompt_template="Reference: {ground_truth}\nAnswer:\n{response}\n")(
        data, return_dict=True
    )
    assert out["reward_extra_info"]["reward_error"] == [0.0, 1.0] and judge.calls == [1]
    assert out["reward_extra_info"]["judge_text"] == ["Score: 8", None]

    judge = ScriptedJudge(tokenizer, {"4": "Score: 8", "Blue": "Score: 5"})
    data = make_batch(tokenizer, ["4", "Blue"], truths=["4", "and so on " * 100])
    with pytest.raises(
        RewardFunctionError,
        match=r"sample 1 .*JudgePromptError: the judge's prompt has \d+ tokens, "
        r"over reward_model.rollout.prompt_length=200",
    ):
        manager(tokenizer, judge, on_error="raise", rollout={"prompt_length": 200})(data)
    assert judge.calls == [1]


def test_custom_parser_and_pattern(tokenizer, tmp_path):
    parser = tmp_path / "parse.py"
    parser.write_text(
        "def parse_score(judge_text, ground_truth=None, **row):\n"
        "    if 'yes' in judge_text.lower():\n        return {'score': 1.0, 'verdict': 'yes'}\n"
        "    if 'no' in judge_text.lower():\n        return 0.0\n    return None\n"
    )
    judge = ScriptedJudge(tokenizer, {"4": "Yes.", "Blue": "No.", "Rome": "Maybe"})
    out = manager(tokenizer, judge, score_parser={"path": str(parser), "name": "parse_score"})(
        make_batch(tokenizer, ["4", "Blue", "Rome"]), return_dict=True
    )
    info = out["reward_extra_info"]
    assert out["reward_tensor"].sum(-1).tolist() == [1.0, 0.0, 0.0]
    assert info["verdict"] == ["yes", None, None] and info["reward_error"] == [0.0, 0.0, 1.0]
    judge = ScriptedJudge(tokenizer, {"4": "Verdict 4 of 5", "Blue": "Verdict 2 of 5"})
    out = manager(tokenizer, judge, score_pattern=r"Verdict (\d) of 5", score_range=[1, 5])(
        make_batch(tokenizer, ["4", "Blue"])
    )
    assert out.sum(-1).tolist() == pytest.approx([0.75, 0.25])


def test_num_examine_prints_the_judges_answer(tokenizer, capsys):
    judge = ScriptedJudge(tokenizer, {"4": "Score: 10"})
    JudgeRewardManager(tokenizer, num_examine=1, on_error="zero", config=ppo_config_with(judge_config()), judge=judge)(
        make_batch(tokenizer, ["4"])
    )
    printed = capsys.readouterr().out
    assert "[judge_text] Score: 10" in printed and "[score] 1.0" in printed


# ---------------------------------------------------------------- the tiny model behind the HF engine


@pytest.mark.cuda
def test_tiny_model_end_to_end(tokenizer, tiny_model_dir, device):
    """The tiny random model as the judge behind the HF engine, built from the config. It answers
    noise, so the response prefix writes the verdict ("Score: 7") and the model adds noise after
    it; one row lacks the ground truth the template reads and fails alone."""
    cfg = judge_config(
        tiny_model_dir,
        device,
        response_prefix="Score: 7\n",
        rollout={"response_length": 6},
        prompt_template="Question: {question}\nReference: {ground_truth}\nAnswer:\n{response}\n",
    )
    cfg["reward_model"].update(on_error="zero", reward_manager="judge")
    reward_fn = load_reward_manager(ppo_config_with(cfg), tokenizer)
    assert isinstance(reward_fn, JudgeRewardManager) and isinstance(reward_fn.judge, JudgeEngine)
    assert load_reward_manager(ppo_config_with(cfg), tokenizer).judge is reward_fn.judge  # one engine per run
    engine, calls = reward_fn.judge.engine, []
    original = engine.generate_sequences
    engine.generate_sequences = lambda batch: calls.append(batch.batch["input_ids"].shape) or original(batch)
    data = make_batch(tokenizer, ["4", "Blue", "Rome", "Five", "4", "Red"], truths=["4", "Red", "Rome", "4", None, "4"])
    try:
        out = reward_fn(data, return_dict=True)
    finally:
        engine.generate_sequences = original
    assert len(calls) == 1 and calls[0][0] == 5  # one engine call, for the five rows that have a prompt
    info = out["reward_extra_info"]
    scores = out["reward_tensor"].sum(-1)
    assert ((scores >= 0) & (scores <= 1)).all()
    assert info["reward_error"] == [0.0, 0.0, 0.0, 0.0, 1.0, 0.0]
    assert all(t.startswith("Score: 7\n") for i, t in enumerate(info["judge_text"]) if i != 4)
    assert info["judge_text"][4] is None and scores[4] == 0
    assert [s for i, s in enumerate(scores.tolist()) if i != 4] == pytest.approx([0.7] * 5)


@pytest.mark.cuda
def test_engine_refuses_a_call_while_a_late_one_runs(tiny_model_dir, device):
    engine = JudgeEngine(tiny_model_dir, judge_config()["reward_model"]["rollout"], device)
    release = threading.Event()
    nothing = SimpleNamespace(
        batch={"responses": torch.zeros(1, 0, dtype=torch.long), "response_mask": torch.zeros(1, 0, dtype=torch.long)}
    )
    engine.engine.generate_sequences = lambda batch: release.wait(5) and nothing
    late = threading.Thread(target=engine.generate, args=([[1, 2, 3]],), daemon=True)
    late.start()
    time.sleep(0.2)
    with pytest.raises(JudgeBusyError, match="still generating an earlier batch that ran past its deadline"):
        engine.generate([[1, 2, 3]])
    release.set()
    late.join(5)
    assert engine.generate([[1, 2, 3]]) == [""]


def test_a_judge_tokenizer_without_chat_template_needs_apply_chat_template_false(tokenizer, tokenizer_dir):
    from transformers import AutoTokenizer

    bare = AutoTokenizer.from_pretrained(tokenizer_dir)
    bare.chat_template = None
    with pytest.raises(RewardConfigError, match="has no chat template; set reward_model.judge.apply_chat_template"):
        manager(tokenizer, ScriptedJudge(bare, {}))
    judge = ScriptedJudge(bare, {"4": "Score: 6"})
    out = manager(tokenizer, judge, apply_chat_template=False, system_prompt="Be fair.")(make_batch(tokenizer, ["4"]))
    assert out.sum().item() == pytest.approx(0.6) and judge.prompts[0].startswith("Be fair.\n\nRate the answer")


# ---------------------------------------------------------------- the start-up check

BASE = [
    "algorithm.adv_estimator=grpo",
    "data.train_batch_size=8",
    "actor_rollout_ref.actor.ppo_mini_batch_size=4",
    "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=2",
    "actor_rollout_ref.rollout.n=2",
    "reward_model.reward_manager=judge",
]


def test_config_check(tiny_model_dir):
    validate_ppo_config(load_config(BASE + [f"reward_model.model.path={tiny_model_dir}"]))
    validate_ppo_config(
        load_config(
            BASE
            + [f"reward.reward_model.model_path={tiny_model_dir}", "reward.reward_model.rollout.response_length=32"]
        )
    )
    for overrides, message in [
        (
            [],
            "reward_model.model.path='~/models/FsfairX-LLaMA3-RM-v0.1' does not exist; with "
            "reward_model.reward_manager=judge set it to the judge model",
        ),
        (
            [f"reward_model.model.path={tiny_model_dir}", "reward_model.rollout.name=vllmm"],
            "reward_model.rollout.name='vllmm' is not a known rollout engine",
        ),
        (
            [f"reward_model.model.path={tiny_model_dir}", "reward_model.judge.prompt_template=Rate it"],
            "has no {response} field",
        ),
        (
            [
                f"reward_model.model.path={tiny_model_dir}",
                "reward_model.enable=true",
                "reward_model.micro_batch_size_per_gpu=2",
            ],
            "set reward_model.enable=false",
        ),
    ]:
        with pytest.raises(ConfigError) as err:
            validate_ppo_config(load_config(BASE + overrides))
        assert message in str(err.value) and "\n" not in str(err.value)


# ---------------------------------------------------------------- the bundled SmolLM2 as the judge

PAIRS = [
    ("What is the capital of France?", "The capital of France is Paris.", "The capital of France is Berlin."),
    ("What is 7 + 5?", "7 + 5 = 12.", "7 + 5 = 15."),
    ("How many legs does a spider have?", "A spider has eight legs.", "A spider has six legs."),
]


@pytest.mark.slow
@pytest.mark.cuda
def test_smollm2_judges_hand_made_pairs(tokenizer, smollm2_dir, device):
    """SmolLM2-135M-Instruct grades a good and a bad answer to three questions. It is a tiny model:
    the test checks the mechanics (every answer parsed, scores in [0, 1]) and prints how often the
    good answer won; quality is measured by benchmarks/judge_smollm2.py (docs/rewards.md)."""
    cfg = judge_config(smollm2_dir, device, response_prefix="Score:", rollout={"dtype": "auto", "response_length": 8})
    cfg["reward_model"].update(on_error="zero", reward_manager="judge")
    reward_fn = load_reward_manager(ppo_config_with(cfg), tokenizer)
    data = make_batch(
        tokenizer,
        [a for _, good, bad in PAIRS for a in (good, bad)],
        truths=[None] * 6,
        questions=[q for q, _, _ in PAIRS for _ in range(2)],
    )
    started = time.perf_counter()
    out = reward_fn(data, return_dict=True)
    seconds = time.perf_counter() - started
    scores, info = out["reward_tensor"].sum(-1).tolist(), out["reward_extra_info"]
    assert all(0 <= s <= 1 for s in scores) and sum(info["reward_error"]) <= 1
    assert all(t.startswith("Score:") for t in info["judge_text"])
    preferred = sum(g > b for g, b in zip(scores[0::2], scores[1::2]))
    print(f"SmolLM2 judge: good answer preferred in {preferred}/3 pairs, scores {scores}, {seconds:.1f} s")
