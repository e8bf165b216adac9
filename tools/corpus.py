"""Corpora of real documents for tools/eval_quality.py, each document a dict
``{"kind", "source", "html", "text"}``.

``debian_corpus``: thousands of documents of several kinds from Debian's
documentation packages (``apt-get install`` them first, see DEBIAN_PACKAGES);
rendered once and cached as JSON lines. ``python_corpus``: a small one from
what any Python installation has, for the test suite.

Kinds: ``prose`` (reST and AsciiDoc sources of manuals), ``html`` (manual
pages that share a site template: Sphinx, DocBook, AsciiDoc), ``code``
(Python standard library), ``licence`` (Debian copyright files and the
common licences), ``man`` (English man pages rendered to text), ``cjk``
(Japanese and Chinese man pages, Debian Handbook in Chinese, Japanese and
Korean, as HTML). Held out from tuning: ``relnotes`` (Git's release notes:
one template, many versions) and ``l10n-html`` (the Debian Handbook in
European languages).

``held_out_corpus``: kinds the project never tuned on, from other Debian
packages (HELD_OUT_PACKAGES), never used to choose parameters: ``perl-pod``
(Perl's POD manuals), ``pg-html`` (PostgreSQL's HTML manual, one DocBook
template), ``kernel-rst`` (the Linux kernel's reST documentation sources),
``kernel-html`` (the same rendered by Sphinx, another template than
Python's), ``changelog`` (Debian changelogs: one format, many versions).
Cached apart from the tuning corpus, so adding it changes no tuned document.
"""

import concurrent.futures
import gzip
import json
import os
import pathlib
import random
import subprocess
import sysconfig

DEBIAN_PACKAGES = ("python3.11-doc debian-reference-en debian-reference-ja "
                   "debian-reference-zh-cn debian-handbook manpages-ja manpages-zh git-doc "
                   "developers-reference maint-guide")
HELD_OUT_PACKAGES = "perl-doc postgresql-doc-15 linux-doc"
HELD_OUT = ("relnotes", "l10n-html", "perl-pod", "pg-html", "kernel-rst", "kernel-html",
            "changelog")
MIN_CHARS, MAX_CHARS = 500, 200_000
CACHE = pathlib.Path(__file__).resolve().parent.parent / ".corpus" / "debian.jsonl"
HELD_OUT_CACHE = CACHE.with_name("held-out.jsonl")
DOC = pathlib.Path("/usr/share/doc")


def _read(path):
    data = path.read_bytes()
    if path.suffix == ".gz":
        data = gzip.decompress(data)
    return data.decode("utf-8", "replace")


def _man(path):
    """A man page rendered to plain text (man-db, 80 columns, no overstrikes)."""
    env = dict(os.environ, MANWIDTH="80", LC_ALL="C.UTF-8")
    rendered = subprocess.run(["man", "-l", "-E", "UTF-8", str(path)], env=env,
                              capture_output=True, timeout=60).stdout
    plain = subprocess.run(["col", "-bx"], input=rendered, env=env, capture_output=True).stdout
    return plain.decode("utf-8", "replace")


def _sources(rng):
    """(kind, path, html, reader) of every candidate document, kinds in order."""
    py = DOC / "python3.11" / "html"
    handbook = DOC / "debian-handbook" / "html"
    git = DOC / "git-doc"
    stdlib = pathlib.Path(sysconfig.get_paths()["stdlib"])
    kinds = {
        "prose": [(p, False) for p in sorted((py / "_sources").rglob("*.txt"))]
        + [(p, False) for p in sorted(git.rglob("*.txt"))],
        "html": [(p, True) for p in sorted(py.rglob("*.html")) if "_static" not in p.parts]
        + [(p, True) for p in sorted((handbook / "en-US").glob("*.html"))]
        + [(p, True) for p in sorted(git.rglob("*.html"))]
        + [(p, True) for d in ("developers-reference", "maint-guide")
           for p in sorted((DOC / d).rglob("*.en.html")) + sorted((DOC / d).rglob("*/index.html"))],
        "code": [(p, False) for p in sorted(stdlib.rglob("*.py"))
                 if "site-packages" not in p.parts and "test" not in p.parts],
        "licence": [(p, False) for p in sorted(DOC.glob("*/copyright"))]
        + [(p, False) for p in sorted(pathlib.Path("/usr/share/common-licenses").iterdir())],
        "man": [(p, False) for s in ("man1", "man3", "man5", "man8")
                for p in sorted((pathlib.Path("/usr/share/man") / s).iterdir())],
        "cjk": [(p, False) for lang in ("ja", "zh_CN")
                for p in sorted((pathlib.Path("/usr/share/man") / lang).rglob("*.gz"))]
        + [(p, True) for lang in ("ja-JP", "zh-CN", "zh-TW", "ko-KR")
           for p in sorted((handbook / lang).glob("*.html"))],
        "relnotes": [(p, False) for p in sorted((DOC / "git" / "RelNotes").iterdir())],
        "l10n-html": [(p, True) for lang in ("de-DE", "fr-FR", "es-ES", "it-IT", "pt-BR",
                                             "ru-RU", "nl-NL")
                      for p in sorted((handbook / lang).glob("*.html"))],
    }
    caps = {"code": 1500, "man": 1500}
    for kind, items in kinds.items():
        items = [(p, h) for p, h in items if p.is_file() and not p.is_symlink()]
        rng.shuffle(items)
        for path, html in items[:caps.get(kind, len(items)) * 2]:
            man = kind == "man" or (kind == "cjk" and "/man/" in str(path))
            yield kind, path, html, _man if man else _read


