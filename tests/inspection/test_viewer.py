"""`hybridrl view`: the dumps of a real tiny training run, browsed in the terminal UI (driven
by keys through textual's Pilot) and printed as tables; sorting and filtering by hand."""

import asyncio
import json

import pytest

pytest.importorskip("textual")  # hybridrl view's terminal UI (the view extra)

from hybridrl.cli import main as cli_main
from hybridrl.inspection.viewer import SampleDump, ViewerError, parse_filter, select
from hybridrl.inspection.viewer_app import SampleScreen, SampleTable, SampleViewer
from hybridrl.trainer.ppo.rollout_dump import list_steps, read_step

VAL = "val-core/openai/gsm8k/reward/mean@1"


def _metrics(run):
    return {r["step"]: r for r in map(json.loads, (run / "metrics.jsonl").read_text().splitlines())}


def _mean(records):
    return sum(r["score"] for r in records) / len(records)


def test_training_run_dumps_every_step(dumped_run):
    metrics = _metrics(dumped_run)
    rollout, validation = list_steps(str(dumped_run / "rollout")), list_steps(str(dumped_run / "validation"))
    assert list(rollout) == [1, 2] and list(validation) == [0, 2]
    for step, path in rollout.items():
        records = read_step(path)
        assert len(records) == 4  # 2 prompts x rollout.n=2
        assert {k for r in records for k in r} >= {"input", "output", "score", "ground_truth", "step"}
        assert {r["step"] for r in records} == {step}
        assert sorted(map(len, [[r for r in records if r["uid"] == u] for u in {r["uid"] for r in records}])) == [2, 2]
        assert _mean(records) == pytest.approx(metrics[step]["critic/score/mean"])
    val0, val2 = read_step(validation[0]), read_step(validation[2])
    assert [r["input"] for r in val0] == [r["input"] for r in val2] and len(val0) > 16  # both val batches
    assert _mean(val2) == pytest.approx(metrics[2][VAL])
    assert all(r["ground_truth"].isdigit() for r in val2)
    printed = (dumped_run / "stdout.txt").read_text().splitlines()
    heads = [line.split(" | score")[0] for line in printed if "| validation sample" in line]
    assert heads == [f"step {s} | validation sample {i}/2" for s in (0, 2) for i in (1, 2)]


def test_viewer_browses_real_dumps(dumped_run):
    records = {step: read_step(path) for step, path in list_steps(str(dumped_run / "rollout")).items()}

    async def drive():
        app = SampleViewer(SampleDump(str(dumped_run / "rollout")))
        async with app.run_test(size=(160, 40)) as pilot:
            table = app.query_one(SampleTable)
            assert app.step == 2 and table.row_count == 4  # opens on the last step
            await pilot.press("left")
            assert app.step == 1 and [r for _, r in app.rows] == records[1]
            await pilot.press("left", "p")
            assert app.step == 1  # no step before the first
            await pilot.press("right")
            assert app.step == 2
            await pilot.press("s")
            scores = [r["score"] for _, r in app.rows]
            assert scores == sorted((r["score"] for r in records[2]), reverse=True)
            await pilot.press("s")
            assert [r["score"] for _, r in app.rows] == sorted(scores)
            threshold = sorted(scores)[2]
            await pilot.press("slash", *f">={threshold}", "enter")
            assert app.filter_text == f">={threshold}"
            kept = [r for r in records[2] if r["score"] >= threshold]
            assert table.row_count == len(kept)
            assert sorted(r["score"] for _, r in app.rows) == sorted(r["score"] for r in kept)
            await pilot.press("escape")
            assert app.filter_text == "" and table.row_count == 4
            await pilot.press("down", "enter")
            screen = app.screen
            assert isinstance(screen, SampleScreen) and screen.position == 1
            index, record = app.rows[1]
            body = str(screen.query_one("#sample-body").render())
            assert record["input"] in body and record["output"] in body
            assert f"sample #{index}" in str(screen.query_one("#sample-head").render())
            await pilot.press("n")
            assert screen.position == 2
            await pilot.press("escape")
            assert not isinstance(app.screen, SampleScreen)

    asyncio.run(drive())


def test_bad_filter_keeps_the_box_open():
    async def drive(folder):
        app = SampleViewer(SampleDump(folder))
        async with app.run_test() as pilot:
            await pilot.press("slash", *">abc", "enter")
            assert app.filter_text == "" and app.query_one("#filter").has_class("visible")

    import tempfile

    with tempfile.TemporaryDirectory() as folder:
        with open(f"{folder}/step_1.jsonl", "w") as f:
            f.write('{"input": "q", "output": "a", "score": 1}\n')
        asyncio.run(drive(folder))


def test_print_tables_of_a_real_dump(dumped_run, capsys):
    assert cli_main(["view", str(dumped_run / "validation"), "--print", "--limit", "3", "--sort", "best"]) == 0
    out = capsys.readouterr().out
    total = len(read_step(str(dumped_run / "validation" / "step_2.jsonl")))
    assert f"step 2: 3 of {total} sample(s) (score, best first)" in out
    assert "2 step(s)" in out


def test_main_opens_the_ui_with_the_options(dumped_run, monkeypatch):
    seen = []
    monkeypatch.setattr(SampleViewer, "run", lambda self: seen.append((self.step, self.sort, self.filter_text)))
    assert cli_main(["view", str(dumped_run / "rollout"), "--step", "1", "--sort", "worst", "--filter", "<1"]) == 0
    assert seen == [(1, "worst", "<1")]


def test_errors_are_one_line(dumped_run, tmp_path, capsys):
    assert cli_main(["view", str(dumped_run), "--print"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1
    assert f"sample folders under it: {dumped_run / 'rollout'}, {dumped_run / 'validation'}" in err
    assert cli_main(["view", str(tmp_path / "missing")]) == 2
    assert "no such folder" in capsys.readouterr().err
    assert cli_main(["view", str(dumped_run / "rollout"), "--step", "7"]) == 2
    assert "has steps [1, 2]" in capsys.readouterr().err


RECORDS = [
    {"input": "A", "output": "x", "score": 0.5},
    {"input": "b", "output": "Yes", "score": None},
    {"input": "c", "output": "z", "score": 1},
    {"input": "d", "output": "w", "score": 0.5, "ground_truth": "yes"},
]


def test_select_sorts_with_unscored_last_and_ties_in_file_order():
    assert [i for i, _ in select(RECORDS)] == [0, 1, 2, 3]
    assert [i for i, _ in select(RECORDS, "best")] == [2, 0, 3, 1]
    assert [i for i, _ in select(RECORDS, "worst")] == [0, 3, 2, 1]
    with pytest.raises(ViewerError, match="choose one of"):
        select(RECORDS, "-score")


@pytest.mark.parametrize(
    "text, kept",
    [
        ("", [0, 1, 2, 3]),
        (">0.5", [2]),
        (">= 0.5", [0, 2, 3]),
        ("==1", [2]),
        ("=0.5", [0, 3]),
        ("!=0.5", [2]),
        ("<1", [0, 3]),
        ("yes", [1, 3]),
        ("a", [0]),
    ],
)
def test_filters(text, kept):
    assert [i for i, _ in select(RECORDS, filter_text=text)] == kept


def test_bad_score_filter():
    with pytest.raises(ViewerError, match=r"filter '<=x': a score filter is <op><number>"):
        parse_filter("<=x")
