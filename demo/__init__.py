"""The demo harness: ``make demo`` and ``make airflow`` on the embedded default.

Kept apart from the operators: it drives Airflow (``dag.test()``, ``airflow standalone``)
around the example DAGs and is no part of what a DAG imports. ``python -m
gridcore_airflow.demo`` runs it (:mod:`gridcore_airflow.demo.harness`).
"""

from __future__ import annotations
