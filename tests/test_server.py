"""simhashdb-cli serve: the HTTP server's answers against the library's own
decisions, bad requests, the token, concurrent clients, and a server killed
or stopped while writing (every acknowledged write is in the database), with
one process and with workers (a page and its near-duplicate at two workers at
once, a worker that ends)."""

import asyncio
import contextlib
import http.client
import json
import os
import random
import re
import select
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.parse

import pytest

aiohttp = pytest.importorskip("aiohttp")

import simhashdb
from simhashdb import server
from simhashdb.aio import AsyncDB

WORDS = ("river bridge farmer cattle school valley volunteer sandbag street official rain "
         "road north library square reading children lecture history market harbour ship "
         "train station garden winter summer letter paper window").split()


FRAME = "<nav>%s</nav><main>%%s</main>" % " ".join(WORDS)  # a page's text in a template


def page(seed, words=120):
    rng = random.Random(seed)
    return " ".join(rng.choice(WORDS) + str(rng.randrange(50)) for _ in range(words))


@contextlib.asynccontextmanager
async def served(path, **options):
    """A server of the database at ``path`` on 127.0.0.1, and a client session
    whose URLs are relative to it."""
    from aiohttp.test_utils import TestServer
    async with AsyncDB(path) as db:
        test_server = TestServer(server.make_app(db, **options), host="127.0.0.1")
        await test_server.start_server()
        try:
            async with aiohttp.ClientSession(base_url=test_server.make_url("/")) as http:
                yield http
        finally:
            await test_server.close()


async def post(http, endpoint, body, status=200, **kwargs):
    async with http.post("/v1/" + endpoint, json=body, **kwargs) as response:
        assert response.status == status, await response.text()
        assert response.content_type == "application/json"
        return await response.json()


def test_text_decisions_are_the_librarys(tmp_path):
    """Each answer of /v1/insert-text-if-new (statuses, matches) is the
    decision the library makes on the same pages in the same order."""
    base = [page(i) for i in range(6)]
    edited = [text.replace(text.split()[5], "edited", 1) for text in base[:3]]
    stream = [("a%d" % i, text) for i, text in enumerate(base)] + [
        ("b%d" % i, text) for i, text in enumerate(edited)] + [
        ("a0", base[0]), ("a1", base[1]), ("e", "  <p> </p> ")]

    async def scenario():
        async with served(tmp_path / "served.db") as http:
            answers = [await post(http, "insert-text-if-new",
                                  {"key": key, "text": text, "html": True}) for key, text in stream]
            batch = await post(http, "insert-text-if-new", {"items": [
                {"key": key, "text": text, "html": True} for key, text in stream]})
            queried = await post(http, "query-text", {"items": [{"text": t} for t in edited]})
            framed = await post(http, "query-text", {"text": FRAME % edited[0], "html": "main"})
            return answers, batch["items"], queried["items"], framed

    answers, batch, queried, framed = asyncio.run(scenario())
    with simhashdb.DB(tmp_path / "library.db") as db:
        for (key, text), answer in zip(stream, answers):
            expected = db.insert_text_if_new_many([(key, text)], html=True, invalid="report")[0]
            assert answer["key"] == key and answer["status"] == expected.status
            assert [(m["key"], m["distance"]) for m in answer["matches"]] == [
                (m.key, m.distance) for m in expected]
            assert [m["resemblance"] for m in answer["matches"]] == [
                round(m.resemblance, 4) for m in expected]
        assert [a["status"] for a in answers] == (["stored"] * 6 + ["duplicate"] * 3
                                                  + ["unchanged"] * 2 + ["invalid"])
        assert "no words" in answers[-1]["reason"]
        assert [a["status"] for a in batch] == ["unchanged"] * 6 + ["duplicate"] * 3 + [
            "unchanged"] * 2 + ["invalid"]  # the same pages again
        assert [m["key"] for m in framed["matches"]] == [
            m.key for m in db.query_text(FRAME % edited[0], html="main")] != []
        for text, answer in zip(edited, queried):
            assert [m["key"] for m in answer["matches"]] == [m.key for m in db.query_text(text)]
            assert answer["status"] == "duplicate"


