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
import functools
import gc
import heapq
import os
import ssl
import struct
import threading
import time
import urllib.parse
import uuid
from array import array

import msgpack

from . import _ext
from .errors import DatabaseError, InvalidArgumentError, SimhashDBError
from .layout import Layout
from .storage import Storage, Txn, View, is_url, value_fingerprint

SLOTS = 16384
ROUND_BYTES = 4 << 20  # about the most one round sends to a node
ROUND_FIELDS = 8192  # about the most hash fields one round of an iteration reads
ROUND_SHARDS = 4096  # the most hashes one round of an iteration reads
SCRIPT_BYTES = 64 << 10  # about the most one script call takes: a node that runs a
# script answers nothing else, and the cluster fails a node silent for its node timeout
READ_ATTEMPTS = 3  # reads retried while batches land before writers are held back
DEFAULTS = {"retry": 20.0, "lease": 10.0, "timeout": 10.0, "replicas": None, "ca": None}

# Entries are compared as two numbers (Lua's are doubles): the first W - 4
# bytes and the last 4.
_LUA_COMMON = """
local W = tonumber(ARGV[1])
local KL = tonumber(ARGV[2])
local blob = ARGV[3]
local fmt = '>I' .. (W - 4) .. 'I4'
local function lower_bound(s, n, a, b, i)
  local j = n
  while i < j do
    local m = math.floor((i + j) / 2)
    local x, y = struct.unpack(fmt, s, m * W + 1)
    if x < a or (x == a and y < b) then i = m + 1 else j = m end
  end
  return i
end
"""

# ARGV[first..]: fence keys, each the epoch of the last batch that wrote in
# its slot. A write of an older batch (its writer stalled past its lease
# while a later batch was written) is refused; the others raise them.
_LUA_FENCE = """
local function fenced(epoch, first)
  for i = first, #ARGV do
    if tonumber(redis.call('GET', ARGV[i]) or '0') > epoch then return true end
  end
  for i = first, #ARGV do redis.call('SET', ARGV[i], epoch) end
  return false
end
"""
FENCED = "FENCED a later batch wrote here"

# ARGV[3]: records of key, 4-byte add count, 4-byte delete count, the adds
# and the deletes (entries of W bytes, each list sorted); ARGV[4]: the batch's
# epoch; ARGV[5..]: the fence keys of the records' slots. Each bucket becomes
# (bucket | adds) - deletes; an emptied bucket is deleted.
MERGE = "#!lua flags=allow-cross-slot-keys\n" + _LUA_COMMON + _LUA_FENCE + """
if fenced(tonumber(ARGV[4]), 5) then return redis.error_reply('%s') end
local pos = 1
while pos <= #blob do
  local key = string.sub(blob, pos, pos + KL - 1)
  local nadd, ndel = struct.unpack('>I4I4', blob, pos + KL)
  local adds = pos + KL + 8
  local dels = adds + nadd * W
  pos = dels + ndel * W
  -- adds without deletes into an empty bucket, or all after its last entry,
  -- are written at once, not entry by entry
  local fresh = ndel == 0 and redis.call('SET', key, string.sub(blob, adds, dels - 1), 'NX')
  local s = fresh and '' or redis.call('GET', key) or ''
  local n = #s / W
  local pieces, copied, at, i, j = {}, 0, 0, 0, 0
  if fresh then
    i = nadd
  elseif ndel == 0 and n > 0 then
    local x, y = struct.unpack(fmt, s, (n - 1) * W + 1)
    local a, b = struct.unpack(fmt, blob, adds)
    if x < a or (x == a and y < b) then
      pieces[1], pieces[2], copied, i = s, string.sub(blob, adds, dels - 1), n, nadd
    end
  end
  while i < nadd or j < ndel do
    local off, adding
    if j >= ndel then
      off, adding = adds + i * W, true
    elseif i >= nadd then
      off, adding = dels + j * W, false
    else
      local a1, b1 = struct.unpack(fmt, blob, adds + i * W)
      local a2, b2 = struct.unpack(fmt, blob, dels + j * W)
      adding = a1 < a2 or (a1 == a2 and b1 < b2)
      off = adding and adds + i * W or dels + j * W
    end
    if adding then i = i + 1 else j = j + 1 end
    local a, b = struct.unpack(fmt, blob, off)
    at = lower_bound(s, n, a, b, at)
    local found = false
    if at < n then
      local x, y = struct.unpack(fmt, s, at * W + 1)
      found = x == a and y == b
    end
    if adding and not found then
      pieces[#pieces + 1] = string.sub(s, copied * W + 1, at * W)
      pieces[#pieces + 1] = string.sub(blob, off, off + W - 1)
      copied = at
    elseif found and not adding then
      pieces[#pieces + 1] = string.sub(s, copied * W + 1, at * W)
      copied = at + 1
      at = at + 1
    end
  end
  if #pieces > 0 then
    pieces[#pieces + 1] = string.sub(s, copied * W + 1)
    local merged = table.concat(pieces)
    if #merged == 0 then redis.call('DEL', key) else redis.call('SET', key, merged) end
  end
end
return 1
""" % FENCED

