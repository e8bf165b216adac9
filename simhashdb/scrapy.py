"""Scrapy components that keep near-duplicate pages out of a crawl: an item
pipeline that decides on each item's text, and a downloader middleware that
decides on each HTML response before the spider parses it. Both use
:class:`simhashdb.aio.AsyncDB`, so the pages decided at once by a crawl's
concurrent requests share a durable transaction. They need Scrapy's asyncio
reactor (its default).

Usage, in a project's settings.py::

    SIMHASHDB_PATH = "crawl.db"
    ITEM_PIPELINES = {"simhashdb.scrapy.NearDuplicatePipeline": 300}
    # or, to drop duplicate responses before they are parsed:
    DOWNLOADER_MIDDLEWARES = {"simhashdb.scrapy.NearDuplicateMiddleware": 540}

Settings (with their defaults):

- ``SIMHASHDB_PATH``: the database (required).
- ``SIMHASHDB_KEY_FIELD = "url"``: the item field that keys a page.
- ``SIMHASHDB_TEXT_FIELD = "text"``: the item field of its text (a string or
  a list of strings); items without both fields pass untouched.
- ``SIMHASHDB_HTML = True``: the text is HTML (its markup is left out);
  ``"main"``: its main content only, without menus, headers, footers and
  asides (for the middleware too).
- ``SIMHASHDB_THRESHOLD = None``: the least resemblance of a near-duplicate
  (None: the database's default, 0.45).
- ``SIMHASHDB_SHORT_WORDS = None``: pages of fewer words are near-duplicates
  only at a resemblance of 0.8 or more (None: 0, none; see the crawler guide).
- ``SIMHASHDB_REFRESH = False``: record the stored near-duplicates a page
  was decided against (its own earlier version among them) as seen now, so
  that ``expire`` removes only the pages the crawl no longer sees.
- ``SIMHASHDB_META_FIELDS = []``: item fields stored with the page as its metadata.
- ``SIMHASHDB_DROP = ["duplicate"]``: the statuses whose items or responses
  are dropped (of ``"stored"``, ``"unchanged"``, ``"duplicate"``, ``"invalid"``).
- ``SIMHASHDB_STATUS_FIELD = None``: an item field to write the status in.

A request with ``meta={"simhashdb": False}`` is not decided by the
middleware; the responses it decides carry their :class:`simhashdb.Decision`
in ``response.meta["simhashdb_decision"]``. The crawl's stats count the
statuses (``simhashdb/stored``, ...).
"""

import os

from itemadapter import ItemAdapter
from scrapy import signals
from scrapy.exceptions import DropItem, IgnoreRequest
from scrapy.http import HtmlResponse
from scrapy.utils.reactor import is_asyncio_reactor_installed

from .aio import AsyncDB
from .errors import InvalidArgumentError

STATUSES = ("stored", "unchanged", "duplicate", "invalid")


