"""Per-sample k-mer counting against a shared reference: the computation behind the
example batch-pipeline workload ``examples/pipelines/kmer_count.toml``.

How it works, in full: ``docs/apps.md``
(section ``gridcore/apps/kmer.py``).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import os
import struct
import sys
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from numpy.typing import NDArray

from gridcore.errors import GridError, RequestError

Kmers = NDArray[np.uint64]
Codes = NDArray[np.uint8]

K = 31
READ_BASES = 100
REFERENCE_TAXA = 8
NAME_BYTES = 64
LINEAGE_BYTES = 240
SAMPLE_BYTES = 128
TAXONOMY_HEADER = (
    f"# gridcore k-mer taxonomy v1: taxon_id<TAB>name<TAB>lineage padded to {LINEAGE_BYTES}"
)
REPORT_COLUMNS = "taxon\tlineage\tcount\tfraction"
UNCLASSIFIED = "unclassified"

GENOME_BASES = 1_000_000  # at scale 1
TAXONOMY_ROWS = 16_384
MIN_TAXONOMY_ROWS = 64
READS_PER_SAMPLE = 8_000
ERROR_RATE = 0.01
RANDOM_READS = (0.2, 0.5)  # the fraction of random reads, drawn per sample in this range
MIN_SCALE, MAX_SCALE = 0.01, 10.0  # below: a taxon shorter than a read; above: GBs of RAM
MAX_SAMPLES = 999

_INDEX = struct.Struct("<4sHHQ")
_INDEX_MAGIC = b"GKI1"
_TABLE_MAGIC = b"GKT1"
_COUNTS = struct.Struct("<4sIQQQ")
_COUNTS_MAGIC = b"GKC1"
_COUNT_ROW = np.dtype([("taxon", "<u4"), ("count", "<u8")])
_DIGITS = 20  # the most digits a u64 prints
_FRACTION_CHARS = len("1.000000")
_NOT_A_BASE = 255  # and 4 is N: a base, but in no k-mer
_LETTERS = np.frombuffer(b"ACGT", dtype=np.uint8)
_SYLLABLES = ("ba", "ci", "do", "fu", "ga", "le", "mi", "no", "pa", "ri", "so", "tu", "vex")


class InputFileError(GridError):
    """An input file is unreadable or malformed; the message names the file."""


@dataclass(frozen=True)
class Reads:
    """The reads of one FASTQ file: each whole record (its four lines, as read) and its
    bases."""

    records: tuple[bytes, ...]
    bases: tuple[bytes, ...]


@dataclass(frozen=True)
class KmerTable:
    """k-mer -> taxon id: ``kmers`` strictly increasing, ``taxa[i]`` the id of
    ``kmers[i]``."""

    kmers: Kmers
    taxa: NDArray[np.uint32]


@dataclass(frozen=True)
class TaxonCounts:
    """What ``count`` writes: per taxon of the table (increasing id) its k-mers, and the
    totals."""

    reads: int
    kmers: int
    unclassified: int
    taxa: tuple[int, ...]
    counts: tuple[int, ...]


@dataclass(frozen=True)
class Taxon:
    """One line of the taxonomy, its lineage without the padding."""

    taxon_id: int
    name: str
    lineage: str


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        summary = args.run(args)
    except GridError as exc:
        print(f"kmer: error: {exc}", file=sys.stderr)
        return 2
    print(json.dumps(summary), flush=True)
    return 0


# --- the subcommands -------------------------------------------------------------------


def lookup(index_path: Path, reads_path: Path, out_path: Path) -> dict[str, Any]:
    """Write the reads of ``reads_path`` having a k-mer in the index, records unchanged."""
    index = read_index(index_path)
    reads = read_fastq(reads_path)
    kmers, read_of = read_kmers(reads)
    hit = read_of[_contains(index, kmers)]
    kept = np.zeros(len(reads.records), dtype=bool)
    kept[hit] = True
    output = b"".join(record for record, keep in zip(reads.records, kept, strict=True) if keep)
    _publish(out_path, output)
    return {"reads": len(reads.records), "kept": int(kept.sum()), "bytes": len(output)}


def count(table_path: Path, reads_path: Path, out_path: Path) -> dict[str, Any]:
    """Write the reads' k-mers per taxon of the table (the counts format)."""
    table = read_table(table_path)
    reads = read_fastq(reads_path)
    counts = count_by_taxon(table, read_kmers(reads)[0], len(reads.records))
    _publish(out_path, encode_counts(counts))
    return {"reads": counts.reads, "kmers": counts.kmers, "unclassified": counts.unclassified}


