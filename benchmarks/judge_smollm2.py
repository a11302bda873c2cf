"""How well the bundled SmolLM2-135M-Instruct judges: ``reward_model.reward_manager=judge`` on
hand-made (question, good answer, bad answer) pairs.

Each answer is scored by the judge reward manager (HF engine, greedy, the built-in templates);
a pair counts as *preferred* when the good answer scores higher than the bad one, *tie* when
equal, *wrong* otherwise. Unparseable judgements score 0 (``on_error=zero``) and are counted.
Several judge settings are compared: with and without the reference answer in the prompt, and
with and without a response prefix ("Score:") that makes the judge start with its number.

    python benchmarks/judge_smollm2.py                 # all settings, all pairs
    python benchmarks/judge_smollm2.py --pairs 6 --dtype float32
    python benchmarks/judge_smollm2.py --engine vllm       # the judge on vLLM (pip install -e ".[vllm]")
"""

from __future__ import annotations

import argparse
import time

import torch
from common import MODEL

# (question, reference, good answer, bad answer): short, unambiguous, hand-written.
PAIRS = [
    ("What is the capital of France?", "Paris", "The capital of France is Paris.", "The capital of France is Berlin."),
    ("What is 7 + 5?", "12", "7 + 5 = 12.", "7 + 5 = 15."),
    ("What color is the sky on a clear day?", "Blue", "It is blue.", "It is green."),
    ("How many legs does a spider have?", "8", "A spider has eight legs.", "A spider has six legs."),
    (
        "What is the boiling point of water at sea level in Celsius?",
        "100",
        "Water boils at 100 degrees Celsius.",
        "Water boils at 50 degrees Celsius.",
    ),
    (
        "Who wrote Romeo and Juliet?",
        "William Shakespeare",
        "William Shakespeare wrote it.",
        "Charles Dickens wrote it.",
    ),
    ("What is 9 times 3?", "27", "9 times 3 is 27.", "9 times 3 is 21."),
    (
        "Which planet is closest to the Sun?",
        "Mercury",
        "Mercury is the closest planet to the Sun.",
        "Jupiter is the closest planet to the Sun.",
    ),
    ("How many days are in a week?", "7", "A week has seven days.", "A week has ten days."),
    (
        "What gas do plants take in for photosynthesis?",
        "Carbon dioxide",
        "Plants take in carbon dioxide.",
        "Plants take in helium.",
    ),
    (
        "What is the largest ocean on Earth?",
        "The Pacific Ocean",
        "The Pacific Ocean is the largest.",
        "The Arctic Ocean is the largest.",
    ),
    ("What is the square root of 81?", "9", "The square root of 81 is 9.", "The square root of 81 is 7."),
    ("In which continent is Kenya?", "Africa", "Kenya is in Africa.", "Kenya is in South America."),
    ("How many minutes are in an hour?", "60", "An hour has 60 minutes.", "An hour has 100 minutes."),
    ("What do bees make?", "Honey", "Bees make honey.", "Bees make milk."),
    (
        "What is the freezing point of water in Celsius?",
        "0",
        "Water freezes at 0 degrees Celsius.",
        "Water freezes at 30 degrees Celsius.",
    ),
]

SETTINGS = {  # name -> (reward_model.judge overrides, whether the row carries the reference answer)
    "reference": ({}, True),
    "reference + prefix": ({"response_prefix": "Score:"}, True),
    "no reference": ({}, False),
    "no reference + prefix": ({"response_prefix": "Score:"}, False),
}


