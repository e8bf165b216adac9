"""A local site with planted near-duplicates, and the spider that crawls it:
tests/test_scrapy.py serves the site on 127.0.0.1 (tests/local_http.py) and runs the spider with
`scrapy runspider` in a process of its own."""

import pathlib
import random
import re
import sysconfig

import scrapy

KINDS = ("same text", "date banner", "comments and an ad", "two words changed")  # (titles differ)


def build(root, originals=20, words=300, seed=7):
    """Write ``originals`` pages of unrelated text and, for each, one
    near-duplicate of a kind of KINDS under another URL, and an index
    linking them all; returns {original path: copy path}."""
    rng = random.Random(seed)
    stdlib = pathlib.Path(sysconfig.get_paths()["stdlib"])
    vocabulary = sorted({word for name in ("argparse.py", "textwrap.py", "tarfile.py")
                         for word in re.findall(r"[a-z]{4,}", (stdlib / name).read_text())})
    pages, copies = {}, {}
    for i in range(originals):
        text = [rng.choice(vocabulary) for _ in range(words)]
        body = "<p>%s</p>" % " ".join(text)
        pages["page-%d.html" % i] = body
        kind = KINDS[i % len(KINDS)]
        if kind == "date banner":
            body = "<p>Updated on 2026-11-%02d</p>%s" % (i + 1, body)
        elif kind == "comments and an ad":
            body = "<!-- mirror %d -->%s<div class=ad>Buy now, it is cheap</div>" % (i, body)
        elif kind == "two words changed":
            text[10], text[200] = "changed", "edited"
            body = "<p>%s</p>" % " ".join(text)
        copies["page-%d.html" % i] = "copy-%d.html" % i
        pages["copy-%d.html" % i] = body
    for name, body in pages.items():
        (root / name).write_text("<html><head><title>%s</title></head><body><nav><a href="
                                 "'index.html'>Home</a></nav>%s</body></html>" % (name, body))
    (root / "index.html").write_text("<html><body>%s</body></html>" % "".join(
        "<a href='%s'>%s</a> " % (name, name) for name in sorted(pages)))
    return copies


class SiteSpider(scrapy.Spider):
    """Follows the index's links; yields {"url", "text"} for every page it parses."""

    name = "site"

    def __init__(self, start=None, **kwargs):
        super().__init__(**kwargs)
        self.site = start

    async def start(self):
        yield scrapy.Request(self.site + "index.html", meta={"simhashdb": False})

    def parse(self, response):
        if response.url.endswith("/index.html"):
            yield from response.follow_all(css="a")
        else:
            yield {"url": response.url, "text": response.text,
                   "title": response.css("title::text").get()}


def crawl_twice(url, db):
    """Two spiders of one CrawlerProcess crawl the site at once into one
    database; prints each crawl's simhashdb stats as a JSON line."""
    import json

    from scrapy.crawler import CrawlerProcess
    process = CrawlerProcess(settings={
        "SIMHASHDB_PATH": db, "ITEM_PIPELINES": {"simhashdb.scrapy.NearDuplicatePipeline": 300},
        "LOG_LEVEL": "ERROR", "TELNETCONSOLE_ENABLED": False})
    crawlers = [process.create_crawler(SiteSpider) for _ in range(2)]
    for crawler in crawlers:
        process.crawl(crawler, start=url)
    process.start()
    for crawler in crawlers:
        print(json.dumps({name: count for name, count in crawler.stats.get_stats().items()
                          if name.startswith("simhashdb/")}))


if __name__ == "__main__":
    import sys
    crawl_twice(*sys.argv[1:])