def merge(taxonomy_path: Path, counts_path: Path, out_path: Path, sample: str) -> dict[str, Any]:
    """Write the sample's report: its counts with the taxa's names and lineages."""
    counts = read_counts(counts_path)
    taxonomy = read_taxonomy(taxonomy_path)
    missing = [taxon for taxon in counts.taxa if taxon not in taxonomy]
    if missing:
        raise InputFileError(f"{taxonomy_path}: has no taxon {missing[0]} (named by {counts_path})")
    report = report_text(sample, counts, taxonomy).encode("utf-8")
    _publish(out_path, report)
    return {"sample": sample, "taxa": len(counts.taxa), "bytes": len(report)}


def make_data(out_dir: Path, samples: int, seed: int = 0, scale: float = 1.0) -> dict[str, Any]:
    """Write the synthetic data set (docs/apps.md) under ``out_dir``; its manifest."""
    _check_data_request(samples, seed, scale)
    rng = np.random.default_rng(seed)
    taxonomy = _synthetic_taxonomy(rng, max(MIN_TAXONOMY_ROWS, round(TAXONOMY_ROWS * scale)))
    taxon_ids = np.sort(rng.choice(len(taxonomy), REFERENCE_TAXA, replace=False)) + 1
    genome = rng.integers(0, 4, round(GENOME_BASES * scale), dtype=np.uint8)
    segments = np.array_split(genome, REFERENCE_TAXA)
    files = [
        _write_file(out_dir, "ref/index-k31.bin", encode_index(index_of(segments))),
        _write_file(
            out_dir, "ref/kmer-table.bin", encode_table(table_of(segments, taxon_ids.tolist()))
        ),
        _write_file(out_dir, "ref/taxonomy.tsv", taxonomy_text(taxonomy).encode("utf-8")),
    ]
    n_reads = max(1, round(READS_PER_SAMPLE * scale))
    width = max(2, len(str(samples)))
    for i in range(1, samples + 1):
        name = f"sample-{i:0{width}}"
        reads = _synthetic_reads(rng, segments, name, n_reads)
        files.append(_write_file(out_dir, f"reads/{name}.fq", reads))
    return {
        "seed": seed,
        "scale": scale,
        "k": K,
        "files": files,
        "output_bytes": {
            "lookup": max(f["size_bytes"] for f in files if f["path"].startswith("reads/")),
            "count": count_output_bytes(REFERENCE_TAXA),
            "merge": merge_output_bound(REFERENCE_TAXA),
        },
    }


# --- output bounds ----------------------------------------------------------------------


def count_output_bytes(taxa: int) -> int:
    """The size of ``count``'s output for a table of ``taxa`` taxa."""
    return _COUNTS.size + _COUNT_ROW.itemsize * taxa


def merge_output_bound(taxa: int) -> int:
    """The most bytes ``merge`` writes for counts of ``taxa`` taxa: reached by the
    longest sample name, names and lineages, and 20-digit numbers."""
    comment = len("# sample= reads= kmers=\n") + SAMPLE_BYTES + 2 * _DIGITS
    numbers = _DIGITS + _FRACTION_CHARS + len("\t\t\t\n")
    row = NAME_BYTES + LINEAGE_BYTES + numbers
    return comment + len(REPORT_COLUMNS) + 1 + taxa * row + len(UNCLASSIFIED) + numbers


# --- k-mers -----------------------------------------------------------------------------


def base_codes(bases: bytes) -> Codes:
    """Each byte's 2-bit code, 4 for N, :data:`_NOT_A_BASE` for anything else."""
    return _base_code_table()[np.frombuffer(bases, dtype=np.uint8)]