def judge_batch(tokenizer, pairs, with_reference: bool):
    """Rows 2i / 2i+1: the good / bad answer to pair i, as a rollout would hand them over."""
    from hybridrl.protocol import DataProto

    rows = [(q, ref, answer) for q, ref, good, bad in pairs for answer in (good, bad)]
    prompts = [
        tokenizer.encode(
            tokenizer.apply_chat_template([{"role": "user", "content": q}], tokenize=False, add_generation_prompt=True),
            add_special_tokens=False,
        )
        for q, _, _ in rows
    ]
    responses = [tokenizer.encode(a) + [tokenizer.eos_token_id] for _, _, a in rows]
    p_len, r_len, pad = max(map(len, prompts)), max(map(len, responses)), tokenizer.pad_token_id
    prompt_ids = torch.tensor([[pad] * (p_len - len(p)) + p for p in prompts])
    response_ids = torch.tensor([r + [pad] * (r_len - len(r)) for r in responses])
    mask = torch.tensor(
        [[0] * (p_len - len(p)) + [1] * (len(p) + len(r)) + [0] * (r_len - len(r)) for p, r in zip(prompts, responses)]
    )
    return DataProto.from_dict(
        tensors={"prompts": prompt_ids, "responses": response_ids, "attention_mask": mask},
        non_tensors={
            "data_source": ["judge_bench"] * len(rows),
            "reward_model": [{"style": "model", "ground_truth": ref if with_reference else None} for _, ref, _ in rows],
            "extra_info": [{"question": q} for q, _, _ in rows],
        },
    )


def run(
    name: str,
    judge_keys: dict,
    with_reference: bool,
    pairs,
    tokenizer,
    dtype: str,
    response_length: int,
    engine: str = "hf",
):
    from omegaconf import OmegaConf

    import hybridrl.workers  # noqa: F401  registers reward_manager=judge (the trainer imports it too)
    from hybridrl.rewards.load import load_reward_manager

    cfg = OmegaConf.create(
        {
            "trainer": {"device": "cpu"},
            "reward_model": {
                "reward_manager": "judge",
                "on_error": "zero",
                "model": {"path": MODEL},
                "rollout": {
                    "name": engine,
                    "dtype": dtype,
                    "prompt_length": 1024,
                    "response_length": response_length,
                    "do_sample": False,
                    "micro_batch_size": 64,
                },
                "judge": judge_keys,
            },
        }
    )
    manager = load_reward_manager(cfg, tokenizer)
    data = judge_batch(tokenizer, pairs, with_reference)
    started = time.perf_counter()
    out = manager(data, return_dict=True)
    seconds = time.perf_counter() - started
    scores = out["reward_tensor"].sum(-1).tolist()
    failed = out["reward_extra_info"]["reward_error"]
    good, bad = scores[0::2], scores[1::2]
    preferred = sum(g > b for g, b in zip(good, bad))
    ties = sum(g == b for g, b in zip(good, bad))
    print(
        f"{name:24s} preferred {preferred:2d}/{len(pairs)}  ties {ties:2d}  wrong {len(pairs) - preferred - ties:2d}"
        f"  unparseable {int(sum(failed)):2d}/{len(scores)}  mean good {sum(good) / len(good):.2f}"
        f"  bad {sum(bad) / len(bad):.2f}  {seconds:5.1f} s ({seconds / len(scores):.2f} s/answer)",
        flush=True,
    )
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pairs", type=int, default=len(PAIRS))
    parser.add_argument("--dtype", default="auto", help="judge engine dtype: auto | bfloat16 | float32")
    parser.add_argument("--response_length", type=int, default=32)
    parser.add_argument("--show", type=int, default=2, help="judge answers to print per setting")
    parser.add_argument("--engine", default="hf", help="reward_model.rollout.name: hf | vllm")
    args = parser.parse_args()
    from hybridrl.models import load_tokenizer, resolve_model_path

    torch.manual_seed(0)
    tokenizer = load_tokenizer(resolve_model_path(MODEL))
    pairs = PAIRS[: args.pairs]
    print(
        f"judge {MODEL} on the {args.engine} engine, {len(pairs)} pairs, greedy, {args.response_length} new "
        f"tokens, dtype {args.dtype}, {torch.get_num_threads()} threads"
    )
    for name, (keys, with_reference) in SETTINGS.items():
        out = run(name, keys, with_reference, pairs, tokenizer, args.dtype, args.response_length, args.engine)
        for text in out["reward_extra_info"]["judge_text"][: args.show]:
            print("    judge:", repr(text))


if __name__ == "__main__":
    main()
