"""A small dialog of labelled text fields: Enter moves to the next field and submits from the last, Escape
cancels. It returns {field: text} or None."""

from __future__ import annotations

from dataclasses import dataclass

from textual import on
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical
from textual.screen import ModalScreen
from textual.widgets import Button, Input, Label, Static


@dataclass(frozen=True)
class Field:
    name: str
    label: str
    value: str = ""
    placeholder: str = ""


class FormScreen(ModalScreen[dict | None]):
    BINDINGS = [Binding("escape", "cancel", "Cancel")]

    def __init__(self, title: str, fields: list[Field], context: str = "", submit: str = "OK"):
        super().__init__()
        self.form_title, self.fields, self.context, self.submit_label = title, fields, context, submit

    def compose(self) -> ComposeResult:
        with Vertical(id="form"):
            yield Label(self.form_title, id="form-title")
            if self.context:
                yield Static(self.context, id="form-context")
            for f in self.fields:
                yield Label(f.label)
                yield Input(f.value, placeholder=f.placeholder, id=f"field-{f.name}")
            with Horizontal(id="form-buttons"):
                yield Button(self.submit_label, variant="primary", id="ok")
                yield Button("Cancel", id="cancel")
            yield Static("Enter: next field / submit    Esc: cancel", id="form-help")

    @on(Input.Submitted)
    def next_or_submit(self, event: Input.Submitted) -> None:
        inputs = list(self.query(Input))
        position = inputs.index(event.input)
        if position + 1 < len(inputs):
            inputs[position + 1].focus()
        else:
            self._submit()

    @on(Button.Pressed, "#ok")
    def _submit(self) -> None:
        self.dismiss({f.name: self.query_one(f"#field-{f.name}", Input).value for f in self.fields})

    @on(Button.Pressed, "#cancel")
    def action_cancel(self) -> None:
        self.dismiss(None)
