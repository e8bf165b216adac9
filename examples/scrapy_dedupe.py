"""A Scrapy crawl that keeps near-duplicate pages out of its items, with
simhashdb's item pipeline (pip install '.[scrapy]'): each item's page is
stored in the database unless a near-duplicate of it is there already, and
the items of near-duplicates are dropped. The database outlives the crawl, so
a second run finds the same pages "unchanged" and drops the same copies.

The site is local, served on 127.0.0.1: a page for each of the Python
standard library's modules (its source, in one site template), and for one
module in five a mirror's copy under another URL, with a banner, a date and
an ad of its own. --url crawls a site of yours instead (its host only).

Usage: python examples/scrapy_dedupe.py [--db crawl.db] [--pages N] [--url URL]
"""

import argparse
import contextlib
import functools
import html
import http.server
import pathlib
import sysconfig
import tempfile
import threading
import urllib.parse

import scrapy
from scrapy.crawler import CrawlerProcess

TEMPLATE = ("<!DOCTYPE html><html><head><title>%s</title></head><body><nav><a href='index.html'>"
            "Home</a></nav>%s<main><pre>%s</pre></main><footer>%s</footer></body></html>")


class SiteSpider(scrapy.Spider):
    """Follows the links of the start page's host; an item for every page."""

    name = "site"

    def __init__(self, start, **kwargs):
        super().__init__(**kwargs)
        self.start_urls = [start]
        self.allowed_domains = [urllib.parse.urlsplit(start).hostname]

    def parse(self, response):
        yield {"path": urllib.parse.urlsplit(response.url).path, "text": response.text,
               "title": response.css("title::text").get()}
        yield from response.follow_all(css="a")


def write_site(root, pages):
    """Write about ``pages`` pages of the standard library's modules into ``root``."""
    stdlib = pathlib.Path(sysconfig.get_paths()["stdlib"])
    modules = sorted(p for p in stdlib.glob("*.py") if p.stat().st_size > 2000)[:pages * 5 // 6]
    links = []
    for i, path in enumerate(modules):
        source = html.escape(path.read_text("utf-8", errors="replace"))
        (root / (path.stem + ".html")).write_text(TEMPLATE % (path.stem, "", source, "Home"))
        links.append(path.stem + ".html")
        if i % 5 == 0:  # a mirror's copy: its own banner, date and ad
            (root / ("mirror-" + path.stem + ".html")).write_text(TEMPLATE % (
                path.stem, "<p>Mirrored on 2026-11-%02d by example.net</p>" % (i % 28 + 1),
                source, "<div class=ad>Fast hosting for your project</div>"))
            links.append("mirror-" + path.stem + ".html")
    (root / "index.html").write_text("<html><body>%s</body></html>" % " ".join(
        "<a href='%s'>%s</a>" % (link, link) for link in links))


class QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args):
        pass


@contextlib.contextmanager
def local_site(pages):
    """Serve a site of about ``pages`` pages on 127.0.0.1; yields its start URL."""
    with tempfile.TemporaryDirectory(prefix="site-") as root:
        write_site(pathlib.Path(root), pages)
        server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(
            QuietHandler, directory=root))
        threading.Thread(target=server.serve_forever, daemon=True).start()
        try:
            yield "http://127.0.0.1:%d/index.html" % server.server_address[1]
        finally:
            server.shutdown()


def crawl(start, db, pages):
    process = CrawlerProcess(settings={
        "SIMHASHDB_PATH": db,
        "ITEM_PIPELINES": {"simhashdb.scrapy.NearDuplicatePipeline": 300},
        # pages keyed by their path: the local site's port changes from run to run
        "SIMHASHDB_KEY_FIELD": "path",
        "SIMHASHDB_META_FIELDS": ["title"],  # stored with each page
        "CLOSESPIDER_PAGECOUNT": pages,
        "LOG_LEVEL": "ERROR",
    })
    crawler = process.create_crawler(SiteSpider)
    process.crawl(crawler, start=start)
    process.start()
    count = crawler.stats.get_stats()
    print("crawled %d pages: %d stored, %d near-duplicates dropped, %d unchanged since the "
          "last crawl" % (count.get("response_received_count", 0),
                          count.get("simhashdb/stored", 0), count.get("simhashdb/duplicate", 0),
                          count.get("simhashdb/unchanged", 0)))


def main():
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--db", default="scrapy-crawl.db",
                        help="the database directory (default: scrapy-crawl.db)")
    parser.add_argument("--pages", type=int, default=200, help="stop after N pages")
    parser.add_argument("--url", help="the start page of a site to crawl (default: a local one)")
    args = parser.parse_args()
    with contextlib.nullcontext(args.url) if args.url else local_site(args.pages) as start:
        crawl(start, args.db, args.pages)


if __name__ == "__main__":
    main()
