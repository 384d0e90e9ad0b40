"""The k-mer counting application behind examples/pipelines/kmer_count.toml: its k-mers
against a brute force over strings, each subcommand on a tiny hand-made case, the output
bounds a pipeline file declares, deterministic synthetic data, malformed inputs refused
in one line naming the file, and the three jobs end to end as OS processes."""

from __future__ import annotations

import hashlib
import json
import random
import subprocess
import sys
from collections import Counter
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np
import pytest

from gridcore.apps.kmer import (
    LINEAGE_BYTES,
    NAME_BYTES,
    REFERENCE_TAXA,
    SAMPLE_BYTES,
    TAXONOMY_HEADER,
    K,
    KmerTable,
    Taxon,
    TaxonCounts,
    base_codes,
    canonical_kmers,
    count,
    count_output_bytes,
    encode_counts,
    encode_index,
    encode_table,
    index_of,
    lookup,
    main,
    make_data,
    merge,
    merge_output_bound,
    read_counts,
    read_fastq,
    read_table,
    read_taxonomy,
    report_text,
    table_of,
    taxonomy_text,
)
from gridcore.errors import RequestError

REPO = Path(__file__).resolve().parents[2]
COMPLEMENT = str.maketrans("ACGT", "TGCA")


# --- brute force over strings ----------------------------------------------------------


def random_bases(rng: random.Random, n: int) -> str:
    return "".join(rng.choice("ACGT") for _ in range(n))


def reverse_complement(bases: str) -> str:
    return bases[::-1].translate(COMPLEMENT)


def brute_kmers(bases: str) -> list[str]:
    """Every canonical k-mer of ``bases`` as text (A < C < G < T orders text as the
    2-bit integers), windows with an N skipped."""
    windows = (bases[i : i + K] for i in range(len(bases) - K + 1))
    return [min(w, reverse_complement(w)) for w in windows if "N" not in w]


def as_int(kmer: str) -> int:
    return int(kmer.translate(str.maketrans("ACGT", "0123")), 4)


def fastq(reads: Sequence[str]) -> bytes:
    return b"".join(
        b"@r%d\n%s\n+\n%s\n" % (i, r.encode(), b"I" * len(r)) for i, r in enumerate(reads)
    )


def write(path: Path, data: bytes) -> Path:
    path.write_bytes(data)
    return path


# --- k-mers ----------------------------------------------------------------------------


def test_canonical_kmers_match_the_brute_force_on_both_strands() -> None:
    rng = random.Random(1)
    bases = random_bases(rng, 150) + "N" + random_bases(rng, 60) + "acgt"
    kmers, valid = canonical_kmers(base_codes(bases.encode()))
    assert [int(x) for x in kmers[valid]] == [as_int(k) for k in brute_kmers(bases.upper())]
    other_strand = base_codes(reverse_complement(bases.upper()).encode())
    assert np.array_equal(
        np.sort(canonical_kmers(other_strand)[0][valid[::-1]]), np.sort(kmers[valid])
    )


def test_a_sequence_shorter_than_k_has_no_kmer() -> None:
    kmers, valid = canonical_kmers(base_codes(b"ACGT" * 7))
    assert len(kmers) == len(valid) == 0


# --- lookup ----------------------------------------------------------------------------


def test_lookup_keeps_exactly_the_reads_sharing_a_kmer_with_the_reference(tmp_path: Path) -> None:
    rng = random.Random(2)
    reference = random_bases(rng, 200)
    with_error = reference[40:120]
    with_error = "".join(  # a substitution every 25 bases: no error-free 31-base window
        ("A" if b != "A" else "C") if i % 25 == 12 else b for i, b in enumerate(with_error)
    )
    reads = [
        reference[10:90],  # forward strand: kept
        reverse_complement(reference[100:170]),  # other strand: kept
        random_bases(rng, 80),  # unrelated: dropped
        with_error,  # every window has an error: dropped
        reference[0:30],  # shorter than k: dropped
        reference[150:200] + "N" + random_bases(rng, 40),  # one k-mer before the N: kept
        reference[60:80] + "N" + reference[81:100],  # hits on either side of N too short
        "",  # no bases
    ]
    index_path = write(
        tmp_path / "index.bin", encode_index(index_of([base_codes(reference.encode())]))
    )
    reads_path = write(tmp_path / "reads.fq", fastq(reads))

    summary = lookup(index_path, reads_path, tmp_path / "hits.fq")

    in_reference = set(brute_kmers(reference))
    expected = [i for i, r in enumerate(reads) if in_reference & set(brute_kmers(r))]
    assert expected == [0, 1, 5]
    records = read_fastq(reads_path).records
    assert (tmp_path / "hits.fq").read_bytes() == b"".join(records[i] for i in expected)
    assert summary == {"reads": 8, "kept": 3, "bytes": (tmp_path / "hits.fq").stat().st_size}


