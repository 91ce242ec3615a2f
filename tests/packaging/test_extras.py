"""The user guide's install line (`pip install '.[cpu]'`) brings everything the examples and
`write_records --digits` import: each third-party module they import is a requirement of the
package or of the `cpu` extra (and, Paddle aside, of the `examples` extra for GPU users)."""
import ast
import configparser
import importlib.metadata
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
USER_CODE = sorted((ROOT / "examples").glob("*.py")) + [ROOT / "fleetlite" / "data" / "write_records.py"]
PADDLE = "paddlepaddle"    # GPU users install paddlepaddle-gpu instead, from Paddle's index


def imported_distributions(path):
    """The installed distributions whose top-level modules `path` imports (fleetlite's own left out)."""
    local = {p.stem for p in (ROOT / "examples").glob("*.py")}
    modules = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            modules |= {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0:
            modules.add(node.module.split(".")[0])
    third_party = modules - set(sys.stdlib_module_names) - local - {"fleetlite"}
    owners = importlib.metadata.packages_distributions()
    return {owners[module][0].lower() for module in third_party}


def requirement_names(lines):
    return {re.split(r"[<>=!~;\[ ]", line.strip(), maxsplit=1)[0].lower() for line in lines.splitlines() if line.strip()}


def with_their_dependencies(names):
    """`names` and what each installed one requires unconditionally (Pillow comes with Paddle)."""
    required = set(names)
    for name in names:
        for line in importlib.metadata.requires(name) or ():
            if "extra ==" not in line:
                required |= requirement_names(line)
    return required


def test_the_cpu_extra_installs_what_the_examples_and_write_records_import():
    """scikit-learn was only in the test and bench extras: `pip install '.[cpu]'` then failed on
    `import sklearn` in every example."""
    config = configparser.ConfigParser()
    config.read(ROOT / "setup.cfg")
    base = requirement_names(config["options"]["install_requires"])
    cpu = requirement_names(config["options.extras_require"]["cpu"])
    examples = requirement_names(config["options.extras_require"]["examples"])
    needed = set().union(*(imported_distributions(path) for path in USER_CODE))
    assert "scikit-learn" in needed and PADDLE in needed       # what the examples are made of
    assert needed - with_their_dependencies(base | cpu) == set()
    assert needed - with_their_dependencies(base | examples | {PADDLE}) == set()


def test_write_records_digits_without_scikit_learn_says_what_to_install(tmp_path, monkeypatch, capsys):
    from fleetlite.data import write_records
    monkeypatch.setitem(sys.modules, "sklearn", None)          # import sklearn then raises ImportError
    monkeypatch.setitem(sys.modules, "sklearn.datasets", None)
    assert write_records.main([str(tmp_path / "digits"), "--digits"]) == 2
    assert capsys.readouterr().err == (
        "write_records: error: --digits reads scikit-learn's embedded digits, and scikit-learn is not installed: "
        "pip install 'fleetlite[cpu]' (or 'fleetlite[examples]' beside a GPU Paddle)\n")
