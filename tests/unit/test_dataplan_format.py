"""The batch-pipeline file (issue 10, item 1) and ``gridcore plan``: the example parses
and plans, files round-trip, every mistake names file and field, padding to canonical is
reported as computed by hand, the environment comes from the grid, and the CLI prints
JSON without infinities and exits 2 on bad input without writing anything."""

from __future__ import annotations

import json
import math
import re
import shlex
import subprocess
import sys
import tomllib
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import pytest

from gridcore.cli import main
from gridcore.config import default_grid, load_grid
from gridcore.dataplan.format import (
    MAX_PIPELINES,
    BatchVolume,
    DepthSpec,
    PipelineFieldError,
    PipelineInput,
    PipelineSpec,
    dump_pipeline,
    load_pipeline,
    parse_pipeline,
)
from gridcore.dataplan.planning import (
    CHOOSERS,
    DEFAULT_BW_L,
    choose_site,
    environment_for_site,
    plan_for_site,
    to_canonical,
)
from gridcore.engine.dataplan import DataPlanRunner, build_run
from gridcore.engine.runtime import GridRuntime
from gridcore.errors import ConfigError
from gridcore.model import (
    MB,
    NO_RESOURCES,
    GridSpec,
    JobResources,
    MemoryScope,
    Replica,
    SiteKind,
    SiteSpec,
)
from gridcore.policies.dataplan import (
    Environment,
    Strategy,
    Workload,
    choose_bent2009,
    compute_time,
)

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "pipelines" / "kmer_count.toml"
EXAMPLE_GRID = ROOT / "examples" / "pipelines" / "grid.toml"
PLAN_KEYS = {
    "feasible",
    "predicted",
    "picks",
    "reasons",
    "padding",
    "site",
    "workload",
    "environment",
}


def _no_infinity(text: str) -> Any:
    def refuse(constant: str) -> Any:
        raise AssertionError(f"JSON has {constant}")

    return json.loads(text, parse_constant=refuse)


# -- the example ---------------------------------------------------------------------------


def test_the_example_file_parses_into_eight_samples_of_three_depths() -> None:
    spec = load_pipeline(EXAMPLE)
    assert spec.name == "kmer-count" and (spec.W, spec.D) == (8, 3)
    assert [d.name for d in spec.depths] == ["lookup", "count", "merge"]
    assert [p.name for p in spec.pipelines] == [f"sample-{i:02}" for i in range(1, 9)]
    assert spec.pipelines[0] == PipelineInput(
        "sample-01", 1_784_000, logical_name="kmer/reads/sample-01.fq"
    )
    assert spec.depths[1].batch == BatchVolume("kmer/ref/kmer-table.bin", 11_997_136)
    assert spec.depths[2].command_for(
        pipeline="sample-03", depth=2, input_path="c.tsv", output_path="r.txt", batch_path="t"
    ) == (
        f"{shlex.quote(sys.executable)} -m gridcore.apps.kmer merge --taxonomy t --counts c.tsv"
        " --out r.txt --sample sample-03"
    )
    # filled values are shell-quoted: a path with a space or a quote stays one argument
    assert (
        spec.depths[2]
        .command_for(
            pipeline="s", depth=2, input_path="my c.tsv", output_path="it's", batch_path="t"
        )
        .endswith("--counts 'my c.tsv' --out 'it'\"'\"'s' --sample s")
    )
    assert spec.unsized_logical_names() == ()


def test_the_example_grid_is_the_default_grid_with_storage() -> None:
    # The embedded default configures no storage: the example needs its own grid file.
    assert all(site.storage_bytes is None for site in default_grid("/tmp/x").sites)
    grid = load_grid(EXAMPLE_GRID)
    assert grid.site_names == default_grid("/tmp/x").site_names
    assert [s.storage_bytes for s in grid.sites] == [35 * MB, 100 * MB, 20 * MB]


# -- round trip ------------------------------------------------------------------------------


def _spec(**changes: Any) -> PipelineSpec:
    """Two depths (the second without batch data), three pipelines; see the padding test."""
    spec = PipelineSpec(
        name="small",
        depths=(
            DepthSpec(
                "a", "run-a {batch} {input} {output}", 10.0, 10, 1.0, BatchVolume("b/a", 100)
            ),
            DepthSpec("b", "run-b {input} {output}", 20, 30, 3),
        ),
        pipelines=(
            PipelineInput("p1", 5, logical_name="in/p1"),
            PipelineInput("p2", 20, path="/data/p2"),
            PipelineInput("p3", 25, logical_name="in/p3"),
        ),
    )
    return replace(spec, **changes)


def test_a_spec_round_trips_through_its_file(tmp_path: Path) -> None:
    odd = 'say "{{hi}}" \\ tab\there {pipeline}@{depth} caf\u00e9 \x7f'
    inputs = _spec().pipelines
    spec = _spec(
        depths=(
            *_spec().depths,
            DepthSpec("c", odd, 0, 0, batch=BatchVolume("b/c")),
        ),
        pipelines=(inputs[0], replace(inputs[1], path=str(tmp_path / "data" / "p2")), inputs[2]),
    )
    path = tmp_path / "p.toml"
    text = dump_pipeline(spec, tmp_path)
    assert 'path = "data/p2"' in text  # relative to the file's directory, as a file must
    path.write_text(text, encoding="utf-8")
    loaded = load_pipeline(path)
    assert loaded == spec and loaded.source == str(path)
    assert loaded.depths[2].command == odd and loaded.depths[2].batch == BatchVolume("b/c")
    assert loaded.unsized_logical_names() == ("b/c",)