def test_lookup_of_an_empty_fastq_writes_an_empty_one(tmp_path: Path) -> None:
    index_path = write(tmp_path / "index.bin", encode_index(np.array([5], dtype=np.uint64)))
    lookup(index_path, write(tmp_path / "reads.fq", b""), tmp_path / "hits.fq")
    assert (tmp_path / "hits.fq").read_bytes() == b""


# --- count -----------------------------------------------------------------------------


def test_count_per_taxon_equals_the_brute_force(tmp_path: Path) -> None:
    rng = random.Random(3)
    shared = random_bases(rng, 40)  # in both taxa: its k-mers name neither
    taxa = {7: random_bases(rng, 120) + shared, 3: shared + random_bases(rng, 90)}
    reads = [
        taxa[7][5:105],
        reverse_complement(taxa[3][20:120]),
        taxa[7][100:] + taxa[3][:50],
        random_bases(rng, 60),
        taxa[7][:40] + taxa[7][:40],  # a repeated k-mer counts twice
    ]
    table = table_of([base_codes(s.encode()) for s in taxa.values()], list(taxa))
    table_path = write(tmp_path / "table.bin", encode_table(table))
    reads_path = write(tmp_path / "reads.fq", fastq(reads))

    count(table_path, reads_path, tmp_path / "counts.bin")

    owners: dict[str, set[int]] = {}
    for taxon, bases in taxa.items():
        for kmer in brute_kmers(bases):
            owners.setdefault(kmer, set()).add(taxon)
    named = {kmer: next(iter(t)) for kmer, t in owners.items() if len(t) == 1}
    every = [kmer for r in reads for kmer in brute_kmers(r)]
    per_taxon = Counter(named[kmer] for kmer in every if kmer in named)
    assert read_counts(tmp_path / "counts.bin") == TaxonCounts(
        reads=5,
        kmers=len(every),
        unclassified=sum(kmer not in named for kmer in every),
        taxa=(3, 7),
        counts=(per_taxon[3], per_taxon[7]),
    )
    assert per_taxon[3] > 0 and per_taxon[7] > 0
    assert (tmp_path / "counts.bin").stat().st_size == count_output_bytes(2)


def test_the_table_leaves_out_kmers_two_taxa_share() -> None:
    rng = random.Random(4)
    shared = random_bases(rng, K)
    table = table_of([base_codes(s.encode()) for s in (shared, reverse_complement(shared))], [1, 2])
    assert len(table.kmers) == len(table.taxa) == 0


# --- merge -----------------------------------------------------------------------------


def test_merge_names_the_taxa_by_decreasing_count(tmp_path: Path) -> None:
    taxonomy = [
        Taxon(2, "Alpha one", "root;g__Alpha"),
        Taxon(5, "Beta two", "root;g__Beta"),
        Taxon(9, "Gamma three", "root;g__Gamma"),
    ]
    counts = TaxonCounts(reads=3, kmers=16, unclassified=4, taxa=(2, 5, 9), counts=(3, 6, 3))
    taxonomy_path = write(tmp_path / "taxonomy.tsv", taxonomy_text(taxonomy).encode())
    counts_path = write(tmp_path / "counts.bin", encode_counts(counts))

    merge(taxonomy_path, counts_path, tmp_path / "report.tsv", "s-1")

    assert (tmp_path / "report.tsv").read_text() == (
        "# sample=s-1 reads=3 kmers=16\n"
        "taxon\tlineage\tcount\tfraction\n"
        "Beta two\troot;g__Beta\t6\t0.375000\n"
        "Alpha one\troot;g__Alpha\t3\t0.187500\n"
        "Gamma three\troot;g__Gamma\t3\t0.187500\n"
        "unclassified\t\t4\t0.250000\n"
    )


