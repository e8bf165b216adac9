"""MkDocs hooks (mkdocs.yml: ``hooks``) that make the repository's own
README.md the site's home page and ARCHITECTURE.md one of its pages, so each
is written once and read the same on a checkout and on the site.

The Markdown files link to each other by their paths in the repository
(README.md to ``docs/cli.md``, a page to ``../ARCHITECTURE.md``); a link is
rewritten to the page it names on the site. A link to anything else outside
``docs/`` is left as written, so ``mkdocs build --strict`` reports it.
"""

import os
import posixpath
import re

from mkdocs.structure.files import File

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# a file at the repository's root -> its page on the site
PAGES = {"README.md": "index.md", "ARCHITECTURE.md": "architecture.md"}
SITE = {page: name for name, page in PAGES.items()}
LINK = re.compile(r"(\]\()([^)#\s]+\.md)(#[^)\s]*)?(\))")
ROLE = re.compile(r":(?:meth|func|class|mod|attr|exc|data):(<code>)")


def on_files(files, config):
    for name, page in PAGES.items():
        files.append(File.generated(config, page, abs_src_path=os.path.join(ROOT, name)))
    return files


def on_page_markdown(markdown, page, config, files):
    here = SITE.get(page.file.src_uri, "docs/" + page.file.src_uri)  # its path in the repository

    def site_link(match):
        target = posixpath.normpath(posixpath.join(posixpath.dirname(here), match.group(2)))
        if target in PAGES:
            target = PAGES[target]
        elif target.startswith("docs/"):
            target = target[len("docs/"):]
        else:
            return match.group(0)
        return match.group(1) + target + (match.group(3) or "") + match.group(4)

    return LINK.sub(site_link, markdown)


def on_page_content(html, page, config, files):
    """Docstrings cross-reference as Sphinx does (:meth:`insert`); on the
    site the name shows as code, without the role."""
    return ROLE.sub(r"\1", html)
