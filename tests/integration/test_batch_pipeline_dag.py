"""The batch_pipeline example DAG (issue 10 item 6) through Airflow's real ``dag.test()``
on the example grid's local sites: a plan rendered into fetch / jobs / evict tasks,
pipelines as mapped task instances labelled by sample, the real k-mer computation, the
origin behind an emulated slow link, and the bytes on the chosen site's disk sampled
during the run: never above its storage."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from gridcore.config import load_grid
from gridcore.state import capacity
from gridcore.state.store import open_store
from tests.capacity_checks import assert_capacity_invariant
from tests.dataplan_live import DiskSampler
from tests.integration.airflow_services import rendered_map_indexes, task_states
from tests.integration.conftest import IntegrationEnv

pytestmark = pytest.mark.airflow
DAG_ID = "batch_pipeline"
GRID_FILE = Path(__file__).resolve().parents[2] / "examples" / "pipelines" / "grid.toml"


def test_the_plan_is_rendered_as_stages_with_mapped_pipelines(dagbag: Any) -> None:
    assert DAG_ID not in dagbag.import_errors
    dag = dagbag.dags[DAG_ID]
    assert dag.task_ids[:2] == ["make_data", "prepare"] or {"make_data", "prepare"} <= set(
        dag.task_ids
    )
    jobs = [t for t in dag.tasks if t.task_type == "DataPlanPipelineOperator"]
    assert jobs, dag.task_ids
    for task in jobs:
        assert task.max_active_tis_per_dagrun >= 1
        assert task.map_index_template == "{{ gridcore_pipeline }}"
    # the plan and its reasons are the DAG's documentation
    assert dag.doc_md.startswith("# kmer-count: ") and "planned by `simulation`" in dag.doc_md
    # a chain: every task but the first has exactly one upstream task
    roots = [t.task_id for t in dag.tasks if not t.upstream_task_ids]
    assert roots == ["make_data"]


def test_dag_test_counts_every_sample_within_the_sites_storage(
    dagbag: Any, airflow_env: IntegrationEnv
) -> None:
    dag = dagbag.dags[DAG_ID]
    site = dag.get_task("prepare").site
    limit = load_grid(GRID_FILE).site(site).storage_bytes
    assert limit is not None
    with DiskSampler(airflow_env.gridcore_home / "sites" / site, every_s=0.02) as disk:
        run = dag.test()
    assert run.state == "success", task_states(DAG_ID, run.run_id)
    assert disk.samples > 10 and 0 < disk.peak <= limit, (disk.peak, limit)
    outputs = airflow_env.gridcore_home / "outputs" / "kmer-count"
    reports = sorted(outputs.rglob("merge"))
    assert [r.parent.name for r in reports] == [f"sample-{i:02}" for i in range(1, 9)]
    for report in reports:
        head = report.read_text().splitlines()
        assert head[0].startswith(f"# sample={report.parent.name} reads=")
        assert head[1].split("\t")[:2] == ["taxon", "lineage"]
    # every mapped pipeline task is labelled by its sample's name

    jobs = [t.task_id for t in dag.tasks if t.task_type == "DataPlanPipelineOperator"]
    for task_id in jobs:
        labels = rendered_map_indexes(DAG_ID, run.run_id, task_id)
        pipelines = dag.get_task(task_id).expand_input.value["pipeline"]
        assert [labels[i] for i in range(len(pipelines))] == [
            f"sample-{p + 1:02}" for p in pipelines
        ]
    assert_capacity_invariant(airflow_env.db_url, no_live_holds=True)
    store = open_store(airflow_env.db_url)
    try:
        with store.begin() as conn:  # every volume was evicted: no byte is held
            assert capacity.usage(conn)[site].storage_claimed == 0
    finally:
        store.dispose()
