"""Fakes at I/O edges, shared by the test modules (fakes live only under tests/)."""

from __future__ import annotations

from typing import Any


class FakeTaskStateStore:
    """Airflow 3.3's ``context["task_state_store"]``: one per task instance, all tries."""

    def __init__(self) -> None:
        self.values: dict[str, Any] = {}

    def get(self, key: str, default: Any = None) -> Any:
        return self.values.get(key, default)

    def set(self, key: str, value: Any, *, retention: Any = None) -> None:
        self.values[key] = value

    def delete(self, key: str) -> None:
        self.values.pop(key, None)
