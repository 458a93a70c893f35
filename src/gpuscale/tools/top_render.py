"""``gpuscale top``'s tables laid out for a terminal width and drawn with rich: printed
once (``--once``), or cell by cell by the Textual app (top_app.py). The rows come from
top.py; a cell cut to fit a terminal ends in "…" and keeps its whole text in its note.
Printed to a pipe or a file, every cell is whole (``once_text`` with no width): that output
is for reading and grep.
"""

from __future__ import annotations

import io
from collections.abc import Sequence

from rich.console import Console
from rich.table import Table as RichTable
from rich.text import Text

from gpuscale.tools.top import QUEUE_LEGEND, Cell, Column, Row, Table, View

PAD = 2  # columns between two cells (one space each side in Textual, one gap in rich)


def _clip(text: str, width: int) -> str:
    return text if len(text) <= width else text[:max(0, width - 1)] + "…"


def widths(columns: Sequence[Column], width: int) -> tuple[int, ...]:
    """Each column's width so that the cells and PAD between each two fit ``width``
    (flex columns share what is left; below the minimum, flex columns shrink first)."""
    out = [c.width for c in columns]
    spare = width - sum(out) - PAD * len(columns)
    flexes = sum(c.flex for c in columns)
    if spare > 0 and flexes:
        for i, c in enumerate(columns):
            out[i] += spare * c.flex // flexes
    elif spare < 0:
        for i in sorted(range(len(columns)), key=lambda i: -columns[i].flex):
            take = min(-spare, out[i] - 3)
            out[i] -= take
            spare += take
    return tuple(out)


def whole_widths(table: Table) -> tuple[int, ...]:
    """Each column as wide as its title or its widest cell: nothing is cut."""
    return tuple(max([len(c.title)] + [len(r.cells[i].text) for r in table.rows])
                 for i, c in enumerate(table.columns))


def fitted(row: Row, cols: Sequence[int]) -> tuple[Cell, ...]:
    """The row's cells cut to ``cols``; a cut cell keeps its whole text in its note."""
    return tuple(c if len(c.text) <= w else Cell(_clip(c.text, w), c.note or c.text, c.style)
                 for c, w in zip(row.cells, cols, strict=True))


def text(cell: Cell, right: bool = False) -> Text:
    return Text(cell.text, style=cell.style, no_wrap=True, overflow="ellipsis",
                justify="right" if right else "left")


def once_text(view: View, width: int | None, styled: bool = False) -> str:
    """The view as ``--once`` prints it: fitted to ``width`` columns (a terminal's), or,
    with ``width`` None (a pipe, a file), every cell whole in columns as wide as their
    widest cell, and the notes under the tables wrapped between words at 80 columns or
    the widest table's width. ``styled``: with the terminal's bold and dim."""
    whole = width is None
    if width is None:
        width = max([80, len(view.summary)]
                    + [sum(whole_widths(t)) + PAD * (len(t.columns) - 1)
                       for t in view.tables])
    console = Console(file=io.StringIO(), width=width, highlight=False,
                      force_terminal=styled, color_system="standard" if styled else None)
    for part in rich_tables(view, width, whole):
        console.print(part)
    text: str = console.file.getvalue()  # type: ignore[attr-defined]
    return text


def rich_tables(view: View, width: int, whole: bool = False) -> list[RichTable | Text]:
    """The view for printing once: each table laid out for ``width`` columns (``whole``:
    each column as wide as its widest cell, whatever ``width`` says), then what each ``-``
    means (distinct reasons, with how many cells)."""
    out: list[RichTable | Text] = [Text(view.summary, style="bold")]
    notes: dict[str, int] = {}
    for table in view.tables:
        cols = whole_widths(table) if whole else widths(table.columns, width)
        t = RichTable(title=table.title, title_justify="left", box=None, padding=(0, 1),
                      pad_edge=False, show_edge=False, expand=False, collapse_padding=True)
        for col, w in zip(table.columns, cols, strict=True):
            t.add_column(col.title, width=w, no_wrap=True, overflow="ellipsis",
                         justify="right" if col.right else "left")
        cut: list[str] = []  # the whole text of each cell the width shortened
        for row in table.rows:
            shown = fitted(row, cols)
            t.add_row(*(text(c) for c in shown))
            for col, cell, fit in zip(table.columns, row.cells, shown, strict=True):
                if cell.text == "-" and cell.note:
                    reason = cell.note.split(": ", 1)[-1]
                    notes[reason] = notes.get(reason, 0) + 1
                elif fit.text != cell.text:
                    cut.append(f"  {row.cells[0].text} {col.title.lower()}: {cell.text}")
        if not table.rows:
            t.add_row(Text("(none)", style="dim"), *(Text("") for _ in cols[1:]))
        out.append(t)
        out.extend(Text(line, style="dim") for line in cut)  # wrapped, never cut
    if notes:
        out.append(Text("- means: " + "; ".join(f"{why} ({n})" for why, n in notes.items()),
                        style="dim"))
    out.append(Text(QUEUE_LEGEND, style="dim"))
    return out