def test_fingerprint_queries_find_what_a_scan_finds(tmp_path):
    rng = random.Random(5)
    stored = {}
    for i in range(300):
        near = i % 3 == 1  # a bit away from the one before
        fp = stored["f%d" % (i - 1)] ^ (1 << rng.randrange(64)) if near else rng.getrandbits(64)
        stored["f%d" % i] = fp

    async def scenario():
        async with served(tmp_path / "x.db") as http:
            answers = await post(http, "insert-if-new", {"items": [
                {"key": key, "fingerprint": "%x" % fp if i % 2 else fp, "metadata": {"i": i}}
                for i, (key, fp) in enumerate(stored.items())]})
            probes = [rng.getrandbits(64) for _ in range(20)] + list(stored.values())[:20]
            found = await post(http, "query", {"items": [{"fingerprint": fp, "distance": 12}
                                                         for fp in probes]})
            return answers["items"], probes, found["items"]

    answers, probes, found = asyncio.run(scenario())
    kept = {}
    for (key, fp), answer in zip(stored.items(), answers):
        near = sorted((simhashdb.num_differing_bits(fp, other), k) for k, other in kept.items()
                      if simhashdb.num_differing_bits(fp, other) <= 3)
        assert answer["status"] == ("duplicate" if near else "stored"), key
        assert [(m["distance"], m["key"]) for m in answer["matches"]] == near
        if not near:
            kept[key] = fp
    for fp, answer in zip(probes, found):
        scan = sorted((simhashdb.num_differing_bits(fp, other), k) for k, other in kept.items()
                      if simhashdb.num_differing_bits(fp, other) <= 12)
        assert sorted((m["distance"], m["key"]) for m in answer["matches"]) == scan
        assert answer["status"] == ("duplicate" if scan else "new")
    with simhashdb.DB(tmp_path / "x.db") as db:
        assert {r.key: r.fingerprint for r in db} == kept
        assert db["f0"].meta == {"i": 0}


def test_delete_stats_and_health(tmp_path):
    url = "https://example.com/a b/ü?q=1&r=2#top"

    async def scenario():
        async with served(tmp_path / "x.db") as http:
            await post(http, "insert-text-if-new", {"key": url, "text": page(1)})
            async with http.get("/v1/stats") as response:
                before = (await response.json())["count"]
            path = "/v1/documents/" + urllib.parse.quote(url, safe="")
            async with http.delete(path) as response:
                first = await response.json()
            async with http.delete(path) as response:
                second = await response.json()
            async with http.get("/v1/stats") as response:
                after = (await response.json())["count"]
            async with http.get("/healthz") as response:
                health = await response.json()
            return before, first, second, after, health

    before, first, second, after, health = asyncio.run(scenario())
    assert (before, after) == (1, 0)
    assert first == {"key": url, "deleted": True} and second == {"key": url, "deleted": False}
    assert health == {"status": "ok", "pid": os.getpid()}


def test_threshold_and_refresh_decide_as_the_library_does(tmp_path, monkeypatch):
    """An item's threshold decides it as the library's does (not the
    default's way); refresh records the stored pages it matched as seen now."""
    clock = [1_000]
    monkeypatch.setattr(simhashdb.batches, "_now", lambda: clock[0])  # every write's clock
    base = [page(i) for i in range(8)]
    edited = [text.replace(" ".join(text.split()[40:48]), "new words", 1) for text in base]

    async def scenario():
        async with served(tmp_path / "x.db") as http:
            await post(http, "insert-text-if-new", {"items": [
                {"key": "a%d" % i, "text": text} for i, text in enumerate(base)]})
            await post(http, "insert-if-new", {"items": [{"key": "f", "fingerprint": 77},
                                                         {"key": "g", "fingerprint": 2**40}]})
            clock[0] = 2_000
            strict = await post(http, "query-text", {"items": [
                {"text": text, "threshold": 0.86} for text in edited]})
            stored = await post(http, "insert-text-if-new", {"items": [
                {"key": "b%d" % i, "text": text, "threshold": 0.86, "refresh": i < 4}
                for i, text in enumerate(edited)]})
            await post(http, "insert-if-new", {"items": [
                {"key": "f", "fingerprint": 77, "refresh": True},
                {"key": "g", "fingerprint": 2**40}]})
            return strict["items"], stored["items"]

    strict, stored = asyncio.run(scenario())
    with simhashdb.DB(tmp_path / "library.db") as db:
        db.insert_text_many([("a%d" % i, text) for i, text in enumerate(base)])
        expected = db.insert_text_if_new_many([("b%d" % i, text) for i, text in
                                               enumerate(edited)], threshold=0.86)
        by_default = [db.query_text(text) for text in edited]
    assert [a["status"] for a in stored] == [d.status for d in expected]
    assert [[m["key"] for m in a["matches"]] for a in strict] == [
        [m.key for m in d] for d in expected]
    assert {d.status for d in expected} == {"stored", "duplicate"}
    assert all(by_default)  # the default threshold finds every edited page
    with simhashdb.DB(tmp_path / "x.db") as db:
        seen = {m["key"] for a in stored[:4] for m in a["matches"]}
        assert seen and all(db[key].stored_at == 2_000 for key in seen | {"f"})
        assert db["g"].stored_at == 1_000
        assert all(db["a%d" % i].stored_at == 1_000 for i in range(8) if "a%d" % i not in seen)