def canonical_kmers(codes: Codes, k: int = K) -> tuple[Kmers, NDArray[np.bool_]]:
    """The canonical k-mer of every window ``codes[i : i + k]`` and whether the window
    has one (no N, no separator in it)."""
    windows = len(codes) - k + 1
    if windows <= 0:
        return np.zeros(0, dtype=np.uint64), np.zeros(0, dtype=bool)
    unusable = np.concatenate(([0], np.cumsum(codes > 3)))
    valid = unusable[k:] == unusable[:-k]
    bits = (codes & 3).astype(np.uint64)
    forward = np.zeros(windows, dtype=np.uint64)
    two = np.uint64(2)
    for j in range(k):
        forward <<= two
        forward |= bits[j : j + windows]
    return np.minimum(forward, reverse_complement(forward, k)), valid


def reverse_complement(kmers: Kmers, k: int = K) -> Kmers:
    """The k-mers' reverse complements: complement every 2-bit base (``3 - b`` is
    ``b ^ 3``), reverse the 32 bases of the word, and drop the ``32 - k`` that were
    padding."""
    x = kmers ^ np.uint64(0xFFFF_FFFF_FFFF_FFFF)
    pairs, nibbles = np.uint64(0x3333_3333_3333_3333), np.uint64(0x0F0F_0F0F_0F0F_0F0F)
    x = ((x >> np.uint64(2)) & pairs) | ((x & pairs) << np.uint64(2))
    x = ((x >> np.uint64(4)) & nibbles) | ((x & nibbles) << np.uint64(4))
    return x.byteswap() >> np.uint64(2 * (32 - k))


def read_kmers(reads: Reads, k: int = K) -> tuple[Kmers, NDArray[np.intp]]:
    """Every valid canonical k-mer of the reads, and the read each comes from."""
    if not reads.bases:
        return np.zeros(0, dtype=np.uint64), np.zeros(0, dtype=np.intp)
    # An N between reads: no window spans two of them.
    codes = base_codes(b"N".join(reads.bases))
    kmers, valid = canonical_kmers(codes, k)
    starts = np.cumsum([0] + [len(bases) + 1 for bases in reads.bases[:-1]])
    read_of = np.searchsorted(starts, np.arange(len(kmers)), side="right") - 1
    return kmers[valid], read_of[valid]


def index_of(sequences: Sequence[Codes], k: int = K) -> Kmers:
    """The distinct canonical k-mers of the sequences, increasing."""
    parts = [_valid_kmers(codes, k) for codes in sequences]
    return np.unique(np.concatenate(parts)) if parts else np.zeros(0, dtype=np.uint64)


def table_of(sequences: Sequence[Codes], taxon_ids: Sequence[int], k: int = K) -> KmerTable:
    """k-mer -> taxon of ``sequences[i]`` (``taxon_ids[i]``), without the k-mers two taxa
    share."""
    per_taxon = [np.unique(_valid_kmers(codes, k)) for codes in sequences]
    if not per_taxon:
        return KmerTable(np.zeros(0, dtype=np.uint64), np.zeros(0, dtype=np.uint32))
    kmers = np.concatenate(per_taxon)
    taxa = np.concatenate(
        [np.full(len(ks), t, dtype=np.uint32) for ks, t in zip(per_taxon, taxon_ids, strict=True)]
    )
    # A taxon's k-mers are distinct: a k-mer listed twice is in two taxa.
    distinct, first, seen = np.unique(kmers, return_index=True, return_counts=True)
    once = seen == 1
    return KmerTable(distinct[once], taxa[first[once]])


def count_by_taxon(table: KmerTable, kmers: Kmers, reads: int) -> TaxonCounts:
    """The k-mers per taxon of ``table`` (all its taxa, by increasing id)."""
    taxa = np.unique(table.taxa)
    found = _contains(table.kmers, kmers)
    where = np.searchsorted(table.kmers, kmers[found])
    per_taxon = np.bincount(np.searchsorted(taxa, table.taxa[where]), minlength=len(taxa))
    return TaxonCounts(
        reads=reads,
        kmers=len(kmers),
        unclassified=int(len(kmers) - found.sum()),
        taxa=tuple(int(t) for t in taxa),
        counts=tuple(int(c) for c in per_taxon),
    )


def _valid_kmers(codes: Codes, k: int) -> Kmers:
    kmers, valid = canonical_kmers(codes, k)
    return kmers[valid]


def _contains(sorted_kmers: Kmers, kmers: Kmers) -> NDArray[np.bool_]:
    if len(sorted_kmers) == 0:
        return np.zeros(len(kmers), dtype=bool)
    where = np.minimum(np.searchsorted(sorted_kmers, kmers), len(sorted_kmers) - 1)
    return np.asarray(sorted_kmers[where] == kmers)