def test_resources_are_per_file_and_per_depth_and_round_trip(tmp_path: Path) -> None:
    text = _sub('name = "w"', 'name = "w"\n\n[resources]\ntime_limit = "30m"\naccount = "proj"')
    text = _sub("output_bytes = 4", 'output_bytes = 4\nresources = { time_limit = "2h",'
                ' memory_per_cpu = "2G", gpus = 1 }', text)  # fmt: skip
    spec = parse_pipeline(tomllib.loads(text), source="w.toml")

    assert spec.resources == JobResources(time_limit_s=1800, account="proj")
    assert spec.depths[0].resources == NO_RESOURCES
    assert spec.job_resources(0) == JobResources(time_limit_s=1800, account="proj")
    # a depth's keys over the file's, key by key
    assert spec.job_resources(1) == JobResources(
        time_limit_s=7200, account="proj", memory_mib=2048, memory_per=MemoryScope.CPU, gpus=1
    )
    path = tmp_path / "w.toml"
    path.write_text(dump_pipeline(spec), encoding="utf-8")
    assert load_pipeline(path) == spec


def test_a_runs_jobs_ask_the_callers_resources_over_the_files_over_the_sites(
    tmp_path: Path,
) -> None:
    spec = _spec(
        resources=JobResources(time_limit_s=1800, qos="normal"),
        depths=(
            replace(_spec().depths[0], resources=JobResources(memory_mib=4096)),
            replace(_spec().depths[1], resources=JobResources(time_limit_s=7200)),
        ),
    )
    site = SiteSpec("lab", SiteKind.LOCAL, 4, storage_dir=str(tmp_path), storage_bytes=10**9,
                    defaults=JobResources(account="proj", time_limit_s=60))  # fmt: skip
    grid = GridSpec((site,))
    plan = plan_for_site(to_canonical(spec), grid, "lab").plans["bent2009"]
    run = build_run(spec, grid, "lab", plan, run_id="r1", home_dir=str(tmp_path / "home"),
                    resources=JobResources(qos="high"))  # fmt: skip

    def unused() -> GridRuntime:
        raise AssertionError("no job runs here")

    runner = DataPlanRunner(grid, unused, run)
    # the caller's qos, then the depth's, then the file's, then the site's defaults
    assert runner.job_resources(0) == JobResources(1800, "proj", "high", memory_mib=4096)
    assert runner.job_resources(1) == JobResources(7200, "proj", "high")
    assert runner.sent_resources(0, (0, 1)) == {
        "p1/a": {"time_limit_s": 1800, "account": "proj", "qos": "high", "memory_mib": 4096,
                 "memory_per": "node"},
        "p1/b": {"time_limit_s": 7200, "account": "proj", "qos": "high"},
    }  # fmt: skip


def test_a_path_a_file_could_not_name_is_not_dumped(tmp_path: Path) -> None:
    # _spec()'s second input is the absolute path /data/p2
    with pytest.raises(
        PipelineFieldError, match=r"^<python>: pipelines\[1\]\.path: must be relative to"
    ):
        dump_pipeline(_spec())
    with pytest.raises(
        PipelineFieldError,
        match=r"^<python>: pipelines\[1\]\.path: leads out of the pipeline file's directory:"
        r" '\.\./.*data/p2' \(dump_pipeline's base_dir",
    ):
        dump_pipeline(_spec(), tmp_path)
    assert 'path = "p2"' in dump_pipeline(_spec(), "/data")


def test_the_example_round_trips_with_its_range_written_out(tmp_path: Path) -> None:
    spec = load_pipeline(EXAMPLE)
    text = dump_pipeline(spec)
    assert "[pipeline_range]" not in text and text.count("[[pipelines]]") == 8
    path = tmp_path / "kmer.toml"
    path.write_text(text, encoding="utf-8")
    assert load_pipeline(path) == spec


def test_relative_input_paths_are_taken_from_the_file_directory(tmp_path: Path) -> None:
    path = tmp_path / "sub" / "p.toml"
    path.parent.mkdir()
    path.write_text(
        BASE.replace(
            'logical_name = "reads/s{i}.fq"\nsize_bytes = 8',
            'path = "reads/s{i}.fq"\nsize_bytes = 8',
        )
    )
    spec = load_pipeline(path)
    assert spec.pipelines[1].path == str(tmp_path / "sub" / "reads" / "s2.fq")


# -- malformed files -----------------------------------------------------------------------

BASE = """version = 1
name = "w"

[[depths]]
name = "lookup"
command = "lookup {batch} {input} {output}"
runtime_mean_s = 4.0
output_bytes = 6
batch = { logical_name = "ref/index", size_bytes = 60 }

[[depths]]
name = "count"
command = "count {input} {output}"
runtime_mean_s = 6.0
runtime_sd_s = 1
output_bytes = 4

[pipeline_range]
count = 3
name = "s{i}"
logical_name = "reads/s{i}.fq"
size_bytes = 8
"""

RANGE = BASE[BASE.index("[pipeline_range]") :]
LISTED = BASE[: BASE.index("[pipeline_range]")] + (
    '[[pipelines]]\nname = "s1"\nlogical_name = "r/1"\nsize_bytes = 8\n\n'
    '[[pipelines]]\nname = "s2"\npath = "r/2"\nsize_bytes = 8\n'
)


@dataclass(frozen=True)
class Bad:
    """``text`` is a malformed pipeline file; its one-line error, after ``FILE: ``,
    must match ``message`` (a regular expression, searched from the start)."""

    id: str
    text: str
    message: str

    def param(self) -> Any:
        return pytest.param(self, id=self.id)


def _sub(old: str, new: str, base: str = BASE) -> str:
    assert old in base, old
    return base.replace(old, new, 1)


