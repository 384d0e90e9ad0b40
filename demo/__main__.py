"""``python -m gridcore_airflow.demo``: see :mod:`gridcore_airflow.demo.harness`."""

from __future__ import annotations

import sys

from gridcore_airflow.demo.harness import main

sys.exit(main())