# ARGV: hash key, the batch's epoch, how many fields to set, those fields and
# their values, the fields to delete, and last the fence key of the hash's slot.
HWRITE = "#!lua flags=allow-cross-slot-keys\n" + _LUA_FENCE + """
if fenced(tonumber(ARGV[2]), #ARGV) then return redis.error_reply('%s') end
local key, sets = ARGV[1], 4 + 2 * tonumber(ARGV[3])
for i = 4, sets - 1, 1000 do
  redis.call('HSET', key, unpack(ARGV, i, math.min(i + 999, sets - 1)))
end
for i = sets, #ARGV - 1, 1000 do
  redis.call('HDEL', key, unpack(ARGV, i, math.min(i + 999, #ARGV - 1)))
end
return 1
""" % FENCED

# ARGV[3]: ranges of key, first entry, last entry. Returns {range number,
# entries, ...} for the ranges that hold entries (numbered from 1): those of
# the range, or all of a bucket of at most WHOLE (the client checks each
# entry's distance anyway, and searching a small bucket costs more than
# sending it).
SCAN = "#!lua flags=allow-cross-slot-keys,no-writes\n" + _LUA_COMMON + """
local WHOLE = 32
local out, last, s, n = {}, nil, '', 0
local size = KL + 2 * W
for r = 0, #blob / size - 1 do
  local pos = r * size + 1
  local key = string.sub(blob, pos, pos + KL - 1)
  if key ~= last then
    s, last = redis.call('GET', key) or '', key
    n = #s / W
  end
  if n > 0 and n <= WHOLE then
    out[#out + 1] = r + 1
    out[#out + 1] = s
  elseif n > 0 then
    local a, b = struct.unpack(fmt, blob, pos + KL)
    local i = lower_bound(s, n, a, b, 0)
    local ha, hb = struct.unpack(fmt, blob, pos + KL + W)
    local j = i
    while j < n do
      local x, y = struct.unpack(fmt, s, j * W + 1)
      if x > ha or (x == ha and y > hb) then break end
      j = j + 1
    end
    if j > i then
      out[#out + 1] = r + 1
      out[#out + 1] = string.sub(s, i * W + 1, j * W)
    end
  end
end
return out
"""

