"""The batch protocol of a Redis database: writers take turns under one lock
with a lease; a batch is stored as pending (the epoch odd), applied with
fenced, idempotent commands, acknowledged by replicas, and cleared (the
epoch even); a reader retries while the epoch moves under it, and holds new
batches back when they keep landing (the module docstring of
:mod:`simhashdb.storage.redis` says why each step is there)."""

import collections
import time
import uuid
from array import array

import msgpack

from ... import _redis
from ...errors import DatabaseError, Superseded, Unavailable
from .. import BANDS, no_cyclic_gc
from .batch import band_entries_of
from .scripts import ACQUIRE, BEGIN, FINISH, HWRITE, MERGE, RELEASE, RENEW

ROUND_BYTES = 4 << 20  # about the most one round sends to a node
SCRIPT_BYTES = 64 << 10  # about the most one script call takes: a node that runs a
# script answers nothing else, and the cluster fails a node silent for its node timeout
READ_ATTEMPTS = 3  # reads retried while batches land before writers are held back


class Protocol:
    """The protocol for ``db``, a :class:`simhashdb.storage.redis.storage.RedisStorage`
    (its ``nodes``, ``keys``, ``layout``, ``meta``, ``retrying`` and settings)."""

    def __init__(self, db):
        self.db = db

    # Reads

    def consistent(self, read):
        """``read(epoch)`` seeing whole batches: retried while a batch lands
        under it; if batches keep landing (a read slower than the writers'
        pace), it holds new batches back (``{N}:hold``, for a lease at most)."""
        db, keys = self.db, self.db.keys
        db.check_usable()
        token, attempts = uuid.uuid4().hex.encode(), 0

        def step():
            nonlocal attempts
            while True:
                attempts += 1
                if attempts > READ_ATTEMPTS:  # new batches wait until this read is done
                    db.meta("SET", keys.hold, token, "PX", self.lease_ms())
                before = self.even_epoch()
                result = read(before)
                if db.counter(db.meta("GET", keys.epoch), keys.epoch) == before:
                    return result
        try:
            return db.retrying(step)
        finally:
            if attempts > READ_ATTEMPTS:  # it held batches back
                self.release(token, keys.hold)

    def even_epoch(self):
        """The epoch once it is even (no batch applying), finishing the batch of
        a writer that died (its lock gone) first."""
        db, keys = self.db, self.db.keys
        deadline = time.monotonic() + 1
        while True:
            epoch, ttl, layout, pending = db.nodes.round({db.nodes.owner(keys.params): [
                ("GET", keys.epoch), ("PTTL", keys.lock), ("GET", keys.layout),
                ("EXISTS", keys.pending)]}).popitem()[1]
            db.check_instance(layout)
            epoch = self.checked_epoch(epoch, pending)
            if epoch % 2 == 0:
                return epoch
            if ttl == -2:
                self.recover()
            elif time.monotonic() > deadline:
                raise Unavailable("a batch has been landing for a second")
            else:
                time.sleep(0.001)

    def checked_epoch(self, raw, pending):
        """The stored epoch ``raw``, which is odd exactly while a batch is
        ``pending`` (a script sets both): else the database is damaged."""
        epoch = self.db.counter(raw, self.db.keys.epoch)
        if epoch % 2 != bool(pending):
            raise self.db.contradiction("its epoch, %d, is %s with %s batch pending" % (
                epoch, *(("odd", "no") if epoch % 2 else ("even", "a"))))
        return epoch

    # Writes

    def write(self, body, batch):
        """Run ``body(txn)`` on ``batch(count, distinct, epoch)`` (a new txn) under the
        write lock, and land the plan of the txn whole; returns its result."""
        db = self.db
        with no_cyclic_gc():
            token = uuid.uuid4().hex.encode()
            deadline = time.monotonic() + db.retry_seconds
            try:
                while True:
                    count, distinct, epoch = self.acquire(token)
                    txn = batch(count, distinct, epoch)
                    result = body(txn)
                    plan = txn.plan()
                    if plan is None or self.commit(plan, token, epoch):
                        return result
                    if time.monotonic() > deadline:  # another writer took the lock each time
                        raise DatabaseError("could not keep the write lock of %s for a whole "
                                            "batch: raise ?lease= or make batches smaller"
                                            % db.path)
            finally:
                self.release(token)

    def acquire(self, token, recovering=False):
        """Take the write lock (waiting for another writer, at most its lease
        and ``retry_seconds``); finish a dead writer's pending batch; returns
        the (count, distinct, epoch) of the database (``recovering``: only
        finish a pending batch, then return None)."""
        db, keys = self.db, self.db.keys

        def take():
            deadline = time.monotonic() + db.retry_seconds + db.lease_seconds
            pause = 0.001
            while True:
                reply = db.meta("EVAL", ACQUIRE, 8, keys.lock, keys.pending, keys.count,
                                keys.distinct, keys.epoch, keys.hold, keys.queued, keys.layout,
                                token, self.lease_ms(), *(b"1",) * recovering)
                if reply[0] == 2:
                    return None
                if reply[0] == 1:
                    return reply[1:]
                if time.monotonic() > deadline:
                    raise DatabaseError("another writer held the lock of %s for %g s: retry "
                                        "later" % (db.path, db.retry_seconds))
                time.sleep(pause)
                pause = min(2 * pause, 0.05)
        while True:  # until no batch is pending
            taken = db.retrying(take, "lock")
            if taken is None:
                return None
            pending, count, distinct, epoch, layout = taken
            db.check_instance(layout)
            if not pending:
                return (db.counter(count, keys.count), db.counter(distinct, keys.distinct),
                        self.checked_epoch(epoch, pending))
            try:
                plan = msgpack.unpackb(pending)
            except (ValueError, msgpack.UnpackException):
                raise DatabaseError("the pending batch of %s is damaged" % db.path) from None
            if db.layout is None:
                db.retrying(db.use_stored_layout)
            # by this writer, or the one that took the lock
            self.land(plan, token, self.checked_epoch(epoch, pending))

    def recover(self):
        """Finish a dead writer's pending batch (from a reader)."""
        token = uuid.uuid4().hex.encode()
        try:
            self.acquire(token, recovering=True)
        finally:
            self.release(token)

    def release(self, token, *names):
        """Delete those of the keys ``names`` (default: the lock and the queue)
        that ``token`` holds."""
        names = names or (self.db.keys.lock, self.db.keys.queued)
        try:
            self.db.meta("EVAL", RELEASE, len(names), *names, token)
        except DatabaseError:
            pass  # its lease ends it

    def commit(self, plan, token, epoch):
        """Store ``plan`` as pending (acknowledged by a replica), apply it,
        clear it; False (nothing written) if another writer took the lock
        since the batch was planned at ``epoch``."""
        db, keys = self.db, self.db.keys
        packed = msgpack.packb(plan)

        def begin():
            meta = db.nodes.owner(keys.params)
            sent = [("EVAL", BEGIN, 3, keys.lock, keys.pending, keys.epoch, token, packed,
                     self.lease_ms(), epoch)] + self.wait_commands(meta)
            replies = db.nodes.round({meta: sent})[meta]
            if replies[0] != 1:
                return False
            self.check_replicated(meta, sent, replies)
            return True
        if not db.retrying(begin, "write to"):
            return False
        self.land(plan, token, epoch + 1)
        return True

    def land(self, plan, token, epoch):
        """Apply ``plan``, pending at ``epoch``, and clear it; False if this
        writer lost the lock meanwhile (the writer that took it lands the
        batch whole, or did)."""
        db = self.db
        try:
            db.retrying(lambda: self.apply(plan, token, epoch), "write to")
            db.retrying(lambda: self.finish(plan, token, epoch), "write to")
            return True
        except Superseded as exc:
            # a fence above this batch's epoch was raised by a later batch, which
            # moved the epoch on: if it did not, the fences outlived the epoch
            now = db.counter(db.retrying(lambda: db.meta("GET", db.keys.epoch)), db.keys.epoch)
            if now < epoch or now == epoch and exc.fenced:
                raise db.contradiction("its fences are ahead of its epoch (were its {%s}: "
                                       "keys deleted, or flushed on some nodes?), so its "
                                       "batches cannot land" % db.keys.name.decode()) from None
            return False

    def wait_commands(self, address):
        """What ends a round of writes to a node: WAIT for its replicas (unless
        it had none when last seen: a WAIT there would only time out), and ROLE."""
        db = self.db
        if not db.replicas:
            return []
        if not db.nodes.replicas_of.get(address, 1):
            return [("ROLE",)]
        return [("WAIT", db.replicas, self.wait_ms()), ("ROLE",)]

    def check_replicated(self, address, sent, replies):
        """Raise Unavailable unless the writes before :meth:`wait_commands`
        reached ``replicas`` replicas, or every replica the node has that the
        cluster does not flag as failing (a primary left without replicas by
        a failover, or whose replica hangs, writes alone until one is back;
        when one is, the round is written again and waited for)."""
        db = self.db
        if not db.replicas:
            return
        role, waited = replies[-1], len(sent) > 1 and sent[-2][0] == "WAIT"
        listed = [(host.decode(), int(port)) for host, port, *_ in role[2]]
        if not db.nodes.failing.isdisjoint(listed) and time.monotonic() > \
                db.nodes.refreshed + 1:  # a replica that hung (listed for a minute) may be back
            db.nodes.refresh()
        linked = db.nodes.replicas_of[address] = sum(r not in db.nodes.failing for r in listed)
        if not waited and linked:
            raise Unavailable("%s:%d has a replica again" % address)
        if waited and replies[-2] < min(db.replicas, linked):
            raise Unavailable("%s:%d reached %d of %d replicas"
                              % (address + (replies[-2], db.replicas)))

    def finish(self, plan, token, epoch):
        db, keys = self.db, self.db.keys
        params = () if plan["params"] is None else (plan["params"],)
        if db.meta("EVAL", FINISH, 6, keys.lock, keys.pending, keys.epoch, keys.count,
                   keys.distinct, keys.params, token, epoch, plan["count"],
                   plan["distinct"], *params) != 1:
            raise Superseded("the lock was taken over")

    def apply(self, plan, token, epoch):
        """Write ``plan``, pending at ``epoch`` (idempotent: any part may already
        have landed), in rounds of bounded size, each after renewing the lock
        and ending when a replica of every node has it."""
        db, keys = self.db, self.db.keys
        commands = self.plan_commands(plan, epoch)
        renew = ("EVAL", RENEW, 2, keys.lock, keys.epoch, token, self.lease_ms(), epoch)
        start = 0
        while start < len(commands):
            if db.meta(*renew) != 1:  # before each round: a lost lock writes no more
                raise Superseded("the lock was taken over")
            requests, size, end = collections.defaultdict(list), 0, start
            while end < len(commands) and size < ROUND_BYTES:
                key, command = commands[end]
                requests[db.nodes.owner(key)].append(command)
                size += sum(len(a) if isinstance(a, bytes) else 16 for a in command)
                end += 1
            for address in requests:
                requests[address] += self.wait_commands(address)
            for address, out in db.nodes.round(requests).items():
                self.check_replicated(address, requests[address], out)
            start = end

    def plan_commands(self, plan, epoch):
        """(routing key, command) for every write of ``plan``, pending at
        ``epoch``, each fenced (see :data:`HWRITE`)."""
        keys = self.db.keys
        commands = []
        for kind, fields, by_fingerprint in ((b"d", plan["docs"], False),
                                             (b"f", plan["fps"], True)):
            for shard, (sets, gone) in _redis.hash_writes(fields, keys.shard_bits,
                                                          by_fingerprint).items():
                key = keys.hash(kind, shard)
                commands.append((key, ("EVAL", HWRITE, 0, key, epoch, len(sets) // 2, *sets,
                                       *gone, keys.fence(_redis.key_slot(key)))))
        band_deletes = plan.get("bdel")  # none in a plan without band changes
        return commands + self.merge_commands(
            array("Q", plan["add"]), array("Q", plan["del"]),
            band_entries_of([value for _, value in plan["docs"]]),
            [array("Q", entries) for entries in band_deletes] if band_deletes else None, epoch)

    def merge_commands(self, adds, deletes, band_adds, band_deletes, epoch):
        """MERGE calls (one per node and ~SCRIPT_BYTES, each fenced by the
        slots of its buckets) that add the fingerprints ``adds`` to every
        table and remove ``deletes``, and add to each band the entries
        ``band_adds[band]`` and remove ``band_deletes[band]`` (sorted; None:
        none)."""
        db, keys, layout = self.db, self.db.keys, self.db.layout
        nodes = db.nodes
        added = [layout.table_values(adds, t) for t in range(layout.tables)]
        deleted = [layout.table_values(deletes, t) for t in range(layout.tables)]
        none = [array("Q")] * BANDS
        blobs = _redis.merge_buckets(added + (band_adds or none), deleted + (band_deletes or none),
                                     keys.tables + keys.bands, keys.bits, keys.width,
                                     nodes.slot_nodes, len(nodes.addresses), SCRIPT_BYTES)
        return [(blob[:keys.key_length],
                 ("EVAL", MERGE, 0, keys.width, keys.key_length, blob, epoch,
                  *map(keys.fence, slots)))
                for node_blobs in blobs for blob, slots in node_blobs]

    def lease_ms(self):
        return int(self.db.lease_seconds * 1000)

    def wait_ms(self):
        """How long a WAIT waits for replicas: well within the lease, which the
        next round renews."""
        return max(1, min(5000, self.lease_ms() // 4))