BAD = [
    Bad("missing version", _sub("version = 1\n", ""), r"version: is required"),
    Bad("unknown version", _sub("version = 1", "version = 2"), r"version: must be 1, got 2$"),
    Bad("version a string", _sub("version = 1", 'version = "1"'), r"version: .*got '1'$"),
    Bad("version a boolean", _sub("version = 1", "version = true"), r"version: .*got True$"),
    Bad("version 1.0", _sub("version = 1", "version = 1.0"), r"version: .*got 1\.0$"),
    Bad("unknown top key", _sub('name = "w"', 'name = "w"\nextra = 1'), r"extra: unknown key$"),
    Bad("missing name", _sub('name = "w"\n', ""), r"name: is required$"),
    Bad("name with a space", _sub('name = "w"', 'name = "a b"'), r"name: must be 1-128 of"),
    Bad("missing depths", "version = 1\nname = 'w'\n" + RANGE, r"depths: is required$"),
    Bad(
        "depths a number",
        "version = 1\nname = 'w'\ndepths = 3\n" + RANGE,
        r"depths: must be a list of tables \(\[\[depths\]\]\), got 3$",
    ),
    Bad(
        "zero depths",
        "version = 1\nname = 'w'\ndepths = []\n" + RANGE,
        r"depths: at least one depth is required$",
    ),
    Bad(
        "depth key misspelt",
        _sub("output_bytes = 6", "output_byte = 6"),
        r'depths\[0\]\.output_byte: unknown key \(did you mean "output_bytes"\?\)$',
    ),
    Bad(
        "depth unknown key",
        _sub("output_bytes = 6", "output_bytes = 6\ncpus = 1"),
        r"depths\[0\]\.cpus: unknown key$",
    ),
    Bad(
        "depth missing command",
        _sub('command = "count {input} {output}"\n', ""),
        r"depths\[1\]\.command: is required$",
    ),
    Bad(
        "runtime a string",
        _sub("runtime_mean_s = 4.0", 'runtime_mean_s = "4"'),
        r"depths\[0\]\.runtime_mean_s: must be a finite number of seconds >= 0, got '4'$",
    ),
    Bad(
        "negative runtime",
        _sub("runtime_mean_s = 6.0", "runtime_mean_s = -6.0"),
        r"depths\[1\]\.runtime_mean_s: must be .* >= 0, got -6\.0$",
    ),
    Bad(
        "infinite sd",
        _sub("runtime_sd_s = 1", "runtime_sd_s = inf"),
        r"depths\[1\]\.runtime_sd_s: must be a finite number .*, got inf$",
    ),
    Bad(
        "nan runtime",
        _sub("runtime_mean_s = 4.0", "runtime_mean_s = nan"),
        r"depths\[0\]\.runtime_mean_s: .*got nan$",
    ),
    Bad(
        "negative output",
        _sub("output_bytes = 4", "output_bytes = -4"),
        r"depths\[1\]\.output_bytes: must be an integer >= 0 \(bytes, at most \d+\), got -4$",
    ),
    Bad(
        "output a float",
        _sub("output_bytes = 6", "output_bytes = 6.0e6"),
        r"depths\[0\]\.output_bytes: must be an integer >= 0 .*, got 6000000\.0$",
    ),
    Bad(
        "output a boolean",
        _sub("output_bytes = 6", "output_bytes = true"),
        r"depths\[0\]\.output_bytes: .*got True$",
    ),
    Bad(
        "negative batch size",
        _sub("size_bytes = 60", "size_bytes = -60"),
        r"depths\[0\]\.batch\.size_bytes: must be an integer >= 0 .*, got -60$",
    ),
    Bad(
        "batch size a string",
        _sub("size_bytes = 60", 'size_bytes = "60 MB"'),
        r"depths\[0\]\.batch\.size_bytes: .*got '60 MB'$",
    ),
    Bad(
        "batch without a logical name",
        _sub('logical_name = "ref/index", ', ""),
        r"depths\[0\]\.batch\.logical_name: is required$",
    ),
    Bad(
        "batch unknown key",
        _sub("size_bytes = 60 }", "size_bytes = 60, site = 'x' }"),
        r"depths\[0\]\.batch\.site: unknown key$",
    ),
    Bad(
        "batch absolute logical name",
        _sub('"ref/index"', '"/ref/index"'),
        r"depths\[0\]\.batch\.logical_name: must be a relative path",
    ),
    Bad(
        "batch a string",
        _sub('batch = { logical_name = "ref/index", size_bytes = 60 }', 'batch = "ref/index"'),
        r"depths\[0\]\.batch: must be a table, got 'ref/index'$",
    ),
    Bad(
        "two processors",
        _sub("output_bytes = 4", "output_bytes = 4\nprocessors = 2"),
        r"depths\[1\]\.processors: must be 1 .*got 2$",
    ),
    Bad(
        "processors 1.0",
        _sub("output_bytes = 4", "output_bytes = 4\nprocessors = 1.0"),
        r"depths\[1\]\.processors: must be 1 .*got 1\.0$",
    ),
    Bad(
        "unknown placeholder",
        _sub('{input} {output}"\nruntime_mean_s = 6.0', '{sample} {output}"\nruntime_mean_s = 6.0'),
        r"depths\[1\]\.command: unknown placeholder \{sample\}",
    ),
    Bad(
        "unbalanced brace",
        _sub("count {input}", "count {input"),
        r"depths\[1\]\.command: unbalanced",
    ),
    Bad(
        "batch placeholder without batch",
        _sub("count {input}", "count {batch} {input}"),
        r"depths\[1\]\.command: uses \{batch\} but the depth has no batch volume$",
    ),
    Bad(
        "blank command",
        _sub('"count {input} {output}"', '"  "'),
        r"depths\[1\]\.command: must be a non-blank string",
    ),
    Bad(
        "duplicate depth names",
        _sub('name = "count"', 'name = "lookup"'),
        r"depths\[1\]\.name: duplicate name 'lookup' \(also depths\[0\]\)$",
    ),
    Bad(
        "zero pipelines in a range",
        _sub("count = 3", "count = 0"),
        r"pipeline_range\.count: must be an integer from 1 to 1,000,000, got 0$",
    ),
    Bad(
        "a billion pipelines",
        _sub("count = 3", "count = 1_000_000_000"),
        r"pipeline_range\.count: .*got 1000000000$",
    ),
    Bad(
        "zero pipelines in a list",
        _sub('name = "w"', 'name = "w"\npipelines = []', BASE[: BASE.index("[pipeline_range]")]),
        r"pipelines: at least one pipeline is required$",
    ),
    Bad(
        "no pipelines",
        BASE[: BASE.index("[pipeline_range]")],
        r"pipelines: give the pipelines as .* got neither$",
    ),
    Bad(
        "list and range", BASE + LISTED[LISTED.index("[[pipelines]]") :], r"pipelines: .*not both$"
    ),
    Bad(
        "range name without index",
        _sub('name = "s{i}"', 'name = "s"'),
        r"pipeline_range\.name: must contain \{i\}",
    ),
    Bad(
        "range other placeholder",
        _sub('name = "s{i}"', 'name = "s{i}-{j}"'),
        r"pipeline_range\.name: only \{i\} and \{i:0N\}",
    ),
    Bad(
        "range unknown key",
        _sub("count = 3", "count = 3\nstep = 2"),
        r"pipeline_range\.step: unknown key$",
    ),
    Bad(
        "range negative size",
        _sub("size_bytes = 8", "size_bytes = -8"),
        r"pipeline_range\.size_bytes: must be an integer >= 0 .*got -8$",
    ),
    Bad(
        "range negative first",
        _sub("count = 3", "count = 3\nfirst = -1"),
        r"pipeline_range\.first: must be an integer >= 0, got -1$",
    ),
    Bad(
        "duplicate pipeline names",
        _sub('name = "s2"', 'name = "s1"', LISTED),
        r"pipelines\[1\]\.name: duplicate name 's1' \(also pipelines\[0\]\)$",
    ),
    Bad(
        "logical name and path",
        _sub('path = "r/2"', 'path = "r/2"\nlogical_name = "r/2"', LISTED),
        r"pipelines\[1\]\.logical_name: give exactly one of logical_name and path$",
    ),
    Bad(
        "path without size",
        _sub('path = "r/2"\nsize_bytes = 8', 'path = "r/2"', LISTED),
        r"pipelines\[1\]\.size_bytes: is required for an input given by path$",
    ),
    Bad(
        "negative input size",
        _sub("size_bytes = 8\n", "size_bytes = -8\n", LISTED),
        r"pipelines\[0\]\.size_bytes: must be an integer >= 0 .*got -8$",
    ),
    Bad(
        "pipeline unknown key",
        _sub('name = "s1"', 'name = "s1"\nsite = "a"', LISTED),
        r"pipelines\[0\]\.site: unknown key$",
    ),
    Bad(
        "pipelines not tables",
        _sub('name = "w"', 'name = "w"\npipelines = [1]', BASE[: BASE.index("[pipeline_range]")]),
        r"pipelines\[0\]: must be a table, got 1$",
    ),
    # issue 21 item 14: a file names only files inside its own directory
    Bad(
        "absolute input path",
        _sub('path = "r/2"', 'path = "/etc/shadow"', LISTED),
        r"pipelines\[1\]\.path: must be relative to the pipeline file's directory, got"
        r" '/etc/shadow'; name a file elsewhere by its logical_name in the replica catalog$",
    ),
    Bad(
        "input path leading out",
        _sub('path = "r/2"', 'path = "../../../../etc/shadow"', LISTED),
        r"pipelines\[1\]\.path: leads out of the pipeline file's directory:"
        r" '\.\./\.\./\.\./\.\./etc/shadow'; name a file elsewhere",
    ),
    Bad(
        "input path leading out once normalised",
        _sub('path = "r/2"', 'path = "r/../../x"', LISTED),
        r"pipelines\[1\]\.path: leads out of the pipeline file's directory: 'r/\.\./\.\./x'",
    ),
    Bad(
        "input path the directory itself",
        _sub('path = "r/2"', 'path = "r/.."', LISTED),
        r"pipelines\[1\]\.path: names the pipeline file's directory itself, not a file in it",
    ),
    Bad(
        "range path under ../../../../",
        _sub('logical_name = "reads/s{i}.fq"', 'path = "../../../../etc/s{i}"'),
        r"pipeline_range\.path: leads out of the pipeline file's directory:"
        r" '\.\./\.\./\.\./\.\./etc/s1'",
    ),
    Bad(
        "absolute range path",
        _sub('logical_name = "reads/s{i}.fq"', 'path = "/etc/s{i}"'),
        r"pipeline_range\.path: must be relative to the pipeline file's directory, got '/etc/s1'",
    ),
    Bad("not TOML", "version = \n", r"not valid TOML: "),
    Bad(
        "a bad time limit",
        _sub('name = "w"', 'name = "w"\nresources = { time_limit = "10x" }'),
        r"resources\.time_limit: '10x' is not a duration \(use 90s, 10m, 2h, 1d or D-HH:MM:SS\)$",
    ),
    Bad(
        "an unknown resource",
        _sub('name = "w"', 'name = "w"\nresources = { walltime = "1h" }'),
        r"resources\.walltime: unknown key \(known: time_limit, account, qos, partition,",
    ),
    Bad(
        "resources not a table",
        _sub('name = "w"', 'name = "w"\nresources = "1h"'),
        r"resources: must be a table, got '1h'$",
    ),
    Bad(
        "a depth's bad memory",
        _sub("output_bytes = 4", 'output_bytes = 4\nresources = { memory = "lots" }'),
        r"depths\[1\]\.resources\.memory: 'lots' is not a memory size \(use 512M, 4G, 1T",
    ),
    Bad(
        "a depth's two memories",
        _sub("output_bytes = 4", "output_bytes = 4\nresources = { memory = 1, memory_per_cpu = 2}"),
        r"depths\[1\]\.resources\.memory_per_cpu: give memory \(per node\) or memory_per_cpu",
    ),
    Bad(
        "a depth's negative gpus",
        _sub("output_bytes = 6", "output_bytes = 6\nresources = { gpus = -1 }"),
        r"depths\[0\]\.resources\.gpus: must be an integer of GPUs >= 0",
    ),
]


