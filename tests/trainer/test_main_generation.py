"""Generation job on the tiny model: output rows, resume after an interruption, bad config."""

import os

import pandas as pd
import pyarrow.parquet as pq
import pytest
import torch

from hybridrl import cli
from hybridrl.config import ConfigError, load_config
from hybridrl.trainer import main_generation
from hybridrl.trainer.main_generation import parts_dir, run_generation
from hybridrl.workers.rollout.hf import HFRollout

NUM_PROMPTS, BATCH_SIZE, N_SAMPLES = 10, 4, 2  # 3 batches: 4 + 4 + 2 prompts


@pytest.fixture(autouse=True, scope="module")
def _one_torch_thread():
    """Tiny-model ops gain nothing from threads on the shared 2-core machine."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def prompts_parquet(gsm8k_parquet, tmp_path_factory):
    path = tmp_path_factory.mktemp("gen_input") / "prompts.parquet"
    pd.read_parquet(gsm8k_parquet / "test.parquet").head(NUM_PROMPTS).to_parquet(path, index=False)
    return str(path)


def gen_config(prompts_parquet, model_dir, output_path, *extra):
    return load_config(
        [
            f"data.path={prompts_parquet}",
            f"data.output_path={output_path}",
            f"model.path={model_dir}",
            f"data.n_samples={N_SAMPLES}",
            f"data.batch_size={BATCH_SIZE}",
            "rollout.response_length=6",
            "rollout.prompt_length=256",
            "rollout.dtype=float32",
            "trainer.device=cpu",
            *extra,
        ],
        config_name="generation",
    )


@pytest.fixture(scope="module")
def full_run(prompts_parquet, tiny_model_dir, tmp_path_factory):
    """One uninterrupted run: the output path."""
    out = tmp_path_factory.mktemp("gen_full") / "out.parquet"
    assert run_generation(gen_config(prompts_parquet, tiny_model_dir, out)) == str(out)
    return str(out)


def test_output_is_input_rows_plus_responses(full_run, prompts_parquet):
    inp, out = pq.read_table(prompts_parquet), pq.read_table(full_run)
    assert out.column_names == inp.column_names + ["responses"]
    assert out.drop_columns(["responses"]).equals(inp)  # rows unchanged, same order
    responses = out.column("responses").to_pylist()
    assert all(len(r) == N_SAMPLES and all(isinstance(s, str) for s in r) for r in responses)
    assert any(r[0] != r[1] for r in responses)  # sampled, not copies
    assert not os.path.exists(parts_dir(full_run))


def test_resume_skips_finished_batches_and_matches_an_uninterrupted_run(
    full_run, prompts_parquet, tiny_model_dir, tmp_path, monkeypatch
):
    calls = []
    real = HFRollout.generate_sequences

    def counting(self, prompts):
        calls.append(len(prompts))
        if fail_at is not None and len(calls) == fail_at:
            raise RuntimeError("interrupted")
        return real(self, prompts)

    monkeypatch.setattr(HFRollout, "generate_sequences", counting)
    out = tmp_path / "out.parquet"
    config = gen_config(prompts_parquet, tiny_model_dir, out)
    fail_at = 3  # the third batch dies: two are finished
    with pytest.raises(RuntimeError, match="interrupted"):
        run_generation(config)
    assert sorted(os.listdir(parts_dir(out))) == ["batch-000000.parquet", "batch-000001.parquet", "manifest.json"]
    assert not out.exists()
    calls.clear()
    fail_at = None
    run_generation(config)
    assert calls == [2 * N_SAMPLES]  # only the last batch (2 prompts) was generated again
    assert pq.read_table(out).equals(pq.read_table(full_run))  # per-batch seeds: same samples
    assert not os.path.exists(parts_dir(out))


def test_parts_of_other_settings_are_not_reused(prompts_parquet, tiny_model_dir, tmp_path, monkeypatch):
    out = tmp_path / "out.parquet"
    monkeypatch.setattr(main_generation, "write_output", lambda *a: (_ for _ in ()).throw(RuntimeError("stop")))
    with pytest.raises(RuntimeError, match="stop"):  # every batch done, final write interrupted
        run_generation(gen_config(prompts_parquet, tiny_model_dir, out))
    with pytest.raises(ConfigError, match=r"n_samples changed.*delete the folder"):
        run_generation(gen_config(prompts_parquet, tiny_model_dir, out, "data.n_samples=3"))


def test_damaged_parts_are_generated_again(full_run, prompts_parquet, tiny_model_dir, tmp_path, monkeypatch, capsys):
    """A cut part and a part that is not parquet are named in a warning, removed and generated
    again (same seeds: the output equals an uninterrupted run's); a damaged manifest is one line."""
    out = tmp_path / "out.parquet"
    config = gen_config(prompts_parquet, tiny_model_dir, out)
    real_write_output = main_generation.write_output
    monkeypatch.setattr(main_generation, "write_output", lambda *a: (_ for _ in ()).throw(RuntimeError("stop")))
    with pytest.raises(RuntimeError, match="stop"):  # every batch done, final write interrupted
        run_generation(config)
    monkeypatch.setattr(main_generation, "write_output", real_write_output)
    folder = parts_dir(out)
    cut = os.path.join(folder, "batch-000001.parquet")
    with open(cut, "rb") as f:
        data = f.read()
    with open(cut, "wb") as f:
        f.write(data[: len(data) // 2])
    garbage = os.path.join(folder, "batch-000002.parquet")
    with open(garbage, "wb") as f:
        f.write(b"not parquet")
    calls = []
    real = HFRollout.generate_sequences
    monkeypatch.setattr(HFRollout, "generate_sequences", lambda self, p: calls.append(len(p)) or real(self, p))
    capsys.readouterr()
    run_generation(config)
    assert calls == [4 * N_SAMPLES, 2 * N_SAMPLES]  # batches 1 and 2 again, batch 0 kept
    warnings = [line for line in capsys.readouterr().out.splitlines() if "warning" in line]
    assert len(warnings) == 2 and cut in warnings[0] and garbage in warnings[1], warnings
    assert pq.read_table(out).equals(pq.read_table(full_run))

    os.makedirs(folder)
    with open(os.path.join(folder, "manifest.json"), "w") as f:
        f.write('{"batch_size": 4,')
    with pytest.raises(ConfigError, match=r"manifest.json is damaged.*delete .*\.parts to start over"):
        run_generation(config)


def test_engine_start_errors_name_this_jobs_keys(prompts_parquet, tiny_model_dir, tmp_path, monkeypatch):
    """The engines name training's keys (actor_rollout_ref.rollout.*); hybridrl generate's are rollout.*."""
    from hybridrl.workers.rollout import RolloutEngineError

    class FailingEngine:
        def __init__(self, *args):
            raise RolloutEngineError(
                "actor_rollout_ref.rollout.name=vllm: vLLM could not start an engine: no memory; change "
                "actor_rollout_ref.rollout.kv_cache_memory_gb (now 1.0), or actor_rollout_ref.model.path"
            )

    monkeypatch.setattr(main_generation, "get_rollout_cls", lambda name: FailingEngine)
    with pytest.raises(RolloutEngineError) as err:
        run_generation(gen_config(prompts_parquet, tiny_model_dir, tmp_path / "o.parquet"))
    assert str(err.value) == (
        "rollout.name=vllm: vLLM could not start an engine: no memory; change "
        "rollout.kv_cache_memory_gb (now 1.0), or model.path"
    )


@pytest.mark.parametrize(
    "override,match",
    [
        ("rollout.temperature=0", r"data.n_samples=2 with greedy decoding"),
        ("data.batch_size=0", r"data.batch_size=0 must be a whole number >= 1"),
        ("data.output_path=''", r"data.output_path is empty"),
    ],
)
def test_bad_config_is_one_clear_error(prompts_parquet, tiny_model_dir, tmp_path, override, match):
    with pytest.raises(ConfigError, match=match):
        run_generation(gen_config(prompts_parquet, tiny_model_dir, tmp_path / "o.parquet", override))


def test_cli_missing_input_prints_one_line(tiny_model_dir, tmp_path, capsys):
    code = cli.main(
        [
            "generate",
            f"data.path={tmp_path}/nope.parquet",
            f"data.output_path={tmp_path}/o.parquet",
            f"model.path={tiny_model_dir}",
            "trainer.device=cpu",
        ]
    )
    err = capsys.readouterr().err.strip()
    assert code == 2 and len(err.splitlines()) == 1
    assert "data.path" in err and "nope.parquet does not exist" in err
