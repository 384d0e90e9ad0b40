"""A site job's own output in its task's log.

One :class:`~gridcore_airflow.operators.site_job.SiteJobOperator` runs a short shell
job on a grid site chosen by gridcore. While it runs, the trigger copies its new stdout
and stderr lines into the task's log at every poll (``[stdout] ...``, ``[stderr]
...``); a job that fails ends the log with the tail of its stderr, and the task fails.
The XCom result names the job's output files (``output_files``) and what the job asked
for (``resources``: a five-minute time limit and 256 MiB, over the site's defaults).
How much is copied is bounded, with a marker where it was cut: see
``gridcore/sites/output.py``.

Params: ``lines`` (how many steps the job prints, a third of a second apart) and
``exit_code`` (0 succeeds; anything else makes the job say why on stderr and fail).
"""

from __future__ import annotations

from datetime import timedelta

from airflow.sdk import Param, dag

from gridcore_airflow.operators.site_job import SiteJobOperator

# Each step: one line on stdout, one on stderr; a failing job says why last, on stderr.
COMMAND = """\
lines={{ params.lines }}
code={{ params.exit_code }}
i=1
while [ "$i" -le "$lines" ]; do
  echo "step $i of $lines on site $GRIDCORE_SITE"
  echo "debug: step $i done" >&2
  i=$((i + 1))
  sleep 0.3
done
if [ "$code" -ne 0 ]; then
  echo "error: giving up after $lines steps, exit code $code" >&2
fi
exit "$code"
"""


@dag(
    dag_id="job_output",
    schedule=None,
    catchup=False,
    tags=["gridcore", "example"],
    # a task whose worker died is retried (it reattaches to its job); a job that failed
    # is run again by a retry, as any Airflow task is
    default_args={"retries": 2, "retry_delay": timedelta(seconds=5)},
    params={
        "lines": Param(5, type="integer", minimum=1, maximum=1000),
        "exit_code": Param(0, type="integer", minimum=0, maximum=255),
    },
    doc_md=__doc__,
)
def job_output() -> None:
    SiteJobOperator(
        task_id="job",
        command=COMMAND,
        runtime_s=5,
        poll_interval=0.5,
        # what production clusters require (over the site's grid-file defaults): Slurm
        # gets them, a local site enforces the time limit; XCom shows them as resources
        time_limit="5m",
        memory="256M",
    )


job_output()
