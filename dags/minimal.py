"""The smallest complete gridcore DAG: two jobs, one after the other, each sent to the
site where it should finish first. Copy it to start your own (README, "A complete DAG")."""

from __future__ import annotations

from airflow.sdk import dag

from gridcore_airflow.operators.site_job import SiteJobOperator


@dag(
    dag_id="minimal",
    schedule=None,
    catchup=False,
    tags=["gridcore", "example"],
    default_args={
        "retries": 0,
        # Where gridcore is: the Airflow connection gridcore_default (type gridcore,
        # extra {"grid_file": "/etc/gridcore/grid.toml"}; host, login, password and
        # schema: a PostgreSQL state database) when it is defined, else $GRIDCORE_GRID
        # and $GRIDCORE_DB_URL, else three local sites on this machine.
        "gridcore_conn_id": "gridcore_default",
    },
)
def minimal() -> None:
    hello = SiteJobOperator(
        task_id="hello",
        command="echo hello from $GRIDCORE_SITE",
        processors=1,
        runtime_s=2,  # your estimate, seconds: sites are ranked by estimated completion
    )
    world = SiteJobOperator(
        task_id="world",
        command="echo world from $GRIDCORE_SITE",
        processors=2,
        runtime_s=2,
        site="auto",  # the default; or a site name to pin the job there
        time_limit="5m",  # and account, qos, partition, memory, gpus, constraint
    )
    hello >> world


minimal()
