"""The Redis backend: one database on a Redis Cluster (or a single Redis),
shared by many clients on many machines.

``redis://[user:password@]host:port/name[?options]`` (``rediss://`` for TLS)
names database ``name`` on the cluster (detected) or server at host:port;
several databases share a cluster. Options: ``replicas`` (how many replicas
of each node a batch must reach before it is acknowledged, default 1 where
the primaries have replicas, else 0; a primary that a failover left without
any replica writes alone until one is back), ``retry`` (seconds to retry
through a failover before DatabaseError, default 20), ``lease`` (seconds a
dead writer's lock lives, default 10), ``timeout`` (socket timeout, default
10), ``ca`` (a PEM file of the CA certificates that signed a rediss://
server's, default the system's). With ``SIMHASHDB_BACKEND=redis``, a plain name is a database on the server of
``$SIMHASHDB_REDIS_URL``.

Keys of database N (a table's bucket holds the fingerprints whose permuted
value starts with the bucket's B bits, B a multiple of 8 chosen from the
layout, as one string of the remaining bytes, sorted):

- ``{N}:params``, ``{N}:layout``, ``{N}:count``, ``{N}:distinct``, ``{N}:lock``,
  ``{N}:pending``, ``{N}:epoch``, ``{N}:hold``, ``{N}:queued``: one slot;
- ``N:<table><bucket>``: a table's bucket (3 + B/4 hex digits);
- ``N:d:<shard>``: a hash of documents (encoded key -> encoded value), sharded
  by a CRC of the key;
- ``N:f:<shard>``: a hash of fingerprints (8 bytes -> their keys, each after
  its 2-byte length), sharded by the fingerprint's first B bits;
- ``N:fence{<tag>}``: the epoch of the last batch that wrote in the slot of
  ``<tag>``, one per slot written.

Writers take turns under one lock with a lease (``{N}:lock``; a waiting
writer queues for the next turn, ``{N}:queued``). A batch is
planned under it, stored as ``{N}:pending`` (which makes ``{N}:epoch`` odd)
and acknowledged by a replica, applied with idempotent commands (buckets are
merged by a server-side script, one call per node), acknowledged by a
replica on every node, and cleared (the epoch is even again, the counts
set). Every write raises the fence of its slot to the batch's epoch in the
same script, and is refused if a later batch raised it further: a writer
that stalled past its lease cannot land a round it had already sent over a
later batch (the lock alone cannot stop it). A writer that
finds a pending batch (its writer died) applies it first, so a batch never
lands half; a reader retries while the epoch is odd or changed under it, so
it sees whole batches (after three tries it holds new batches back until it
is done, ``{N}:hold``, so that a steady writer cannot starve it). A query costs one round trip per node for the tables
(the script scans the buckets' ranges on the server), one more for the keys
of what matched, and two reads of the epoch.
"""

import binascii
import bisect
import collections
import contextlib
import gc
import os
import threading
import time
import uuid
from array import array

import msgpack

from ... import _redis
from ...errors import DatabaseError, DatabaseNotFoundError, SimhashDBError
from ...layout import Layout
from .. import Storage, check_process
from .batch import RedisTxn
from .cluster import Nodes, Superseded, Unavailable, parse_url, slot_tags
from .view import RedisView
from .scripts import ACQUIRE, BEGIN, FINISH, HWRITE, MERGE, RELEASE, RENEW, SCAN

ROUND_BYTES = 4 << 20  # about the most one round sends to a node
ROUND_FIELDS = 8192  # about the most hash fields one round of an iteration reads
ROUND_SHARDS = 4096  # the most hashes one round of an iteration reads
SCRIPT_BYTES = 64 << 10  # about the most one script call takes: a node that runs a
# script answers nothing else, and the cluster fails a node silent for its node timeout
READ_ATTEMPTS = 3  # reads retried while batches land before writers are held back