def _base_code_table() -> Codes:
    table = np.full(256, _NOT_A_BASE, dtype=np.uint8)
    for code, letters in enumerate((b"Aa", b"Cc", b"Gg", b"Tt", b"Nn")):
        table[list(letters)] = code
    return table


# --- the files --------------------------------------------------------------------------


def encode_index(kmers: Kmers, k: int = K) -> bytes:
    return _INDEX.pack(_INDEX_MAGIC, k, 0, len(kmers)) + kmers.astype("<u8").tobytes()


def read_index(path: Path) -> Kmers:
    """The index's k-mers; a file that is not an index of k = 31 is refused."""
    data = _read_bytes(path)
    count = _kmer_header(path, data, _INDEX_MAGIC, "k-mer index")
    _expect_size(path, data, _INDEX.size + 8 * count, f"{count} k-mers")
    return _increasing_kmers(path, data, count)


def encode_table(table: KmerTable, k: int = K) -> bytes:
    header = _INDEX.pack(_TABLE_MAGIC, k, 0, len(table.kmers))
    return header + table.kmers.astype("<u8").tobytes() + table.taxa.astype("<u4").tobytes()


def read_table(path: Path) -> KmerTable:
    """The k-mer table; a file that is not a table of k = 31 is refused."""
    data = _read_bytes(path)
    count = _kmer_header(path, data, _TABLE_MAGIC, "k-mer table")
    _expect_size(path, data, _INDEX.size + 12 * count, f"{count} k-mers and taxon ids")
    kmers = _increasing_kmers(path, data, count)
    taxa = np.frombuffer(data, dtype="<u4", count=count, offset=_INDEX.size + 8 * count)
    if count and int(taxa.min()) == 0:
        raise InputFileError(f"{path}: taxon id 0 in the k-mer table (ids start at 1)")
    return KmerTable(kmers, taxa.astype(np.uint32))


def encode_counts(counts: TaxonCounts) -> bytes:
    header = _COUNTS.pack(
        _COUNTS_MAGIC, len(counts.taxa), counts.reads, counts.kmers, counts.unclassified
    )
    rows = np.zeros(len(counts.taxa), dtype=_COUNT_ROW)
    rows["taxon"], rows["count"] = counts.taxa, counts.counts
    return header + rows.tobytes()


def read_counts(path: Path) -> TaxonCounts:
    """``count``'s output; its totals must add up."""
    data = _read_bytes(path)
    if len(data) < _COUNTS.size or data[:4] != _COUNTS_MAGIC:
        raise InputFileError(f"{path}: not k-mer counts (expected magic {_COUNTS_MAGIC!r})")
    _, taxa, reads, kmers, unclassified = _COUNTS.unpack_from(data)
    _expect_size(path, data, count_output_bytes(taxa), f"{taxa} taxa")
    rows = np.frombuffer(data, dtype=_COUNT_ROW, count=taxa, offset=_COUNTS.size)
    if int(rows["count"].sum()) + unclassified != kmers:
        raise InputFileError(
            f"{path}: the taxa's k-mers and the unclassified do not add up to {kmers}"
        )
    return TaxonCounts(
        reads,
        kmers,
        unclassified,
        tuple(int(t) for t in rows["taxon"]),
        tuple(int(c) for c in rows["count"]),
    )


def taxonomy_text(taxa: Sequence[Taxon]) -> str:
    """The taxonomy file of ``taxa``, every lineage padded to :data:`LINEAGE_BYTES`."""
    lines = [TAXONOMY_HEADER]
    for t in taxa:
        padding = LINEAGE_BYTES - len(t.lineage.encode("utf-8"))
        if padding < 0 or any(c in t.name + t.lineage for c in "\t\n"):
            raise RequestError(
                f"taxon {t.taxon_id}: a lineage of at most {LINEAGE_BYTES} bytes, and no tab"
                " or newline in it or the name"
            )
        lines.append(f"{t.taxon_id}\t{t.name}\t{t.lineage}{' ' * padding}")
    return "\n".join(lines) + "\n"


