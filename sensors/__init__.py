"""gridcore's Airflow sensors and every trigger (everything that waits, async)."""

from __future__ import annotations
