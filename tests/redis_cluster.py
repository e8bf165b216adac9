"""A Redis Cluster of 3 primaries and 3 replicas on loopback, in a directory
of its own: for the tests (a session fixture) and tools/bench_redis.py.

Debian's ``redis-server`` (or ``$SIMHASHDB_TEST_REDIS_SERVER``) and ``redis-cli``; nothing is persisted (a killed
primary is restarted only after its replica took over, and then resyncs from
it as the new replica).
"""

import ctypes
import os
import shutil
import signal
import socket
import subprocess
import time

# The server binary: a Redis-protocol fork may stand in (e.g. Valkey's valkey-server).
SERVER = os.environ.get("SIMHASHDB_TEST_REDIS_SERVER", "redis-server")
NODE_TIMEOUT_MS = 1000  # how long a silent primary lives before its replica takes over


def available():
    """Whether redis-server, redis-cli and redis-py (the redis extra) are installed."""
    try:
        _redis()
    except ImportError:
        return False
    return bool(shutil.which(SERVER) and shutil.which("redis-cli"))


def _redis():
    import redis
    return redis


def free_ports(count):
    """``count`` loopback ports that are free, as are their cluster bus ports (+10000)."""
    ports = []
    while len(ports) < count:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        if port + 10000 < 65536 and port not in ports and _free(port + 10000):
            ports.append(port)
    return ports


def _free(port):
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def _die_with_parent():
    """In a node's process (Linux): SIGTERM when the process that started it
    ends, so that a test run killed before its teardown leaves no cluster."""
    try:
        ctypes.CDLL(None).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


def start_server(directory, *options, tls=False):
    """A single (non-cluster) redis-server on a free loopback port, with
    ``options`` (e.g. "--requirepass", "pw"), listening for TLS only where
    ``tls`` (its certificate files among ``options``): (port, process), once
    it accepts connections; RuntimeError with what it said if it does not
    start. It ends with the process that started it."""
    for _ in range(5):  # a port taken since it was found free: another one
        port = free_ports(1)[0]
        ports = ["--port", "0", "--tls-port", str(port)] if tls else ["--port", str(port)]
        process = subprocess.Popen(
            [SERVER, *ports, "--bind", "127.0.0.1", "--dir", str(directory),
             "--save", "", "--appendonly", "no", "--logfile", "redis.log", *options],
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, preexec_fn=_die_with_parent)
        deadline = time.monotonic() + 20
        while process.poll() is None and time.monotonic() < deadline:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                return port, process
            except OSError:
                time.sleep(0.05)
        if process.poll() is None:
            process.kill()
        said = process.communicate()[0].decode(errors="replace")
        try:
            with open(os.path.join(str(directory), "redis.log"), errors="replace") as log:
                said += "".join(log.readlines()[-5:])
        except OSError:
            pass
    raise RuntimeError("redis-server %s did not start: %s" % (" ".join(options), said))


