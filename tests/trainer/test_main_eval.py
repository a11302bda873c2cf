"""Evaluation job: generate -> eval round trip on the tiny model, hand-computed metrics, bad input."""

import json
import math

import numpy as np
import pandas as pd
import pytest
import torch

from hybridrl import cli
from hybridrl.config import load_config
from hybridrl.trainer.main_eval import run_eval
from hybridrl.trainer.main_generation import run_generation

MATH = "HuggingFaceH4/MATH-500"

# A scorer that depends only on the text, so the test can recompute every metric from the parquet.
LENGTH_SCORER = """
def compute_score(data_source, solution_str, ground_truth, extra_info=None, modulus=2):
    return {"score": float(len(solution_str) % modulus == 0), "pred": str(len(solution_str) % 3)}
"""


@pytest.fixture(scope="module")
def generated(gsm8k_parquet, tiny_model_dir, tmp_path_factory):
    """6 GSM8K prompts x 4 responses from the tiny model, written by the generation job."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    folder = tmp_path_factory.mktemp("eval_roundtrip")
    pd.read_parquet(gsm8k_parquet / "test.parquet").head(6).to_parquet(folder / "prompts.parquet", index=False)
    out = folder / "responses.parquet"
    run_generation(
        load_config(
            [
                f"data.path={folder / 'prompts.parquet'}",
                f"data.output_path={out}",
                f"model.path={tiny_model_dir}",
                "data.n_samples=4",
                "data.batch_size=3",
                "rollout.response_length=5",
                "rollout.prompt_length=256",
                "rollout.dtype=float32",
                "trainer.device=cpu",
                "rollout.top_k=0",
                "rollout.top_p=1.0",
            ],
            config_name="generation",
        )
    )
    torch.set_num_threads(threads)
    return out


def eval_config(path, *extra):
    return load_config([f"data.path={path}", "metrics.bootstrap_samples=200", *extra], config_name="evaluation")


def _majority_pred(preds):
    """The most frequent answer; among equally frequent ones, the first in response order."""
    counts = {p: preds.count(p) for p in preds}
    return next(p for p in preds if counts[p] == max(counts.values()))


def _pass_at_k(n, c, k):
    return 1 - math.comb(n - c, k) / math.comb(n, k)


def test_generate_then_eval_round_trip_with_custom_scorer(generated, tmp_path):
    scorer = tmp_path / "length_scorer.py"
    scorer.write_text(LENGTH_SCORER)
    report = run_eval(
        eval_config(
            generated, f"custom_reward_function.path={scorer}", "+custom_reward_function.reward_kwargs.modulus=3"
        )
    )
    responses = pd.read_parquet(generated)["responses"].map(list).tolist()
    scores = np.array([[float(len(r) % 3 == 0) for r in row] for row in responses])
    entry = report["data_sources"]["openai/gsm8k"]
    assert (entry["num_prompts"], entry["num_responses"]) == (6, 4)
    m = {k: v["value"] for k, v in entry["metrics"].items()}
    assert list(m) == ["mean@4", "pass@1", "pass@2", "pass@4", "maj@4", "best@4"]
    assert m["mean@4"] == pytest.approx(scores.mean())
    assert m["best@4"] == pytest.approx(scores.max(1).mean())
    c = scores.sum(1).astype(int)
    assert m["pass@2"] == pytest.approx(np.mean([_pass_at_k(4, ci, 2) for ci in c]))
    # with modulus 3 a response scores 1 exactly when its pred ("len % 3") is "0"
    maj = [float(_majority_pred([str(len(r) % 3) for r in row]) == "0") for row in responses]
    assert m["maj@4"] == pytest.approx(np.mean(maj))
    written = json.loads((generated.parent / "responses.eval.json").read_text())
    assert written["data_sources"] == report["data_sources"]


def test_eval_with_builtin_gsm8k_scorer_notes_missing_maj(generated, tmp_path, capsys):
    out = tmp_path / "report.json"
    report = run_eval(eval_config(generated, f"output_path={out}"))
    printed = capsys.readouterr().out
    metrics = report["data_sources"]["openai/gsm8k"]["metrics"]
    assert list(metrics) == ["mean@4", "pass@1", "pass@2", "pass@4", "best@4"]
    assert "maj@4 left out" in printed and "openai/gsm8k" in printed
    assert json.loads(out.read_text())["data_sources"]["openai/gsm8k"]["metrics"] == metrics


def _math_parquet(path, responses_per_row, sources=None):
    gts = ["5", r"\frac{1}{2}", "(1,2)"][: len(responses_per_row)]
    pd.DataFrame(
        {
            "data_source": sources or [MATH] * len(gts),
            "prompt": [[{"role": "user", "content": "q"}]] * len(gts),
            "reward_model": [{"style": "rule", "ground_truth": gt} for gt in gts],
            "responses": responses_per_row,
        }
    ).to_parquet(path, index=False)
    return path


def test_math_scores_hand_computed(tmp_path):
    path = _math_parquet(
        tmp_path / "m.parquet",
        [
            [r"\boxed{5}", r"\boxed{4}", r"\boxed{4}", "no box"],  # 1 right; majority "4" wrong
            [r"\boxed{0.5}", r"\boxed{\frac12}", r"\boxed{2}", r"\boxed{0.5}"],  # 3 right; majority "0.5"
            [r"\boxed{(2,1)}"] * 4,  # none right
        ],
    )
    m = {k: v for k, v in run_eval(eval_config(path, "metrics.pass_k=[1,3]"))["data_sources"][MATH]["metrics"].items()}
    assert list(m) == ["mean@4", "pass@1", "pass@3", "maj@4", "best@4"]
    assert m["mean@4"]["value"] == pytest.approx((1 / 4 + 3 / 4 + 0) / 3)
    assert m["pass@1"]["value"] == pytest.approx(m["mean@4"]["value"])
    assert m["pass@3"]["value"] == pytest.approx((_pass_at_k(4, 1, 3) + 1.0 + 0.0) / 3)
    assert m["maj@4"]["value"] == pytest.approx(1 / 3)
    assert m["best@4"]["value"] == pytest.approx(2 / 3)
    assert all(v["ci_low"] <= v["value"] <= v["ci_high"] for v in m.values())


def test_rows_with_more_responses_are_cut_to_the_fewest(tmp_path, capsys):
    path = _math_parquet(tmp_path / "m.parquet", [[r"\boxed{5}", r"\boxed{5}", r"\boxed{5}"], [r"\boxed{2}"]])
    entry = run_eval(eval_config(path))["data_sources"][MATH]
    assert entry["num_responses"] == 1 and entry["metrics"]["mean@1"]["value"] == pytest.approx(0.5)
    assert "only the first 1 of each are scored" in capsys.readouterr().out


def _cli_error(argv, capsys):
    code = cli.main(["eval", *argv])
    err = capsys.readouterr().err.strip()
    assert code == 2 and len(err.splitlines()) == 1, err
    return err


def test_parquet_without_response_column_is_one_clear_line(gsm8k_parquet, capsys):
    err = _cli_error([f"data.path={gsm8k_parquet / 'test.parquet'}"], capsys)
    assert "data.response_key" in err and "no column 'responses'" in err and "hybridrl generate" in err


def test_data_source_without_scorer_lists_known_ones_and_how_to_add(tmp_path, capsys):
    path = _math_parquet(tmp_path / "m.parquet", [[r"\boxed{5}"]], sources=["my/unknown-set"])
    err = _cli_error([f"data.path={path}"], capsys)
    assert "'my/unknown-set'" in err and MATH in err and "openai/gsm8k" in err
    assert "custom_reward_function.path" in err and "register_scorer" in err


def test_bad_pass_k_is_a_config_error(tmp_path, capsys):
    path = _math_parquet(tmp_path / "m.parquet", [[r"\boxed{5}"]])
    assert "metrics.pass_k" in _cli_error([f"data.path={path}", "metrics.pass_k=[0]"], capsys)
