"""The textual terminal UI of `hybridrl view` (imported only when the UI opens).

One screen lists a step's samples in a table; Enter opens a sample in full. Keys are listed
in the footer; the logic (loading, sorting, filtering) lives in `viewer.py`.
"""

from __future__ import annotations

import json

from rich.markup import escape
from textual.app import App, ComposeResult
from textual.binding import Binding
from textual.containers import VerticalScroll
from textual.screen import Screen
from textual.widgets import DataTable, Footer, Input, Static

from hybridrl.inspection.samples import (
    SORT_NAMES,
    SORTS,
    SampleDump,
    ViewerError,
    format_score,
    mean_score,
    one_line,
    select,
)

_SHOWN_FIELDS = ("input", "output", "score", "ground_truth", "step")


class SampleTable(DataTable):
    """The sample list; left/right change the step instead of moving a cell cursor."""

    BINDINGS = [
        Binding("left", "app.step(-1)", "prev step", show=False),
        Binding("right", "app.step(1)", "next step", show=False),
    ]


class SampleScreen(Screen):
    """One sample in full: score, ground truth, input, output and any extra fields."""

    BINDINGS = [
        Binding("escape,q", "app.pop_screen", "back"),
        Binding("n", "move(1)", "next sample"),
        Binding("p", "move(-1)", "prev sample"),
    ]

    def __init__(self, rows: list[tuple[int, dict]], position: int, step: int):
        super().__init__()
        self.rows, self.position, self.step = rows, position, step

    def compose(self) -> ComposeResult:
        yield Static(id="sample-head")
        with VerticalScroll():
            yield Static(id="sample-body")
        yield Footer()

    def on_mount(self) -> None:
        self.show()

    def show(self) -> None:
        index, record = self.rows[self.position]
        self.query_one("#sample-head", Static).update(
            f"[b]step {self.step} · sample #{index}[/b] ({self.position + 1}/{len(self.rows)}) · "
            f"score [b]{format_score(record)}[/b] · ground truth [b]{escape(str(record.get('ground_truth')))}[/b]"
        )
        extra = {k: v for k, v in record.items() if k not in _SHOWN_FIELDS}
        parts = [
            f"[b reverse] input [/]\n{escape(str(record.get('input', '')))}",
            f"[b reverse] output [/]\n{escape(str(record.get('output', '')))}",
        ]
        if extra:
            parts.append("[b reverse] other fields [/]\n" + escape(json.dumps(extra, ensure_ascii=False, indent=2)))
        self.query_one("#sample-body", Static).update("\n\n".join(parts))

    def action_move(self, delta: int) -> None:
        self.position = (self.position + delta) % len(self.rows)
        self.show()


class SampleViewer(App):
    """Browse a sample dump folder by step; sort and filter by score or text."""

    TITLE = "hybridrl view"
    CSS = """
    #status { height: auto; padding: 0 1; background: $boost; }
    #filter { dock: bottom; display: none; }
    #filter.visible { display: block; }
    #sample-head { height: auto; padding: 0 1; background: $boost; }
    #sample-body { padding: 0 1; }
    """
    BINDINGS = [
        Binding("q", "quit", "quit"),
        Binding("n,right_square_bracket", "step(1)", "next step"),
        Binding("p,left_square_bracket", "step(-1)", "prev step"),
        Binding("s", "cycle_sort", "sort"),
        Binding("slash", "open_filter", "filter"),
        Binding("escape", "clear_filter", "clear filter", show=False),
    ]

    def __init__(self, dump: SampleDump, step: int | None = None, sort: str = "file", filter_text: str = ""):
        super().__init__()
        self.dump = dump
        self.step_index = dump.steps.index(step) if step is not None else len(dump.steps) - 1
        self.sort, self.filter_text = sort, filter_text
        self.rows: list[tuple[int, dict]] = []
        self.text_width = 48

    @property
    def step(self) -> int:
        return self.dump.steps[self.step_index]

    def compose(self) -> ComposeResult:
        yield Static(id="status")
        yield SampleTable(cursor_type="row", zebra_stripes=True)
        yield Input(placeholder="filter: >0.5, <=0, ==1 on the score, or text; Enter applies, Esc clears", id="filter")
        yield Footer()

    def on_mount(self) -> None:
        table = self.query_one(SampleTable)
        # input and output share what the terminal has left after the narrow columns
        self.text_width = max(20, (self.size.width - 4 - 8 - 14 - 12) // 2)
        for name, width in (
            ("#", 4),
            ("score", 8),
            ("ground truth", 14),
            ("input (end)", self.text_width),
            ("output", self.text_width),
        ):
            table.add_column(name, width=width)
        self.refresh_rows()
        table.focus()

    def refresh_rows(self) -> None:
        """Re-read the current step with the current sort and filter into the table."""
        records = self.dump.samples(self.step)
        self.rows = select(records, self.sort, self.filter_text)
        table = self.query_one(SampleTable)
        table.clear()
        for position, (index, record) in enumerate(self.rows):
            table.add_row(
                str(index),
                format_score(record),
                one_line(record.get("ground_truth"), 14),
                one_line(record.get("input"), self.text_width, keep_end=True),
                one_line(record.get("output"), self.text_width),
                key=str(position),
            )
        mean = mean_score(records)
        status = (
            f"[b]step {self.step}[/b] ({self.step_index + 1}/{len(self.dump.steps)}) · "
            f"{len(self.rows)} of {len(records)} samples · mean score "
            f"{'-' if mean is None else f'{mean:.4g}'} · sort: {SORT_NAMES[self.sort]}"
        )
        if self.filter_text:
            status += f" · filter: {escape(self.filter_text)}"
        self.query_one("#status", Static).update(status)

    def check_action(self, action: str, parameters: tuple) -> bool | None:
        # the list's keys do nothing (and are not shown) while a sample is open
        if action in ("step", "cycle_sort", "open_filter", "clear_filter"):
            return not isinstance(self.screen, SampleScreen)
        return True

    def action_step(self, delta: int) -> None:
        self.step_index = max(0, min(len(self.dump.steps) - 1, self.step_index + delta))
        self.refresh_rows()

    def action_cycle_sort(self) -> None:
        self.sort = SORTS[(SORTS.index(self.sort) + 1) % len(SORTS)]
        self.refresh_rows()

    def action_open_filter(self) -> None:
        box = self.query_one("#filter", Input)
        box.value = self.filter_text
        box.add_class("visible")
        box.focus()

    def action_clear_filter(self) -> None:
        self.filter_text = ""
        self._close_filter()

    def on_input_submitted(self, event: Input.Submitted) -> None:
        try:
            select([], self.sort, event.value)  # parse only
        except ViewerError as err:
            self.notify(str(err), severity="error")
            return
        self.filter_text = event.value.strip()
        self._close_filter()

    def _close_filter(self) -> None:
        self.query_one("#filter", Input).remove_class("visible")
        self.query_one(SampleTable).focus()
        self.refresh_rows()

    def on_data_table_row_selected(self, event: DataTable.RowSelected) -> None:
        if self.rows:
            self.push_screen(SampleScreen(self.rows, int(event.row_key.value), self.step))
