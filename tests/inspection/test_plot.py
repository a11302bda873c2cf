"""`hybridrl plot`: panels, data drawn, PNG written, real run metrics, errors."""

import json

import pytest
from PIL import Image

from hybridrl.cli import main as cli_main
from hybridrl.inspection.plot import PlotError, load_metrics, plot_curves, series

VAL = "val-core/openai/gsm8k/reward/mean@1"


def _write_metrics(path, rows, tail=""):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows) + tail)
    return path


ROWS = [
    {"step": 0, VAL: 0.1},
    {
        "step": 1,
        "critic/score/mean": 0.2,
        "critic/rewards/mean": 0.1,
        "actor/entropy": 2.0,
        "response_length/mean": 10.0,
        "response_length/min": 4,
        "response_length/max": 16,
        "perf/throughput": 900.0,
    },
    {
        "step": 2,
        "critic/score/mean": 0.4,
        "critic/rewards/mean": None,
        "actor/entropy": 1.5,
        "response_length/mean": 12.0,
        "response_length/min": 5,
        "response_length/max": 20,
        "perf/throughput": 950.0,
        VAL: 0.3,
    },
]


def _lines(ax):
    return {line.get_label(): (list(line.get_xdata()), list(line.get_ydata())) for line in ax.get_lines()}


def test_png_has_the_panels_and_the_data(tmp_path):
    metrics = _write_metrics(tmp_path / "metrics.jsonl", ROWS, tail='{"step": 3, "critic/sc')  # cut by a crash
    out = tmp_path / "out" / "curves.png"
    fig = plot_curves({"run": load_metrics(str(tmp_path))}, str(out))
    with Image.open(out) as image:
        assert image.format == "PNG" and image.size == (1200, 1000)
    titles = [ax.get_title() for ax in fig.axes]
    assert titles == ["reward", "KL (not logged)", "entropy", "response length", "throughput"]
    reward, _, entropy, length, throughput = fig.axes
    assert _lines(reward) == {
        "score": ([1, 2], [0.2, 0.4]),
        "reward (score - KL penalty)": ([1], [0.1]),
        "val openai/gsm8k": ([0, 2], [0.1, 0.3]),
    }
    assert _lines(entropy) == {"actor/entropy": ([1, 2], [2.0, 1.5])}
    assert _lines(throughput)["perf/throughput"][1] == [900.0, 950.0]
    assert len(length.collections) == 1  # the min-max band
    assert [p.name for p in out.parent.iterdir()] == ["curves.png"]  # written via a temporary file
    assert metrics.exists()


def test_series_skips_nulls_and_keeps_the_last_of_a_repeated_step():
    rows = [
        {"step": 1, "x": 1.0},
        {"step": 2, "x": None},
        {"step": 3, "x": 3.0},
        {"step": 2, "x": 2.5},
        {"step": 4, "x": True},
    ]
    assert series(rows, "x") == ([1, 2, 3], [1.0, 2.5, 3.0])


def test_two_runs_are_drawn_over_each_other(tmp_path):
    a = _write_metrics(tmp_path / "a.jsonl", ROWS)
    b = _write_metrics(tmp_path / "b.jsonl", [{"step": 1, "actor/kl_loss": 0.01}, {"step": 2, "actor/kl_loss": 0.02}])
    fig = plot_curves({"grpo": load_metrics(str(a)), "ppo": load_metrics(str(b))})
    kl = fig.axes[1]
    assert kl.get_title() == "KL"
    assert _lines(kl) == {"ppo: KL loss": ([1, 2], [0.01, 0.02])}
    assert {t.get_text() for t in kl.get_legend().get_texts()} == {"ppo: KL loss"}


def test_cli_on_a_real_run(dumped_run, tmp_path, capsys):
    out = tmp_path / "curves.png"
    assert cli_main(["plot", str(dumped_run), "-o", str(out)]) == 0
    assert "wrote" in capsys.readouterr().out
    with Image.open(out) as image:
        assert image.format == "PNG" and image.size == (1200, 1000)
    assert cli_main(["plot", str(dumped_run / "metrics.jsonl"), "--list"]) == 0
    listed = dict(line.split(": ", 1) for line in capsys.readouterr().out.splitlines())
    assert list(listed) == ["reward", "KL", "entropy", "response length", "throughput"]
    assert listed["reward"] == f"critic/score/mean, critic/rewards/mean, {VAL}"
    assert listed["KL"] == "actor/kl_loss"  # GRPO with use_kl_loss: no KL in the reward
    assert listed["throughput"] == "perf/throughput"


def test_errors_are_one_line(tmp_path, capsys):
    assert cli_main(["plot", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "no metrics.jsonl in this folder" in err
    assert cli_main(["plot", str(tmp_path / "nope.jsonl")]) == 2
    assert "no such file or folder" in capsys.readouterr().err
    (tmp_path / "metrics.jsonl").write_text("not json\n")
    with pytest.raises(PlotError, match="no metrics lines"):
        load_metrics(str(tmp_path))