@pytest.mark.parametrize("case", [c.param() for c in BAD])
def test_each_malformed_file_names_file_and_field(case: Bad, tmp_path: Path) -> None:
    path = tmp_path / "pipeline.toml"
    path.write_text(case.text, encoding="utf-8")
    with pytest.raises(ConfigError) as err:
        load_pipeline(path)
    message = str(err.value)
    assert "\n" not in message
    assert message.startswith(f"{path}: "), message
    assert re.match(case.message, message.removeprefix(f"{path}: ")), message


def test_the_base_of_the_malformed_cases_is_valid() -> None:
    # Otherwise a case could fail for the base's fault, not for its own change.
    for text in (BASE, LISTED):
        spec = parse_pipeline(tomllib.loads(text), source="b.toml")
        assert spec.D == 2


@pytest.mark.parametrize(
    ("write", "message"),
    [
        (lambda p: None, r"pipeline file .* does not exist$"),
        (lambda p: p.mkdir(), r"is a directory, not a pipeline file$"),
        (lambda p: p.write_bytes(BASE.encode() + b"# caf\xe9\n"), r"not UTF-8 text \(byte 0xe9"),
        (lambda p: p.write_bytes(b"\x7fELF\x00\x01"), r"a binary file \(NUL bytes\)"),
    ],
    ids=["missing", "directory", "latin-1", "binary"],
)
def test_files_that_are_not_pipeline_files(
    write: Callable[[Path], None], message: str, tmp_path: Path
) -> None:
    path = tmp_path / "p.toml"
    write(path)
    with pytest.raises(ConfigError, match=message):
        load_pipeline(path)