class _Component:
    """What the pipeline and the middleware share: settings, the database
    (one AsyncDB a path in a process, however many components use it) and
    the crawl's stats."""

    _databases = {}  # absolute path -> [AsyncDB, components using it]

    def __init__(self, crawler):
        settings = crawler.settings
        self.path = settings.get("SIMHASHDB_PATH")
        if not self.path:
            raise InvalidArgumentError("%s needs SIMHASHDB_PATH, the database's directory, in "
                                       "the crawl's settings" % type(self).__name__)
        if not is_asyncio_reactor_installed():
            raise InvalidArgumentError(
                "%s needs Scrapy's asyncio reactor: set TWISTED_REACTOR = "
                "'twisted.internet.asyncioreactor.AsyncioSelectorReactor'" % type(self).__name__)
        self.drop = set(settings.getlist("SIMHASHDB_DROP", ["duplicate"]))
        unknown = sorted(self.drop - set(STATUSES))
        if unknown:
            raise InvalidArgumentError("SIMHASHDB_DROP holds %r, not a status; the statuses are "
                                       "%s" % (unknown[0], ", ".join(STATUSES)))
        self.html = settings.get("SIMHASHDB_HTML", True)
        if self.html != "main":
            self.html = settings.getbool("SIMHASHDB_HTML", True)
        self.threshold = None if settings.get("SIMHASHDB_THRESHOLD") is None else \
            settings.getfloat("SIMHASHDB_THRESHOLD")
        self.short_words = None if settings.get("SIMHASHDB_SHORT_WORDS") is None else \
            settings.getint("SIMHASHDB_SHORT_WORDS")
        self.refresh = settings.getbool("SIMHASHDB_REFRESH", False)
        self.stats = crawler.stats
        self.db = None

    @classmethod
    def from_crawler(cls, crawler):
        return cls(crawler)

    async def open_spider(self, spider=None):
        where = os.path.abspath(self.path)
        if where not in self._databases:
            self._databases[where] = [AsyncDB(self.path), 0]
        self._databases[where][1] += 1
        self.db = self._databases[where][0]

    async def close_spider(self, spider=None):
        where = os.path.abspath(self.path)
        self._databases[where][1] -= 1
        if not self._databases[where][1]:
            await self._databases.pop(where)[0].close()

    async def _decide(self, key, text, meta, html):
        """The page's Decision, counted in the crawl's stats."""
        decision = await self.db.insert_text_if_new(key, text, meta, html=html,
                                                    threshold=self.threshold,
                                                    short_words=self.short_words,
                                                    refresh=self.refresh)
        self.stats.inc_value("simhashdb/" + decision.status)
        return decision

    @staticmethod
    def _why(decision):
        """Why a page was dropped, for Scrapy's log."""
        if decision.status == "duplicate":
            first = decision[0]
            return "a near-duplicate of %s (%s)" % (first.key, "distance %d" % first.distance
                                                    if first.resemblance is None else
                                                    "resemblance %.3f" % first.resemblance)
        return "%s%s" % (decision.status, ": %s" % decision.reason if decision.reason else "")


class NearDuplicatePipeline(_Component):
    """An item pipeline that stores each item's page unless a near-duplicate is
    stored, and drops the items whose status is in ``SIMHASHDB_DROP``.

    Usage: ``ITEM_PIPELINES = {"simhashdb.scrapy.NearDuplicatePipeline": 300}``
    and ``SIMHASHDB_PATH`` in the settings (the module's docstring lists the rest).
    """

    def __init__(self, crawler):
        super().__init__(crawler)
        settings = crawler.settings
        self.key_field = settings.get("SIMHASHDB_KEY_FIELD", "url")
        self.text_field = settings.get("SIMHASHDB_TEXT_FIELD", "text")
        self.meta_fields = settings.getlist("SIMHASHDB_META_FIELDS", [])
        self.status_field = settings.get("SIMHASHDB_STATUS_FIELD")

    async def process_item(self, item, spider=None):
        fields = ItemAdapter(item)
        key, text = fields.get(self.key_field), fields.get(self.text_field)
        if key is None or text is None:
            return item
        if isinstance(text, (list, tuple)):  # what a selector's getall() gives
            text = "\n".join(text)
        meta = {name: fields[name] for name in self.meta_fields if name in fields} or None
        decision = await self._decide(key, text, meta, self.html)
        if self.status_field:
            fields[self.status_field] = decision.status
        if decision.status in self.drop:
            raise DropItem("%s is %s" % (key, self._why(decision)))
        return item


class NearDuplicateMiddleware(_Component):
    """A downloader middleware that decides on each HTML response (keyed by its
    URL) and drops those whose status is in ``SIMHASHDB_DROP`` before the
    spider parses them (their requests' errbacks get IgnoreRequest).

    Usage: ``DOWNLOADER_MIDDLEWARES = {"simhashdb.scrapy.NearDuplicateMiddleware": 540}``
    (below the retry, redirect and decompression middlewares, so that it sees
    the final body) and ``SIMHASHDB_PATH`` in the settings.
    """

    def __init__(self, crawler):
        super().__init__(crawler)  # a downloader middleware is told of the spider by signals
        crawler.signals.connect(self.open_spider, signal=signals.spider_opened)
        crawler.signals.connect(self.close_spider, signal=signals.spider_closed)

    async def process_response(self, request, response, spider=None):
        if (not isinstance(response, HtmlResponse) or response.status != 200
                or request.meta.get("simhashdb") is False):
            return response
        decision = await self._decide(response.url, response.text, None, self.html or True)
        request.meta["simhashdb_decision"] = decision
        if decision.status in self.drop:
            raise IgnoreRequest("%s is %s" % (response.url, self._why(decision)))
        return response
