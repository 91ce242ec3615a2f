"""The copyable blocks of the documentation, and the markers that say how each is checked.

A fenced block tagged `python`, `bash` (or `sh`, `shell`) or `yaml` is copyable: the docs tests
run it as written, unless the HTML comment on the line before it says otherwise. The
convention is stated for writers at the end of docs/index.md:

    <!-- fragment: examples/train_digits.py -->   not run: an excerpt of that file, which a test runs
    <!-- save-as: train.py -->                    written to train.py in the page's scratch folder
                                                  for the page's later blocks (e.g. fleetrun ... train.py)

A fenced block with no tag is program output or pseudo-code, never a command.
"""
import re
from dataclasses import dataclass
from pathlib import Path

REPOSITORY = Path(__file__).resolve().parents[2]
TESTS_ROOT = REPOSITORY / "tests"
RUN_LANGUAGES = {"python": "python", "bash": "bash", "sh": "bash", "shell": "bash", "yaml": "yaml"}
TEXT_LANGUAGES = {"", "text"}
MARKER = re.compile(r"^<!--\s*(fragment|save-as):\s*(\S+)\s*-->\s*$")
FENCE = re.compile(r"^(\s*)```(\S*)\s*$")


@dataclass(frozen=True)
class Block:
    page: str          # repository-relative path of the markdown file
    line: int          # line number of the opening fence
    language: str      # "python", "bash", "yaml" or "text"
    text: str
    marker: str = ""   # "", "fragment" or "save-as"
    target: str = ""   # the marker's file

    @property
    def where(self):
        return f"{self.page}:{self.line}"


def pages():
    """README.md and every page under docs/, repository-relative, in a stable order."""
    found = [REPOSITORY / "README.md", *sorted((REPOSITORY / "docs").rglob("*.md"))]
    return [str(path.relative_to(REPOSITORY)) for path in found]


def blocks(page):
    """The fenced blocks of `page`, each with the marker on the line before its fence."""
    return blocks_of_text(page, (REPOSITORY / page).read_text(encoding="utf-8"))


def blocks_of_text(page, text):
    lines = text.splitlines()
    found, index = [], 0
    while index < len(lines):
        opening = FENCE.match(lines[index])
        if not opening:
            index += 1
            continue
        indent, tag = opening.groups()
        end = index + 1
        while end < len(lines) and not FENCE.match(lines[end]):
            end += 1
        body = "\n".join(_dedent(line, indent) for line in lines[index + 1:end]) + "\n"
        marker = MARKER.match(lines[index - 1].strip()) if index else None
        language = RUN_LANGUAGES.get(tag, "text" if tag in TEXT_LANGUAGES else tag)
        found.append(Block(page, index + 1, language, body, *(marker.groups() if marker else ("", ""))))
        index = end + 1
    return found


def command_lines(block):
    """A shell block's commands: continuation lines joined, blank and comment-only lines dropped."""
    commands, pending = [], []
    for line in block.text.splitlines():
        pending.append(line.strip())
        if pending[-1].endswith("\\"):
            pending[-1] = pending[-1][:-1].rstrip()
            continue
        command = " ".join(pending).strip()
        if command and not command.startswith("#"):
            commands.append(command)
        pending = []
    return commands


def expected_exit_status(command):
    """0, or N where the line's comment says `exit N` (e.g. `strategy diff ... # exit 1 when they differ`)."""
    comment = re.search(r"#\s*exits? (\d+)\b", command)
    return int(comment.group(1)) if comment else 0


def _dedent(line, indent):
    return line[len(indent):] if line.startswith(indent) else line.lstrip()
