"""The docs test's own parts: the markers are read from the line before a fence, shell lines
are split as a reader would type them, and a failing block fails the page naming its line."""
import json
import subprocess
import sys

from support.doc_blocks import TESTS_ROOT, blocks_of_text, command_lines, expected_exit_status

PAGE = """Intro.

<!-- fragment: examples/train_digits.py -->
```python
step(x)
```

<!-- save-as: train.py -->
```python
print("hi")
```

  ```bash
  fleetlite strategy show a.yaml \\
      --flag   # a comment
  # only a comment
  fleetlite strategy diff a.yaml b.yaml   # exit 1 when they differ
  ```

```
fleetlite compile report: output
```
"""


def test_markers_tags_and_indented_fences_are_read():
    found = blocks_of_text("page.md", PAGE)
    assert [(b.line, b.language, b.marker, b.target) for b in found] == [
        (4, "python", "fragment", "examples/train_digits.py"), (9, "python", "save-as", "train.py"),
        (13, "bash", "", ""), (20, "text", "", "")]
    assert found[1].text == 'print("hi")\n'


def test_shell_lines_join_continuations_drop_comments_and_read_the_expected_status():
    commands = command_lines(blocks_of_text("page.md", PAGE)[2])
    assert commands == ["fleetlite strategy show a.yaml --flag   # a comment",
                        "fleetlite strategy diff a.yaml b.yaml   # exit 1 when they differ"]
    assert [expected_exit_status(command) for command in commands] == [0, 1]


def test_the_page_runner_shares_names_between_blocks_and_names_the_failing_block(tmp_path):
    steps = [{"where": "p.md:3", "kind": "python", "text": "value = 41\n"},
             {"where": "p.md:7", "kind": "save", "text": "print(value + 1)\n", "target": "t.py"},
             {"where": "p.md:9", "kind": "command", "text": "test -f t.py", "status": 0},
             {"where": "p.md:12", "kind": "python", "text": "assert value == 41\nundefined_name\n"},
             {"where": "p.md:20", "kind": "python", "text": "raise SystemExit('not reached')\n"}]
    (tmp_path / "steps.json").write_text(json.dumps(steps))
    finished = subprocess.run([sys.executable, "-m", "support.doc_page_runner", str(tmp_path / "steps.json")],
                              cwd=tmp_path, env={"PYTHONPATH": str(TESTS_ROOT), "PATH": "/usr/bin:/bin"},
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=60)
    assert finished.returncode == 1
    assert "ok in" in finished.stdout and "p.md:9" in finished.stdout
    assert "DOC BLOCK FAILED: p.md:12" in finished.stdout
    assert "NameError: name 'undefined_name' is not defined" in finished.stdout
    assert "p.md:20" not in finished.stdout


def test_a_command_must_exit_with_the_status_its_line_states(tmp_path):
    steps = [{"where": "p.md:5", "kind": "command", "text": "false   # exit 1 here", "status": 1},
             {"where": "p.md:6", "kind": "command", "text": "true", "status": 1}]
    (tmp_path / "steps.json").write_text(json.dumps(steps))
    finished = subprocess.run([sys.executable, "-m", "support.doc_page_runner", str(tmp_path / "steps.json")],
                              cwd=tmp_path, env={"PYTHONPATH": str(TESTS_ROOT), "PATH": "/usr/bin:/bin"},
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=60)
    assert finished.returncode == 1
    assert "DOC BLOCK FAILED: p.md:6" in finished.stdout and "exited 0, the page expects 1" in finished.stdout
