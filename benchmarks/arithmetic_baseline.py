"""Baseline of the bundled SmolLM2-135M-Instruct on the arithmetic task (no training).

Samples ``--n_samples`` responses (temperature 1.0, top_p 1.0) and one greedy response for
each of the first ``--n_prompts`` test prompts, scores them with
``hybridrl.rewards.arithmetic.compute_score`` and prints the sampled mean reward, the greedy
accuracy, the mean response length in tokens, the share of responses cut at
``--max_new_tokens`` and the wall time.

    python benchmarks/arithmetic_baseline.py                       # data generated on the fly
    python benchmarks/arithmetic_baseline.py --data ~/data/arithmetic/test.parquet
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time

import torch


def load_model(dtype: torch.dtype):
    """The bundled SmolLM2-135M-Instruct and its left-padding tokenizer, as training loads them.

    The model's own generation defaults are dropped, so sampling is the plain softmax that the
    training rollout uses.
    """
    from transformers import GenerationConfig

    from hybridrl.models import load_causal_lm, load_tokenizer, resolve_model_path

    folder = resolve_model_path("HuggingFaceTB/SmolLM2-135M-Instruct")
    tokenizer = load_tokenizer(folder)
    model = load_causal_lm(folder, dtype=dtype).eval()
    model.generation_config = GenerationConfig(pad_token_id=tokenizer.pad_token_id, eos_token_id=tokenizer.eos_token_id)
    return model, tokenizer


@torch.no_grad()
def generate(
    model, tokenizer, messages: list, n: int, max_new_tokens: int, batch_size: int, greedy: bool
) -> tuple[list[str], list[int], list[bool]]:
    """``n`` responses per prompt (prompt-major order): texts, token lengths, finished flags."""
    texts = [
        tokenizer.apply_chat_template(m, tokenize=False, add_generation_prompt=True) for m in messages for _ in range(n)
    ]
    out_texts, lengths, finished = [], [], []
    for start in range(0, len(texts), batch_size):
        enc = tokenizer(texts[start : start + batch_size], return_tensors="pt", padding=True)
        sampling = {"do_sample": False} if greedy else {"do_sample": True, "temperature": 1.0, "top_p": 1.0, "top_k": 0}
        seqs = model.generate(**enc, max_new_tokens=max_new_tokens, **sampling, pad_token_id=tokenizer.pad_token_id)
        for row in seqs[:, enc["input_ids"].shape[1] :]:
            is_eos = (row == tokenizer.eos_token_id).nonzero()
            length = int(is_eos[0]) + 1 if len(is_eos) else len(row)
            out_texts.append(tokenizer.decode(row[:length], skip_special_tokens=True))
            lengths.append(length)
            finished.append(bool(len(is_eos)))
    return out_texts, lengths, finished


def load_test_rows(path: str | None, n_prompts: int):
    """First ``n_prompts`` rows of the test parquet; generates the default data when no path."""
    import pandas as pd

    if path is None:
        from hybridrl.data.preprocess import arithmetic

        path = arithmetic.main(["--local_dir", tempfile.mkdtemp(), "--train_size", "0"])[1]
    return pd.read_parquet(os.path.expanduser(path)).head(n_prompts)


def main(argv: list[str] | None = None) -> dict:
    from hybridrl.rewards.arithmetic import compute_score

    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--data", default=None, help="test.parquet (default: generate the default task)")
    p.add_argument("--n_prompts", type=int, default=48)
    p.add_argument("--n_samples", type=int, default=4)
    p.add_argument("--max_new_tokens", type=int, default=96)
    p.add_argument("--batch_size", type=int, default=64)
    p.add_argument("--dtype", choices=["bfloat16", "float32"], default="float32")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--show", type=int, default=3, help="print this many sampled responses")
    args = p.parse_args(argv)

    torch.manual_seed(args.seed)
    rows = load_test_rows(args.data, args.n_prompts)
    messages = [list(m) for m in rows["prompt"]]
    truths = [rm["ground_truth"] for rm in rows["reward_model"]]
    model, tokenizer = load_model(getattr(torch, args.dtype))

    start = time.perf_counter()
    texts, lengths, finished = generate(
        model, tokenizer, messages, args.n_samples, args.max_new_tokens, args.batch_size, greedy=False
    )
    sample_s = time.perf_counter() - start
    rewards = [compute_score(t, truths[i // args.n_samples]) for i, t in enumerate(texts)]
    greedy_texts, _, _ = generate(model, tokenizer, messages, 1, args.max_new_tokens, args.batch_size, greedy=True)
    greedy = [compute_score(t, g) for t, g in zip(greedy_texts, truths)]
    wall_s = time.perf_counter() - start

    for i in range(min(args.show, len(texts))):
        print(f"--- truth {truths[i // args.n_samples]} reward {rewards[i]}: {texts[i]!r}")
    result = {
        "sampled_mean_reward": sum(rewards) / len(rewards),
        "greedy_accuracy": sum(greedy) / len(greedy),
        "mean_response_tokens": sum(lengths) / len(lengths),
        "truncated_fraction": 1 - sum(finished) / len(finished),
        "sampling_wall_s": sample_s,
        "total_wall_s": wall_s,
    }
    print(
        f"prompts {len(messages)} x {args.n_samples} samples, dtype {args.dtype}, max_new_tokens {args.max_new_tokens}"
    )
    for key, value in result.items():
        print(f"{key:22s} {value:.3f}")
    return result


if __name__ == "__main__":
    main()