def test_the_taxonomy_pads_every_lineage_to_its_documented_width(tmp_path: Path) -> None:
    taxa = [Taxon(1, "A b", "root"), Taxon(2, "C d", "root;\u00e9")]
    text = taxonomy_text(taxa)
    lines = text.encode().splitlines()
    assert lines[0] == TAXONOMY_HEADER.encode()
    assert [len(line.split(b"\t")[2]) for line in lines[1:]] == [LINEAGE_BYTES, LINEAGE_BYTES]
    assert read_taxonomy(write(tmp_path / "t.tsv", text.encode())) == {t.taxon_id: t for t in taxa}
    with pytest.raises(RequestError, match="taxon 3: a lineage of at most 240 bytes"):
        taxonomy_text([Taxon(3, "E f", "x" * (LINEAGE_BYTES + 1))])


# --- output bounds ---------------------------------------------------------------------


def test_the_merge_bound_is_reached_by_the_longest_report() -> None:
    biggest = 10**20 - 1  # 20 digits, as many as a u64 prints
    taxa = tuple(range(1, REFERENCE_TAXA + 1))
    counts = TaxonCounts(biggest, biggest, biggest, taxa, (biggest,) * len(taxa))
    longest = {t: Taxon(t, "n" * NAME_BYTES, "l" * LINEAGE_BYTES) for t in taxa}
    report = report_text("s" * SAMPLE_BYTES, counts, longest).encode()
    assert len(report) == merge_output_bound(REFERENCE_TAXA)


def test_an_overlong_sample_name_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    counts = TaxonCounts(0, 0, 0, (), ())
    taxonomy = write(tmp_path / "taxonomy.tsv", taxonomy_text([]).encode())
    counts_path = write(tmp_path / "counts.bin", encode_counts(counts))
    argv = ["merge", "--taxonomy", str(taxonomy), "--counts", str(counts_path)]
    assert main([*argv, "--out", str(tmp_path / "r.tsv"), "--sample", "s" * 129]) == 2
    assert "sample: must be 1-128 bytes" in capsys.readouterr().err


# --- synthetic data --------------------------------------------------------------------


def test_make_data_is_deterministic_and_its_manifest_true(tmp_path: Path) -> None:
    first = make_data(tmp_path / "a", samples=3, seed=11, scale=0.05)
    second = make_data(tmp_path / "b", samples=3, seed=11, scale=0.05)
    other = make_data(tmp_path / "c", samples=3, seed=12, scale=0.05)

    assert first == second
    assert [f["sha256"] for f in first["files"]] != [f["sha256"] for f in other["files"]]
    assert [f["path"] for f in first["files"]] == [
        "ref/index-k31.bin",
        "ref/kmer-table.bin",
        "ref/taxonomy.tsv",
        "reads/sample-01.fq",
        "reads/sample-02.fq",
        "reads/sample-03.fq",
    ]
    for entry in first["files"]:
        data = (tmp_path / "a" / entry["path"]).read_bytes()
        assert (len(data), hashlib.sha256(data).hexdigest()) == (
            entry["size_bytes"],
            entry["sha256"],
        )
    table = read_table(tmp_path / "a" / "ref/kmer-table.bin")
    assert len(np.unique(table.taxa)) == REFERENCE_TAXA