# KEYS: lock, pending, count, distinct, epoch, hold, queued, layout; ARGV: token,
# lease ms. The holder of the token may take the lock again (after a failover
# interrupted it). A writer that finds the lock taken queues for the next turn
# (one at a time, for a lease), so that a writer in a loop cannot keep it.
# While a reader holds new batches back, only a pending one is landed. With
# ARGV[3] (a reader recovering a dead writer's batch), nothing pending is {2}.
ACQUIRE = """
if ARGV[3] and not redis.call('GET', KEYS[2]) then return {2} end
local holder, queued = redis.call('GET', KEYS[1]), redis.call('GET', KEYS[7])
if holder == ARGV[1] or (not holder and (not queued or queued == ARGV[1])) then
  if redis.call('EXISTS', KEYS[6]) == 1 and not redis.call('GET', KEYS[2]) then
    return {0, redis.call('PTTL', KEYS[6])}
  end
  if queued == ARGV[1] then redis.call('DEL', KEYS[7]) end
  redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
  return {1, redis.call('GET', KEYS[2]) or '', redis.call('GET', KEYS[3]) or '0',
          redis.call('GET', KEYS[4]) or '0', redis.call('GET', KEYS[5]) or '0',
          redis.call('GET', KEYS[8])}
end
if not queued then redis.call('SET', KEYS[7], ARGV[1], 'PX', ARGV[2]) end
return {0, redis.call('PTTL', KEYS[1])}
"""
# Whether the lock (KEYS[1]) is the token's (ARGV[1]), or lapsed with its
# epoch key still at ``epoch`` (no other writer wrote or finished a batch).
_LUA_HOLDS = """
local function holds(epoch_key, epoch)
  local holder = redis.call('GET', KEYS[1])
  return holder == ARGV[1] or (not holder and (redis.call('GET', epoch_key) or '0') == epoch)
end
"""
# KEYS: lock, epoch; ARGV: token, lease ms, the (odd) epoch of the batch
# being applied. A lock that expired meanwhile is taken back if no other
# writer finished the batch (the epoch did not move).
RENEW = _LUA_HOLDS + """
if holds(KEYS[2], ARGV[3]) then
  redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
  return 1
end
return 0
"""
# KEYS: lock, pending, epoch; ARGV: token, plan, lease ms, the epoch the
# batch was planned at. The epoch is odd while a plan is pending. A lock
# that expired while the batch was planned is taken back if no batch was
# written since (the epoch did not move).
BEGIN = _LUA_HOLDS + """
if not holds(KEYS[3], ARGV[4]) then return 0 end
redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[3])
if not redis.call('GET', KEYS[2]) then redis.call('INCR', KEYS[3]) end
redis.call('SET', KEYS[2], ARGV[2])
return 1
"""
# KEYS: lock, pending, epoch, count, distinct, params; ARGV: token, the (odd)
# epoch of the batch, its count and distinct, and its params if it sets them.
FINISH = _LUA_HOLDS + """
if not holds(KEYS[3], ARGV[2]) then return 0 end
if redis.call('DEL', KEYS[2]) == 1 then
  redis.call('INCR', KEYS[3])
  redis.call('SET', KEYS[4], ARGV[3])
  redis.call('SET', KEYS[5], ARGV[4])
  if ARGV[5] then redis.call('SET', KEYS[6], ARGV[5]) end
end
return 1
"""
# KEYS: any of lock, queued, hold; ARGV: token. Deletes those the token holds.
RELEASE = """
for _, key in ipairs(KEYS) do
  if redis.call('GET', key) == ARGV[1] then redis.call('DEL', key) end
end
return 0
"""

# Replies that a failover or a moving slot gives for a while: retried.
_RETRYABLE_MESSAGES = ("NOREPLICAS", "non local key", "cluster is down", "CLUSTERDOWN")


def _ca_file(path, scheme, url):
    """The ``ca`` option of ``url``: a readable file of CA certificates, for rediss://."""
    if scheme != "rediss":
        raise InvalidArgumentError("option ca= names the CA certificates of a TLS server, "
                                   "which a rediss:// URL reaches; got %s" % url)
    if not os.access(path, os.R_OK) or os.path.isdir(path):
        raise InvalidArgumentError("option ca=%s in %s: no such readable file of CA "
                                   "certificates (PEM)" % (path, url))
    return path


def redis_url(path):
    """The URL of ``path``: itself if a redis:// or rediss:// URL, else the
    database ``path`` on the server of ``$SIMHASHDB_REDIS_URL``."""
    path = os.fspath(path)
    if is_url(path):
        return path
    server = os.environ.get("SIMHASHDB_REDIS_URL")
    if not server:
        raise InvalidArgumentError(
            "the redis backend takes a redis://host:port/name URL, or a name with "
            "$SIMHASHDB_REDIS_URL naming the server; got %r" % path)
    parts = urllib.parse.urlsplit(server)
    return urllib.parse.urlunsplit(parts._replace(path="/" + urllib.parse.quote(path, safe="")))


class _Unavailable(Exception):
    """A node did not answer, or the cluster is changing: retry after a refresh."""


class _Superseded(Exception):
    """This writer lost its lock while applying a batch: the batch is pending,
    so the writer that took the lock over finishes it (or already did)."""


