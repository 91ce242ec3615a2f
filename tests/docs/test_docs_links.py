"""Every link and file path in README.md and docs/ names a file of this repository.

Markdown links to files must resolve (relative to their page, inside the repository); a
repository path written in backquotes (`tests/data/test_data_samplers.py`) must exist; and no
page may send the reader outside the repository to project notes (`notes/...`) they do not have.
"""
import re

from support.doc_blocks import REPOSITORY, pages

LINK = re.compile(r"\]\(([^)\s]+)\)")
CODE_PATH = re.compile(r"`((?:fleetlite|launcher|strategies|tests|examples|benchmarks|docs|configs)/[\w./-]+"
                       r"\.(?:py|md|cc|proto|yaml|prototxt|json))`")
OUTSIDE_NOTES = re.compile(r"\bnotes/\w+\.md")


def _page_text(page):
    return (REPOSITORY / page).read_text(encoding="utf-8")


def _anchors(path):
    """The anchors GitHub gives a page's headings: lower case, punctuation dropped, spaces to '-'."""
    headings = re.findall(r"^#+\s+(.+?)\s*$", path.read_text(encoding="utf-8"), re.MULTILINE)
    return {re.sub(r"[^\w\- ]", "", heading.lower()).replace(" ", "-") for heading in headings}


def test_markdown_links_resolve_inside_the_repository():
    problems = []
    for page in pages():
        for target in LINK.findall(_page_text(page)):
            if re.match(r"^[a-z]+:", target):
                continue
            file_part, _, anchor = target.partition("#")
            path = ((REPOSITORY / page).parent / file_part).resolve()
            if REPOSITORY not in path.parents and path != REPOSITORY:
                problems.append(f"{page}: link {target} leaves the repository")
            elif not path.exists():
                problems.append(f"{page}: link {target} names no file")
            elif anchor and path.suffix == ".md" and anchor not in _anchors(path):
                problems.append(f"{page}: link {target} names no heading of {file_part or page}")
    assert not problems, "\n".join(problems)


def test_repository_paths_in_backquotes_exist():
    problems = [f"{page}: `{path}` is not a file of the repository"
                for page in pages() for path in CODE_PATH.findall(_page_text(page))
                if not (REPOSITORY / path).is_file() and not path.startswith("configs/mine")]
    assert not problems, "\n".join(problems)


def test_no_page_cites_notes_outside_the_repository():
    problems = [f"{page}: cites {match} (project notes are not in the repository: state the fact here)"
                for page in pages() for match in OUTSIDE_NOTES.findall(_page_text(page))]
    assert not problems, "\n".join(problems)
