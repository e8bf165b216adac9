"""The Redis backend's Storage: opening a database on a cluster, reading its
committed data, and writing through :mod:`.protocol`."""

import bisect
import collections
import contextlib
import os
import threading
import time
from array import array

from ... import _redis
from ...errors import (DatabaseError, DatabaseNotFoundError, NodeTimeoutError, SimhashDBError,
                       Unavailable)
from .. import BANDS, Storage, check_process
from .batch import RedisTxn
from .cluster import Nodes, parse_url
from .keys import Keys
from .protocol import SCRIPT_BYTES, Protocol
from .scripts import PREFIX, SCAN
from .view import RedisView

ROUND_FIELDS = 8192  # about the most hash fields one round of an iteration reads
ROUND_SHARDS = 4096  # the most hashes one round of an iteration reads
PREFIX_HASHES = 256  # the most hashes one PREFIX call reads whole


class RedisStorage(Storage):
    """Database ``name`` on the Redis (Cluster) of a URL (see the package).

    Its views, batches and protocol read through the methods below: ``meta``
    and ``run`` send commands, ``retrying`` rides out a failover, and
    ``search_committed``, ``band_search_committed``, ``keys_of``,
    ``prefix_groups``, ``hash_fields``, ``documents``, ``fingerprint_groups``,
    ``table_fingerprints`` and ``band_entries`` read committed data
    (seeing whole batches only inside :meth:`Protocol.consistent`).
    """

    backend = "redis"
    snapshots = False

    def __init__(self, path, readonly=False, create=True):
        address = parse_url(path)
        try:
            import redis  # noqa: F401
        except ImportError:
            raise DatabaseError("the redis backend needs redis-py: pip install '.[redis]' "
                                "in simhashdb's source directory") from None
        self.path = address.path
        self.readonly = readonly
        self.retry_seconds = address.options["retry"]
        self.lease_seconds = address.options["lease"]
        self.keys = Keys(address.name.encode())
        self.layout = None
        self.protocol = Protocol(self)
        self._instance = None  # the layout record opened: while it stays, the database does
        self._vanished = None
        self._bucket_keys = (None, {})  # (epoch, {table: keys}) of the last scan
        self._pid = os.getpid()
        self._write_lock = threading.Lock()
        self.nodes = None
        self.nodes = self.retrying(lambda: Nodes(address.seeds, address.connection),
                                   "connect to")
        self.replicas = address.options["replicas"]
        if self.replicas is None:
            self.replicas = min(1, self.nodes.replicas)
        if not create or readonly:
            with self.read() as view:
                if view.params() is None:
                    self.close()
                    raise DatabaseNotFoundError("no database at %s" % self.path)

    # Plumbing

    def check_usable(self):
        check_process(self._pid)
        if self.nodes is None:
            raise DatabaseError("the database at %s is closed" % self.path)
        if self._vanished:
            raise DatabaseError(self._vanished)

    def check_instance(self, raw):
        """Raise DatabaseError, for good, unless ``raw`` is the layout record this
        handle opened: the database's keys are gone (a server restarted without
        persistence, a FLUSHALL) or were made anew, which this handle must
        neither read as empty nor write into."""
        if self._instance is not None and raw != self._instance:
            self._vanished = (
                "the Redis database %s is gone or was created anew since this handle opened "
                "it (a server restarted without persistence? FLUSHALL?): this handle reads "
                "and writes it no more; restore it, or open it again (it had distance=%d, "
                "blocks=%d)" % (self.path, self.layout.distance, self.layout.blocks))
            raise DatabaseError(self._vanished)

    def contradiction(self, what):
        """The DatabaseError of data that contradicts itself (``what``): raised
        at once as :meth:`check_instance` raises it if the database vanished
        under this handle (a FLUSHALL reaches one node after another), else
        returned, naming the damage."""
        if self._instance is not None:
            try:
                self.check_instance(self.meta("GET", self.keys.layout))
            except Unavailable:
                pass
        return DatabaseError("the Redis database %s holds damaged data or answered "
                             "unexpectedly (%s); run check()" % (self.path, what))

    def counter(self, raw, key):
        """The count or epoch ``raw`` (None: 0) stored at ``key``: an int >= 0,
        else the :meth:`contradiction`."""
        try:
            value = int(raw or 0)
        except ValueError:
            value = -1
        if value < 0:
            raise self.contradiction("%s holds %r, not a count" % (key.decode(), raw))
        return value

    def stored_params(self, epoch):
        """The stored parameters at ``epoch`` (None for a new database, which
        no batch has written yet)."""
        raw = self.meta("GET", self.keys.params)
        if raw is None and epoch:
            raise self.contradiction("its parameters, %s, are missing"
                                     % self.keys.params.decode(errors="replace"))
        return raw

    def retrying(self, step, doing="read from"):
        """``step()``, retried while the cluster is unavailable (a failover),
        for at most ``retry_seconds``; then DatabaseError."""
        deadline = time.monotonic() + self.retry_seconds
        delay = 0.02
        while True:
            try:
                return step()
            except (ValueError, TypeError, KeyError, IndexError) as exc:
                if isinstance(exc, SimhashDBError):
                    raise
                raise self.contradiction("%s: %s" % (type(exc).__name__, exc)) from None
            except Unavailable as exc:
                if time.monotonic() + delay > deadline:
                    if exc.node:
                        raise NodeTimeoutError(
                            "could not %s the Redis database %s within %g s: %s does not "
                            "answer (a stopped, frozen or overloaded redis-server?) and no "
                            "replica took over from it: resume or restart it, fail it over "
                            "to a replica (CLUSTER FAILOVER FORCE on one), or raise ?retry="
                            % (doing, self.path, self.retry_seconds, exc.node)) from None
                    raise DatabaseError(
                        "could not %s the Redis database %s within %g s (%s): check that the "
                        "cluster is up and its replicas linked, or raise ?retry="
                        % (doing, self.path, self.retry_seconds, exc)) from None
                time.sleep(delay)
                delay = min(2 * delay, 0.2)
                if self.nodes is not None:
                    try:
                        self.nodes.refresh()
                    except Unavailable:
                        pass

    def meta(self, *command):
        """One command on the node of the database's own slot."""
        address = self.nodes.owner(self.keys.params)
        return self.nodes.round({address: [command]})[address][0]

    def run(self, commands):
        """(routing key, command) pairs in one round: their replies, in order."""
        requests, where = collections.defaultdict(list), []
        for key, command in commands:
            address = self.nodes.owner(key)
            where.append((address, len(requests[address])))
            requests[address].append(command)
        replies = self.nodes.round(requests) if requests else {}
        return [replies[address][i] for address, i in where]

    # The layout

    def open_tables(self, layout):
        self.check_usable()
        keys = self.keys
        raw = self.retrying(lambda: self.meta("GET", keys.layout))
        record, bits = keys.new_record(layout)
        if raw is None and not self.readonly:
            self.retrying(lambda: self.meta("SET", keys.layout, record, "NX"), "write to")
            raw = self.retrying(lambda: self.meta("GET", keys.layout))
        if raw is not None:
            self._instance = raw
            stored, bits = keys.read_record(raw, self.path)
            if (stored.blocks, stored.distance) != (layout.blocks, layout.distance):
                raise DatabaseError(
                    "the database %s was created with blocks=%d, distance=%d (another client "
                    "created it at the same time with other parameters?); open it without them"
                    % (self.path, stored.blocks, stored.distance))
        self.layout = layout
        keys.use(bits, layout.tables)

    def use_stored_layout(self):
        """Use the stored layout (to finish a pending batch before open_tables)."""
        self.layout, bits = self.keys.read_record(self.meta("GET", self.keys.layout), self.path)
        self.keys.use(bits, self.layout.tables)

    # Reads of committed data

    def read(self):
        self.check_usable()
        return contextlib.nullcontext(RedisView(self))

    def read_whole(self, read):
        """``read(view)`` seeing whole batches (retried while one lands)."""
        self.check_usable()
        return self.protocol.consistent(lambda epoch: read(RedisView(self)))

    def search(self, probes, distance):
        """:meth:`View.search` seeing whole batches (retried while one lands)."""
        return self.protocol.consistent(lambda epoch: self.search_committed(probes, distance))

    def search_committed(self, probes, distance):
        """For each probe, its (key, fingerprint, distance) hits: one round for
        the tables (a SCAN script per node), one for the keys of the matches."""
        layout, nodes, keys = self.layout, self.nodes, self.keys
        firsts, probe_of, table_of = layout.range_starts(probes, distance)
        step = SCRIPT_BYTES // (keys.key_length + 2 * keys.width)
        requests = dict(zip(nodes.addresses, _redis.scan_records(
            firsts, table_of, layout.prefixes, keys.tables, keys.bits, keys.width,
            nodes.slot_nodes, len(nodes.addresses), step)))
        replies = nodes.round({
            address: [("EVAL", SCAN, 0, keys.width, keys.key_length, blob) for blob in blobs]
            for address, (blobs, _) in requests.items() if blobs})
        found = [{} for _ in range(len(probes))]
        for address, calls in replies.items():
            _redis.scan_hits(calls, requests[address][1], step, firsts, probe_of, table_of,
                             probes, layout.spec, layout.tables, keys.bits, keys.width, distance,
                             found)
        keys_of = self.keys_of(set().union(*found))
        return [[(key, fp, bits) for fp, bits in hits.items() for key in keys_of[fp]]
                for hits in found]

    def band_search_committed(self, keys):
        """For each query (BANDS band keys of ``keys``, a uint32 buffer), the
        (key, fingerprint) of every document whose fingerprint's top 32 bits
        an entry of one of its keys names, by prefix: one round for the bands'
        buckets (a SCAN script per node), one for the fingerprint index (a
        PREFIX script per node)."""
        nodes, k, queries = self.nodes, self.keys, len(keys) // BANDS
        if not queries:
            return []
        firsts, bands = _redis.band_ranges(keys[:queries * BANDS])  # whole queries, as LMDB
        step = SCRIPT_BYTES // (k.key_length + 2 * k.width)
        requests = dict(zip(nodes.addresses, _redis.scan_records(
            firsts, bands, _redis.BAND_PREFIXES, k.bands, k.bits, k.width, nodes.slot_nodes,
            len(nodes.addresses), step)))
        replies = nodes.round({
            address: [("EVAL", SCAN, 0, k.width, k.key_length, blob) for blob in blobs]
            for address, (blobs, _) in requests.items() if blobs})
        found = [set() for _ in range(len(firsts) // BANDS)]
        for address, calls in replies.items():
            _redis.band_hits(calls, requests[address][1], step, firsts, k.bits, k.width, found)
        groups = self.prefix_groups(set().union(*found))
        return [[(key, fp) for prefix in sorted(prefixes) for fp, keys_of in groups.get(prefix, ())
                 for key in keys_of] for prefixes in found]

    def prefix_groups(self, prefixes):
        """{prefix: [(fingerprint, [keys]), ...] in fingerprint order} of the
        fingerprints of the index whose top 32 bits are one of ``prefixes``
        (ints), read in one round (a PREFIX script per node and a few hundred
        hashes: each reads its hashes whole)."""
        if not prefixes:
            return {}
        nodes, bits, by_shard = self.nodes, self.keys.shard_bits, collections.defaultdict(list)
        for prefix in prefixes:  # a fingerprint's shard is its leading bits (fewer than 32)
            by_shard[prefix >> (32 - bits) if bits else 0].append(prefix.to_bytes(4, "big"))
        calls = collections.defaultdict(list)
        for shard, wanted in by_shard.items():
            key = self.keys.hash(b"f", shard)
            calls[nodes.owner(key)].append((key, b"".join(wanted)))
        replies = nodes.round({address: [
            ("EVAL", PREFIX, 0, *(arg for pair in pairs[i:i + PREFIX_HASHES] for arg in pair))
            for i in range(0, len(pairs), PREFIX_HASHES)] for address, pairs in calls.items()})
        groups = collections.defaultdict(list)
        for node_replies in replies.values():
            for reply in node_replies:
                for field, value in zip(reply[::2], reply[1::2]):
                    if len(field) != 8:
                        raise ValueError("a field of the fingerprint index is %d bytes"
                                         % len(field))
                    fp = int.from_bytes(field, "big")
                    groups[fp >> 32].append((fp, _split_keys(value)))
        for found in groups.values():
            found.sort()
        return groups

    def keys_of(self, fps):
        """{fp: its keys} of the fingerprints ``fps``, read in one round."""
        return {fp: _split_keys(value)
                for fp, value in self.hash_fields(b"f", list(fps), True).items()}

    def hash_fields(self, kind, names, by_fingerprint):
        """{name: value or None} of the documents (``kind`` b"d", ``names``
        their keys) or fingerprints (b"f"), read in one round (an HMGET per
        hash)."""
        shards = _redis.hash_reads(names, self.keys.shard_bits, by_fingerprint)
        commands = []
        for shard, (_, fields) in shards.items():
            key = self.keys.hash(kind, shard)
            commands.append((key, ("HMGET", key, *fields)))
        found = {}
        for (names, _), values in zip(shards.values(), self.run(commands)):
            found.update(zip(names, values))
        return found

    def documents(self, after, whole_batches=True):
        """(shard, key, value) of the documents after ``after`` (None: all) in
        the order (shard, key), streamed by :meth:`_shards`."""
        first = 0 if after is None else self.keys.doc_shard(after)
        for shard, docs in self._shards(b"d", first, whole_batches):
            for key, value in docs:
                if after is None or shard > first or key > after:
                    yield shard, key, value

    def fingerprint_groups(self, whole_batches=True):
        """(fingerprint, [keys]) of every fingerprint in order (a fingerprint's
        shard is its leading bits), streamed by :meth:`_shards`."""
        for _, fps in self._shards(b"f", 0, whole_batches):
            for fp, keys in fps:
                yield int.from_bytes(fp, "big"), _split_keys(keys)

    def table_fingerprints(self, table, epoch):
        """The fingerprints of ``table`` in table order, committed at
        ``epoch``: the keys of every table and band are scanned once for all
        while it stays."""
        perms = self._bucket_entries(b"t", table, self.keys.tables[table], epoch)
        return [self.layout.unpermute(perm, table) for perm in sorted(perms)]

    def band_entries(self, band, epoch):
        """The entries of band ``band``, sorted (the keys scanned as
        :meth:`table_fingerprints` scans them)."""
        return sorted(self._bucket_entries(b"b", band, self.keys.bands[band], epoch))

    def _bucket_entries(self, kind, number, prefix, epoch):
        """The entries (64-bit) of every bucket of table or band ``number``
        (``kind`` b"t" or b"b"), whose keys start with ``prefix``."""
        if self._bucket_keys[0] != epoch:
            grouped = collections.defaultdict(list)
            start = len(self.keys.name) + 1
            for key in self._scan(b"[0-9a-f][0-9a-f][0-9a-f]*"):  # "b" is a hex digit too
                grouped[self.keys.bucket_kind(key[start:])].append(key)
            self._bucket_keys = (epoch, grouped)
        buckets = self._bucket_keys[1].get((kind, number), [])
        entries, width, bits = [], self.keys.width, self.keys.bits
        for key, blob in zip(buckets, self.run([(key, ("GET", key)) for key in buckets])):
            head = int(key[len(prefix):] or b"0", 16) << (64 - bits) if bits else 0
            entries += [head | int.from_bytes(blob[e:e + width], "big")
                        for e in range(0, len(blob or b""), width)]
        return entries

    def _scan(self, pattern):
        """Every key of the database matching the glob ``pattern`` (after ``N:``)."""
        name = b"".join(b"\\" + bytes([c]) if c in b"*?[]\\" else bytes([c])
                        for c in self.keys.name)
        found = []
        for address in self.nodes.primaries():
            cursor = b"0"
            while True:
                cursor, keys = self.nodes.round({address: [
                    ("SCAN", cursor, "MATCH", name + b":" + pattern, "COUNT", 1000)]})[address][0]
                found += keys
                if cursor == b"0":
                    break
        return found

    def _shards(self, kind, first, whole_batches):
        """(shard, [(field, value)] sorted) of the hashes of ``kind`` (b"d":
        documents, b"f": the fingerprint index) from shard ``first`` on, in
        shard order, a group of hashes a round. A round sees whole batches
        where ``whole_batches`` (else it runs under the write lock); batches
        may land between rounds. The group starts at one hash and doubles
        while a round reads under ROUND_FIELDS fields, so memory stays bounded
        and a reader that stops early (an expire batch) read about twice what
        it used."""
        shards = self._shard_numbers(kind, first)
        at, group = 0, 1
        while at < len(shards):
            numbers = shards[at:at + group]
            keys = [self.keys.hash(kind, s) for s in numbers]

            def read():
                return self.run([(key, ("HGETALL", key)) for key in keys])
            replies = (self.protocol.consistent(lambda epoch: read()) if whole_batches
                       else self.retrying(read))
            fields = 0
            for shard, reply in zip(numbers, replies):
                fields += len(reply) // 2
                yield shard, sorted(zip(reply[::2], reply[1::2]))
            at += len(keys)
            group = max(1, min(2 * group, ROUND_SHARDS,
                               ROUND_FIELDS * len(keys) // max(1, fields)))

    def _shard_numbers(self, kind, first):
        """The shards of ``kind`` from ``first`` on worth reading: all of them
        where the database fills an eighth of them or more, else (a walk
        would read mostly empty hashes) those whose hash exists, found by a
        SCAN of the database's keys."""
        shards = 1 << self.keys.shard_bits
        key = self.keys.count if kind == b"d" else self.keys.distinct
        if 8 * self.counter(self.retrying(lambda: self.meta("GET", key)), key) >= shards:
            return range(first, shards)
        start = len(self.keys.name) + 3
        found = array("I", sorted({int(key[start:], 16) for key in
                                   self.retrying(lambda: self._scan(kind + b":*"))}))
        return found[bisect.bisect_left(found, first):]

    # Writes and the rest of Storage

    def write(self, body, documents=0):
        """Run ``body(txn)`` under the database's write lock; its changes land
        whole, acknowledged once a replica of every node they touch has them
        (``documents``: unused, a cluster's memory is not reserved)."""
        self.check_usable()
        if self.readonly:
            raise DatabaseError("the database at %s is open read-only" % self.path)
        with self._write_lock:
            return self.protocol.write(body, lambda *state: RedisTxn(self, *state))

    def compact(self):
        """Nothing to do: a bucket's string shrinks as entries go, and Redis
        frees an emptied key."""
        self.check_usable()

    def info(self):
        """Backend facts; ``memory_bytes`` is what the database's keys take in
        RAM on the primaries (their MEMORY USAGE; Redis keeps nothing of it on
        disk but for its own snapshots, if configured)."""
        self.check_usable()
        keys = self.keys

        def memory():
            names = self._scan(b"*") + [keys.params, keys.layout, keys.count, keys.distinct,
                                        keys.epoch]
            usage = self.run([(key, ("MEMORY", "USAGE", key, "SAMPLES", "0")) for key in names])
            return sum(m or 0 for m in usage), sum(m is not None for m in usage)
        memory_bytes, count = self.retrying(memory)
        return {"backend": self.backend, "memory_bytes": memory_bytes, "keys": count,
                "primaries": len(self.nodes.primaries()), "bucket_bits": keys.bits,
                "replicas": self.replicas}

    def close(self):
        if self.nodes is not None:
            self.nodes.close()
            self.nodes = None


def _split_keys(blob):
    """The keys of a fingerprint index entry (each after its 2-byte length)."""
    if not blob:
        return []
    if int.from_bytes(blob[:2], "big") + 2 == len(blob):
        return [blob[2:]]
    keys, i = [], 0
    while i < len(blob):
        size = int.from_bytes(blob[i:i + 2], "big")
        keys.append(blob[i + 2:i + 2 + size])
        i += 2 + size
    return keys