# -- the Python API checks the same rules ----------------------------------------------------


@pytest.mark.parametrize(
    ("build", "message"),
    [
        (lambda: DepthSpec("a", "x", 1.0, -1), r"^DepthSpec: output_bytes: must be an integer"),
        (lambda: DepthSpec("a", "x {batch}", 1.0, 1), r"^DepthSpec: command: uses \{batch\}"),
        (
            lambda: DepthSpec("a", "x", 1.0, 1, batch={"logical_name": "r"}),  # type: ignore[arg-type]
            r"^DepthSpec: batch: must be a BatchVolume, got a table$",
        ),
        (
            lambda: BatchVolume("r", size_bytes=1.5),  # type: ignore[arg-type]
            r"^BatchVolume: size_bytes: must be an integer",
        ),
        (lambda: PipelineInput("p"), r"^PipelineInput: logical_name: give exactly one"),
        (lambda: _spec(pipelines=()), r"^<python>: pipelines: at least one pipeline"),
        (lambda: _spec(depths=[{"name": "a"}]), r"^<python>: depths\[0\]: must be a DepthSpec"),
        (lambda: _spec(name=""), r"^<python>: name: must be 1-128"),
        (lambda: PipelineInput("p\n", 1, path="/x"), r"^PipelineInput: name: .*got 'p\\n'$"),
        (
            lambda: _spec(pipelines=[PipelineInput("p", 1, path="/x")] * 2),
            r"^<python>: pipelines\[1\]\.name: duplicate name 'p'",
        ),
        (
            lambda: DepthSpec("a", "x", 1.0, 1, resources=JobResources(time_limit_s=0)),
            r"^DepthSpec: resources\.time_limit: must be from 1 second",
        ),
        (
            lambda: _spec(resources={"time_limit": "1h"}),
            r"^<python>: resources: must be a JobResources, got a table$",
        ),
    ],
    ids=[
        "negative output",
        "batch placeholder",
        "batch a dict",
        "float size",
        "no input",
        "no pipelines",
        "depth a dict",
        "empty name",
        "name with a newline",
        "duplicate pipeline",
        "zero time limit",
        "resources a dict",
    ],
)
def test_the_python_api_refuses_with_the_class_and_field(
    build: Callable[[], object], message: str
) -> None:
    with pytest.raises(PipelineFieldError, match=message):
        build()


def test_a_list_is_taken_as_a_tuple_and_runtimes_as_floats() -> None:
    spec = _spec(pipelines=list(_spec().pipelines))
    assert spec == _spec() and isinstance(spec.pipelines, tuple)
    assert spec.depths[1].runtime_mean_s == 20.0 and isinstance(
        spec.depths[1].runtime_mean_s, float
    )
    assert MAX_PIPELINES == 1_000_000


# -- padding to canonical ------------------------------------------------------------------