def _load(item):
    kind, path, html, reader = item
    try:
        text = reader(path)
    except (OSError, subprocess.SubprocessError, EOFError):
        return None
    if not MIN_CHARS <= len(text) <= MAX_CHARS or "\x00" in text:
        return None
    return {"kind": kind, "source": str(path), "html": html, "text": text}


def debian_corpus(rebuild=False):
    """The Debian documentation corpus (see module docstring), cached."""
    if CACHE.exists() and not rebuild:
        with CACHE.open() as f:
            return [json.loads(line) for line in f]
    missing = [p for p in DEBIAN_PACKAGES.split()
               if subprocess.run(["dpkg", "-s", p], capture_output=True).returncode]
    if missing:
        raise SystemExit("install the corpus first: apt-get install " + " ".join(missing))
    caps = {"code": 1500, "man": 1500}
    counts, docs = {}, []
    with concurrent.futures.ThreadPoolExecutor(4) as pool:
        for doc in pool.map(_load, _sources(random.Random(0)), chunksize=8):
            if doc and counts.get(doc["kind"], 0) < caps.get(doc["kind"], 10 ** 9):
                counts[doc["kind"]] = counts.get(doc["kind"], 0) + 1
                docs.append(doc)
    CACHE.parent.mkdir(exist_ok=True)
    with CACHE.open("w") as f:
        for doc in docs:
            f.write(json.dumps(doc) + "\n")
    return docs


def _held_out_sources(rng):
    """(kind, path, html, reader) of the held-out kinds, each kind shuffled."""
    kernel = DOC / "linux-doc"
    kinds = {
        "perl-pod": sorted(p for root in ("/usr/share/perl", "/usr/share/perl5")
                           for p in pathlib.Path(root).rglob("*.pod")),
        "pg-html": sorted((DOC / "postgresql-doc-15" / "html").glob("*.html")),
        "kernel-rst": sorted((kernel / "Documentation").rglob("*.rst.gz")),
        "kernel-html": sorted(p for p in (kernel / "html").rglob("*.html")
                              if "_static" not in p.parts and "_sources" not in p.parts),
        "changelog": sorted(DOC.glob("*/changelog.Debian.gz")),
    }
    for kind, paths in kinds.items():
        paths = [p for p in paths if p.is_file() and not p.is_symlink()]
        rng.shuffle(paths)
        for path in paths[:HELD_OUT_CAP * 2]:
            yield kind, path, kind.endswith("html"), _read


HELD_OUT_CAP = 800


def held_out_corpus(rebuild=False):
    """The held-out kinds (see module docstring), cached; [] with a note on
    stderr where their packages are missing."""
    if HELD_OUT_CACHE.exists() and not rebuild:
        with HELD_OUT_CACHE.open() as f:
            return [json.loads(line) for line in f]
    missing = [p for p in HELD_OUT_PACKAGES.split()
               if subprocess.run(["dpkg", "-s", p], capture_output=True).returncode]
    if missing:
        raise SystemExit("install the held-out corpus first: apt-get install " + " ".join(missing))
    counts, docs = {}, []
    for doc in map(_load, _held_out_sources(random.Random(0))):
        if doc and counts.get(doc["kind"], 0) < HELD_OUT_CAP:
            counts[doc["kind"]] = counts.get(doc["kind"], 0) + 1
            docs.append(doc)
    HELD_OUT_CACHE.parent.mkdir(exist_ok=True)
    with HELD_OUT_CACHE.open("w") as f:
        for doc in docs:
            f.write(json.dumps(doc) + "\n")
    return docs
