"""Short pages and site templates, measured: a crawler's dedupe of real HTML
pages under their site's template, read whole (``html=True``), as their main
content (``html="main"``, or a main-content extractor of PyPI), with and
without ``short_words``.

The pages (``apt-get install python3.11-doc``): Python's HTML manual, 530
full pages of one Sphinx template (its menus marked up as navigation), and
short pages made of the opening 15 to 100 words of each manual page under
the template of another site (a menu and a footer of 60 words; one site in
two marks them up as ``nav``/``header``/``footer``, the other as plain
``div`` elements, which only an extractor that reads the text's shape, or
``short_words``, can tell from content). Copies of one page in three are
planted after their original, edited by kind: ``copy`` (the same page under
another URL), ``date`` (the template's date changed), ``comment`` (an HTML
comment), ``ad`` (a paragraph of 40 words injected into the content; full
pages only), ``reword`` (one content word in 50 replaced), ``mirror`` (the
content under another site's template).

Each way decides every page in one shuffled stream through
``DB.insert_text_if_new_many`` (batches of 1,000). Reported per way and for
full and short pages apart: the false drops (an original page flagged as a
near-duplicate of a page whose content shares under 0.3 of its word
5-shingles), the planted copies found by kind (of those whose original was
stored, the others having no original to find), and milliseconds a page to
read and decide (extraction, fingerprinting, the decision).

Usage: python tools/eval_templates.py [--seed N] [--extractors] [--short-words N ...]
(``--extractors`` adds resiliparse's and trafilatura's main content, when
installed: ``pip install resiliparse trafilatura``.)
"""

import argparse
import collections
import pathlib
import random
import re
import tempfile
import time

import simhashdb
from simhashdb.fingerprint import main_content, strip_html

MANUAL = pathlib.Path("/usr/share/doc/python3.11/html")
SITE_MENU = ("Home Products Solutions Pricing Documentation Downloads Community Forum Blog "
             "Events Careers About us Contact Support Partners Press Sign in Register Search "
             "this site English Deutsch Francais Espanol").split()
SITE_FOOTER = ("Follow us Copyright 2026 Example Corporation All rights reserved Privacy policy "
               "Terms of use Cookie settings Sitemap Accessibility Status Security Newsletter "
               "Made with care in Europe Report a problem with this page").split()
MIRROR = ("Mirror of the Python documentation hosted by the University library computing "
          "service Mirrors list Contact the mirror team Our other mirrors Debian Ubuntu "
          "Fedora Arch CPAN CRAN Last synchronised").split()
FOREIGN = ("advertisement sponsored offer discount subscribe premium members exclusive deal "
           "limited shipping free trial coupon savings partner brand product").split()
KINDS = {"full": ("copy", "date", "comment", "ad", "reword", "mirror"),
         "short": ("copy", "date", "comment", "reword", "mirror")}


def shingles(text):
    words = re.findall(r"\w+", text.casefold())
    return {tuple(words[i:i + 5]) for i in range(max(len(words) - 4, 1))}


def jaccard(a, b):
    return len(a & b) / len(a | b) if a or b else 1.0


def site_page(title, content, date, tagged, menu=SITE_MENU, footer=SITE_FOOTER):
    """A page of another site: its menu and footer around ``content``
    (markup), marked up as navigation when ``tagged``."""
    head, nav, foot = ("header", "nav", "footer") if tagged else ("div", "div", "div")
    return ("<html><body><%s><b>Example</b> <%s>%s</%s></%s><div class='content'><h1>%s</h1>"
            "%s</div><%s>%s Updated %s</%s></body></html>"
            % (head, nav, " ".join(menu), nav, head, title, content, foot, " ".join(footer),
               date, foot))


def corpus(rng):
    """[(key, html, group, content shingles)] of the manual's pages and the
    short pages, originals only."""
    pages = []
    for i, path in enumerate(sorted(MANUAL.rglob("*.html"))):
        html = path.read_text(encoding="utf-8", errors="replace")
        content = strip_html(main_content(html))
        pages.append(("full/%s" % path.relative_to(MANUAL), html, "full", shingles(content)))
        opening = " ".join(content.split()[:rng.randrange(15, 101)])
        tagged = i % 2 == 0
        short = site_page(path.stem, "<p>%s</p>" % opening, "2026-11-%02d" % (1 + i % 28),
                          tagged)
        pages.append(("short-%s/%s" % ("tagged" if tagged else "plain", path.stem), short,
                      "short", shingles(opening)))
    return pages


