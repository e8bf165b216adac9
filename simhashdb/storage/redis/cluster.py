"""Connections to a Redis Cluster (or a single server): a database's URL and
options, which primary owns each slot, and rounds of commands sent to every
node at once."""

import binascii
import collections
import functools
import os
import socket
import ssl
import time
import urllib.parse
from array import array

from ... import _redis
from ...errors import DatabaseError, InvalidArgumentError, Superseded, Unavailable

SLOTS = 16384
DEFAULTS = {"retry": 20.0, "lease": 10.0, "timeout": 10.0, "replicas": None, "ca": None}
WATCH_SECONDS = 0.25  # how often a late reply makes us ask whether its node was replaced
ASK_SECONDS = 2.0  # the most a question of which node owns what waits for its answer
HANDSHAKE_SECONDS = 1.0  # the most a new connection waits for each answer of its handshake

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
    if path.startswith(("redis://", "rediss://")):
        return path
    server = os.environ.get("SIMHASHDB_REDIS_URL")
    if not server:
        raise InvalidArgumentError(
            "the redis backend takes a redis://host:port/name URL, or a name with "
            "$SIMHASHDB_REDIS_URL naming the server; got %r" % path)
    parts = urllib.parse.urlsplit(server)
    return urllib.parse.urlunsplit(parts._replace(path="/" + urllib.parse.quote(path, safe="")))


Address = collections.namedtuple("Address", "path name seeds options connection")


def _seeds(netloc, url):
    """The (host, port) of each node a URL's ``host:port,host:port,...`` names."""
    seeds = []
    for item in netloc.rpartition("@")[2].split(","):
        try:
            parts = urllib.parse.urlsplit("//" + item)
            seed = (parts.hostname or "localhost", 6379 if parts.port is None else parts.port)
            if not item or not seed[1]:
                raise ValueError(item)
        except ValueError:
            raise InvalidArgumentError("a Redis URL names its nodes as host:port, separated "
                                       "by commas; got %r in %s" % (item, url)) from None
        if seed not in seeds:
            seeds.append(seed)
    return seeds


def _named(address):
    """``host:port`` (an IPv6 host in brackets)."""
    host, port = address
    return "%s:%d" % ("[%s]" % host if ":" in host else host, port)


def parse_url(path):
    """The :class:`Address` of database ``path`` (a URL, or a name on the
    server of ``$SIMHASHDB_REDIS_URL``): its canonical path, name, seeds (the
    (host, port) of each node it names), options (``DEFAULTS`` as the URL
    sets them) and redis-py connection options.

    :raises InvalidArgumentError: a bad name, node or option.
    """
    url = redis_url(path)
    try:
        parts = urllib.parse.urlsplit(url)
    except ValueError as exc:  # an unclosed [ of an IPv6 host
        raise InvalidArgumentError("a Redis URL names its nodes as host:port, separated by "
                                   "commas (%s): %s" % (exc, url)) from None
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
    seeds = _seeds(parts.netloc, url)
    connection = {"socket_timeout": options["timeout"],
                  "socket_connect_timeout": min(HANDSHAKE_SECONDS, options["timeout"]),
                  "username": urllib.parse.unquote(parts.username or "") or None,
                  "password": urllib.parse.unquote(parts.password or "") or None,
                  "ssl": parts.scheme == "rediss"}
    if options["ca"]:
        connection["ssl_ca_certs"] = options["ca"]
    return Address("%s://%s/%s" % (parts.scheme, ",".join(map(_named, seeds)), name), name,
                   seeds, options, connection)