def test_padding_of_a_small_non_canonical_spec_computed_by_hand() -> None:
    """Batch 100 and none (0) -> S_B = 100; privates: inputs 5, 20, 25, outputs 10, 30 ->
    S_P = 30; runtimes 10 and 20 (sd 1, 3) -> R_bar 15, SD_R 2.
    Actual: batch 100 + 0, inputs 50, outputs 3 x (10 + 30) = 120: 270.
    Padded: S_TotB + S_TotP = 2 x 100 + 3 x 3 x 30 = 470: +200, of which depth 0 adds
    3 x (30 - 10) = 60, depth 1 100 - 0 = 100, the inputs 90 - 50 = 40."""
    canonical = to_canonical(_spec())
    assert canonical.workload == Workload(W=3, D=2, S_B=100, S_P=30, R_bar=15.0, SD_R=2.0)
    report = canonical.padding
    assert (report.actual_bytes, report.padded_bytes, report.padding_bytes) == (270, 470, 200)
    assert report.padded_bytes == canonical.workload.S_TotB + canonical.workload.S_TotP
    first, second = report.depths
    assert (first.batch_bytes, first.padded_batch_bytes, first.output_bytes) == (100, 100, 10)
    assert (second.batch_bytes, second.padded_batch_bytes, second.padded_output_bytes) == (
        0,
        100,
        30,
    )
    assert [d.padding_bytes(3) for d in report.depths] == [60, 100]
    inputs = report.inputs
    assert (inputs.min_bytes, inputs.max_bytes, inputs.total_bytes) == (5, 25, 50)
    assert (inputs.padded_total_bytes, inputs.padding_bytes) == (90, 40)
    assert not report.canonical
    # The mean keeps the models' compute time (Eq. 10: R_bar x D) the sum of the depths'.
    assert compute_time(canonical.workload) == 10.0 + 20.0
    as_json = report.as_json()
    assert as_json["padding_bytes"] == 200 and as_json["depths"][1]["padding_bytes"] == 100
    assert as_json["inputs"]["padding_bytes"] == 40
    assert any("depth 1 (b): +100 B" in note for note in report.notes), report.notes


def test_a_canonical_spec_is_reported_as_such() -> None:
    depth = DepthSpec("a", "x", 5.0, 7, 1.0, BatchVolume("r", 50))
    spec = PipelineSpec(
        "c",
        (depth, replace(depth, name="b")),
        tuple(PipelineInput(f"p{i}", 7, logical_name=f"in/{i}") for i in range(4)),
    )
    canonical = to_canonical(spec)
    assert canonical.padding.canonical and canonical.padding.padding_bytes == 0
    assert canonical.padding.notes == ("already canonical: nothing padded",)
    assert canonical.workload == Workload(4, 2, 50, 7, 5.0, 1.0)
    # The same sizes with different runtimes: nothing padded, yet not canonical.
    uneven = replace(spec, depths=(depth, replace(depth, name="b", runtime_mean_s=9.0)))
    report = to_canonical(uneven).padding
    assert report.padding_bytes == 0 and not report.canonical


def test_sizes_left_to_the_catalog_come_from_known_sizes_or_name_the_field() -> None:
    spec = _spec(
        depths=(replace(_spec().depths[0], batch=BatchVolume("b/a")), _spec().depths[1]),
        pipelines=(*_spec().pipelines[1:], PipelineInput("p4", logical_name="in/p4")),
    )
    assert spec.unsized_logical_names() == ("b/a", "in/p4")
    with pytest.raises(
        ConfigError,
        match=r"^<python>: depths\[0\]\.batch\.size_bytes: not given, and the replica catalog"
        r" has no size for 'b/a'$",
    ):
        to_canonical(spec)
    with pytest.raises(ConfigError, match=r"pipelines\[2\]\.size_bytes: not given"):
        to_canonical(spec, {"b/a": 100})
    assert to_canonical(spec, {"b/a": 300, "in/p4": 40}).workload.S_B == 300
    assert to_canonical(spec, {"b/a": 300, "in/p4": 40}).workload.S_P == 40


# -- the environment from the grid ---------------------------------------------------------


def test_the_default_grid_has_no_storage_so_its_sites_need_a_measured_one() -> None:
    grid = default_grid("/tmp/state")
    with pytest.raises(
        ConfigError,
        match=r"^<embedded default>: sites\.local-a\.storage_gb: not set: a data-driven plan",
    ):
        environment_for_site(grid, "local-a")
    env = environment_for_site(grid, "local-a", {"S": 2 * 10**9})
    # processors 8, the origin -> local-a bandwidth 400 MB/s, 1 Gb/s within, no failures
    assert env == Environment(N_CPU=8, S=2e9, F=0.0, BW_R=400 * MB, BW_L=125 * MB)
    assert DEFAULT_BW_L == 125 * MB
    measured = {"S": 1e9, "BW_R": 3 * MB, "F": 1e-4, "N_CPU": 2, "BW_L": 50 * MB}
    assert environment_for_site(grid, "local-c", measured) == Environment(**measured)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("site", "measured", "message"),
    [
        ("local-a", {"disk": 1.0}, r"^measured\.disk: unknown key \(known: N_CPU, S, F, BW_R"),
        ("local-a", {"S": 1e9, "N_CPU": 0}, r"sites\.local-a: Environment\.N_CPU must be"),
        ("local-a", {"S": -1.0}, r"Environment\.S must be a finite number >= 0.*\(measured: S\)"),
        ("nowhere", None, r"unknown site 'nowhere'"),
    ],
)
def test_bad_environment_inputs_are_named(
    site: str, measured: dict[str, float] | None, message: str
) -> None:
    with pytest.raises(ConfigError, match=message):
        environment_for_site(default_grid("/tmp/state"), site, measured)


def test_each_example_site_is_planned_with_its_slowness_and_the_fastest_chosen() -> None:
    canonical = to_canonical(load_pipeline(EXAMPLE))
    grid = load_grid(EXAMPLE_GRID)
    plans = [plan_for_site(canonical, grid, name) for name in grid.site_names]
    b = plans[1]
    assert b.environment == Environment(4, 100 * MB, 0.0, 2 * MB, DEFAULT_BW_L)
    assert b.workload.R_bar == pytest.approx(1.2 * canonical.workload.R_bar)
    assert b.plans["bent2009"] == choose_bent2009(b.workload, b.environment)
    best, why = choose_site(plans)  # by the default chooser, ours
    expected = min(plans, key=lambda p: p.plans["simulation"].predicted_s)
    assert best is expected and why.startswith(f"{best.site}: simulation's pick")
    best, why = choose_site(plans, "bent2009")
    expected = min(plans, key=lambda p: p.plans["bent2009"].predicted_s)
    assert best is expected and why.startswith(f"{best.site}: bent2009's pick")
    # local-c (100 MB) only fits Minimal: one batch volume and a few pipelines at a time
    assert plans[2].as_json()["feasible"] == ["minimal"]


