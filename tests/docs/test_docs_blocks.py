"""Every copyable block of README.md and docs/ works as written, or says which tested file it comes from.

Each page's python blocks and command lines run in order in one child process, in a scratch
folder that holds the repository's configs/ and examples/ (the paths the pages use), with this
environment's `fleetrun`, `fleetlite` and `python` first on PATH. A block marked
`<!-- fragment: FILE -->` is not run: FILE must exist and a test must run it. YAML blocks must
load as strategies. The markers are described at the end of docs/index.md.
"""
import json
import os
import re
import signal
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from support.doc_blocks import REPOSITORY, TESTS_ROOT, blocks, command_lines, expected_exit_status, pages
from support.multiprocess import QUIET_CPU, clean_environment

PAGE_TIMEOUT_S = 240
PAGES_AT_ONCE = 2   # a page's child mostly waits (Paddle's import, its workers): two keep 2 cores busy
SCRATCH_LINKS = ("configs", "examples")
LOOKS_LIKE_A_COMMAND = re.compile(r"^\s*(fleetrun --|fleetlite (run|strategy|explain|tune) |python |pip install|make |import )")

def _runnable(page):
    return [block for block in blocks(page)
            if block.language in ("python", "bash") and block.marker != "fragment"]


def _steps(page_blocks):
    steps = []
    for block in page_blocks:
        if block.marker == "save-as":
            steps.append({"where": block.where, "kind": "save", "text": block.text, "target": block.target})
        elif block.language == "python":
            steps.append({"where": block.where, "kind": "python", "text": block.text})
        else:
            steps.extend({"where": block.where, "kind": "command", "text": command,
                          "status": expected_exit_status(command)} for command in command_lines(block))
    return steps


def _run_in_scratch(page_blocks, folder):
    """The exit status and output of the page runner on `page_blocks`, in `folder`."""
    for name in SCRATCH_LINKS:
        (folder / name).symlink_to(REPOSITORY / name)
    steps_file = folder.parent / f"{folder.name}.steps.json"
    steps_file.write_text(json.dumps(_steps(page_blocks)))
    environ = {**clean_environment(), **QUIET_CPU, "PYTHONPATH": str(TESTS_ROOT),
               "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"}
    child = subprocess.Popen([sys.executable, "-m", "support.doc_page_runner", str(steps_file)], cwd=folder,
                             env=environ, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                             errors="replace", start_new_session=True)
    try:
        output, _ = child.communicate(timeout=PAGE_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        os.killpg(child.pid, signal.SIGKILL)
        output, _ = child.communicate()
        pytest.fail(f"the blocks still ran after {PAGE_TIMEOUT_S} s:\n{output[-4000:]}")
    return child.returncode, output


def _run_page(page, folder):
    scratch = folder / "scratch"
    scratch.mkdir()
    return _run_in_scratch(_runnable(page), scratch)


PAGES_WITH_BLOCKS = [page for page in pages() if any(step["kind"] != "save" for step in _steps(_runnable(page)))]


@pytest.fixture(scope="module")
def page_runs(request, tmp_path_factory):
    """Every selected page's run, started at once, PAGES_AT_ONCE at a time, longest first."""
    selected = [item.callspec.params["page"] for item in request.session.items
                if getattr(item, "originalname", "") == "test_page_blocks_run_as_written"]
    selected.sort(key=lambda page: -len(_steps(_runnable(page))))
    with ThreadPoolExecutor(PAGES_AT_ONCE) as pool:
        yield {page: pool.submit(_run_page, page, tmp_path_factory.mktemp("page")) for page in selected}


@pytest.mark.parametrize("page", PAGES_WITH_BLOCKS)
def test_page_blocks_run_as_written(page, page_runs):
    status, output = page_runs[page].result()
    assert status == 0, output[-6000:]
    print(output)


def test_yaml_blocks_load_as_strategies(tmp_path):
    yaml_blocks = [block for page in pages() for block in blocks(page)
                   if block.language == "yaml" and block.marker != "fragment"]
    files = []
    for index, block in enumerate(yaml_blocks):
        path = tmp_path / f"block{index}.yaml"
        path.write_text(block.text)
        files.append((block.where, str(path)))
    script = ("import json, sys\nimport fleetlite as fleet\n"
              "for where, path in json.loads(sys.argv[1]):\n"
              "    try:\n        fleet.DistributedStrategy.load(path).validate()\n"
              "    except Exception as error:\n        sys.exit(f'{where}: {error}')\n")
    finished = subprocess.run([sys.executable, "-c", script, json.dumps(files)], capture_output=True, text=True,
                              timeout=120, env={**os.environ, **QUIET_CPU})
    assert finished.returncode == 0, finished.stderr[-3000:]
    assert len(files) > 20


def test_every_block_is_run_or_marked():
    """Only known tags; an untagged block is output, so it may not look like a command."""
    problems = []
    for page in pages():
        for block in blocks(page):
            if block.language not in ("python", "bash", "yaml", "text"):
                problems.append(f"{block.where}: tag ```{block.language}: use python, bash, yaml or text")
            elif block.language == "text" and LOOKS_LIKE_A_COMMAND.match(block.text):
                problems.append(f"{block.where}: an untagged block that looks like a command: tag it "
                                "bash or python (then it runs) and mark it if it cannot run")
            elif block.marker == "save-as" and block.language != "python":
                problems.append(f"{block.where}: save-as is for python blocks")
    assert not problems, "\n".join(problems)


def _tested_by_a_test(target):
    if target.startswith("tests/"):
        return True
    needle = re.compile(re.escape(target) + "|" + re.escape(Path(target).name))
    return any(needle.search(path.read_text(encoding="utf-8", errors="replace"))
               for path in TESTS_ROOT.rglob("*.py") if path.resolve() != Path(__file__).resolve())


def test_fragments_name_a_tested_file():
    problems = []
    for page in pages():
        for block in blocks(page):
            if block.marker != "fragment":
                continue
            if not (REPOSITORY / block.target).is_file():
                problems.append(f"{block.where}: fragment of {block.target}, which is not a file of the repository")
            elif not _tested_by_a_test(block.target):
                problems.append(f"{block.where}: fragment of {block.target}, which no test under tests/ runs")
    assert not problems, "\n".join(problems)