class _Nodes:
    """The primaries of a cluster (or one server) and which owns each slot."""

    def __init__(self, host, port, options):
        import redis
        self._redis = redis
        self.errors = (redis.RedisError, OSError)
        self._retryable = (redis.exceptions.MovedError, redis.exceptions.AskError,
                           redis.exceptions.TryAgainError, redis.exceptions.ClusterDownError,
                           redis.exceptions.ReadOnlyError, redis.exceptions.MasterDownError)
        self._options = options
        self._clients = {}
        self._seeds = [(host, port)]
        client = self.client((host, port))
        try:
            self.cluster = bool(client.info("cluster").get("cluster_enabled"))
        except redis.AuthenticationError as exc:
            raise DatabaseError("Redis at %s:%d refused the login (%s): give its user and "
                                "password in the URL, redis://user:password@host:port/name"
                                % (host, port, exc)) from None
        except (redis.ConnectionError, redis.TimeoutError) as exc:
            if isinstance(exc.__context__, ssl.SSLCertVerificationError):
                raise DatabaseError("Redis at %s:%d has a certificate that no CA known here "
                                    "signed (%s): name its CA's certificates with "
                                    "?ca=/path/to/ca.pem" % (host, port, exc.__context__)) from None
            raise _Unavailable(exc) from None
        except redis.RedisError as exc:
            raise DatabaseError("Redis at %s:%d refused: %s" % (host, port, exc)) from None
        self.owners = [(host, port)] * SLOTS
        self.addresses = [(host, port)]  # the primaries
        self.slot_nodes = array("H", [0]) * SLOTS  # the index in addresses of each slot's
        self.replicas = 0  # the fewest replicas a primary has
        self.replicas_of = {}  # address of a primary: its replicas, as last seen
        self.refresh()

    def client(self, address):
        client = self._clients.get(address)
        if client is None:
            from redis.backoff import NoBackoff
            from redis.retry import Retry
            client = self._clients[address] = self._redis.Redis(  # retried by us, not redis-py
                host=address[0], port=address[1], protocol=2, retry=Retry(NoBackoff(), 0),
                **self._options)
        return client

    def refresh(self):
        """Learn which primary owns each slot (and how many replicas each has)."""
        redis = self._redis
        if not self.cluster:
            try:
                info = self.client(self._seeds[0]).info("replication")
            except (redis.ConnectionError, redis.TimeoutError) as exc:
                raise _Unavailable(exc) from None
            self.replicas = info.get("connected_slaves", 0)
            self.replicas_of = {self._seeds[0]: self.replicas}
            return
        failure = None
        for address in self._seeds + sorted(set(self.owners) - set(self._seeds)):
            try:
                shards = self.client(address).execute_command("CLUSTER SLOTS")
                nodes = self.client(address).execute_command("CLUSTER NODES")
            except (redis.RedisError, OSError) as exc:
                failure = exc
                continue
            owners = [None] * SLOTS
            for start, end, primary, *_ in shards:
                owner = (primary[0].decode() or address[0], int(primary[1]))
                owners[start:end + 1] = [owner] * (end - start + 1)
            if None in owners:
                failure = "not every slot has a primary"
                continue
            self.owners = owners
            self._seeds = self.addresses = sorted(set(owners))
            index = {address: i for i, address in enumerate(self.addresses)}
            self.slot_nodes = array("H", [index[owner] for owner in owners])
            by_primary = collections.Counter(n["master_id"] for n in nodes.values()
                                             if "slave" in n["flags"] and "fail" not in n["flags"])
            self.replicas_of = {}
            for text, n in nodes.items():  # "host:port@bus port"
                if "master" in n["flags"]:
                    host, node_port = text.split("@")[0].rsplit(":", 1)
                    self.replicas_of[(host or address[0], int(node_port))] = \
                        by_primary[n["node_id"]]
            self.replicas = min((by_primary[n["node_id"]] for n in nodes.values()
                                 if "master" in n["flags"] and n["slots"]), default=0)
            return
        raise _Unavailable(failure)

    def owner(self, key):
        return self.addresses[self.slot_nodes[_ext.key_slot(key)]]

    def primaries(self):
        return list(self.addresses)

    def round(self, requests):
        """Send each node its commands (lists of args) at once, then read every
        reply: {address: [reply or ResponseError, ...]}."""
        redis = self._redis
        taken, replies = [], {}
        try:
            for address, commands in requests.items():
                pool = self.client(address).connection_pool
                connection = pool.get_connection()
                taken.append((pool, connection, address, commands))
                connection.send_packed_command([_ext.pack_commands(commands)], False)
            for pool, connection, address, commands in taken:
                out = replies[address] = []
                for _ in commands:
                    try:
                        out.append(connection.read_response())
                    except redis.ResponseError as exc:
                        out.append(exc)
        except (redis.ConnectionError, redis.TimeoutError, OSError) as exc:
            for _, connection, _, _ in taken:
                connection.disconnect()
            raise _Unavailable(exc) from None
        finally:
            for pool, connection, _, _ in taken:
                pool.release(connection)
        for out in replies.values():
            for reply in out:
                if isinstance(reply, redis.ResponseError):
                    message = "%s %s" % (type(reply).__name__, reply)
                    if str(reply).startswith("FENCED"):
                        raise _Superseded(message)
                    if isinstance(reply, self._retryable) or any(
                            m in message for m in _RETRYABLE_MESSAGES):
                        raise _Unavailable(message)
                    raise DatabaseError("Redis refused a command: %s" % message)
        return replies

    def close(self):
        for client in self._clients.values():
            client.close()
        self._clients = {}


