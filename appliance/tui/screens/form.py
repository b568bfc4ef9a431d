"""Small dialogs. FormScreen: labelled text fields; Enter moves to the next field and submits from the last,
Escape cancels. Its action runs on submit (in a worker thread): done, the dialog closes with the action's line;
refused (ApplianceError), the dialog stays open with the error under the fields and everything typed kept.
ConfirmScreen: a yes/no question (y / n, Enter / Escape)."""

from __future__ import annotations

from dataclasses import dataclass
from functools import partial
from typing import Callable

from textual import on
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical
from textual.screen import ModalScreen
from textual.widgets import Button, Input, Label, Static
from textual.worker import Worker, WorkerState

from appliance.errors import ApplianceError


@dataclass(frozen=True)
class Field:
    name: str
    label: str
    value: str = ""
    placeholder: str = ""


class FormScreen(ModalScreen[str | None]):
    BINDINGS = [Binding("escape", "cancel", "Cancel")]

    def __init__(self, title: str, fields: list[Field], action: Callable[[dict], str], context: str = "",
                 submit: str = "OK"):
        super().__init__()
        self.form_title, self.fields, self.context, self.submit_label = title, fields, context, submit
        self.action = action

    def compose(self) -> ComposeResult:
        with Vertical(id="form"):
            yield Label(self.form_title, id="form-title")
            if self.context:
                yield Static(self.context, id="form-context")
            for f in self.fields:
                yield Label(f.label)
                yield Input(f.value, placeholder=f.placeholder, id=f"field-{f.name}")
            yield Static("", id="form-error", markup=False)
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
        values = {f.name: self.query_one(f"#field-{f.name}", Input).value for f in self.fields}
        self.query_one("#form-error", Static).update("working ...")
        self.run_worker(partial(self.action, values), thread=True, group="form", exclusive=True, exit_on_error=False)

    @on(Worker.StateChanged)
    def _done(self, event: Worker.StateChanged) -> None:
        if event.worker.group != "form":
            return
        if event.worker.state == WorkerState.SUCCESS:
            self.dismiss(event.worker.result)
        elif event.worker.state == WorkerState.ERROR:
            error = event.worker.error
            why = str(error) if isinstance(error, ApplianceError) else f"{type(error).__name__}: {error}"
            self.query_one("#form-error", Static).update(f"not done: {why}")

    @on(Button.Pressed, "#cancel")
    def action_cancel(self) -> None:
        self.dismiss(None)


class ConfirmScreen(ModalScreen[bool]):
    BINDINGS = [Binding("y", "answer(True)", "Yes"), Binding("enter", "answer(True)", "Yes", show=False),
                Binding("n", "answer(False)", "No"), Binding("escape", "answer(False)", "No", show=False)]

    def __init__(self, question: str):
        super().__init__()
        self.question = question

    def compose(self) -> ComposeResult:
        with Vertical(id="form"):
            yield Label(self.question, id="form-title")
            yield Static("y: yes    n / Esc: no", id="form-help")

    def action_answer(self, yes: bool) -> None:
        self.dismiss(yes)