def read_taxonomy(path: Path) -> dict[int, Taxon]:
    """The taxonomy's taxa by id."""
    try:
        lines = _read_bytes(path).decode("utf-8").split("\n")
    except UnicodeDecodeError as exc:
        raise InputFileError(f"{path}: not UTF-8 text ({exc.reason} at byte {exc.start})") from None
    if lines[0] != TAXONOMY_HEADER:
        raise InputFileError(f"{path}: not a taxonomy (line 1 is not {TAXONOMY_HEADER!r})")
    if lines[-1]:
        raise InputFileError(f"{path}: line {len(lines)}: no newline at the end")
    taxa: dict[int, Taxon] = {}
    for number, line in enumerate(lines[1:-1], start=2):
        taxon = _taxon(path, number, line)
        if taxa.setdefault(taxon.taxon_id, taxon) is not taxon:
            raise InputFileError(f"{path}: line {number}: taxon {taxon.taxon_id} again")
    return taxa


def report_text(sample: str, counts: TaxonCounts, taxonomy: Mapping[int, Taxon]) -> str:
    """``merge``'s report (the format in docs/apps.md)."""
    _check_sample(sample)
    rows = sorted(zip(counts.taxa, counts.counts, strict=True), key=lambda r: (-r[1], r[0]))
    lines = [f"# sample={sample} reads={counts.reads} kmers={counts.kmers}", REPORT_COLUMNS]
    lines += [
        f"{taxonomy[t].name}\t{taxonomy[t].lineage}\t{n}\t{_fraction(n, counts.kmers)}"
        for t, n in rows
    ]
    unclassified = counts.unclassified
    lines.append(f"{UNCLASSIFIED}\t\t{unclassified}\t{_fraction(unclassified, counts.kmers)}")
    return "\n".join(lines) + "\n"


def read_fastq(path: Path) -> Reads:
    """The FASTQ file's reads (the format in docs/apps.md)."""
    data = _read_bytes(path)
    if data and not data.endswith(b"\n"):
        raise InputFileError(f"{path}: no newline at the end (a truncated file?)")
    lines = data.split(b"\n")[:-1]
    if len(lines) % 4:
        raise InputFileError(
            f"{path}: {len(lines)} lines, not four per read (read {len(lines) // 4 + 1} is cut)"
        )
    records, bases, qualities = [], [], []
    for first in range(0, len(lines), 4):
        header, sequence, plus, quality = lines[first : first + 4]
        _check_record(path, first + 1, header, sequence, plus, quality)
        records.append(b"\n".join(lines[first : first + 4]) + b"\n")
        bases.append(sequence)
        qualities.append(quality)
    wrong_bases = base_codes(b"".join(bases)) == _NOT_A_BASE
    _check_letters(path, bases, wrong_bases, 2, "base {!r} is not one of A C G T N")
    codes = np.frombuffer(b"".join(qualities), dtype=np.uint8)
    wrong_qualities = (codes < ord("!")) | (codes > ord("~"))
    _check_letters(path, qualities, wrong_qualities, 4, "quality {!r} is not one of '!'..'~'")
    return Reads(tuple(records), tuple(bases))


def _check_record(
    path: Path, line: int, header: bytes, sequence: bytes, plus: bytes, quality: bytes
) -> None:
    if not header.startswith(b"@"):
        raise InputFileError(f"{path}: line {line}: a read's header must start with '@'")
    if not plus.startswith(b"+"):
        raise InputFileError(f"{path}: line {line + 2}: expected the '+' line")
    if len(quality) != len(sequence):
        raise InputFileError(
            f"{path}: line {line + 3}: {len(quality)} qualities for {len(sequence)} bases"
        )


def _check_letters(
    path: Path, fields: Sequence[bytes], wrong: NDArray[np.bool_], line: int, problem: str
) -> None:
    """Refuse the first ``wrong`` letter of the joined ``fields`` (one per read, on the
    read's ``line``-th line), naming its line; ``problem`` formats the letter."""
    where = np.flatnonzero(wrong)
    if len(where):
        ends = np.cumsum([len(field) for field in fields])
        read = int(np.searchsorted(ends, where[0], side="right"))
        letter = b"".join(fields)[where[0] : where[0] + 1]
        raise InputFileError(f"{path}: line {4 * read + line}: {problem.format(letter)}")