@functools.lru_cache(maxsize=None)
def _slot_tags():
    """For each cluster slot, a short hash tag whose keys live in it."""
    tags, missing, n = [None] * SLOTS, SLOTS, 0
    while missing:
        tag = b"%x" % n
        slot = binascii.crc_hqx(tag, 0) % SLOTS
        if tags[slot] is None:
            tags[slot], missing = tag, missing - 1
        n += 1
    return tags


def probe_starts(layout, probes, distance):
    """The first permuted value of each range a query of ``probes`` at
    ``distance`` scans, with the probe and the table of each (uint64 arrays)."""
    if distance <= layout.distance:  # one range a table
        return _ext.probe_starts(probes, layout.spec, layout.prefixes)
    firsts, probe_of, table_of = array("Q"), array("Q"), array("Q")
    for i, fp in enumerate(probes):
        for table, ranges in enumerate(layout.probe_ranges(fp, distance)[1]):
            for first, _ in ranges:
                firsts.append(first)
                probe_of.append(i)
                table_of.append(table)
    return firsts, probe_of, table_of


class RedisStorage(Storage):
    """Database ``name`` on the Redis (Cluster) of a URL (see the module)."""

    backend = "redis"
    max_key_bytes = 511

    def __init__(self, path, readonly=False):
        url = redis_url(path)
        parts = urllib.parse.urlsplit(url)
        name = urllib.parse.unquote(parts.path[1:])
        if not name or any(c in name for c in "{}:"):
            raise InvalidArgumentError("a Redis database URL ends with /name, a name without "
                                       "{, } or : (its keys are name:...); got %r" % url)
        options = dict(DEFAULTS)
        for key, values in urllib.parse.parse_qs(parts.query).items():
            if key not in options:
                raise InvalidArgumentError("unknown option %r in %s (known: %s)"
                                           % (key, url, ", ".join(sorted(DEFAULTS))))
            if key == "ca":
                options[key] = _ca_file(values[-1], parts.scheme, url)
                continue
            try:
                options[key] = int(values[-1]) if key == "replicas" else float(values[-1])
            except ValueError:
                raise InvalidArgumentError("option %s=%r in %s is not a number"
                                           % (key, values[-1], url)) from None
        try:
            import redis  # noqa: F401
        except ImportError:
            raise DatabaseError("the redis backend needs redis-py: pip install "
                                "'simhashdb[redis]'") from None
        host, port = parts.hostname or "localhost", parts.port or 6379
        self.path = "%s://%s:%d/%s" % (parts.scheme, host, port, name)
        self.readonly = readonly
        self.retry_seconds, self.lease_seconds = options["retry"], options["lease"]
        self._name = name.encode()
        meta = b"{" + self._name + b"}:"
        (self._params, self._layout_key, self._count, self._distinct, self._lock,
         self._pending, self._epoch, self._hold, self._queued) = (meta + k for k in (
             b"params", b"layout", b"count", b"distinct", b"lock", b"pending", b"epoch",
             b"hold", b"queued"))
        self._layout = None
        self._instance = None  # the layout record this handle opened: while it stays, the database does
        self._vanished = None
        self._bucket_keys = (None, {})  # (epoch, {table: keys}) of the last scan
        self._pid = os.getpid()
        self._write_lock = threading.Lock()
        self._nodes = None
        connection = {"socket_timeout": options["timeout"],
                      "socket_connect_timeout": options["timeout"],
                      "username": urllib.parse.unquote(parts.username or "") or None,
                      "password": urllib.parse.unquote(parts.password or "") or None,
                      "ssl": parts.scheme == "rediss"}
        if options["ca"]:
            connection["ssl_ca_certs"] = options["ca"]
        self._nodes = self._retrying(lambda: _Nodes(host, port, connection), "connect to")
        self._replicas = options["replicas"]
        if self._replicas is None:
            self._replicas = min(1, self._nodes.replicas)

    # Plumbing

    def _check_usable(self):
        if os.getpid() != self._pid:
            raise DatabaseError("this DB was opened in process %d before a fork; open a new "
                                "DB in the child process" % self._pid)
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
            except _Unavailable as exc:
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
                    except _Unavailable:
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
                    raise _Unavailable(exc) from None
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
                raise _Unavailable("a batch has been landing for a second")
            else:
                time.sleep(0.001)

    def _search(self, probes, distance):
        """For each probe, its (key, fingerprint, distance) hits: one round for
        the tables (a SCAN script per node), one for the keys of the matches."""
        layout, nodes = self._layout, self._nodes
        firsts, probe_of, table_of = probe_starts(layout, probes, distance)
        step = SCRIPT_BYTES // (self._key_length + 2 * self._width)
        requests = dict(zip(nodes.addresses, _ext.scan_records(
            firsts, table_of, layout.prefixes, self._table_keys, self._bits, self._width,
            nodes.slot_nodes, len(nodes.addresses), step)))
        replies = nodes.round({
            address: [("EVAL", SCAN, 0, self._width, self._key_length, blob) for blob in blobs]
            for address, (blobs, _) in requests.items() if blobs})
        found = [{} for _ in range(len(probes))]
        for address, calls in replies.items():
            _ext.scan_hits(calls, requests[address][1], step, firsts, probe_of, table_of, probes,
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
        shards = _ext.hash_reads(names, self._shard_bits, by_fingerprint)
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
        except (_Unavailable, DatabaseError):
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
        except _Superseded:
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
        """Raise _Unavailable unless the writes before :meth:`_wait_commands`
        reached ``replicas`` replicas, or every replica the node has (a
        primary left without replicas by a failover writes alone until one
        is back; when one is, the round is written again and waited for)."""
        if not self._replicas:
            return
        role, waited = replies[-1], len(sent) > 1 and sent[-2][0] == "WAIT"
        linked = self._nodes.replicas_of[address] = len(role[2])
        if not waited and linked:
            raise _Unavailable("%s:%d has a replica again" % address)
        if waited and replies[-2] < min(self._replicas, linked):
            raise _Unavailable("%s:%d reached %d of %d replicas"
                               % (address + (replies[-2], self._replicas)))

    def _finish(self, plan, token, epoch):
        params = () if plan["params"] is None else (plan["params"],)
        if self._meta("EVAL", FINISH, 6, self._lock, self._pending, self._epoch, self._count,
                      self._distinct, self._params, token, epoch, plan["count"],
                      plan["distinct"], *params) != 1:
            raise _Superseded("the lock was taken over")

    def _apply(self, plan, token, epoch):
        """Write ``plan``, pending at ``epoch`` (idempotent: any part may already
        have landed), in rounds of bounded size, each after renewing the lock
        and ending when a replica of every node has it."""
        commands = self._plan_commands(plan, epoch)
        renew = ("EVAL", RENEW, 2, self._lock, self._epoch, token, self._lease_ms(), epoch)
        start = 0
        while start < len(commands):
            if self._meta(*renew) != 1:  # before each round: a lost lock writes no more
                raise _Superseded("the lock was taken over")
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
            for shard, (sets, gone) in _ext.hash_writes(fields, self._shard_bits,
                                                        by_fingerprint).items():
                key = self._name + kind + b"%x" % shard
                commands.append((key, ("EVAL", HWRITE, 0, key, epoch, len(sets) // 2, *sets,
                                       *gone, self._fence_key(_ext.key_slot(key)))))
        return commands + self._merge_commands(array("Q", plan["add"]), array("Q", plan["del"]),
                                               epoch)

    def _fence_key(self, slot):
        return self._name + b":fence{" + _slot_tags()[slot] + b"}"

    def _merge_commands(self, adds, deletes, epoch):
        """MERGE calls (one per node and ~SCRIPT_BYTES, each fenced by the
        slots of its buckets) that add the fingerprints ``adds`` to every
        table and remove ``deletes``."""
        nodes = self._nodes
        blobs = _ext.merge_records(adds, deletes, self._layout.spec, self._table_keys, self._bits,
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


class RedisView(View):
    """Reads of committed data; each call sees whole batches (a batch may land
    between two calls: Redis keeps no snapshots)."""

    def __init__(self, storage):
        self._storage = storage

    def _read(self, read):
        return self._storage._consistent(lambda epoch: read())

    def params(self):
        return self._read(lambda: self._storage._meta("GET", self._storage._params))

    def count(self):
        return int(self._read(lambda: self._storage._meta("GET", self._storage._count)) or 0)

    def distinct(self):
        return int(self._read(lambda: self._storage._meta("GET", self._storage._distinct)) or 0)

    def get(self, key):
        shard = self._storage._doc_shard(key)
        return self._read(lambda: self._storage._run([(shard, ("HGET", shard, key))])[0])

    def keys_of(self, fingerprint):
        return self._read(lambda: self._storage._keys_of([fingerprint]))[fingerprint]

    def keys_of_many(self, fingerprints):
        """In one round (seeing whole batches)."""
        return self._read(lambda: self._storage._keys_of(fingerprints))

    def documents(self, after=None):
        """In the order (shard, key), a shard being a CRC of the key: each round
        of a few thousand documents sees whole batches, but batches may land
        between rounds (Redis keeps no snapshots): a document not changed
        meanwhile comes once, one written meanwhile may come or not."""
        return (doc[1:] for doc in self._storage._documents(after))

    def fingerprint_groups(self):
        """In fingerprint order, each round seeing whole batches (as :meth:`documents`)."""
        return self._storage._fingerprint_groups()

    def search(self, probes, distance):
        return self._storage.search(probes, distance)

    def table_fingerprints(self, table):
        return self._storage._consistent(
            lambda epoch: self._storage._table_fingerprints(table, epoch))


class RedisTxn(RedisView, Txn):
    """A batch being planned under the write lock: reads see the committed
    data and this batch's own changes; :meth:`plan` says what to write."""

    def __init__(self, storage, count, distinct):
        super().__init__(storage)
        self._count_before, self._distinct_before = count, distinct
        self._docs = {}       # key -> value (None: removed) set by this batch
        self._committed = {}  # key -> committed value (None: absent), for keys read
        self._fps = {}        # fp -> its keys (sorted) after this batch, for fps read
        self._fps_committed = {}
        self._new_params = None
        self._near = None  # a _NearIndex of the fps this batch gave keys, once searched

    def _read(self, read):
        return self._storage._retrying(read)  # under the lock, no batch lands meanwhile

    def _load(self, keys, fps):
        """Read the committed values of ``keys`` and keys of ``fps`` (and of the
        fingerprints those values hold) not read yet."""
        storage = self._storage
        if not self._count_before:  # an empty database: nothing to read
            self._committed.update(dict.fromkeys(keys))
            _ext.add_absent(fps, self._fps, self._fps_committed)
            return
        keys = _ext.unread(keys, self._committed)
        if keys:
            values = self._read(lambda: storage._hash_fields(b":d:", keys, False))
            self._committed.update(values)
            fps = list(fps) + [value_fingerprint(v) for v in values.values() if v is not None]
        fps = _ext.unread(fps, self._fps)
        if fps:
            for fp, keys_of in self._read(lambda: storage._keys_of(fps)).items():
                self._fps[fp] = keys_of
                self._fps_committed[fp] = tuple(keys_of)

    def _value(self, key):
        return self._docs[key] if key in self._docs else self._committed[key]

    def _put(self, documents):
        """Store the (key, fp, value) ``documents`` in this batch (their keys
        and fingerprints read)."""
        moved = _ext.put_documents(documents, self._docs, self._committed, self._fps,
                                   value_fingerprint)
        if self._near is not None:
            for fp in moved:
                self._near.add(fp)

    # Reads with this batch's changes

    def params(self):
        return self._new_params if self._new_params is not None else super().params()

    def count(self):
        return self._count_before + _ext.planned_documents(self._docs, self._committed)[1]

    def distinct(self):
        return self._distinct_before + _ext.planned_fingerprints(self._fps,
                                                                 self._fps_committed)[3]

    def get(self, key):
        return self._docs[key] if key in self._docs else super().get(key)

    def keys_of(self, fingerprint):
        self._load([], [fingerprint])
        return list(self._fps[fingerprint])

    def keys_of_many(self, fingerprints):
        self._load([], fingerprints)
        return {fp: list(self._fps[fp]) for fp in fingerprints}

    def documents(self, after=None):
        """The committed documents streamed with this batch's changes merged in."""
        storage = self._storage
        start = None if after is None else (storage._doc_shard_number(after), after)
        own = sorted((storage._doc_shard_number(key), key, value)
                     for key, value in self._docs.items() if value is not None)
        own = [doc for doc in own if start is None or doc[:2] > start]
        committed = (doc for doc in storage._documents(after, False) if doc[1] not in self._docs)
        return (doc[1:] for doc in heapq.merge(committed, own))

    def fingerprint_groups(self):
        """The committed groups streamed with this batch's changes merged in."""
        own = sorted((fp, keys) for fp, keys in self._fps.items() if keys)
        committed = (group for group in self._storage._fingerprint_groups(False)
                     if group[0] not in self._fps)
        return heapq.merge(committed, own)

    def table_fingerprints(self, table):
        present = set(self._storage._table_fingerprints(table))
        present |= {fp for fp, keys in self._fps.items() if keys}
        present -= {fp for fp, keys in self._fps.items() if not keys}
        perms = self._storage._layout.table_values(array("Q", sorted(present)), table)
        return [self._storage._layout.unpermute(p, table) for p in perms]

    def search(self, probes, distance):
        committed = self._read(lambda: self._storage._search(probes, distance))
        return [[hit for hit in hits if hit[0] not in self._docs]
                + self._own_hits(fp, distance) for fp, hits in zip(probes, committed)]

    def _own_hits(self, fp, distance):
        """Hits among the documents this batch stored."""
        if self._near is None:
            self._near = _NearIndex(self._storage._layout)
            for other, keys in self._fps.items():
                if any(key in self._docs for key in keys):
                    self._near.add(other)
        return [(key, other, bits) for other, bits in self._near.search(fp, distance)
                for key in self._fps[other] if key in self._docs]

    # Writes

    def set_params(self, raw):
        self._new_params = raw

    def upsert(self, documents):
        self._load([d[0] for d in documents], [d[1] for d in documents])
        self._put(documents)

    def remove(self, keys):
        self._load(keys, [])
        removed = 0
        for key in keys:
            old = self._value(key)
            if old is not None:
                self._docs[key] = None
                self._fps[value_fingerprint(old)].remove(key)
                removed += 1
        return removed

    def insert_if_new(self, documents, distance):
        self._load([d[0] for d in documents], [d[1] for d in documents])
        probes = array("Q", [d[1] for d in documents])
        committed = self._read(lambda: self._storage._search(probes, distance))
        found = []
        for (key, fp, value), hits in zip(documents, committed):
            hits = [hit for hit in hits if hit[0] not in self._docs] + \
                self._own_hits(fp, distance)
            if not hits:
                self._put([(key, fp, value)])
            found.append(hits)
        return found

    def plan(self):
        """What this batch writes (final values, so that writing it twice
        is writing it once), or None if nothing."""
        docs, added = _ext.planned_documents(self._docs, self._committed)
        fps, adds, deletes, distinct = _ext.planned_fingerprints(self._fps, self._fps_committed)
        if not docs and not fps and self._new_params is None:
            return None
        return {"docs": docs, "fps": fps, "count": self._count_before + added,
                "distinct": self._distinct_before + distinct, "params": self._new_params,
                "add": adds.tobytes(), "del": deletes.tobytes()}


class _NearIndex:
    """Fingerprints in memory by the leading blocks of each table: the
    near-duplicates among a batch's own documents."""

    def __init__(self, layout):
        self._layout = layout
        self._tables = [collections.defaultdict(set) for _ in range(layout.tables)]

    def add(self, fp):
        perms, _ = self._layout.scan_bounds(fp)
        for table, perm, prefix in zip(self._tables, perms, self._layout.prefixes):
            table[perm & prefix].add(fp)

    def search(self, fp, distance):
        """(fingerprint, distance) of each one within ``distance`` of ``fp``."""
        if not any(self._tables):
            return []
        found = {}
        for table, ranges in zip(self._tables, self._layout.probe_ranges(fp, distance)[1]):
            for start, _ in ranges:
                for other in table.get(start, ()):
                    bits = (other ^ fp).bit_count()
                    if bits <= distance:
                        found[other] = bits
        return list(found.items())