class LocalCluster:
    """Start with :meth:`start`, end with :meth:`stop`; ``url`` names a node."""

    def __init__(self, root, primaries=3, replicas=1):
        self.root = str(root)
        self.ports = free_ports(primaries * (1 + replicas))
        self.replicas = replicas
        self.processes = {}
        self.paused = set()  # ports of the nodes stopped with SIGSTOP (hung, not dead)

    @property
    def url(self):
        return "redis://127.0.0.1:%d" % self.ports[0]

    def start(self, timeout=60):
        for i, port in enumerate(self.ports):
            for _ in range(5):  # a port taken since it was found free: another one
                self.start_node(port)
                if self._wait_pinging(port, timeout):
                    break
                del self.processes[port]
                port = self.ports[i] = free_ports(1)[0]
            else:
                raise RuntimeError("redis-server did not start (see %s)" % self.root)
        subprocess.run(["redis-cli", "--cluster", "create",
                        *["127.0.0.1:%d" % p for p in self.ports],
                        "--cluster-replicas", str(self.replicas), "--cluster-yes"],
                       check=True, capture_output=True, timeout=timeout)
        self.wait_healthy(timeout)
        return self

    def start_node(self, port):
        """Start (or restart) the node of ``port``; its cluster config is kept."""
        directory = os.path.join(self.root, str(port))
        os.makedirs(directory, exist_ok=True)
        self.processes[port] = subprocess.Popen(
            [SERVER, "--port", str(port), "--bind", "127.0.0.1", "--dir", directory,
             "--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf",
             "--cluster-node-timeout", str(NODE_TIMEOUT_MS), "--save", "", "--appendonly", "no",
             "--logfile", "redis.log", "--daemonize", "no"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, preexec_fn=_die_with_parent)

    def _wait_pinging(self, port, timeout):
        """Whether the node of ``port`` answers (False: its process ended)."""
        deadline = time.monotonic() + timeout
        while self.processes[port].poll() is None:
            try:
                with _redis().Redis(port=port, socket_timeout=1) as client:
                    if client.ping():
                        return True
            except _redis().RedisError:
                if time.monotonic() > deadline:
                    raise
            time.sleep(0.05)
        return False

    def client(self, port):
        return _redis().Redis(port=port, socket_timeout=2)

    def roles(self):
        """{port: "master" or "slave"} of the running nodes."""
        out = {}
        for port, process in self.processes.items():
            if process.poll() is None and port not in self.paused:
                with self.client(port) as c:
                    out[port] = c.info("replication")["role"]
        return out

    def primaries(self):
        return sorted(p for p, role in self.roles().items() if role == "master")

    def wait_healthy(self, timeout=60):
        """Until every running node sees the cluster ok, every slot has a primary
        and every primary has its replicas linked."""
        deadline = time.monotonic() + timeout
        while True:
            try:
                if self._healthy():
                    return
            except _redis().RedisError:
                pass
            if time.monotonic() > deadline:
                raise TimeoutError("the Redis cluster in %s did not become healthy" % self.root)
            time.sleep(0.1)

    def _healthy(self):
        running = [p for p, proc in self.processes.items()
                   if proc.poll() is None and p not in self.paused]
        for port in running:
            with self.client(port) as c:
                if c.execute_command("CLUSTER INFO")["cluster_state"] != "ok":
                    return False
                nodes = c.execute_command("CLUSTER NODES")  # {address: {flags, connected...}}
                live = [n for n in nodes.values() if "fail" not in n["flags"]
                        and "fail?" not in n["flags"] and n["connected"]]
                if len(live) < len(running):
                    return False
                replication = c.info("replication")
                if replication["role"] == "master":
                    if replication["connected_slaves"] < self.replicas:
                        return False
                    if any(replication["slave%d" % i]["state"] != "online"
                           for i in range(replication["connected_slaves"])):
                        return False
                elif replication["master_link_status"] != "up":
                    return False
        return True

    def flush(self):
        """Delete every key (on the primaries; the replicas follow)."""
        for port in self.primaries():
            with self.client(port) as c:
                c.flushall()

    def kill(self, port):
        """SIGKILL the node of ``port``."""
        process = self.processes[port]
        process.send_signal(signal.SIGKILL)
        process.wait()
        self.paused.discard(port)

    def pause(self, port):
        """SIGSTOP the node of ``port``: it hangs, its connections open but silent."""
        self.processes[port].send_signal(signal.SIGSTOP)
        self.paused.add(port)

    def resume(self, port):
        """SIGCONT the node of ``port``."""
        self.processes[port].send_signal(signal.SIGCONT)
        self.paused.discard(port)

    def stop(self):
        for process in self.processes.values():
            if process.poll() is None:
                process.terminate()
        for process in self.processes.values():
            try:
                process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
        shutil.rmtree(self.root, ignore_errors=True)