def test_make_data_refuses_a_scale_out_of_range(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    assert main(["make-data", "--out", str(tmp_path), "--samples", "2", "--scale", "0"]) == 2
    assert capsys.readouterr().err.startswith("kmer: error: scale: must be 0.01 to 10.0")


# --- malformed inputs ------------------------------------------------------------------


def _index(data: bytes) -> Callable[[Path], list[str]]:
    def argv(tmp: Path) -> list[str]:
        reads = write(tmp / "reads.fq", fastq(["ACGT"]))
        return ["lookup", "--index", str(write(tmp / "bad", data)), "--reads", str(reads)]

    return argv


def _table(data: bytes) -> Callable[[Path], list[str]]:
    def argv(tmp: Path) -> list[str]:
        reads = write(tmp / "reads.fq", fastq(["ACGT"]))
        return ["count", "--table", str(write(tmp / "bad", data)), "--reads", str(reads)]

    return argv


def _reads(data: bytes) -> Callable[[Path], list[str]]:
    def argv(tmp: Path) -> list[str]:
        index = write(tmp / "index.bin", encode_index(np.zeros(0, dtype=np.uint64)))
        return ["lookup", "--index", str(index), "--reads", str(write(tmp / "bad", data))]

    return argv


def _missing_reads(tmp: Path) -> list[str]:
    index = write(tmp / "index.bin", encode_index(np.zeros(0, dtype=np.uint64)))
    return ["lookup", "--index", str(index), "--reads", str(tmp / "bad")]


def _merge(taxonomy: bytes, counts: bytes) -> Callable[[Path], list[str]]:
    def argv(tmp: Path) -> list[str]:
        if taxonomy:
            t, c = write(tmp / "bad", taxonomy), write(tmp / "counts.bin", counts)
        else:
            t = write(tmp / "taxonomy.tsv", taxonomy_text([Taxon(1, "A b", "root")]).encode())
            c = write(tmp / "bad", counts)
        return ["merge", "--taxonomy", str(t), "--counts", str(c), "--sample", "s"]

    return argv


_KMERS = np.array([3, 9], dtype=np.uint64)
_GOOD_COUNTS = encode_counts(TaxonCounts(1, 2, 1, (1,), (1,)))


@pytest.mark.parametrize(
    ("scenario", "argv", "message"),
    [
        ("index: bad magic", _index(b"XXXX" + encode_index(_KMERS)[4:]), "not a k-mer index"),
        ("index: truncated", _index(encode_index(_KMERS)[:-1]), "but its header says 2 k-mers"),
        ("index: empty file", _index(b""), "not a k-mer index"),
        ("index: of k = 21", _index(encode_index(_KMERS, k=21)), "a k-mer index of k = 21"),
        ("index: a table", _index(encode_table(KmerTable(_KMERS, np.ones(2, np.uint32)))), "GKI1"),
        ("index: unsorted", _index(encode_index(_KMERS[::-1])), "not strictly increasing"),
        ("table: taxon 0", _table(encode_table(KmerTable(_KMERS, np.zeros(2, np.uint32)))), "id 0"),
        ("table: an index", _table(encode_index(_KMERS)), "not a k-mer table"),
        ("reads: no final newline", _reads(b"@r\nACGT\n+\nIIII"), "no newline at the end"),
        ("reads: a read cut short", _reads(b"@r\nACGT\n+\n"), "3 lines, not four per read"),
        ("reads: header", _reads(b"r\nACGT\n+\nIIII\n"), "line 1: a read's header"),
        ("reads: plus line", _reads(b"@r\nACGT\n-\nIIII\n"), "line 3: expected the '+' line"),
        ("reads: qualities", _reads(b"@r\nACGT\n+\nIII\n"), "line 4: 3 qualities for 4 bases"),
        ("reads: a base", _reads(fastq(["ACGT", "ACXT"])), "line 6: base b'X' is not one of"),
        ("reads: a quality", _reads(b"@r\nACGT\n+\nII I\n"), "line 4: quality b' ' is not"),
        ("taxonomy: header", _merge(b"1\tA b\troot\n", _GOOD_COUNTS), "not a taxonomy"),
        (
            "taxonomy: no padding",
            _merge(f"{TAXONOMY_HEADER}\n1\tA b\troot\n".encode(), _GOOD_COUNTS),
            "line 2: the lineage must be padded to 240 bytes",
        ),
        ("taxonomy: not UTF-8", _merge(b"\xff\n", _GOOD_COUNTS), "not UTF-8 text"),
        ("counts: bad magic", _merge(b"", b"GKX1" + _GOOD_COUNTS[4:]), "not k-mer counts"),
        (
            "counts: totals",
            _merge(b"", encode_counts(TaxonCounts(1, 5, 1, (1,), (1,)))),
            "do not add up to 5",
        ),
        ("reads: missing", _missing_reads, "cannot read: No such file or directory"),
    ],
)
def test_malformed_inputs_are_refused_naming_the_file(
    scenario: str,
    argv: Callable[[Path], list[str]],
    message: str,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert main([*argv(tmp_path), "--out", str(tmp_path / "out")]) == 2, scenario

    err = capsys.readouterr().err
    assert err.startswith(f"kmer: error: {tmp_path / 'bad'}: ") and err.count("\n") == 1, err
    assert message in err
    assert not (tmp_path / "out").exists()


def test_a_taxon_the_taxonomy_lacks_is_named(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    taxonomy = write(tmp_path / "taxonomy.tsv", taxonomy_text([Taxon(1, "A b", "root")]).encode())
    counts = write(tmp_path / "counts.bin", encode_counts(TaxonCounts(1, 1, 0, (4,), (1,))))
    argv = ["merge", "--taxonomy", str(taxonomy), "--counts", str(counts), "--sample", "s"]
    assert main([*argv, "--out", str(tmp_path / "r.tsv")]) == 2
    assert f"{taxonomy}: has no taxon 4 (named by {counts})" in capsys.readouterr().err


def test_a_bad_index_exits_2_naming_it_from_a_real_process(tmp_path: Path) -> None:
    index = write(tmp_path / "index.bin", b"NOPE" + bytes(12))
    reads = write(tmp_path / "reads.fq", fastq(["ACGT"]))
    done = _run("lookup", "--index", index, "--reads", reads, "--out", tmp_path / "hits.fq")
    assert done.returncode == 2
    assert done.stderr == (
        f"kmer: error: {index}: not a k-mer index (expected magic b'GKI1', got b'NOPE')\n"
    )


# --- end to end ------------------------------------------------------------------------


def test_the_three_jobs_end_to_end_on_synthetic_data(tmp_path: Path) -> None:
    data, out = tmp_path / "data", tmp_path / "out"
    made = _run("make-data", "--out", data, "--samples", "2", "--scale", "0.05")
    assert made.returncode == 0, made.stderr
    manifest = json.loads(made.stdout)
    sizes = {entry["path"]: entry["size_bytes"] for entry in manifest["files"]}
    bounds = manifest["output_bytes"]
    assert bounds == {
        "lookup": sizes["reads/sample-01.fq"],
        "count": count_output_bytes(REFERENCE_TAXA),
        "merge": merge_output_bound(REFERENCE_TAXA),
    }
    reads = data / "reads/sample-02.fq"

    steps = [
        (
            "lookup",
            "--index",
            data / "ref/index-k31.bin",
            "--reads",
            reads,
            "--out",
            out / "hits.fq",
        ),
        (
            "count",
            "--table",
            data / "ref/kmer-table.bin",
            "--reads",
            out / "hits.fq",
            "--out",
            out / "counts",
        ),
        (
            "merge",
            "--taxonomy",
            data / "ref/taxonomy.tsv",
            "--counts",
            out / "counts",
            "--out",
            out / "report.tsv",
            "--sample",
            "sample-02",
        ),
    ]
    summaries = []
    for step in steps:
        done = _run(*step)
        assert done.returncode == 0, done.stderr
        summaries.append(json.loads(done.stdout))

    kept, counted = summaries[0]["kept"], summaries[1]
    assert 0 < kept < summaries[0]["reads"] == 400  # random reads are dropped
    assert counted["reads"] == kept and counted["kmers"] == kept * (100 - K + 1)
    assert (out / "hits.fq").stat().st_size <= bounds["lookup"]
    assert (out / "counts").stat().st_size == bounds["count"]
    assert (out / "report.tsv").stat().st_size <= bounds["merge"]
    lines = (out / "report.tsv").read_text().splitlines()
    assert lines[0] == f"# sample=sample-02 reads={kept} kmers={counted['kmers']}"
    rows = [line.split("\t") for line in lines[2:]]
    assert len(rows) == REFERENCE_TAXA + 1 and rows[-1][:3] == [
        "unclassified",
        "",
        str(counted["unclassified"]),
    ]
    assert sum(int(row[2]) for row in rows) == counted["kmers"]
    assert all(row[1].startswith("root;d__") for row in rows[:-1])


def _run(*argv: object) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "gridcore.apps.kmer", *map(str, argv)],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=120,
        check=False,
    )
