"""``python -m gridcore_airflow.demo``: see :mod:`gridcore_airflow.demo.harness`."""

from __future__ import annotations

import sys

from gridcore_airflow.demo.harness import main

if __name__ == "__main__":
    sys.exit(main())