def _taxon(path: Path, number: int, line: str) -> Taxon:
    fields = line.split("\t")
    if len(fields) != 3 or not fields[0].isascii() or not fields[0].isdigit():
        raise InputFileError(f"{path}: line {number}: expected id<TAB>name<TAB>lineage")
    taxon_id, name, lineage = int(fields[0]), fields[1], fields[2]
    if taxon_id == 0 or not 0 < len(name.encode("utf-8")) <= NAME_BYTES:
        raise InputFileError(
            f"{path}: line {number}: needs an id >= 1 and a name of 1-{NAME_BYTES} bytes"
        )
    if len(lineage.encode("utf-8")) != LINEAGE_BYTES:
        raise InputFileError(
            f"{path}: line {number}: the lineage must be padded to {LINEAGE_BYTES} bytes"
        )
    return Taxon(taxon_id, name, lineage.rstrip(" "))


def _kmer_header(path: Path, data: bytes, magic: bytes, what: str) -> int:
    if len(data) < _INDEX.size or data[:4] != magic:
        raise InputFileError(f"{path}: not a {what} (expected magic {magic!r}, got {data[:4]!r})")
    _, k, _, count = _INDEX.unpack_from(data)
    if k != K:
        raise InputFileError(f"{path}: a {what} of k = {k}, this program counts k = {K}")
    return int(count)


def _expect_size(path: Path, data: bytes, size: int, holding: str) -> None:
    if len(data) != size:
        raise InputFileError(
            f"{path}: {len(data)} bytes, but its header says {holding} ({size} bytes)"
        )


def _increasing_kmers(path: Path, data: bytes, count: int) -> Kmers:
    kmers = np.frombuffer(data, dtype="<u8", count=count, offset=_INDEX.size)
    if count and (np.any(kmers[1:] <= kmers[:-1]) or int(kmers[-1]) >= 4**K):
        raise InputFileError(f"{path}: the k-mers are not strictly increasing 62-bit values")
    return kmers.astype(np.uint64)


def _read_bytes(path: Path) -> bytes:
    try:
        return Path(path).read_bytes()
    except OSError as exc:
        raise InputFileError(f"{path}: cannot read: {exc.strerror or exc}") from None


def _publish(path: Path, data: bytes) -> None:
    """Write to a temporary file beside ``path`` and rename it into place: a job that
    dies leaves no partial output under the name the next depth reads."""
    path = Path(path)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, temporary = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    except OSError as exc:
        raise RequestError(f"out: cannot write {path}: {exc.strerror or exc}") from None
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
            # mkstemp's 0600 would hide the data from a stager running as another user.
            os.fchmod(handle.fileno(), 0o644)
        os.replace(temporary, path)
    except OSError as exc:
        Path(temporary).unlink(missing_ok=True)
        raise RequestError(f"out: cannot write {path}: {exc.strerror or exc}") from None


def _fraction(part: int, whole: int) -> str:
    return f"{part / whole if whole else 0.0:.6f}"


def _check_sample(sample: str) -> None:
    if not 0 < len(sample.encode("utf-8")) <= SAMPLE_BYTES or any(c in sample for c in "\t\n\r"):
        raise RequestError(
            f"sample: must be 1-{SAMPLE_BYTES} bytes without tabs or newlines, got {sample!r}"
        )


# --- synthetic data ---------------------------------------------------------------------


def _check_data_request(samples: int, seed: int, scale: float) -> None:
    if seed < 0:
        raise RequestError(f"seed: must be >= 0, got {seed}")
    if not 1 <= samples <= MAX_SAMPLES:
        raise RequestError(f"samples: must be 1 to {MAX_SAMPLES}, got {samples}")
    if not (math.isfinite(scale) and MIN_SCALE <= scale <= MAX_SCALE):
        raise RequestError(f"scale: must be {MIN_SCALE} to {MAX_SCALE}, got {scale}")


