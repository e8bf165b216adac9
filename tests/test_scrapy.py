"""simhashdb.scrapy in a real Scrapy crawl (`scrapy runspider`) of a local
site on 127.0.0.1 with a planted near-duplicate of every page
(tests/scrapy_site.py): one page of each pair comes through, the database
holds exactly those, and a second crawl decides every page the same way."""

import json
import pathlib
import re
import subprocess
import sys

import pytest

pytest.importorskip("scrapy")

import local_http
import scrapy_site

import simhashdb

PIPELINE = '{"simhashdb.scrapy.NearDuplicatePipeline": 300}'
MIDDLEWARE = '{"simhashdb.scrapy.NearDuplicateMiddleware": 540}'


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    root = tmp_path_factory.mktemp("site")
    copies = scrapy_site.build(root)
    with local_http.serve(root) as url:
        yield url, copies, root


def crawl(url, db, tmp_path, *settings):
    """Crawl the site with ``settings``: the URLs of the items, and the crawl's stats."""
    items = tmp_path / "items.jsonl"
    args = [sys.executable, "-m", "scrapy", "runspider", scrapy_site.__file__, "-a",
            "start=" + url, "-O", str(items), "-s", "SIMHASHDB_PATH=%s" % db,
            "-s", "TELNETCONSOLE_ENABLED=False", "-s", "LOG_LEVEL=INFO"]
    for setting in settings:
        args += ["-s", setting]
    done = subprocess.run(args, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert "ERROR" not in done.stderr, done.stderr
    stats = {name: int(n) for name, n in re.findall(r"'(simhashdb/\w+)': (\d+)", done.stderr)}
    return [json.loads(line) for line in items.read_text().splitlines()], stats


def one_of_each_pair(urls, url, copies):
    pairs = {page: (url + page, url + copy) for page, copy in copies.items()}
    return all(sum(u in urls for u in pair) == 1 for pair in pairs.values()) and \
        len(urls) == len(pairs)


def test_the_pipeline_drops_one_page_of_each_planted_pair(site, tmp_path):
    url, copies, root = site
    db = tmp_path / "crawl.db"
    items, stats = crawl(url, db, tmp_path, "ITEM_PIPELINES=" + PIPELINE,
                         "SIMHASHDB_META_FIELDS=title", "SIMHASHDB_STATUS_FIELD=status")
    kept = {item["url"] for item in items}
    assert one_of_each_pair(kept, url, copies)
    assert {item["status"] for item in items} == {"stored"}
    assert stats["simhashdb/stored"] == stats["simhashdb/duplicate"] == len(copies)
    with simhashdb.DB(db) as database:
        assert {record.key for record in database} == kept
        assert all(record.meta == {"title": record.key.rsplit("/", 1)[1]} for record in database)
        database.import_records([(key, fp, meta, 1_000, signature)  # stored long ago
                                 for key, fp, meta, _, signature in database.export_records()])
    again, stats = crawl(url, db, tmp_path, "ITEM_PIPELINES=" + PIPELINE,
                         "SIMHASHDB_STATUS_FIELD=status", "SIMHASHDB_REFRESH=True")
    assert {item["url"] for item in again} == kept  # unchanged: they come through again
    assert {item["status"] for item in again} == {"unchanged"}
    assert stats["simhashdb/unchanged"] == stats["simhashdb/duplicate"] == len(copies)
    with simhashdb.DB(db) as database:  # seen again: recorded as seen now
        assert {record.key for record in database if record.stored_at > 1_000} == kept


def test_the_middleware_drops_duplicate_responses_before_the_spider(site, tmp_path):
    url, copies, root = site
    db = tmp_path / "crawl.db"
    items, stats = crawl(url, db, tmp_path, "DOWNLOADER_MIDDLEWARES=" + MIDDLEWARE,
                         "SIMHASHDB_DROP=duplicate,unchanged")
    parsed = {item["url"] for item in items}
    assert one_of_each_pair(parsed, url, copies)
    assert stats == {"simhashdb/stored": len(copies), "simhashdb/duplicate": len(copies)}
    with simhashdb.DB(db) as database:  # (the index is not decided: its request says so)
        assert {record.key for record in database} == parsed
    # again with a higher threshold: the copies less alike than it are pages of their own
    again, stats = crawl(url, db, tmp_path, "DOWNLOADER_MIDDLEWARES=" + MIDDLEWARE,
                         "SIMHASHDB_DROP=duplicate,unchanged", "SIMHASHDB_THRESHOLD=0.975")
    alike = {page for page, copy in copies.items() if simhashdb.resemblance(
        *(simhashdb.fingerprint_with_signature((root / name).read_text(), html=True)[1]
          for name in (page, copy))) >= 0.975}
    assert 0 < len(alike) < len(copies)
    assert stats == {"simhashdb/unchanged": len(copies), "simhashdb/duplicate": len(alike),
                     "simhashdb/stored": len(copies) - len(alike)}
    assert {item["url"] for item in again} == {
        url + (copies[page] if url + page in parsed else page)
        for page in copies if page not in alike}


def test_the_example_drops_the_mirrors_copies(tmp_path):
    example = pathlib.Path(__file__).resolve().parent.parent / "examples" / "scrapy_dedupe.py"
    out = subprocess.run([sys.executable, str(example), "--db", str(tmp_path / "crawl.db"),
                          "--pages", "60"], capture_output=True, text=True, check=True).stdout
    crawled, stored, dropped, unchanged = map(int, re.findall(r"\d+", out)[:4])
    assert dropped == 10 and stored + dropped + unchanged == crawled  # one module in five


def test_two_spiders_of_one_process_share_the_database(site, tmp_path):
    url, copies, _ = site
    db = tmp_path / "crawl.db"
    out = subprocess.run([sys.executable, scrapy_site.__file__, url, str(db)],
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0 and "Traceback" not in out.stderr, out.stderr
    first, second = map(json.loads, out.stdout.splitlines())
    decided = {name: first.get(name, 0) + second.get(name, 0) for name in {*first, *second}}
    assert decided["simhashdb/stored"] == len(copies)  # one page of each pair, once
    assert sum(decided.values()) == 4 * len(copies)  # every page, by each spider
    with simhashdb.DB(db) as database:
        assert one_of_each_pair({record.key for record in database}, url, copies)