def test_predictions_come_from_every_registered_chooser() -> None:
    canonical = to_canonical(load_pipeline(EXAMPLE))
    choosers = {
        "bent2009": CHOOSERS["bent2009"],
        "without-all": lambda w, e: choose_bent2009(w, e, consider_all=False),
    }
    plan = plan_for_site(canonical, load_grid(EXAMPLE_GRID), "local-b", choosers=choosers)
    data = plan.as_json()
    assert list(data["predicted"]) == ["bent2009", "without-all"]
    assert data["picks"] == {"bent2009": "all", "without-all": "all_batch"}
    assert "all" not in data["predicted"]["without-all"]


def test_an_infinite_prediction_is_null_with_a_reason() -> None:
    canonical = to_canonical(load_pipeline(EXAMPLE))
    grid = load_grid(EXAMPLE_GRID)
    plan = plan_for_site(canonical, grid, "local-c", measured={"F": 1.0})  # a failure a second
    data = plan.as_json()
    assert data["predicted"]["bent2009"] == {"minimal": None}
    assert any("reported as null" in r for r in data["reasons"]["bent2009"])
    _no_infinity(json.dumps(data, allow_nan=False))
    assert math.isinf(plan.plans["bent2009"].predicted_s)


# -- gridcore plan ---------------------------------------------------------------------------


