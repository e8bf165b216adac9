"""Connections to a Redis Cluster (or a single server): a database's URL and
options, which primary owns each slot, and rounds of commands sent to every
node at once."""

import binascii
import collections
import functools
import os
import socket
import ssl
import urllib.parse
from array import array

from ... import _redis
from ...errors import DatabaseError, InvalidArgumentError

SLOTS = 16384
DEFAULTS = {"retry": 20.0, "lease": 10.0, "timeout": 10.0, "replicas": None, "ca": None}

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


Address = collections.namedtuple("Address", "path name host port options connection")


def parse_url(path):
    """The :class:`Address` of database ``path`` (a URL, or a name on the
    server of ``$SIMHASHDB_REDIS_URL``): its canonical path, name, host, port,
    options (``DEFAULTS`` as the URL sets them) and redis-py connection options.

    :raises InvalidArgumentError: a bad name or option.
    """
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
    host, port = parts.hostname or "localhost", parts.port or 6379
    connection = {"socket_timeout": options["timeout"],
                  "socket_connect_timeout": options["timeout"],
                  "username": urllib.parse.unquote(parts.username or "") or None,
                  "password": urllib.parse.unquote(parts.password or "") or None,
                  "ssl": parts.scheme == "rediss"}
    if options["ca"]:
        connection["ssl_ca_certs"] = options["ca"]
    return Address("%s://%s:%d/%s" % (parts.scheme, host, port, name), name, host, port,
                   options, connection)


class Unavailable(Exception):
    """A node did not answer, or the cluster is changing: retry after a refresh."""


class Superseded(Exception):
    """This writer lost its lock while applying a batch: the batch is pending,
    so the writer that took the lock over finishes it (or already did)."""


class Nodes:
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
            cause = exc.__context__
            if isinstance(cause, ConnectionRefusedError) or (
                    isinstance(cause, socket.gaierror) and cause.errno == socket.EAI_NONAME):
                # nothing listens there, or no such host: no failover brings it back
                # (a name server that did not answer, EAI_AGAIN, is retried)
                raise DatabaseError("no Redis server answers at %s:%d (%s): start it, or "
                                    "check the host and port in the URL"
                                    % (host, port, cause.strerror)) from None
            raise Unavailable(exc) from None
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
                raise Unavailable(exc) from None
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
        raise Unavailable(failure)

    def owner(self, key):
        return self.addresses[self.slot_nodes[_redis.key_slot(key)]]

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
                connection.send_packed_command([_redis.pack_commands(commands)], False)
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
            raise Unavailable(exc) from None
        finally:
            for pool, connection, _, _ in taken:
                pool.release(connection)
        for out in replies.values():
            for reply in out:
                if isinstance(reply, redis.ResponseError):
                    message = "%s %s" % (type(reply).__name__, reply)
                    if str(reply).startswith("FENCED"):
                        raise Superseded(message)
                    if isinstance(reply, self._retryable) or any(
                            m in message for m in _RETRYABLE_MESSAGES):
                        raise Unavailable(message)
                    raise DatabaseError("Redis refused a command: %s" % message)
        return replies

    def close(self):
        for client in self._clients.values():
            client.close()
        self._clients = {}


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
