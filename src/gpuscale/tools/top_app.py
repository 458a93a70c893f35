"""``gpuscale top``'s live screen: the three tables of top.py, refreshed in place.

The app reads the fleet through ``fetch`` (a blocking call that raises ToolError, run in a
worker thread, one at a time) and keeps no state but the last reply: sorting and filtering
redraw it. When the scaler stops answering, the status line says so with the client's
message, the tables keep the last data (the status says how old), and polling goes on.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable
from typing import ClassVar

from textual import work
from textual.app import App, ComposeResult
from textual.binding import Binding, BindingType
from textual.css.query import NoMatches
from textual.widgets import DataTable, Footer, Static
from textual.widgets.data_table import CellDoesNotExist

from gpuscale.proto import inspect_pb2 as pb
from gpuscale.tools import top, top_render
from gpuscale.tools.client import ToolError

Fetch = Callable[[], pb.FleetReply]
SCROLLBAR = 2  # a DataTable's vertical scrollbar, kept free so no column is hidden under it
TABLES = ("devices", "pods", "workloads")


class TopApp(App[None]):
    """``fetch``: the whole fleet (unfiltered: the filters cycle through what it holds);
    ``first``: a reply already read, shown at once."""

    TITLE = "gpuscale top"
    CSS = """
    #status { height: auto; max-height: 4; background: $boost; }
    #status.down { background: $error 40%; }
    .title { height: 1; text-style: bold; color: $accent; }
    DataTable { height: 1fr; }
    #workloads { height: auto; max-height: 1fr; }
    #detail { height: 1; color: $text-muted; }
    """
    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("s", "sort", "Sort"),
        Binding("n", "namespace", "Namespace"),
        Binding("N", "node", "Node"),
        Binding("r", "refresh", "Refresh"),
        Binding("q", "quit", "Quit"),
    ]

    def __init__(self, fetch: Fetch, source: str, interval: float = 2.0, sort: str = "util",
                 namespace: str = "", node: str = "",
                 first: pb.FleetReply | None = None) -> None:
        super().__init__()
        self._fetch = fetch
        self.source = source
        self.interval = interval
        self.sort = sort
        self.namespace = namespace
        self.node = node
        self.reply = first
        self.received = time.monotonic() if first is not None else 0.0
        self.error = ""
        self.view: top.View | None = None
        self._busy = False
        self._widths: dict[str, int] = {}  # each table's width when its columns were laid

    def compose(self) -> ComposeResult:
        yield Static(id="status")
        for name in TABLES:
            yield Static(id=f"{name}-title", classes="title")
            table: DataTable[object] = DataTable(id=name, cursor_type="row", zebra_stripes=True)
            yield table
        yield Static(id="detail")
        yield Footer()

    def on_mount(self) -> None:
        self.redraw()
        self.poll()
        self.set_interval(self.interval, self.poll)

    def on_resize(self) -> None:
        self.redraw()

    # -- reading -----------------------------------------------------------------------------

    def poll(self) -> None:
        if not self._busy:  # a slow scaler gets one call at a time, not a pile of them
            self._busy = True
            self._read()

    @work(thread=True, group="fetch")
    def _read(self) -> None:
        try:
            reply = self._fetch()
        except ToolError as exc:
            self.call_from_thread(self._failed, str(exc))
        else:
            self.call_from_thread(self._got, reply)

    def _got(self, reply: pb.FleetReply) -> None:
        self._busy = False
        self.reply, self.received, self.error = reply, time.monotonic(), ""
        self.redraw()

    def _failed(self, message: str) -> None:
        self._busy = False
        self.error = message
        self.redraw()

    # -- keys --------------------------------------------------------------------------------

    def action_sort(self) -> None:
        self.sort = top.SORTS[(top.SORTS.index(self.sort) + 1) % len(top.SORTS)]
        self.redraw()

    def action_namespace(self) -> None:
        self.namespace = top.cycle(self.namespace, self.view.namespaces if self.view else ())
        self.redraw()

    def action_node(self) -> None:
        self.node = top.cycle(self.node, self.view.nodes if self.view else ())
        self.redraw()

    def action_refresh(self) -> None:
        self.poll()

    # -- drawing -----------------------------------------------------------------------------

    def redraw(self) -> None:
        try:
            status = self.query_one("#status", Static)
        except NoMatches:  # a reply that lands while the app is closing
            return
        if self.reply is not None:
            self.view = top.build(self.reply, self.sort, self.namespace, self.node)
        if self.error:
            held = (f"; showing data from {time.monotonic() - self.received:.0f} s ago"
                    if self.reply is not None else "")
            status.update(f"{self.source}: no answer, retrying every {self.interval:g} s"
                          f"{held}. {self.error}")
            status.add_class("down")
        else:
            status.update(f"{self.source}  " + (self.view.summary if self.view else
                                                 "reading the fleet..."))
            status.remove_class("down")
        if self.view is None:
            return
        width = self.size.width - SCROLLBAR
        for name, table in zip(TABLES, self.view.tables, strict=True):
            self.query_one(f"#{name}-title", Static).update(
                f"{table.title} ({len(table.rows)})")
            self._fill(self.query_one(f"#{name}", DataTable), table, width)
        self._explain()

    def _fill(self, widget: DataTable[object], table: top.Table, width: int) -> None:
        cols = top_render.widths(table.columns, width)
        keep = None
        with contextlib.suppress(CellDoesNotExist):  # an empty table has no cursor row
            keep = widget.coordinate_to_cell_key(widget.cursor_coordinate).row_key.value
        widget.clear(columns=self._widths.get(str(widget.id)) != width)
        if not widget.columns:
            for c, w in zip(table.columns, cols, strict=True):
                widget.add_column(c.title, width=w)
        for row in table.rows:
            cells = top_render.fitted(row, cols)
            widget.add_row(*(top_render.text(c, col.right) for c, col
                             in zip(cells, table.columns, strict=True)), key=row.key)
        if keep is not None and keep in {r.key for r in table.rows}:
            widget.move_cursor(row=widget.get_row_index(keep), animate=False)
        self._widths[str(widget.id)] = width

    def _explain(self) -> None:
        try:
            detail = self.query_one("#detail", Static)
        except NoMatches:  # a highlight event delivered while the screen is torn down
            return
        focused = self.focused
        if self.view is None or not isinstance(focused, DataTable) or not focused.row_count:
            detail.update(top.QUEUE_LEGEND)
            return
        table = self.view.tables[TABLES.index(str(focused.id))]
        row = table.rows[focused.cursor_row] if focused.cursor_row < len(table.rows) else None
        detail.update(top.explain_row(row) or top.QUEUE_LEGEND)

    def on_data_table_row_highlighted(self) -> None:
        self._explain()

    def on_descendant_focus(self) -> None:
        self._explain()

    def row_texts(self, name: str) -> list[list[str]]:
        """The cells of table ``name`` (devices, pods, workloads) as shown: for tests and
        for anyone scripting the app."""
        widget = self.query_one(f"#{name}", DataTable)
        return [[str(getattr(c, "plain", c)) for c in widget.get_row_at(i)]
                for i in range(widget.row_count)]