def test_short_words_decide_as_the_library_does(tmp_path):
    """Short pages alike through their template: duplicates by default,
    stored and not matched with an item's short_words, as in the library."""
    from test_short_pages import SHORT, pages
    records = [(key, page) for key, page in pages() if key.startswith("s")]

    async def scenario():
        async with served(tmp_path / "x.db") as http:
            stored = await post(http, "insert-text-if-new", {"items": [
                {"key": key, "text": page, "html": True, "short_words": SHORT}
                for key, page in records]})
            queried = await post(http, "query-text", {"items": [
                {"text": page, "html": True, "short_words": short}
                for _, page in records for short in (SHORT, None)]})
            return stored["items"], queried["items"]

    stored, queried = asyncio.run(scenario())
    with simhashdb.DB(tmp_path / "library.db") as db:
        expected = db.insert_text_if_new_many(records, html=True, short_words=SHORT)
    assert [a["status"] for a in stored] == [d.status for d in expected]
    assert [a["status"] for a in stored].count("stored") == len(records) - 2  # the 2 copies
    strict, default = queried[0::2], queried[1::2]
    assert all(len(a["matches"]) == 1 for a in strict)
    assert sum(len(a["matches"]) for a in default) > len(default)


BAD = [
    ("insert-text-if-new", b'{"key": "a", "text": ', 400, "not JSON"),
    ("insert-text-if-new", b"\xff\xfe", 400, "not JSON"),
    ("insert-text-if-new", b'["a", "b"]', 400, "must be a JSON object, got a list"),
    ("insert-text-if-new", b"[" * 100_000 + b"]" * 100_000, 400, "nested too deeply"),
    ("insert-text-if-new", b'{"key": 7, "text": "words here"}', 400, "'key' must be a string"),
    ("insert-text-if-new", b'{"key": "a", "text": 7}', 400, "'text' must be a string"),
    ("insert-text-if-new", b'{"key": "a", "text": "w", "html": "yes"}', 400,
     'true, false or "main"'),
    ("insert-text-if-new", b'{"text": "words"}', 400, "'key' is missing"),
    ("insert-text-if-new", b'{"key": "a", "txt": "words"}', 400, "unknown field 'txt'"),
    ("insert-text-if-new", b'{"items": {"key": "a"}}', 400, "a list of items"),
    ("insert-text-if-new", b'{"items": [{"key": "a", "text": "w"}, 3]}', 400,
     "items[1]: an item is a JSON object"),
    ("insert-if-new", b'{"key": "a", "fingerprint": 18446744073709551616}', 400, "2**64"),
    ("insert-if-new", b'{"key": "a", "fingerprint": "xyz"}', 400, "hex digits"),
    ("insert-if-new", b'{"key": "a", "fingerprint": 1.5}', 400, "[0, 2**64)"),
    ("query", b'{"fingerprint": 1, "distance": 64}', 400, "[0, 63]"),
    ("query", b'{"fingerprint": 1, "distance": true}', 400, "[0, 63]"),
    ("insert-text-if-new", b'{"key": "a", "text": "w", "threshold": 1.5}', 400,
     "'threshold' must be a number in [0, 1], got 1.5"),
    ("query-text", b'{"text": "w", "threshold": "high"}', 400, "got \"high\""),
    ("query-text", b'{"text": "w", "threshold": true}', 400, "number in [0, 1]"),
    ("insert-text-if-new", b'{"key": "a", "text": "w", "short_words": -1}', 400,
     "'short_words' must be an integer >= 0, got -1"),
    ("query-text", b'{"text": "w", "short_words": 1.5}', 400, "integer >= 0, got 1.5"),
    ("insert-if-new", b'{"key": "a", "fingerprint": 1, "refresh": 1}', 400,
     "'refresh' must be true or false, got a number"),
    ("nothing", b"{}", 404, "Not Found"),
]


