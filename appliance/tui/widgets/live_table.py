"""A DataTable refilled on every poll that keeps the operator's place: the highlighted row stays on the same key."""

from __future__ import annotations

from rich.text import Text
from textual.binding import Binding
from textual.widgets import DataTable


class LiveTable(DataTable):
    # Enter opens the highlighted row (DataTable's own enter is hidden too): not in the footer, which at 80 columns
    # has room for the screens' own keys only; the screens' hint lines say it.
    BINDINGS = [Binding("enter", "select_cursor", "Open", show=False)]
    DEFAULT_CSS = """
    LiveTable { height: 1fr; }
    """

    def __init__(self, columns: list[str], **kwargs):
        super().__init__(cursor_type="row", zebra_stripes=True, **kwargs)
        self._columns = columns
        self._shown: list[tuple[str, tuple]] = []

    def on_mount(self) -> None:
        self.add_columns(*self._columns)

    def update_rows(self, rows: list[tuple[str, tuple]]) -> None:
        """Show `rows` as (key, cells); nothing happens when they are what is shown already."""
        if rows == self._shown:
            return
        selected = self.selected_key()
        self.clear()
        for key, cells in rows:  # plain strings are shown as they are, never read as markup
            self.add_row(*(Text(c) if isinstance(c, str) else c for c in cells), key=key)
        self._shown = list(rows)
        if selected is not None and any(key == selected for key, _ in rows):
            self.move_cursor(row=self.get_row_index(selected))

    def selected_key(self) -> str | None:
        if not self.row_count:
            return None
        return self.coordinate_to_cell_key(self.cursor_coordinate).row_key.value
