"""`make demo` (README's first command) is what the README says: fleetrun training the digits
example on 2 CPU processes with the CPU preset. The docs test runs that command line itself
(README's `fleetrun --nproc_per_node 2 examples/train_digits.py ...`); this keeps the Makefile's
recipe the same command."""
import shlex

from support.doc_blocks import REPOSITORY


def _recipe(target):
    lines = (REPOSITORY / "Makefile").read_text().splitlines()
    start = next(index for index, line in enumerate(lines) if line.startswith(f"{target}:"))
    recipe = []
    for line in lines[start + 1:]:
        if not line.startswith("\t"):
            break
        recipe.append(line.strip().rstrip("\\"))
    return shlex.split(" ".join(recipe))


def test_make_demo_runs_the_digits_example_on_two_processes_with_the_cpu_preset():
    words = _recipe("demo")
    assert words[0].endswith("/bin/fleetrun")
    assert words[words.index("--nproc_per_node") + 1] == "2"
    assert "examples/train_digits.py" in words
    assert words[words.index("--strategy") + 1] == "configs/cpu_gloo.yaml"