@pytest.mark.parametrize("endpoint, body, status, said", BAD,
                         ids=["%s-%d" % (b[0], i) for i, b in enumerate(BAD)])
def test_a_bad_request_is_a_json_error_and_writes_nothing(tmp_path, endpoint, body, status,
                                                          said):
    async def scenario():
        async with served(tmp_path / "x.db") as http:
            async with http.post("/v1/" + endpoint, data=body) as response:
                answer = response.status, await response.json()
            async with http.get("/v1/stats") as response:
                return answer, (await response.json())["count"]

    (got, answer), count = asyncio.run(scenario())
    assert got == status and said in answer["error"] and count == 0


def test_bodies_and_batches_are_bounded(tmp_path, monkeypatch):
    monkeypatch.setattr(server, "MAX_ITEMS", 5)

    async def scenario():
        async with served(tmp_path / "x.db", max_body=100_000) as http:
            async with http.post("/v1/insert-text-if-new",
                                 json={"key": "a", "text": "word " * 30_000}) as response:
                huge = response.status, await response.json()
            async with http.get("/v1/query") as response:
                method = response.status, await response.json()
            items = [{"fingerprint": i} for i in range(server.MAX_ITEMS + 1)]
            many = await post(http, "query", {"items": items}, status=413)
            return huge, method, many

    (huge_status, huge), (method_status, method), many = asyncio.run(scenario())
    assert huge_status == 413 and "100000" in huge["error"] and "less" in huge["error"]
    assert method_status == 405 and method == {"error": "Method Not Allowed"}
    assert "at most %d items" % server.MAX_ITEMS in many["error"]


def test_the_token_is_asked_for_everything_but_health(tmp_path):
    async def scenario():
        async with served(tmp_path / "x.db", token="s3cret") as http:
            answers = []
            for headers in ({}, {"Authorization": "Bearer wrong"},
                            {"Authorization": "Bearer s3cret"}):
                async with http.post("/v1/query", json={"fingerprint": 1},
                                     headers=headers) as response:
                    answers.append((response.status, response.headers.get("WWW-Authenticate"),
                                    await response.json()))
            async with http.get("/healthz") as response:
                answers.append((response.status, None, await response.json()))
            return answers

    (none, wrong, right, health) = asyncio.run(scenario())
    assert none[:2] == wrong[:2] == (401, "Bearer") and "Bearer <token>" in none[2]["error"]
    assert right[0] == 200 and right[2]["status"] == "new"
    assert health[0] == 200


@pytest.mark.parametrize("workers", [None, 2])
def test_concurrent_clients_store_one_page_of_each_group(tmp_path, workers):
    """32 clients post 8 groups of copies at once, to a server in this
    process or to one of 2 workers: one page of each group is stored, every
    other is a duplicate of a stored one."""
    groups = {g: page(100 + g) for g in range(8)}

    async def clients(http):
        async def client(c):
            return [await post(http, "insert-text-if-new",
                               {"key": "c%d-g%d" % (c, g), "text": text})
                    for g, text in groups.items()]
        return [a for answers in await asyncio.gather(*map(client, range(32))) for a in answers]

    async def scenario():
        if workers is None:
            async with served(tmp_path / "x.db") as http:
                return await clients(http)
        process, url = start_server(tmp_path / "x.db", workers=workers)
        try:
            async with aiohttp.ClientSession(base_url=url) as http:
                return await clients(http)
        finally:
            process.terminate()
            assert process.wait(timeout=60) == 0

    answers = asyncio.run(scenario())
    stored = {a["key"] for a in answers if a["status"] == "stored"}
    assert sorted(key.split("-")[1] for key in stored) == ["g%d" % g for g in groups]
    assert all(a["status"] == "duplicate" and a["matches"][0]["key"] in stored
               for a in answers if a["key"] not in stored)
    with simhashdb.DB(tmp_path / "x.db") as db:
        assert {r.key for r in db} == stored


