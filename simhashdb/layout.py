"""Permutation tables: the math shared by every storage backend and by
in-memory matching.

The 64 bits are split into m blocks (widths differ by at most one, wider
first); table t puts its choice of m - k leading blocks first. Two
fingerprints within k bits agree on every leading block of at least one
table, so a query needs to look only at the entries that share the probe's
leading blocks in each table.
"""

import collections
import itertools
import math
import os
from array import array

from . import _ext
from .errors import InvalidArgumentError

MAX_TABLES = 1024
DEFAULT_EXPECTED_SIZE = 10_000_000
MAX_PROBES_PER_TABLE = 1 << 16
TABLE_COST = 2  # a probe's seek in a table in memory, counted in candidates compared
DISK_READ_COST = 100  # one that reads the disk, more
DOCUMENT_BYTES = 95  # a document's record, key-map and index entries, with an int key
DOCUMENT_READS = 3  # what a write or a hit reads of them: the key map, the index, the record


class Layout:
    """Blocks and permutation tables for ``blocks`` blocks and ``distance`` bits.

    Block widths differ by at most one bit, wider blocks first. Table t puts
    the t-th combination (in lexicographic order) of ``blocks - distance``
    blocks first, the other blocks after them in their original order.
    """

    def __init__(self, blocks, distance):
        if not isinstance(distance, int) or isinstance(distance, bool) or not 0 <= distance < 64:
            raise InvalidArgumentError("distance must be an int in [0, 64), got %s"
                                       % _ext.shown(distance))
        if not isinstance(blocks, int) or isinstance(blocks, bool) or not distance < blocks <= 64:
            raise InvalidArgumentError(
                "blocks must be an int with distance < blocks <= 64 (distance is %d), got %s"
                % (distance, _ext.shown(blocks)))
        count = math.comb(blocks, distance)
        if count > MAX_TABLES:
            raise InvalidArgumentError(
                "blocks=%d, distance=%d needs %d tables, more than %d; use fewer blocks"
                % (blocks, distance, count, MAX_TABLES))
        self.blocks, self.distance = blocks, distance
        self.widths = [64 // blocks + (i < 64 % blocks) for i in range(blocks)]
        shifts = [64 - sum(self.widths[:i + 1]) for i in range(blocks)]
        self.leading = list(itertools.combinations(range(blocks), blocks - distance))
        spec, prefixes = [], []
        for lead in self.leading:
            order = list(lead) + [b for b in range(blocks) if b not in lead]
            position = 64
            for b in order:
                position -= self.widths[b]
                spec += [shifts[b], self.widths[b], position]
            prefix_bits = sum(self.widths[b] for b in lead)
            prefixes.append(((1 << prefix_bits) - 1) << (64 - prefix_bits))
        self.spec = array("l", spec)
        self.prefixes = array("Q", prefixes)
        self.block_masks = array("Q", [((1 << w) - 1) << s for w, s in zip(self.widths, shifts)])
        self.leading_masks = array("Q", [sum(1 << b for b in lead) for lead in self.leading])
        self.prefix_bits = [sum(self.widths[b] for b in lead) for lead in self.leading]

    @property
    def tables(self):
        """Number of permutation tables."""
        return len(self.leading)

    def prefix_flips(self, distance):
        """How many bits of its leading blocks a fingerprint within ``distance``
        bits may differ in, in the table where it differs least: 0 up to the
        layout's distance; above it, a query probes every prefix within that
        many bits of its own (spread evenly over the blocks is the worst case)."""
        whole, rest = divmod(distance, self.blocks)
        return distance - self.distance * whole - min(rest, self.distance)

    def probes_per_table(self, distance):
        """The most prefixes one table is probed at for a query at ``distance``."""
        flips = self.prefix_flips(distance)
        return max(sum(math.comb(bits, i) for i in range(flips + 1)) for bits in self.prefix_bits)

    def check_query_distance(self, distance):
        """Raise unless a query at ``distance`` bits is exact and affordable here."""
        if not isinstance(distance, int) or isinstance(distance, bool) or not 0 <= distance <= 64:
            raise InvalidArgumentError("query distance must be an int in [0, 64], got %s"
                                       % _ext.shown(distance))
        if self.probes_per_table(distance) > MAX_PROBES_PER_TABLE:
            raise InvalidArgumentError(
                "a query at distance %d would probe %d prefixes per table in a database whose "
                "tables are built for distance %d; ask for less, or lay its tables out for a "
                "larger distance (relayout)"
                % (distance, self.probes_per_table(distance), self.distance))
        return distance

    def probe_ranges(self, fp, distance):
        """Per table, the permuted ``fp`` and the (first, last) permuted values of
        every range a query at ``distance`` scans: one range up to the layout's
        distance, one per prefix within :meth:`prefix_flips` bits above it."""
        perms, bounds = self.scan_bounds(fp)
        flips = self.prefix_flips(distance)
        ranges = []
        for table, perm in enumerate(perms):
            mask, bits = self.prefixes[table], self.prefix_bits[table]
            lo = perm & mask
            table_ranges = []
            for count in range(flips + 1):
                for positions in itertools.combinations(range(64 - bits, 64), count):
                    start = lo ^ sum(1 << p for p in positions)
                    table_ranges.append((start, start | (~mask & 0xFFFFFFFFFFFFFFFF)))
            ranges.append(table_ranges)
        return perms, ranges

    def near(self, fp, distance, scan):
        """{fingerprint: distance} of every stored fingerprint within ``distance``
        bits of ``fp``, where ``scan(table, first, last, perm)`` gives the
        (permuted fingerprint, distance) of those stored in ``table`` between
        ``first`` and ``last`` (permuted values) within ``distance`` of the
        permuted ``fp``, ``perm``: a search through the ranges of
        :meth:`probe_ranges`, each fingerprint once."""
        perms, ranges = self.probe_ranges(fp, distance)
        found = {}
        for table, (perm, table_ranges) in enumerate(zip(perms, ranges)):
            for first, last in table_ranges:
                for entry, bits in scan(table, first, last, perm):
                    found[self.unpermute(entry, table)] = bits
        return found

    def range_starts(self, probes, distance):
        """The first permuted value of every range a query of ``probes`` at
        ``distance`` scans (as :meth:`probe_ranges`), with the probe and the
        table of each: three uint64 arrays, probe by probe, table by table."""
        if distance <= self.distance:  # one range a table
            return _ext.probe_starts(probes, self.spec, self.prefixes)
        firsts, probe_of, table_of = array("Q"), array("Q"), array("Q")
        for i, fp in enumerate(probes):
            for table, ranges in enumerate(self.probe_ranges(fp, distance)[1]):
                for first, _ in ranges:
                    firsts.append(first)
                    probe_of.append(i)
                    table_of.append(table)
        return firsts, probe_of, table_of

    def scan_bounds(self, fp):
        """Per table, the permuted fp; and per table, (first, last) key of its candidate range."""
        return _ext.scan_bounds(fp, self.spec, self.prefixes)

    def table_values(self, fps, table):
        """``fps`` permuted for ``table``, sorted (an array of uint64)."""
        return _ext.table_values(fps, self.spec, table, self.tables)

    def table_items(self, fps, table):
        """Sorted (key, value) items of ``fps`` in ``table``."""
        return _ext.table_items(fps, self.spec, table, self.tables)

    def unpermute(self, perm, table):
        """The fingerprint stored as ``perm`` in ``table``."""
        return _ext.unpermute(perm, self.spec, table, self.tables)

    def table_arrays(self, table):
        """The (spec, prefixes, leading masks) of permutation table ``table``
        alone, as :class:`Layout` holds them for all its tables."""
        per_table = 3 * self.blocks
        return (self.spec[per_table * table:per_table * (table + 1)],
                self.prefixes[table:table + 1], self.leading_masks[table:table + 1])

    @staticmethod
    def choose_blocks(distance, expected_size=DEFAULT_EXPECTED_SIZE, table_cost=2):
        """The block count m minimising C(m, k) * (table_cost + N / 2**prefix):
        the fixed cost of a table (a seek in each, by default, counted in
        candidate comparisons), plus the candidates a random corpus of N puts
        in its range."""
        def cost(m):
            prefix = (m - distance) * (64 // m)
            return math.comb(m, distance) * (table_cost + expected_size / 2.0 ** prefix)
        usable = [m for m in range(distance + 1, 65) if math.comb(m, distance) <= MAX_TABLES]
        return min(usable, key=cost)

    @staticmethod
    def choose(distance, expected_size=DEFAULT_EXPECTED_SIZE, memory=None, table_distance=None):
        """The layout of a database of ``expected_size`` fingerprints queried
        at ``distance``: the (blocks, table distance) of least expected cost a
        query, where a table's probe costs a seek plus the candidates its
        prefix leaves, and a seek reads the disk as often as the tables
        outgrow half of ``memory`` (bytes; default: this machine's), and the
        documents have what the tables leave of it: a write or a hit reads
        them DOCUMENT_READS times, from the disk as often as they outgrow
        that. Small databases get a table per choice of ``distance`` blocks
        (Manku's); bigger ones fewer tables built for a smaller distance, each
        probed at every prefix within the bits left (multi-index hashing),
        while those stay in memory; where none would, the layout of fewest
        disk reads. Always exact. ``table_distance`` fixes that distance and
        chooses the blocks alone."""
        n = max(2, expected_size)
        budget = (memory or physical_memory()) / 2
        entry = (66 - math.log2(n)) / 8 + 0.5  # bytes a table entry: Elias-Fano, LMDB's share

        def cost(m, d):
            tables, widths = math.comb(m, d), sorted(64 // m + (i < 64 % m) for i in range(m))
            flips = distance - d * (distance // m) - min(distance % m, d)
            probes = sum(math.comb(sum(widths[d:]), i) for i in range(flips + 1))
            if probes > MAX_PROBES_PER_TABLE:
                return None
            table_bytes = tables * n * entry
            missed = max(0.0, 1 - budget / table_bytes)  # the tables' share on disk
            documents_missed = max(0.0, 1 - max(0.0, budget - table_bytes) / (n * DOCUMENT_BYTES))
            seek = TABLE_COST + missed * DISK_READ_COST
            return (tables * probes * (seek + n / 2.0 ** sum(widths[:m - d]))
                    + DOCUMENT_READS * documents_missed * DISK_READ_COST), tables, m, d

        costs = [cost(m, d) for d in (range(distance + 1) if table_distance is None
                                      else [table_distance])
                 for m in range(d + 1, 65) if math.comb(m, d) <= MAX_TABLES]
        usable = [c for c in costs if c is not None]
        if not usable:
            raise InvalidArgumentError(
                "no block count keeps a query at distance %d within %d prefixes a table with "
                "tables built for distance %d; ask for a larger table distance"
                % (distance, MAX_PROBES_PER_TABLE, table_distance))
        _, _, m, d = min(usable)
        return Layout(m, d)


def physical_memory():
    """The memory this process may use, in bytes: the machine's, or its
    control group's limit where that is less (8 GiB where neither can be read)."""
    try:
        memory = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        memory = 8 << 30
    try:
        with open("/sys/fs/cgroup/memory.max") as limit:
            return min(memory, int(limit.read()))
    except (OSError, ValueError):  # none, or "max"
        return memory


class NearIndex:
    """Fingerprints in memory by the leading blocks of each of a layout's
    tables: the near-duplicates among a batch's own documents, found as the
    tables find them (exact at any distance)."""

    def __init__(self, layout):
        self._layout = layout
        self._tables = [collections.defaultdict(set) for _ in range(layout.tables)]

    def add(self, fp):
        perms, _ = self._layout.scan_bounds(fp)
        for table, perm, prefix in zip(self._tables, perms, self._layout.prefixes):
            table[perm & prefix].add(perm)

    def search(self, fp, distance):
        """(fingerprint, distance) of each one within ``distance`` of ``fp``."""
        if not any(self._tables):
            return []

        def scan(table, first, last, perm):  # a range is all of one prefix's bucket
            bucket = self._tables[table].get(first, ())
            return [(other, (other ^ perm).bit_count()) for other in bucket
                    if (other ^ perm).bit_count() <= distance]

        return list(self._layout.near(fp, distance, scan).items())
