"""Per-sample k-mer counting as a data-driven batch pipeline (Bent et al., DADC 2009).

Eight samples (``W = 8``) each run three jobs (``D = 3``): ``lookup`` keeps the reads
that share a k = 31 k-mer with a reference index, ``count`` counts their k-mers per taxon
with a k-mer table, ``merge`` writes the sample's taxon report. Every job at a depth reads
that depth's reference file (the batch volume, shared by all samples) and the sample's
previous output (its private input). The workload is ``examples/pipelines/
kmer_count.toml``; the computation is :mod:`gridcore.apps.kmer`, on generated data.

The DAG is rendered from a plan (``operators/dataplan.py``): the grid
``examples/pipelines/grid.toml`` gives the three local sites small storage (MBs), so the
feasible plans differ between sites, and a slow link from the origin where the data
lives (its bandwidth is emulated: copies from and to the origin are paced to it). Every
site with every chooser is planned the first time the file is parsed, and the plan is
cached by the files' content (later parses run no simulation); the simulation chooser's
fastest site and plan become the tasks: ``make_data`` (generate the samples and the
reference files at the origin, register them in the replica catalog), ``prepare``, then
the plan's fetch / jobs / evict stages. ``gridcore plan examples/pipelines/kmer_count.toml
--grid examples/pipelines/grid.toml`` prints the same plan.

Outputs: ``$GRIDCORE_HOME/outputs/kmer-count/<run>/<sample>/merge`` (one TSV report per
sample).
"""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path

from airflow.sdk import task

from gridcore.state.store import state_dir
from gridcore_airflow.operators.dataplan import pipeline_dag
from gridcore_airflow.operators.hooks import GridcoreHook

EXAMPLES = Path(__file__).resolve().parents[1] / "examples" / "pipelines"
PIPELINE_FILE = EXAMPLES / "kmer_count.toml"
GRID_FILE = EXAMPLES / "grid.toml"
SAMPLES = 8


def origin_dir() -> Path:
    return state_dir() / "origin" / "kmer"


dag = pipeline_dag(
    PIPELINE_FILE,
    grid_file=GRID_FILE,
    home_dir=str(state_dir() / "outputs" / "kmer-count"),
    emulate_wan=True,
    dag_id="batch_pipeline",
)

with dag:

    @task(retries=2, retry_delay=timedelta(seconds=5))  # deterministic: a retry redoes it
    def make_data() -> dict[str, int]:
        """Generate the samples and reference files at the origin (deterministic: the
        same bytes every run) and register each in the replica catalog at the origin."""
        from gridcore.dataplan.live import make_example_data

        with GridcoreHook(grid_file=str(GRID_FILE)).catalog() as (_, catalog):
            return make_example_data(catalog, origin_dir(), SAMPLES)

    make_data() >> dag.get_task("prepare")