def start_server(path, env=None, workers=1):
    """A `simhashdb-cli serve` process on 127.0.0.1 (a free port, ``workers``
    processes, in a process group of their own) and its URL."""
    process = subprocess.Popen([sys.executable, "-m", "simhashdb", "serve", str(path),
                                "--port", "0", "--workers", str(workers)],
                               stderr=subprocess.PIPE, text=True, env=env,
                               start_new_session=True)
    line = process.stderr.readline()
    found = re.search(r"serving on (http://127\.0\.0\.1:\d+)", line)
    if not found:
        process.kill()
        pytest.fail("the server did not start: %s%s" % (line, process.stderr.read()))
    return process, found.group(1)


async def write_until(url, stop_after, acknowledged, clients=16):
    """Clients posting pages until one of them has ``stop_after`` answers;
    the keys of the pages answered "stored" go in ``acknowledged``."""
    async with aiohttp.ClientSession(base_url=url) as http:
        async def client(c):
            for i in range(10_000):
                key = "c%d-%d" % (c, i)
                try:
                    answer = await post(http, "insert-text-if-new",
                                        {"key": key, "text": page("%d-%d" % (c, i))})
                except aiohttp.ClientError:
                    return
                assert answer["status"] == "stored"
                acknowledged.add(key)
                if i == stop_after:
                    return
        await asyncio.gather(*map(client, range(clients)))


@pytest.mark.parametrize("workers", [1, 2])
def test_a_killed_server_loses_no_acknowledged_write(tmp_path, workers):
    """SIGKILL to every process of the server while clients write."""
    path = tmp_path / "x.db"
    process, url = start_server(path, workers=workers)
    acknowledged = set()

    async def scenario():
        writing = asyncio.ensure_future(write_until(url, 10_000, acknowledged))
        while len(acknowledged) < 100:
            await asyncio.sleep(0.01)
        os.killpg(process.pid, signal.SIGKILL)
        await writing

    try:
        asyncio.run(scenario())
    finally:
        os.killpg(process.pid, signal.SIGKILL)
        process.wait()
    assert process.returncode == -signal.SIGKILL
    with simhashdb.DB(path) as db:
        assert acknowledged <= {r.key for r in db}
        assert db.check() == []


@pytest.mark.parametrize("workers", [1, 2])
def test_sigterm_answers_the_requests_in_flight_then_stops(tmp_path, workers):
    """SIGTERM to the server's (first) process: every process ends, each
    request answered first."""
    path = tmp_path / "x.db"
    process, url = start_server(path, env=dict(os.environ, SIMHASHDB_TOKEN="t"),
                                workers=workers)
    acknowledged = set()

    async def scenario():
        async with aiohttp.ClientSession(base_url=url,
                                         headers={"Authorization": "Bearer t"}) as http:
            pending = [asyncio.ensure_future(post(http, "insert-text-if-new",
                                                  {"key": "k%d" % i, "text": page(i)}))
                       for i in range(64)]
            await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
            process.send_signal(signal.SIGTERM)  # with the others in flight
            for key, done in zip(("k%d" % i for i in range(64)),
                                 await asyncio.gather(*pending, return_exceptions=True)):
                if isinstance(done, dict):
                    acknowledged.add(key)

    try:
        asyncio.run(scenario())
        assert process.wait(timeout=60) == 0
        with pytest.raises(ProcessLookupError):  # no worker left behind
            os.killpg(process.pid, 0)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)
    assert acknowledged
    with simhashdb.DB(path) as db:
        assert acknowledged <= {r.key for r in db}


def test_serve_refuses_a_port_it_cannot_have(tmp_path, capsys):
    from simhashdb import cli
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        assert cli.main(["serve", str(tmp_path / "x.db"), "--port", str(port)]) == 1
    assert "port %d: Address already in use; choose another" % port in capsys.readouterr().err
    assert cli.main(["serve", str(tmp_path / "x.db"), "--port", "70000"]) == 2
    assert "--port must be in [0, 65535]" in capsys.readouterr().err


def test_texts_a_database_can_never_take_are_a_conflict(tmp_path):
    """A database of fingerprints of no recipe takes no text, now or later: 409."""
    path = tmp_path / "fingerprints.db"
    with simhashdb.DB(path) as db:
        db.insert("a", 12345)

    async def scenario():
        async with served(path) as http:
            refused = await post(http, "insert-text-if-new", {"key": "b", "text": page(1)}, 409)
            stored = await post(http, "insert-if-new", {"key": "c", "fingerprint": 2**40})
            return refused, stored

    refused, stored = asyncio.run(scenario())
    assert "recipe" in refused["error"] and stored["status"] == "stored"


