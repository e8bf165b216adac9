"""Logging in to Redis: a password (requirepass), an ACL user, and TLS
(rediss://, the server's self-signed certificate named by ?ca=), each on a
single redis-server of its own."""

import re
import socket
import subprocess
import time

import pytest
from conftest import REDIS
from redis_cluster import start_server

from simhashdb import DB, DatabaseError, InvalidArgumentError, cli

pytestmark = pytest.mark.skipif(not REDIS, reason="needs redis-server and the redis extra "
                                "(pip install '.[redis]'); CI has both")


@pytest.fixture
def server(tmp_path):
    """Start a redis-server with options: ``port = server(*options, tls=False)``."""
    started = []

    def start(*options, tls=False):
        port, process = start_server(tmp_path, *options, tls=tls)
        started.append(process)
        return port
    yield start
    for process in started:
        process.terminate()
        process.wait()


def stores_and_finds(url):
    with DB(url, distance=3, blocks=5) as db:
        db.insert_many([("a", 1), ("b", 0b111)])
        assert [(m.key, m.distance) for m in db.query(0)] == [("a", 1), ("b", 3)]
        assert sorted(r.key for r in db) == ["a", "b"] and db.check() == []
        assert db.stats()["memory_bytes"] > 0


def refused(url, match, capsys):
    """Opening ``url`` fails at once (not retried for ?retry=20 s as though
    the server were down) with a one-line DatabaseError; the CLI says it in
    one line."""
    start = time.monotonic()
    with pytest.raises(DatabaseError, match=match) as raised:
        DB(url)
    assert time.monotonic() - start < 5
    error = raised.value  # one line, and no redis-py exception chained to it
    assert "\n" not in str(error) and error.__cause__ is None
    assert error.__context__ is None or error.__suppress_context__
    code = cli.main(["stats", url])
    out, err = capsys.readouterr()
    assert code == 1 and out == "" and len(err.strip().splitlines()) == 1
    assert re.search(match, err) and "Traceback" not in err


def test_a_password_logs_in_and_a_wrong_one_is_a_one_line_error(server, capsys):
    port = server("--requirepass", "p@ss:w/rd")
    url = "redis://%s127.0.0.1:" + str(port) + "/crawl"
    stores_and_finds(url % ":p%40ss%3Aw%2Frd@")
    refused(url % ":wrong@", "refused the login .*invalid username-password", capsys)
    refused(url % "", "refused the login .*Authentication required", capsys)


def test_an_acl_user_logs_in_and_a_user_without_the_keys_is_told_so(server, capsys):
    port = server("--user", "default", "off",
                  "--user", "crawler", "on", ">c-pw", "~*", "&*", "+@all",
                  "--user", "other", "on", ">o-pw", "~elsewhere:*", "+@all")
    url = "redis://%s@127.0.0.1:" + str(port) + "/crawl"
    stores_and_finds(url % "crawler:c-pw")
    refused(url % "crawler:wrong", "refused the login .*invalid username-password", capsys)
    refused(url % "nobody:c-pw", "refused the login", capsys)
    refused(url.replace("%s@", ""), "refused the login .*Authentication required", capsys)
    refused(url % "other:o-pw", "NoPermissionError", capsys)


def test_tls_with_the_servers_ca_named_by_an_option(server, tmp_path, capsys):
    cert, key = str(tmp_path / "cert.pem"), str(tmp_path / "key.pem")
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", key,
                    "-out", cert, "-days", "1", "-subj", "/CN=localhost",
                    "-addext", "subjectAltName=IP:127.0.0.1,DNS:localhost"],
                   check=True, capture_output=True)
    try:
        port = server("--tls-cert-file", cert, "--tls-key-file", key, "--tls-ca-cert-file", cert,
                      "--tls-auth-clients", "no", tls=True)
    except RuntimeError as exc:
        if re.search(r"(?i)TLS.*not (supported|built)|BUILD_TLS|finding TLS support", str(exc)):
            pytest.skip("this server binary was built without TLS (Debian's has it): %s"
                        % exc.args[0].splitlines()[-1])
        raise
    stores_and_finds("rediss://127.0.0.1:%d/crawl?ca=%s" % (port, cert))
    stores_and_finds("rediss://localhost:%d/crawl?ca=%s" % (port, cert))  # name checked too
    refused("rediss://127.0.0.1:%d/crawl" % port, "no CA known here signed .*ca=", capsys)
    for url, match in [("rediss://127.0.0.1:%d/crawl?ca=%s" % (port, tmp_path / "none.pem"),
                        "no such readable file"),
                       ("rediss://127.0.0.1:%d/crawl?ca=%s" % (port, tmp_path), "no such"),
                       ("redis://127.0.0.1:%d/crawl?ca=%s" % (port, cert), "rediss://")]:
        with pytest.raises(InvalidArgumentError, match=match):
            DB(url)


def test_a_server_that_is_not_there_is_reported_at_once(capsys):
    # a refused connection or an unknown host is no failover: no 20 s of retries
    with socket.socket() as unused:  # a port nothing listens on
        unused.bind(("127.0.0.1", 0))
        port = unused.getsockname()[1]
    refused("redis://127.0.0.1:%d/crawl" % port, "no Redis server answers at .*refused", capsys)
    refused("redis://no-such-host.invalid:7000/crawl", "no Redis server answers at no-such-host",
            capsys)