def _plan(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    status = main(["plan", *args])
    out, err = capsys.readouterr()
    return status, out, err


def test_plan_json_for_one_site_has_exactly_the_documented_keys(
    capsys: pytest.CaptureFixture[str], db_url: str, tmp_path: Path
) -> None:
    status, out, _ = _plan(
        capsys, str(EXAMPLE), "--grid", str(EXAMPLE_GRID), "--site", "local-a", "--json"
    )
    assert status == 0
    data = _no_infinity(out)
    assert set(data) == PLAN_KEYS
    assert data["site"] == "local-a" and data["picks"]["bent2009"] in data["feasible"]
    assert set(data["feasible"]) == {"slice", "minimal"}
    assert set(data["predicted"]["bent2009"]) == set(data["feasible"])
    assert data["workload"]["W"] == 8 and data["workload"]["S_B"] == 11_997_136
    assert data["environment"]["S"] == 35 * MB and data["padding"]["padding_bytes"] == 40_242_718
    assert list(tmp_path.iterdir()) == []  # no state database, no home: nothing written


def test_plan_without_site_plans_every_site_and_reports_the_fastest(
    capsys: pytest.CaptureFixture[str], db_url: str
) -> None:
    status, out, err = _plan(capsys, str(EXAMPLE), "--grid", str(EXAMPLE_GRID), "--json")
    assert status == 0
    data = _no_infinity(out)
    assert set(data) == PLAN_KEYS | {"sites", "site_choice"}
    assert set(data["sites"]) == {"local-a", "local-b", "local-c"}
    fastest = min(
        data["sites"].values(),
        key=lambda s: s["predicted"]["bent2009"][s["picks"]["bent2009"]],
    )
    assert data["site"] == fastest["site"]
    assert {k: data[k] for k in fastest} == fastest
    assert data["site_choice"]["by"] == "simulation" and data["site_choice"]["skipped"] == {}
    assert "chosen: " in err  # the table goes to stderr with --json


def test_plan_table_marks_each_pick(capsys: pytest.CaptureFixture[str], db_url: str) -> None:
    status, out, _ = _plan(capsys, str(EXAMPLE), "--grid", str(EXAMPLE_GRID), "--site", "local-c")
    assert status == 0
    lines = out.splitlines()
    assert lines[0].startswith("kmer-count (") and "W = 8 pipelines, D = 3 depths" in lines[0]
    assert lines[1] == "padding: +40.2 MB (52.8 MB actual -> 93.1 MB canonical)"
    rows = {line.split()[0]: line for line in lines if line.startswith("  ")}
    # one column per registered chooser; only Minimal fits local-c's 100 MB
    assert rows["minimal"].endswith(" *") and rows["slice"].split()[1:] == ["no"] + ["-"] * len(
        CHOOSERS
    )


def test_the_default_grid_configures_no_storage_exit_2(
    capsys: pytest.CaptureFixture[str], db_url: str, tmp_path: Path
) -> None:
    status, out, err = _plan(capsys, str(EXAMPLE), "--json")
    assert status == 2 and out == ""
    assert "no site of grid <embedded default> can be planned" in err
    assert "sites.local-a.storage_gb: not set" in err and "sites.local-c.storage_gb" in err
    status, out, err = _plan(capsys, str(EXAMPLE), "--site", "local-b")
    assert status == 2 and out == "" and "sites.local-b.storage_gb: not set" in err
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize(
    ("change", "field"),
    [
        (("output_bytes = 6", "output_bytes = -6"), "depths[0].output_bytes: must be an integer"),
        (("version = 1", "version = 3"), "version: must be 1, got 3"),
        (("count = 3", "count = 0"), "pipeline_range.count: must be an integer from 1"),
        (
            ('path = "r/2"', 'path = "/etc/shadow"', LISTED),
            "pipelines[1].path: must be relative to the pipeline file's directory",
        ),
        (
            ('logical_name = "reads/s{i}.fq"', 'path = "../../../../etc/s{i}"'),
            "pipeline_range.path: leads out of the pipeline file's directory",
        ),
    ],
)
def test_a_malformed_file_exits_2_naming_the_field_and_writes_nothing(
    capsys: pytest.CaptureFixture[str],
    db_url: str,
    tmp_path: Path,
    change: tuple[str, ...],
    field: str,
) -> None:
    bad = tmp_path / "in" / "bad.toml"
    bad.parent.mkdir()
    bad.write_text(_sub(*change))
    before = sorted(tmp_path.rglob("*"))
    status, out, err = _plan(capsys, str(bad), "--grid", str(EXAMPLE_GRID), "--json")
    assert status == 2 and out == ""
    assert err.startswith(f"gridcore: error: {bad}: {field}"), err
    assert len(err.strip().splitlines()) == 1
    assert sorted(tmp_path.rglob("*")) == before


def test_an_unknown_site_exits_2(capsys: pytest.CaptureFixture[str], db_url: str) -> None:
    status, out, err = _plan(capsys, str(EXAMPLE), "--grid", str(EXAMPLE_GRID), "--site", "zz")
    assert status == 2 and out == "" and "unknown site 'zz'" in err


def _unsized(tmp_path: Path) -> Path:
    path = tmp_path / "unsized.toml"
    path.write_text(
        _sub('logical_name = "ref/index", size_bytes = 60', 'logical_name = "ref/index"')
    )
    return path


@pytest.mark.parametrize(
    ("change", "field", "name"),
    [
        (
            ("size_bytes = 8\n", "", LISTED),
            "pipelines[0].size_bytes",
            "r/1",
        ),
        (("size_bytes = 8\n", "", BASE), "pipelines[0].size_bytes", "reads/s1.fq"),
        (
            (", size_bytes = 60", "", BASE),
            "depths[0].batch.size_bytes",
            "ref/index",
        ),
    ],
    ids=["listed pipeline", "range of pipelines", "batch volume"],
)
def test_a_size_left_to_a_catalog_without_a_state_database_names_file_and_field(
    capsys: pytest.CaptureFixture[str],
    db_url: str,
    tmp_path: Path,
    change: tuple[str, str, str],
    field: str,
    name: str,
) -> None:
    # issue 21 item 13: the refusal named neither the file nor the field
    pipeline = tmp_path / "in" / "pipe.toml"
    pipeline.parent.mkdir()
    pipeline.write_text(_sub(*change))
    before = sorted(tmp_path.rglob("*"))
    status, out, err = _plan(capsys, str(pipeline), "--grid", str(EXAMPLE_GRID), "--json")
    assert status == 2 and out == ""
    assert re.fullmatch(
        rf"gridcore: error: {re.escape(str(pipeline))}: {re.escape(field)}: not given, and"
        rf" there is no state database '.*' whose replica catalog could give the size of"
        rf" '{re.escape(name)}' \(give size_bytes in the file, or --db\)(; \d+ more .*)?\n",
        err,
    ), err
    assert sorted(tmp_path.rglob("*")) == before  # nothing written, no database made


def test_plan_takes_sizes_the_file_leaves_out_from_the_replica_catalog(
    capsys: pytest.CaptureFixture[str], db_url: str, tmp_path: Path
) -> None:
    from gridcore.staging import ReplicaCatalog
    from gridcore.state.store import open_store

    pipeline = _unsized(tmp_path)
    args = (str(pipeline), "--grid", str(EXAMPLE_GRID), "--site", "local-a", "--json")
    # No state database: refused naming the file and the field, and none is created.
    status, out, err = _plan(capsys, *args)
    assert status == 2 and "'ref/index'" in err
    assert err.startswith(
        f"gridcore: error: {pipeline}: depths[0].batch.size_bytes: not given, and there is"
        " no state database"
    ), err
    assert not (tmp_path / "state.db").exists()

    store = open_store(db_url, upgrade=True)
    try:
        status, out, err = _plan(capsys, *args)  # the catalog does not know the file
        assert status == 2 and f"{pipeline}: depths[0].batch.size_bytes: not given" in err
        ReplicaCatalog(store).register(
            Replica("ref/index", "local-a", "/srv/ref/index", 75, "sha256:" + "0" * 64)
        )
        status, out, _ = _plan(capsys, *args)
    finally:
        store.dispose()
    assert status == 0
    data = _no_infinity(out)
    assert data["padding"]["depths"][0]["batch"]["actual_bytes"] == 75
    assert data["workload"]["S_B"] == 75


def test_strategy_names_in_the_json_are_the_policy_values(
    capsys: pytest.CaptureFixture[str], db_url: str
) -> None:
    status, out, _ = _plan(capsys, str(EXAMPLE), "--grid", str(EXAMPLE_GRID), "--json")
    assert status == 0
    data = _no_infinity(out)
    values = {s.value for s in Strategy}
    for site in data["sites"].values():
        assert set(site["feasible"]) <= values and set(site["predicted"]["bent2009"]) <= values


def test_plan_refine_reads_what_earlier_runs_measured_and_never_creates_a_database(
    capsys: pytest.CaptureFixture[str], db_url: str, tmp_path: Path
) -> None:
    from gridcore.state.store import open_store

    args = (str(EXAMPLE), "--grid", str(EXAMPLE_GRID), "--site", "local-a", "--json")
    status, out, err = _plan(capsys, *args, "--refine")
    assert status == 2 and "--refine: there is no state database" in err
    assert not (tmp_path / "state.db").exists()
    store = open_store(db_url, upgrade=True)
    store.dispose()
    status, out, _ = _plan(capsys, *args, "--refine")
    assert status == 0
    data = _no_infinity(out)
    assert data["refinement"] == ["nothing measured yet: the file's estimates are used"]
    # without --refine the key is absent (exactly the documented keys)
    status, out, _ = _plan(capsys, *args)
    assert "refinement" not in _no_infinity(out)


def test_the_file_format_imports_no_planning_policy_or_simulator() -> None:
    # Reading a pipeline file (a DAG's parse, a validation) loads the format alone.
    code = (
        "import sys, gridcore.dataplan.format\n"
        "print(sorted(m for m in sys.modules if m.startswith(("
        "'gridcore.sim', 'gridcore.policies', 'gridcore.dataplan.planning',"
        " 'gridcore.dataplan.choosers'))))"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "[]"
