"""``gpuscale top``'s tables laid out for a terminal width and drawn with rich: printed
once (``--once``), or cell by cell by the Textual app (top_app.py). The rows come from
top.py; a cell cut to fit keeps its whole text in its note.
"""

from __future__ import annotations

from collections.abc import Sequence

from rich.table import Table as RichTable
from rich.text import Text

from gpuscale.tools.top import QUEUE_LEGEND, Cell, Column, Row, View

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


def fitted(row: Row, cols: Sequence[int]) -> tuple[Cell, ...]:
    """The row's cells cut to ``cols``; a cut cell keeps its whole text in its note."""
    return tuple(c if len(c.text) <= w else Cell(_clip(c.text, w), c.note or c.text, c.style)
                 for c, w in zip(row.cells, cols, strict=True))


def text(cell: Cell, right: bool = False) -> Text:
    return Text(cell.text, style=cell.style, no_wrap=True, overflow="ellipsis",
                justify="right" if right else "left")


def rich_tables(view: View, width: int) -> list[RichTable | Text]:
    """The view for printing once: each table laid out for ``width`` columns, then what
    each ``-`` means (distinct reasons, with how many cells)."""
    out: list[RichTable | Text] = [Text(view.summary, style="bold")]
    notes: dict[str, int] = {}
    for table in view.tables:
        cols = widths(table.columns, width)
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