def _synthetic_taxonomy(rng: np.random.Generator, rows: int) -> list[Taxon]:
    """Taxa 1 .. rows in a tree of six ranks above the species, four children per node:
    taxon ``i``'s genus is node ``i // 4`` of the genus rank, its family ``i // 16``..."""
    ranks = ("d", "p", "c", "o", "f", "g")
    syllables = rng.integers(0, len(_SYLLABLES), (rows + 1, len(ranks) + 1, 3)).tolist()
    words = [["".join(_SYLLABLES[j] for j in word) for word in node] for node in syllables]
    taxa = []
    for i in range(1, rows + 1):
        above = [(rank, i // 4 ** (len(ranks) - r)) for r, rank in enumerate(ranks)]
        lineage = ";".join(
            f"{rank}__{words[node][r].capitalize()}" for r, (rank, node) in enumerate(above)
        )
        name = f"{words[i // 4][len(ranks) - 1].capitalize()} {words[i][len(ranks)]}"
        taxa.append(Taxon(i, name, f"root;{lineage};s__{name}"))
    return taxa


def _synthetic_reads(
    rng: np.random.Generator, segments: Sequence[Codes], sample: str, n_reads: int
) -> bytes:
    weights = rng.dirichlet(np.ones(len(segments)))
    is_random = rng.random(n_reads) < rng.uniform(*RANDOM_READS)
    taxon = rng.choice(len(segments), n_reads, p=weights)
    codes = rng.integers(0, 4, (n_reads, READ_BASES), dtype=np.uint8)
    for t, segment in enumerate(segments):
        rows = np.flatnonzero((taxon == t) & ~is_random)
        starts = rng.integers(0, len(segment) - READ_BASES + 1, len(rows))
        codes[rows] = segment[starts[:, None] + np.arange(READ_BASES)]
    reverse = rng.random(n_reads) < 0.5
    codes[reverse] = 3 - codes[reverse, ::-1]
    errors = (rng.random(codes.shape) < ERROR_RATE) & ~is_random[:, None]
    codes[errors] = (codes[errors] + rng.integers(1, 4, int(errors.sum()), dtype=np.uint8)) % 4
    bases = _LETTERS[codes]
    qualities = rng.integers(ord("5"), ord("J") + 1, codes.shape, dtype=np.uint8)
    return b"".join(
        b"@%s.%07d\n%s\n+\n%s\n"
        % (sample.encode(), i + 1, bases[i].tobytes(), qualities[i].tobytes())
        for i in range(n_reads)
    )


def _write_file(out_dir: Path, relative: str, data: bytes) -> dict[str, Any]:
    """Write one file of the data set; its manifest entry."""
    _publish(out_dir / relative, data)
    return {"path": relative, "size_bytes": len(data), "sha256": hashlib.sha256(data).hexdigest()}


# --- command line ----------------------------------------------------------------------


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m gridcore.apps.kmer",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    commands = parser.add_subparsers(required=True, metavar="SUBCOMMAND")
    make = commands.add_parser("make-data", help="write the synthetic data set")
    make.add_argument("--out", type=Path, required=True, help="directory to write it under")
    make.add_argument("--samples", type=int, required=True, help="how many read files")
    make.add_argument("--seed", type=int, default=0, help="the random seed (default 0)")
    make.add_argument("--scale", type=float, default=1.0, help="size factor (default 1)")
    make.set_defaults(run=lambda a: make_data(a.out, a.samples, a.seed, a.scale))
    find = commands.add_parser("lookup", help="keep the reads that hit the index")
    find.add_argument("--index", type=Path, required=True, help="ref/index-k31.bin")
    find.add_argument("--reads", type=Path, required=True, help="FASTQ")
    find.add_argument("--out", type=Path, required=True, help="FASTQ of the kept reads")
    find.set_defaults(run=lambda a: lookup(a.index, a.reads, a.out))
    tally = commands.add_parser("count", help="count the reads' k-mers per taxon")
    tally.add_argument("--table", type=Path, required=True, help="ref/kmer-table.bin")
    tally.add_argument("--reads", type=Path, required=True, help="FASTQ")
    tally.add_argument("--out", type=Path, required=True, help="the counts (binary)")
    tally.set_defaults(run=lambda a: count(a.table, a.reads, a.out))
    report = commands.add_parser("merge", help="write the sample's report")
    report.add_argument("--taxonomy", type=Path, required=True, help="ref/taxonomy.tsv")
    report.add_argument("--counts", type=Path, required=True, help="count's output")
    report.add_argument("--out", type=Path, required=True, help="the report (TSV)")
    report.add_argument("--sample", required=True, help="the sample's name")
    report.set_defaults(run=lambda a: merge(a.taxonomy, a.counts, a.out, a.sample))
    return parser


if __name__ == "__main__":
    sys.exit(main())