def worker_connections(url, count=2):
    """Keep-alive connections to the server at ``url``, one to each of
    ``count`` different workers (found by the pid ``GET /healthz`` gives)."""
    address = urllib.parse.urlsplit(url)
    found = {}
    for _ in range(1000):
        connection = http.client.HTTPConnection(address.hostname, address.port, timeout=30)
        pid = call(connection, "GET", "/healthz")["pid"]
        if pid in found:
            connection.close()
            time.sleep(0.01)  # (a worker may be starting)
        else:
            found[pid] = connection
        if len(found) == count:
            return list(found.values())
    pytest.fail("1000 connections reached only %d workers" % len(found))


def call(connection, method, path, body=None):
    connection.request(method, path, body=None if body is None else json.dumps(body),
                       headers={"Content-Type": "application/json"})
    response = connection.getresponse()
    answer = json.loads(response.read())
    assert response.status == 200, answer
    return answer


def test_a_page_and_its_near_duplicate_at_two_workers_are_decided_once(tmp_path):
    """Posted at the same moment to two workers (two processes, each with
    its own groups): one page of each pair is stored, the other is its
    duplicate, as their commits take turns under the database's write lock."""
    process, url = start_server(tmp_path / "x.db", workers=2)
    try:
        connections = worker_connections(url)
        pairs = [(page(500 + i), page(500 + i).replace("river", "bridge", 1)
                  .replace("school", "valley", 1)) for i in range(40)]
        together = threading.Barrier(2)
        answers = [[], []]

        def client(side):
            for i, pair in enumerate(pairs):
                together.wait(timeout=60)  # (broken if the other thread failed)
                answers[side].append(call(connections[side], "POST", "/v1/insert-text-if-new",
                                          {"key": "p%d-%d" % (i, side), "text": pair[side]}))

        threads = [threading.Thread(target=client, args=(side,)) for side in (0, 1)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
    finally:
        os.killpg(process.pid, signal.SIGTERM)
        process.wait(timeout=60)
    assert len(answers[0]) == len(answers[1]) == len(pairs)
    for decided in zip(*answers):
        assert sorted(a["status"] for a in decided) == ["duplicate", "stored"], decided
        stored = next(a["key"] for a in decided if a["status"] == "stored")
        duplicate = next(a for a in decided if a["status"] == "duplicate")
        assert [m["key"] for m in duplicate["matches"]] == [stored]
    with simhashdb.DB(tmp_path / "x.db") as db:
        assert len(db) == len(pairs) and db.check() == []


def test_a_worker_that_ends_is_replaced_and_workers_end_with_their_parent(tmp_path):
    """A killed worker is reported on stderr and another answers in its
    place; once the first process is killed, its workers stop by themselves."""
    process, url = start_server(tmp_path / "x.db", workers=2)
    try:
        pid = call(worker_connections(url)[0], "GET", "/healthz")["pid"]
        os.kill(pid, signal.SIGKILL)
        assert select.select([process.stderr], [], [], 60)[0], "no report in 60 s"
        line = process.stderr.readline()
        assert re.search(r"worker \d \(pid %d\) ended \(signal 9\); starting another" % pid,
                         line), line
        workers = [call(c, "GET", "/healthz")["pid"] for c in worker_connections(url)]
        assert pid not in workers
        process.kill()
        process.wait()
        for _ in range(3000):
            if not any(map(running, workers)):
                break
            time.sleep(0.01)
        assert not any(map(running, workers))
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)


def running(pid):
    """Whether process ``pid`` runs (an ended one that no parent waited
    for yet does not; Linux's /proc)."""
    try:
        with open("/proc/%d/stat" % pid) as read:
            return read.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def test_workers_need_so_reuseport(tmp_path, monkeypatch, capsys):
    from simhashdb import cli
    assert cli.main(["serve", str(tmp_path / "x.db"), "--workers", "0"]) == 2
    assert "--workers must be at least 1, got 0" in capsys.readouterr().err
    with pytest.raises(simhashdb.InvalidArgumentError, match="workers must be an integer >= 1"):
        server.serve(tmp_path / "x.db", workers=0)
    monkeypatch.delattr(socket, "SO_REUSEPORT")
    assert server.default_workers() == 1
    assert cli.main(["serve", str(tmp_path / "x.db"), "--workers", "2"]) == 2
    assert "SO_REUSEPORT, which this system lacks: serve with 1 worker" in capsys.readouterr().err