class Nodes:
    """The primaries of a cluster (or one server) and which owns each slot,
    learnt from the first of the ``seeds`` (host, port) that answers."""

    def __init__(self, seeds, options):
        import redis
        self._redis = redis
        self.errors = (redis.RedisError, OSError)
        self._retryable = (redis.exceptions.MovedError, redis.exceptions.AskError,
                           redis.exceptions.TryAgainError, redis.exceptions.ClusterDownError,
                           redis.exceptions.ReadOnlyError, redis.exceptions.MasterDownError)
        self._options = options
        self._clients, self._asking = {}, {}
        self._known = list(seeds)  # the nodes to ask which owns each slot: seeds, then all
        self._silent = set()  # nodes that last failed to answer: asked last
        self.cluster, first = self._contact(seeds)
        self.owners = [first] * SLOTS
        self.addresses = [first]  # the primaries
        self.slot_nodes = array("H", [0]) * SLOTS  # the index in addresses of each slot's
        self.replicas = 0  # the fewest replicas a primary has
        self.replicas_of = {}  # address of a primary: its replicas, as last seen
        self.failing = set()  # nodes the cluster flags as failing (fail or fail?)
        self.refreshed = 0.0  # time.monotonic() of the last refresh
        self.refresh()

    def _contact(self, seeds):
        """(whether the nodes are a cluster, the first seed that answered)."""
        redis, refused, hung, failure = self._redis, [], [], None
        for host, port in seeds:
            try:
                return bool(self.client((host, port), True).info("cluster").get(
                    "cluster_enabled")), (host, port)
            except redis.AuthenticationError as exc:
                raise DatabaseError("Redis at %s:%d refused the login (%s): give its user and "
                                    "password in the URL, redis://user:password@host:port/name"
                                    % (host, port, exc)) from None
            except (redis.ConnectionError, redis.TimeoutError) as exc:
                if isinstance(exc.__context__, ssl.SSLCertVerificationError):
                    raise DatabaseError(
                        "Redis at %s:%d has a certificate that no CA known here signed (%s): "
                        "name its CA's certificates with ?ca=/path/to/ca.pem"
                        % (host, port, exc.__context__)) from None
                cause = failure = exc.__context__ or exc
                self._silent.add((host, port))
                if isinstance(exc, redis.TimeoutError):
                    hung.append(_named((host, port)))
                if isinstance(cause, ConnectionRefusedError) or (
                        isinstance(cause, socket.gaierror) and cause.errno == socket.EAI_NONAME):
                    # nothing listens there, or no such host: no failover brings it back
                    # (a name server that did not answer, EAI_AGAIN, is retried)
                    refused.append("%s:%d (%s)" % (host, port, cause.strerror))
            except redis.RedisError as exc:
                raise DatabaseError("Redis at %s:%d refused: %s" % (host, port, exc)) from None
        if len(refused) == len(seeds):
            raise DatabaseError("no Redis server answers at %s: start it, or check the hosts "
                                "and ports in the URL" % ", ".join(refused))
        raise Unavailable(failure, node=", ".join(hung) or None)

    def client(self, address, asking=False):
        """The client of ``address``; ``asking``: the one for short questions
        (which node owns what), whose timeout is at most ASK_SECONDS. A new
        connection waits for each answer of its handshake as long as it
        may wait to connect (see :func:`_handshake`)."""
        clients = self._asking if asking else self._clients
        client = clients.get(address)
        if client is None:
            from redis.backoff import NoBackoff
            from redis.retry import Retry
            options = dict(self._options)
            if asking:
                options["socket_timeout"] = min(ASK_SECONDS, options["socket_timeout"])
            client = clients[address] = self._redis.Redis(  # retried by us, not redis-py
                host=address[0], port=address[1], protocol=2, retry=Retry(NoBackoff(), 0),
                redis_connect_func=functools.partial(
                    _handshake, options["socket_connect_timeout"]), **options)
        return client

    def _unavailable(self, exc, address):
        """The Unavailable of redis-py's ``exc`` from ``address``, naming the
        node where it did not answer in time."""
        timed_out = isinstance(exc, self._redis.TimeoutError)
        return Unavailable(exc, node=_named(address) if timed_out else None)

    def _askable(self, besides=None):
        """The known nodes but ``besides``, those that last failed to answer last."""
        return sorted((a for a in self._known if a != besides), key=self._silent.__contains__)

    def refresh(self):
        """Learn which primary owns each slot (and how many replicas each has),
        from the first known node that answers."""
        redis = self._redis
        if not self.cluster:
            try:
                info = self.client(self.addresses[0]).info("replication")
            except (redis.ConnectionError, redis.TimeoutError) as exc:
                raise self._unavailable(exc, self.addresses[0]) from None
            self.replicas = info.get("connected_slaves", 0)
            self.replicas_of = {self.addresses[0]: self.replicas}
            return
        failure = None
        for address in self._askable():
            try:
                shards = self.client(address, True).execute_command("CLUSTER SLOTS")
                nodes = self.client(address, True).execute_command("CLUSTER NODES")
            except self.errors as exc:
                self._silent.add(address)
                failure = exc
                continue
            self._silent.discard(address)
            owners = [None] * SLOTS
            for start, end, primary, *_ in shards:
                owners[start:end + 1] = [_primary(primary, address)] * (end - start + 1)
            if None in owners:
                failure = "not every slot has a primary"
                continue
            self.owners = owners
            self.addresses = sorted(set(owners))
            index = {address: i for i, address in enumerate(self.addresses)}
            self.slot_nodes = array("H", [index[owner] for owner in owners])
            by_primary = collections.Counter(n["master_id"] for n in nodes.values()
                                             if "slave" in n["flags"] and "fail" not in n["flags"])
            self.replicas_of, self.failing = {}, set()
            for text, n in nodes.items():  # "host:port@bus port"
                host, node_port = text.split("@")[0].rsplit(":", 1)
                node = (host or address[0], int(node_port))
                if node not in self._known:
                    self._known.append(node)
                if "fail" in n["flags"]:
                    self.failing.add(node)
                if "master" in n["flags"]:
                    self.replicas_of[node] = by_primary[n["node_id"]]
            self.replicas = min((by_primary[n["node_id"]] for n in nodes.values()
                                 if "master" in n["flags"] and n["slots"]), default=0)
            self.refreshed = time.monotonic()
            return
        raise Unavailable(failure)

    def _replaced(self, address):
        """Whether the first other node that answers says that ``address``
        owns no slot (a replica took over from it)."""
        for other in self._askable(besides=address):
            try:
                shards = self.client(other, True).execute_command("CLUSTER SLOTS")
            except self.errors:
                self._silent.add(other)
                continue
            return address not in {_primary(primary, other) for _, _, primary, *_ in shards}
        return False

    def _await(self, connection, address):
        """Until a reply from ``address`` can be read on ``connection``; while
        it is late, every WATCH_SECONDS, Unavailable if a replica took over
        from it (a primary that hangs is replaced in a few seconds, long before
        its socket times out), and after the socket timeout."""
        deadline = time.monotonic() + self._options["socket_timeout"]
        while not connection.can_read(timeout=WATCH_SECONDS):
            if self._replaced(address):
                raise Unavailable("%s stopped answering, and a replica took over its slots"
                                  % _named(address))
            if time.monotonic() > deadline:
                raise Unavailable("%s did not answer within %g s"
                                  % (_named(address), self._options["socket_timeout"]),
                                  node=_named(address))

    def owner(self, key):
        return self.addresses[self.slot_nodes[_redis.key_slot(key)]]

    def primaries(self):
        return list(self.addresses)

    def round(self, requests):
        """Send each node its commands (lists of args) at once, then read every
        reply: {address: [reply or ResponseError, ...]}."""
        redis = self._redis
        taken, replies, address = [], {}, None
        try:
            for address, commands in requests.items():
                if address in self._silent and self.cluster and self._replaced(address):
                    raise Unavailable("%s was replaced" % _named(address))  # not waited for
                pool = self.client(address).connection_pool
                connection = pool.get_connection()
                taken.append((pool, connection, address, commands))
                connection.send_packed_command([_redis.pack_commands(commands)], False)
            for pool, connection, address, commands in taken:
                out = replies[address] = []
                for _ in commands:
                    if self.cluster:
                        self._await(connection, address)
                    try:
                        out.append(connection.read_response())
                    except redis.ResponseError as exc:
                        out.append(exc)
                self._silent.discard(address)
        except (redis.ConnectionError, redis.TimeoutError, OSError, Unavailable) as exc:
            for _, connection, _, _ in taken:  # replies may be on their way: not reusable
                connection.disconnect()
            self._silent.add(address)
            raise (exc if isinstance(exc, Unavailable) else self._unavailable(exc, address)) \
                from None
        finally:
            for pool, connection, _, _ in taken:
                pool.release(connection)
        for out in replies.values():
            for reply in out:
                if isinstance(reply, redis.ResponseError):
                    message = "%s %s" % (type(reply).__name__, reply)
                    if str(reply).startswith("FENCED"):
                        raise Superseded(message, fenced=True)
                    if isinstance(reply, self._retryable) or any(
                            m in message for m in _RETRYABLE_MESSAGES):
                        raise Unavailable(message)
                    raise DatabaseError("Redis refused a command: %s" % message)
        return replies

    def close(self):
        for client in (*self._clients.values(), *self._asking.values()):
            client.close()
        self._clients, self._asking = {}, {}


def _handshake(seconds, connection):
    """redis-py's handshake of a new ``connection`` (a login, CLIENT SETINFO),
    waiting at most ``seconds`` for each answer: redis-py waits for the whole
    socket timeout, so a node that accepts connections but hangs (stopped,
    frozen) held every call that connected to it that long."""
    connection._sock.settimeout(seconds)
    connection.on_connect()
    connection._sock.settimeout(connection.socket_timeout)


def _primary(entry, asked):
    """The (host, port) of a primary in a CLUSTER SLOTS reply of node ``asked``."""
    return entry[0].decode() or asked[0], int(entry[1])


@functools.lru_cache(maxsize=None)
def slot_tags():
    """For each cluster slot, a short hash tag whose keys live in it."""
    tags, missing, n = [None] * SLOTS, SLOTS, 0
    while missing:
        tag = b"%x" % n
        slot = binascii.crc_hqx(tag, 0) % SLOTS
        if tags[slot] is None:
            tags[slot], missing = tag, missing - 1
        n += 1
    return tags