def edited(html, kind, rng):
    """``html`` edited by ``kind`` (see the module's docstring)."""
    if kind == "copy":
        return html
    if kind == "comment":
        return html.replace("<body>", "<body><!-- cached copy %d -->" % rng.randrange(10**6), 1)
    if kind == "date":
        replaced, n = re.subn(r"(Last updated on|Updated) [^<.]*", r"\1 Dec 01, 2026", html,
                              count=1)
        return replaced if n else html.replace("</body>", "<p>Updated Dec 01, 2026</p></body>")
    if kind == "ad":
        ad = "<p>%s</p>" % " ".join(rng.choice(FOREIGN) for _ in range(40))
        return re.sub(r'(role="main"[^>]*>)', lambda m: m.group(1) + ad, html, count=1)
    if kind == "reword":
        parts = re.split(r"(<[^>]*>)", html)
        texts = [i for i, part in enumerate(parts) if part and not part.startswith("<")]
        for i in texts:
            parts[i] = re.sub(r"\b[a-z]{4,}\b", lambda m: rng.choice(FOREIGN)
                              if rng.random() < 0.02 else m.group(0), parts[i])
        return "".join(parts)
    if kind == "mirror":
        return site_page("Mirror", main_content(html), "2026-12-01", False, MIRROR, MIRROR[:8])
    raise ValueError(kind)


def stream(pages, rng):
    """The originals shuffled, a copy of one in three planted after it:
    [(key, html, group, original key or None, kind)]."""
    order = [(key, html, group, None, None) for key, html, group, _ in pages]
    rng.shuffle(order)
    planted = []
    for position, (key, html, group, _, _) in enumerate(order):
        if rng.random() < 1 / 3:
            kind = rng.choice(KINDS[group])
            planted.append((rng.randrange(position + 1, len(order) + 1),
                            (key + "#" + kind, edited(html, kind, rng), group, key, kind)))
    for at, item in sorted(planted, key=lambda p: -p[0]):
        order.insert(at, item)
    return order


def run(name, order, content, read, html, short_words):
    """Decide ``order``, each page's text ``read`` from its markup and given
    as ``html``; the report's row."""
    start = time.perf_counter()
    records = [(key, read(markup)) for key, markup, _, _, _ in order]
    with tempfile.TemporaryDirectory() as tmp, \
            simhashdb.DB(tmp + "/db", recipe=simhashdb.RECIPE) as db:
        decision = dict(zip((key for key, _ in records), db.insert_text_if_new_many(
            records, html=html, short_words=short_words)))
    row = collections.Counter()
    for key, _, group, original, kind in order:
        found = decision[key]
        if original is None:
            row[group, "pages"] += 1
            if found.status == "duplicate" and all(
                    jaccard(content[key], content[m.key.split("#")[0]]) < 0.3 for m in found):
                row[group, "false"] += 1
        elif decision[original].status == "stored":  # a copy can find its original
            row[group, kind, "planted"] += 1
            row[group, kind, "found"] += found.status == "duplicate" and any(
                m.key.split("#")[0] == original for m in found)
    row["ms"] = 1000 * (time.perf_counter() - start) / len(order)
    return name, row


def readers(extractors):
    """{name: (markup -> text, html option of insert_text_if_new)}."""
    ways = {"html=True": (str, True), 'html="main"': (str, "main")}
    if extractors:  # an empty extraction is an invalid page: counted as stored
        from resiliparse.extract.html2text import extract_plain_text
        import trafilatura
        ways["resiliparse"] = (lambda h: extract_plain_text(h, main_content=True), False)
        ways["trafilatura"] = (lambda h: trafilatura.extract(h) or "", False)
    return ways


def report(rows):
    for group in ("full", "short"):
        kinds = KINDS[group]
        print("\n%s pages\n" % group)
        print("| way | false drops | " + " | ".join(kinds) + " | all copies | ms a page |")
        print("|---|---|" + "---|" * (len(kinds) + 2))
        for name, row in rows:
            found = sum(row[group, k, "found"] for k in kinds)
            planted = sum(row[group, k, "planted"] for k in kinds)
            print("| %s | %d of %d | %s | %d/%d | %.2f |" % (
                name, row[group, "false"], row[group, "pages"],
                " | ".join("%d/%d" % (row[group, k, "found"], row[group, k, "planted"])
                           for k in kinds), found, planted, row["ms"]))


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--extractors", action="store_true")
    parser.add_argument("--short-words", type=int, nargs="*", default=[132])
    args = parser.parse_args()
    rng = random.Random(args.seed)
    pages = corpus(rng)
    content = {key: shingles_ for key, _, _, shingles_ in pages}
    order = stream(pages, rng)
    rows = []
    for name, (read, html) in readers(args.extractors).items():
        for short_words in [0] + args.short_words:
            label = name + (", short_words=%d" % short_words if short_words else "")
            rows.append(run(label, order, content, read, html, short_words))
            print(label, "done", flush=True)
    report(rows)


if __name__ == "__main__":
    main()