class RedisStorage(Storage):
    """Database ``name`` on the Redis (Cluster) of a URL (see the module)."""

    backend = "redis"
    snapshots = False

    def __init__(self, path, readonly=False, create=True):
        address = parse_url(path)
        try:
            import redis  # noqa: F401
        except ImportError:
            raise DatabaseError("the redis backend needs redis-py: pip install "
                                "'simhashdb[redis]'") from None
        self.path = address.path
        self.readonly = readonly
        options = address.options
        self.retry_seconds, self.lease_seconds = options["retry"], options["lease"]
        self._name = address.name.encode()
        meta = b"{" + self._name + b"}:"
        (self._params, self._layout_key, self._count, self._distinct, self._lock,
         self._pending, self._epoch, self._hold, self._queued) = (meta + k for k in (
             b"params", b"layout", b"count", b"distinct", b"lock", b"pending", b"epoch",
             b"hold", b"queued"))
        self._layout = None
        self._instance = None  # the layout record opened: while it stays, the database does
        self._vanished = None
        self._bucket_keys = (None, {})  # (epoch, {table: keys}) of the last scan
        self._pid = os.getpid()
        self._write_lock = threading.Lock()
        self._nodes = None
        self._nodes = self._retrying(lambda: Nodes(address.host, address.port,
                                                   address.connection), "connect to")
        self._replicas = options["replicas"]
        if self._replicas is None:
            self._replicas = min(1, self._nodes.replicas)
        if not create or readonly:
            with self.read() as view:
                if view.params() is None:
                    self.close()
                    raise DatabaseNotFoundError("no database at %s" % self.path)

    # Plumbing

    def _check_usable(self):
        check_process(self._pid)
        if self._nodes is None:
            raise DatabaseError("the database at %s is closed" % self.path)
        if self._vanished:
            raise DatabaseError(self._vanished)

    def _check_instance(self, raw):
        """Raise DatabaseError, for good, unless ``raw`` is the layout record this
        handle opened: the database's keys are gone (a server restarted without
        persistence, a FLUSHALL) or were made anew, which this handle must
        neither read as empty nor write into."""
        if self._instance is not None and raw != self._instance:
            self._vanished = (
                "the Redis database %s is gone or was created anew since this handle opened "
                "it (a server restarted without persistence? FLUSHALL?): this handle reads "
                "and writes it no more; restore it, or open it again (it had distance=%d, "
                "blocks=%d)" % (self.path, self._layout.distance, self._layout.blocks))
            raise DatabaseError(self._vanished)

    def _retrying(self, step, doing="read from"):
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
                raise DatabaseError("the Redis database %s holds damaged data or answered "
                                    "unexpectedly (%s: %s); run check()"
                                    % (self.path, type(exc).__name__, exc)) from None
            except Unavailable as exc:
                if time.monotonic() + delay > deadline:
                    raise DatabaseError(
                        "could not %s the Redis database %s within %g s (%s): check that the "
                        "cluster is up and its replicas linked, or raise ?retry="
                        % (doing, self.path, self.retry_seconds, exc)) from None
                time.sleep(delay)
                delay = min(2 * delay, 0.2)
                if self._nodes is not None:
                    try:
                        self._nodes.refresh()
                    except Unavailable:
                        pass

    def _meta(self, *command):
        """One command on the node of the database's own slot."""
        address = self._nodes.owner(self._params)
        return self._nodes.round({address: [command]})[address][0]

    def _run(self, commands):
        """(routing key, command) pairs in one round: their replies, in order."""
        requests, where = collections.defaultdict(list), []
        for key, command in commands:
            address = self._nodes.owner(key)
            where.append((address, len(requests[address])))
            requests[address].append(command)
        replies = self._nodes.round(requests) if requests else {}
        return [replies[address][i] for address, i in where]

    def _lease_ms(self):
        return int(self.lease_seconds * 1000)

    def _wait_ms(self):
        """How long a WAIT waits for replicas: well within the lease, which the
        next round renews."""
        return max(1, min(5000, self._lease_ms() // 4))

    # Layout of the keys

    def open_tables(self, layout):
        self._check_usable()
        raw = self._retrying(lambda: self._meta("GET", self._layout_key))
        bits = min(24, 8 * max(0, (min(layout.prefix_bits) - 6) // 8))
        if raw is None and not self.readonly:
            record = msgpack.packb({"bucket_bits": bits, "blocks": layout.blocks,
                                    "distance": layout.distance,
                                    "instance": uuid.uuid4().hex})
            self._retrying(lambda: self._meta("SET", self._layout_key, record, "NX"), "write to")
            raw = self._retrying(lambda: self._meta("GET", self._layout_key))
        if raw is None:
            self._use_layout(layout, bits)
            return
        self._instance = raw
        stored, bits = self._layout_record(raw)
        if (stored.blocks, stored.distance) != (layout.blocks, layout.distance):
            raise DatabaseError(
                "the database %s was created with blocks=%d, distance=%d (another client "
                "created it at the same time with other parameters?); open it without them"
                % (self.path, stored.blocks, stored.distance))
        self._use_layout(layout, bits)

    def _layout_record(self, raw):
        """The (Layout, bucket bits) of a stored layout record, checked."""
        try:
            record = msgpack.unpackb(raw)
            layout, bits = Layout(record["blocks"], record["distance"]), record["bucket_bits"]
        except (ValueError, TypeError, KeyError, msgpack.UnpackException):
            layout = bits = None
        if layout is None or bits not in (0, 8, 16, 24) or bits > min(layout.prefix_bits):
            raise DatabaseError("the layout record of %s is damaged" % self.path)
        return layout, bits

    def _use_layout(self, layout, bits):
        self._layout, self._bits, self._width = layout, bits, 8 - bits // 8
        # an eighth as many hashes of documents as buckets a table: most stay under
        # Redis's 128 fields, kept compact (a listpack), when the buckets hold ~16
        self._shard_bits = max(0, bits - 3)
        self._table_keys = [self._name + b":%03x" % t for t in range(layout.tables)]
        self._key_length = len(self._table_keys[0]) + bits // 4

    def _stored_layout(self):
        """Use the stored layout (to finish a pending batch before open_tables)."""
        self._use_layout(*self._layout_record(self._meta("GET", self._layout_key)))

    def _bucket_key(self, table, perm):
        if not self._bits:
            return self._table_keys[table]
        return self._table_keys[table] + b"%0*x" % (self._bits // 4, perm >> (64 - self._bits))

    def _doc_shard(self, key):
        return self._doc_hash(self._doc_shard_number(key))

    def _doc_shard_number(self, key):
        return binascii.crc32(key) >> (32 - self._shard_bits)

    def _doc_hash(self, shard):
        return self._name + b":d:%x" % shard

    def _fp_hash(self, shard):
        return self._name + b":f:%x" % shard

    def _scan(self, pattern):
        """Every key of the database matching the glob ``pattern`` (after ``N:``)."""
        name = b"".join(b"\\" + bytes([c]) if c in b"*?[]\\" else bytes([c]) for c in self._name)
        found = []
        for address in self._nodes.primaries():
            client, cursor = self._nodes.client(address), 0
            while True:
                try:
                    cursor, keys = client.scan(cursor, match=name + b":" + pattern, count=1000)
                except self._nodes.errors as exc:
                    raise Unavailable(exc) from None
                found += keys
                if not cursor:
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
        hash_of = self._doc_hash if kind == b"d" else self._fp_hash
        shards = self._shard_numbers(kind, first)
        at, group = 0, 1
        while at < len(shards):
            numbers = shards[at:at + group]
            keys = [hash_of(s) for s in numbers]

            def read():
                return self._run([(key, ("HGETALL", key)) for key in keys])
            replies = (self._consistent(lambda epoch: read()) if whole_batches
                       else self._retrying(read))
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
        shards = 1 << self._shard_bits
        population = self._retrying(
            lambda: self._meta("GET", self._count if kind == b"d" else self._distinct))
        if 8 * int(population or 0) >= shards:
            return range(first, shards)
        start = len(self._name) + 3
        found = array("I", sorted({int(key[start:], 16) for key in
                                   self._retrying(lambda: self._scan(kind + b":*"))}))
        return found[bisect.bisect_left(found, first):]

    # Reads

    def read(self):
        self._check_usable()
        return contextlib.nullcontext(RedisView(self))

    def search(self, probes, distance):
        """:meth:`View.search` seeing whole batches (retried while one lands)."""
        return self._consistent(lambda epoch: self._search(probes, distance))

    def _consistent(self, read):
        """``read(epoch)`` seeing whole batches: retried while a batch lands
        under it; if batches keep landing (a read slower than the writers'
        pace), it holds new batches back (``{N}:hold``, for a lease at most)."""
        self._check_usable()

        token, attempts = uuid.uuid4().hex.encode(), 0

        def step():
            nonlocal attempts
            while True:
                attempts += 1
                if attempts > READ_ATTEMPTS:  # new batches wait until this read is done
                    self._meta("SET", self._hold, token, "PX", self._lease_ms())
                before = self._even_epoch()
                result = read(before)
                if int(self._meta("GET", self._epoch) or 0) == before:
                    return result
        try:
            return self._retrying(step)
        finally:
            self._release(token, self._hold)

    def _even_epoch(self):
        """The epoch once it is even (no batch applying), finishing the batch of
        a writer that died (its lock gone) first."""
        deadline = time.monotonic() + 1
        while True:
            epoch, ttl, layout = self._nodes.round({self._nodes.owner(self._params): [
                ("GET", self._epoch), ("PTTL", self._lock),
                ("GET", self._layout_key)]}).popitem()[1]
            self._check_instance(layout)
            if int(epoch or 0) % 2 == 0:
                return int(epoch or 0)
            if ttl == -2:
                self._recover()
            elif time.monotonic() > deadline:
                raise Unavailable("a batch has been landing for a second")
            else:
                time.sleep(0.001)

    def _search(self, probes, distance):
        """For each probe, its (key, fingerprint, distance) hits: one round for
        the tables (a SCAN script per node), one for the keys of the matches."""
        layout, nodes = self._layout, self._nodes
        firsts, probe_of, table_of = layout.range_starts(probes, distance)
        step = SCRIPT_BYTES // (self._key_length + 2 * self._width)
        requests = dict(zip(nodes.addresses, _redis.scan_records(
            firsts, table_of, layout.prefixes, self._table_keys, self._bits, self._width,
            nodes.slot_nodes, len(nodes.addresses), step)))
        replies = nodes.round({
            address: [("EVAL", SCAN, 0, self._width, self._key_length, blob) for blob in blobs]
            for address, (blobs, _) in requests.items() if blobs})
        found = [{} for _ in range(len(probes))]
        for address, calls in replies.items():
            _redis.scan_hits(calls, requests[address][1], step, firsts, probe_of, table_of, probes,
                           layout.spec, layout.tables, self._bits, self._width, distance, found)
        keys = self._keys_of(set().union(*found))
        return [[(key, fp, bits) for fp, bits in hits.items() for key in keys[fp]]
                for hits in found]

    def _keys_of(self, fps):
        """{fp: its keys} of the fingerprints ``fps``, read in one round."""
        return {fp: _split_keys(value)
                for fp, value in self._hash_fields(b":f:", list(fps), True).items()}

    def _hash_fields(self, kind, names, by_fingerprint):
        """{name: value or None} of the documents (``kind`` b":d:", ``names``
        their keys) or fingerprints (b":f:"), read in one round (an HMGET per
        hash)."""
        shards = _redis.hash_reads(names, self._shard_bits, by_fingerprint)
        commands = []
        for shard, (_, fields) in shards.items():
            key = self._name + kind + b"%x" % shard
            commands.append((key, ("HMGET", key, *fields)))
        found = {}
        for (names, _), values in zip(shards.values(), self._run(commands)):
            found.update(zip(names, values))
        return found

    def _documents(self, after, whole_batches=True):
        """(shard, key, value) of the documents after ``after`` (None: all) in
        the order (shard, key), streamed by :meth:`_shards`."""
        first = 0 if after is None else self._doc_shard_number(after)
        for shard, docs in self._shards(b"d", first, whole_batches):
            for key, value in docs:
                if after is None or shard > first or key > after:
                    yield shard, key, value

    def _fingerprint_groups(self, whole_batches=True):
        """(fingerprint, [keys]) of every fingerprint in order (a fingerprint's
        shard is its leading bits), streamed by :meth:`_shards`."""
        for _, fps in self._shards(b"f", 0, whole_batches):
            for fp, keys in fps:
                yield int.from_bytes(fp, "big"), _split_keys(keys)

    def _table_fingerprints(self, table, epoch=None):
        """The fingerprints of ``table`` in table order; the keys of every table
        are scanned once for all tables while ``epoch`` stays."""
        if epoch is None or self._bucket_keys[0] != epoch:
            by_table = collections.defaultdict(list)
            start = len(self._name) + 1
            for key in self._scan(b"[0-9a-f][0-9a-f][0-9a-f]*"):
                by_table[int(key[start:start + 3], 16)].append(key)
            self._bucket_keys = (epoch, by_table)
        keys, prefix = self._bucket_keys[1][table], self._table_keys[table]
        perms, width = [], self._width
        for key, entries in zip(keys, self._run([(key, ("GET", key)) for key in keys])):
            head = int(key[len(prefix):] or b"0", 16) << (64 - self._bits) if self._bits else 0
            perms += [head | int.from_bytes(entries[e:e + width], "big")
                      for e in range(0, len(entries or b""), width)]
        return [self._layout.unpermute(perm, table) for perm in sorted(perms)]

    # Writes

    def write(self, body):
        """Run ``body(txn)`` under the database's write lock; its changes land
        whole, acknowledged once a replica of every node they touch has them."""
        self._check_usable()
        if self.readonly:
            raise DatabaseError("the database at %s is open read-only" % self.path)
        with self._write_lock, _no_cyclic_gc():
            token = uuid.uuid4().hex.encode()
            deadline = time.monotonic() + self.retry_seconds
            try:
                while True:
                    count, distinct, epoch = self._acquire(token)
                    txn = RedisTxn(self, count, distinct)
                    result = body(txn)
                    plan = txn.plan()
                    if plan is None or self._commit(plan, token, epoch):
                        return result
                    if time.monotonic() > deadline:  # another writer took the lock each time
                        raise DatabaseError("could not keep the write lock of %s for a whole "
                                            "batch: raise ?lease= or make batches smaller"
                                            % self.path)
            finally:
                self._release(token)

    def _acquire(self, token, recovering=False):
        """Take the write lock (waiting for another writer, at most its lease
        and ``retry_seconds``); finish a dead writer's pending batch; returns
        the (count, distinct, epoch) of the database (``recovering``: only
        finish a pending batch, then return None)."""
        def take():
            deadline = time.monotonic() + self.retry_seconds + self.lease_seconds
            pause = 0.001
            while True:
                reply = self._meta("EVAL", ACQUIRE, 8, self._lock, self._pending, self._count,
                                   self._distinct, self._epoch, self._hold, self._queued,
                                   self._layout_key, token, self._lease_ms(),
                                   *(b"1",) * recovering)
                if reply[0] == 2:
                    return None
                if reply[0] == 1:
                    return reply[1:]
                if time.monotonic() > deadline:
                    raise DatabaseError("another writer held the lock of %s for %g s: retry "
                                        "later" % (self.path, self.retry_seconds))
                time.sleep(pause)
                pause = min(2 * pause, 0.05)
        while True:  # until no batch is pending
            taken = self._retrying(take, "lock")
            if taken is None:
                return None
            pending, count, distinct, epoch, layout = taken
            self._check_instance(layout)
            if not pending:
                return int(count), int(distinct), int(epoch)
            try:
                plan = msgpack.unpackb(pending)
            except (ValueError, msgpack.UnpackException):
                raise DatabaseError("the pending batch of %s is damaged" % self.path) from None
            if self._layout is None:
                self._retrying(self._stored_layout)
            self._land(plan, token, int(epoch))  # by this writer, or the one that took the lock

    def _recover(self):
        """Finish a dead writer's pending batch (from a reader)."""
        token = uuid.uuid4().hex.encode()
        try:
            self._acquire(token, recovering=True)
        finally:
            self._release(token)

    def _release(self, token, *keys):
        """Delete those of ``keys`` (default: the lock and the queue) that
        ``token`` holds."""
        keys = keys or (self._lock, self._queued)
        try:
            self._meta("EVAL", RELEASE, len(keys), *keys, token)
        except (Unavailable, DatabaseError):
            pass  # its lease ends it

    def _commit(self, plan, token, epoch):
        """Store ``plan`` as pending (acknowledged by a replica), apply it,
        clear it; False (nothing written) if another writer took the lock
        since the batch was planned at ``epoch``."""
        packed = msgpack.packb(plan)

        def begin():
            meta = self._nodes.owner(self._params)
            sent = [("EVAL", BEGIN, 3, self._lock, self._pending, self._epoch, token, packed,
                     self._lease_ms(), epoch)] + self._wait_commands(meta)
            replies = self._nodes.round({meta: sent})[meta]
            if replies[0] != 1:
                return False
            self._check_replicated(meta, sent, replies)
            return True
        if not self._retrying(begin, "write to"):
            return False
        self._land(plan, token, epoch + 1)
        return True

    def _land(self, plan, token, epoch):
        """Apply ``plan``, pending at ``epoch``, and clear it; False if this
        writer lost the lock meanwhile (the writer that took it lands the
        batch whole, or did)."""
        try:
            self._retrying(lambda: self._apply(plan, token, epoch), "write to")
            self._retrying(lambda: self._finish(plan, token, epoch), "write to")
            return True
        except Superseded:
            if int(self._retrying(lambda: self._meta("GET", self._epoch)) or 0) < epoch:
                raise DatabaseError("the fences of %s are ahead of its epoch (were its {%s}: "
                                    "keys deleted?): its batches cannot land"
                                    % (self.path, self._name.decode())) from None
            return False

    def _wait_commands(self, address):
        """What ends a round of writes to a node: WAIT for its replicas (unless
        it had none when last seen: a WAIT there would only time out), and ROLE."""
        if not self._replicas:
            return []
        if not self._nodes.replicas_of.get(address, 1):
            return [("ROLE",)]
        return [("WAIT", self._replicas, self._wait_ms()), ("ROLE",)]

    def _check_replicated(self, address, sent, replies):
        """Raise Unavailable unless the writes before :meth:`_wait_commands`
        reached ``replicas`` replicas, or every replica the node has (a
        primary left without replicas by a failover writes alone until one
        is back; when one is, the round is written again and waited for)."""
        if not self._replicas:
            return
        role, waited = replies[-1], len(sent) > 1 and sent[-2][0] == "WAIT"
        linked = self._nodes.replicas_of[address] = len(role[2])
        if not waited and linked:
            raise Unavailable("%s:%d has a replica again" % address)
        if waited and replies[-2] < min(self._replicas, linked):
            raise Unavailable("%s:%d reached %d of %d replicas"
                               % (address + (replies[-2], self._replicas)))

    def _finish(self, plan, token, epoch):
        params = () if plan["params"] is None else (plan["params"],)
        if self._meta("EVAL", FINISH, 6, self._lock, self._pending, self._epoch, self._count,
                      self._distinct, self._params, token, epoch, plan["count"],
                      plan["distinct"], *params) != 1:
            raise Superseded("the lock was taken over")

    def _apply(self, plan, token, epoch):
        """Write ``plan``, pending at ``epoch`` (idempotent: any part may already
        have landed), in rounds of bounded size, each after renewing the lock
        and ending when a replica of every node has it."""
        commands = self._plan_commands(plan, epoch)
        renew = ("EVAL", RENEW, 2, self._lock, self._epoch, token, self._lease_ms(), epoch)
        start = 0
        while start < len(commands):
            if self._meta(*renew) != 1:  # before each round: a lost lock writes no more
                raise Superseded("the lock was taken over")
            requests, size, end = collections.defaultdict(list), 0, start
            while end < len(commands) and size < ROUND_BYTES:
                key, command = commands[end]
                requests[self._nodes.owner(key)].append(command)
                size += sum(len(a) if isinstance(a, bytes) else 16 for a in command)
                end += 1
            for address in requests:
                requests[address] += self._wait_commands(address)
            for address, out in self._nodes.round(requests).items():
                self._check_replicated(address, requests[address], out)
            start = end

    def _plan_commands(self, plan, epoch):
        """(routing key, command) for every write of ``plan``, pending at
        ``epoch``, each fenced (see :data:`HWRITE`)."""
        commands = []
        for kind, fields, by_fingerprint in ((b":d:", plan["docs"], False),
                                             (b":f:", plan["fps"], True)):
            for shard, (sets, gone) in _redis.hash_writes(fields, self._shard_bits,
                                                        by_fingerprint).items():
                key = self._name + kind + b"%x" % shard
                commands.append((key, ("EVAL", HWRITE, 0, key, epoch, len(sets) // 2, *sets,
                                       *gone, self._fence_key(_redis.key_slot(key)))))
        return commands + self._merge_commands(array("Q", plan["add"]), array("Q", plan["del"]),
                                               epoch)

    def _fence_key(self, slot):
        return self._name + b":fence{" + slot_tags()[slot] + b"}"

    def _merge_commands(self, adds, deletes, epoch):
        """MERGE calls (one per node and ~SCRIPT_BYTES, each fenced by the
        slots of its buckets) that add the fingerprints ``adds`` to every
        table and remove ``deletes``."""
        nodes = self._nodes
        blobs = _redis.merge_records(adds, deletes, self._layout.spec, self._table_keys, self._bits,
                                   self._width, nodes.slot_nodes, len(nodes.addresses),
                                   SCRIPT_BYTES)
        return [(blob[:self._key_length],
                 ("EVAL", MERGE, 0, self._width, self._key_length, blob, epoch,
                  *map(self._fence_key, slots)))
                for node_blobs in blobs for blob, slots in node_blobs]

    # The rest of Storage

    def compact(self):
        """Nothing to do: a bucket's string shrinks as entries go, and Redis
        frees an emptied key."""
        self._check_usable()

    def info(self):
        """Backend facts; ``memory_bytes`` is what the database's keys take in
        RAM on the primaries (their MEMORY USAGE; Redis keeps nothing of it on
        disk but for its own snapshots, if configured)."""
        self._check_usable()

        def memory():
            keys = self._scan(b"*") + [self._params, self._layout_key, self._count,
                                       self._distinct, self._epoch]
            usage = self._run([(key, ("MEMORY", "USAGE", key, "SAMPLES", "0")) for key in keys])
            return sum(m or 0 for m in usage), sum(m is not None for m in usage)
        memory_bytes, keys = self._retrying(memory)
        return {"backend": self.backend, "memory_bytes": memory_bytes, "keys": keys,
                "primaries": len(self._nodes.primaries()), "bucket_bits": self._bits,
                "replicas": self._replicas}

    def close(self):
        if self._nodes is not None:
            self._nodes.close()
            self._nodes = None


@contextlib.contextmanager
def _no_cyclic_gc():
    """Pause Python's cyclic garbage collector: a batch allocates millions of
    small objects, none in cycles, and the collections it would set off walk
    them all again and again (a third of a 1M-record bulk load)."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()




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
