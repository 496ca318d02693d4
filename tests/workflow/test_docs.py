"""The documentation: mkdocs builds docs/ strictly, every page is in mkdocs.yml's nav, every relative link of
README.md and docs/ leads to a file (and heading) that exists, and every command a ```bash block shows is one a test
runs (tests/doc_commands.py says which; the workflow commands run here as dry runs, the quick ones as shown).

    .venv/bin/python -m pytest tests/workflow/test_docs.py
"""

from __future__ import annotations

import ast
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tests.conftest import REPO
from tests.doc_commands import COMMANDS, DRY_RUN, RUN, Ran
from tests.support import LAYERS, snakemake

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


def shown_commands() -> dict[str, list[str]]:
    """Each command of a ```bash block of README.md and docs/ (a line `a && b` is two), and the pages showing it."""
    shown: dict[str, list[str]] = {}
    for page in [REPO / "README.md", *PAGES]:
        for block in re.findall(r"^```bash\n(.*?)^```", page.read_text(), re.M | re.S):
            for line in block.splitlines():
                for command in line.partition("#")[0].split("&&"):  # no shown command holds a # of its own
                    if command.strip():
                        shown.setdefault(command.strip(), []).append(page.relative_to(REPO).as_posix())
    return shown


def runs_it(ran: Ran) -> str | None:
    """What is wrong with `ran` as the test (or CI script) that runs a command, or None."""
    path, _, function = ran.node.partition("::")
    if not (REPO / path).is_file():
        return f"{path} does not exist"
    source = (REPO / path).read_text()
    if ran.fragment not in source:
        return f"{path} does not run {ran.fragment!r}"
    if function:
        defined = {n.name for n in ast.walk(ast.parse(source)) if isinstance(n, ast.FunctionDef)}
        if function.split("[")[0] not in defined:
            return f"{path} has no test {function}"
    return None


def test_every_command_the_pages_show_is_one_a_test_runs():
    shown = shown_commands()
    unrun = "; ".join(f"{c} ({', '.join(pages)})" for c, pages in shown.items() if c not in COMMANDS)
    assert not unrun, f"no test runs these (add one, then a line to tests/doc_commands.py): {unrun}"
    assert not COMMANDS.keys() - shown.keys(), f"no page shows these: {sorted(COMMANDS.keys() - shown.keys())}"
    wrong = {c: why for c, runners in COMMANDS.items() for r in runners if isinstance(r, Ran) and (why := runs_it(r))}
    assert not wrong, wrong
    for command in COMMANDS:
        words = shlex.split(command)
        if words[:3] == [".venv/bin/python", "-m", "pytest"]:
            assert all((REPO / w).exists() for w in words[3:] if not w.startswith("-")), command


def by(runner: str) -> list[str]:
    return [command for command, runners in COMMANDS.items() if runner in runners]


@pytest.mark.parametrize("command", by(DRY_RUN), ids=lambda c: c.removeprefix(".venv/bin/snakemake --profile "))
def test_a_workflow_command_the_pages_show_builds_its_dag(command, tmp_path):
    words = shlex.split(command)
    assert words[0] == ".venv/bin/snakemake", command
    args = [str(REPO / w) if w.startswith("profiles/") else w for w in words[1:]]
    assert "This was a dry-run" in snakemake(tmp_path, *args, "-n").output


@pytest.mark.parametrize("command", by(RUN))
def test_a_command_the_pages_show_runs(command, tmp_path):
    words = shlex.split(command)
    assert words[:2] == [".venv/bin/python", "-m"], command
    done = subprocess.run([sys.executable, *words[1:]], cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and done.stdout.strip(), done.stderr[-2000:]
    assert not list(tmp_path.iterdir()), "the command wrote into its working folder"


def test_the_architecture_page_gives_every_module_its_layer():
    """docs/architecture.md's table against the layers tests/unit/test_layers.py enforces."""
    table = re.findall(r"^\| (\d+) \| (.+?) \|", (DOCS / "architecture.md").read_text(), re.M)
    names = [(name, int(layer)) for layer, cell in table for name in re.findall(r"`([^`]+)`", cell)]
    documented = {name.removesuffix(".py").rstrip("/"): layer for name, layer in names}
    wrong = {k: (documented.get(k), LAYERS.get(k)) for k in sorted(documented.keys() | LAYERS.keys())}
    wrong = {k: f"page {page}, test_layers {code}" for k, (page, code) in wrong.items() if page != code}
    assert not wrong, f"give each its layer in docs/architecture.md's table, as test_layers does: {wrong}"
