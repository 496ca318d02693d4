"""The documentation: mkdocs builds docs/ strictly, every page is in mkdocs.yml's nav, every relative link of
README.md and docs/ leads to a file (and heading) that exists.

    .venv/bin/python -m pytest tests/workflow/test_docs.py
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import yaml

from tests.conftest import REPO

DOCS = REPO / "docs"
PAGES = sorted(DOCS.glob("*.md"))
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")


def nav_pages(entries: list) -> list[str]:
    """The page files mkdocs.yml's nav names, sections flattened."""
    found = []
    for entry in entries:
        for value in entry.values() if isinstance(entry, dict) else [entry]:
            found += nav_pages(value) if isinstance(value, list) else [value]
    return found


def anchors(page: Path) -> set[str]:
    """The ids mkdocs gives a page's headings (its toc extension's slugs: lower case, punctuation dropped)."""
    body = re.sub(r"^```.*?^```", "", page.read_text(), flags=re.M | re.S)
    titles = re.findall(r"^#+ +(.+?) *$", body, re.M)
    return {re.sub(r"[\s-]+", "-", re.sub(r"[^\w\s-]", "", title.replace("`", "")).strip().lower()) for title in titles}


def test_the_site_builds_strictly_without_a_warning(tmp_path):
    done = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--config-file", str(REPO / "mkdocs.yml")]
        + ["--site-dir", str(tmp_path / "site")],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0 and "WARNING" not in done.stderr, done.stderr[-3000:]
    assert {p.stem for p in PAGES} <= {p.stem for p in (tmp_path / "site").glob("*.html")}


def test_every_page_is_in_the_nav_and_every_nav_entry_is_a_page():
    nav = nav_pages(yaml.safe_load((REPO / "mkdocs.yml").read_text())["nav"])
    assert sorted(nav) == sorted(set(nav)), "a page is in mkdocs.yml's nav twice"
    assert set(nav) == {p.name for p in PAGES}, set(nav) ^ {p.name for p in PAGES}


def test_every_relative_link_leads_to_a_file_and_heading_that_exist():
    broken = []
    for page in [REPO / "README.md", *PAGES]:
        for target in LINK.findall(page.read_text()):
            if re.match(r"[a-z]+:", target):
                continue  # a web address: not checked, no network in tests
            path, _, anchor = target.partition("#")
            file = (page.parent / path).resolve() if path else page
            if not file.is_file() or (anchor and file.suffix == ".md" and anchor not in anchors(file)):
                broken.append(f"{page.relative_to(REPO)}: {target}")
    assert not broken, broken
