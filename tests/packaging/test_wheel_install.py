"""A user's install works: the wheel built from this checkout, installed (not editable) into a
fresh environment outside the checkout, holds every package and trains from an empty folder.

The wheel is built from a copy of the checkout's files (git's list: committed and new, not
ignored), never from a build/ folder an earlier build left. The environment is a venv whose
dependencies are this interpreter's (a .pth naming its site-packages folders, whose own .pth
files, the editable fleetlite's finder among them, Python does not run), so nothing is
downloaded and `import fleetlite` there finds only the installed wheel.
"""
import json
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path
from types import SimpleNamespace

import pytest

from support.multiprocess import clean_environment

ROOT = Path(__file__).resolve().parents[2]
PACKAGE_FOLDERS = {"fleetlite": "fleetlite", "launcher": "fleetlite/launcher", "strategies": "fleetlite/strategies"}
SHIPPED_DATA = (".py", ".proto", ".cc")
# every fleetlite module imported in the installed environment: (name, file) of each, and failures
IMPORT_EVERY_MODULE = """
import importlib, json, pkgutil, sys
import fleetlite
failed = []
names = [found.name for found in pkgutil.walk_packages(fleetlite.__path__, "fleetlite.",
                                                       onerror=lambda name: failed.append(name))
         if not found.name.endswith(".__main__")]           # `python -m` entry points, not imports
for name in names:
    try:
        importlib.import_module(name)
    except Exception as error:
        failed.append(f"{name}: {type(error).__name__}: {error}")
files = {name: sys.modules[name].__file__ for name in ["fleetlite", *names] if name in sys.modules}
print(json.dumps({"files": files, "failed": failed}))
"""


def run(command, cwd, timeout, env=None):
    result = subprocess.run(command, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    assert result.returncode == 0, f"{command} exited {result.returncode}:\n{result.stdout}\n{result.stderr}"
    return result


def copy_of_checkout(destination):
    listed = run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], ROOT, 30).stdout
    for name in filter(None, listed.split("\0")):
        if (ROOT / name).is_file():         # a tracked file deleted in the working tree is not there
            (destination / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / name, destination / name)
    return destination


def build_wheel(source, out):
    run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", "--no-index",
         "-w", str(out), str(source)], source, 120)
    (wheel,) = out.glob("fleetlite-*.whl")
    return wheel


def installed_venv(folder, wheel):
    """A venv with the wheel installed, then given this interpreter's dependencies (installing
    first: pip must not see the editable fleetlite's metadata as an installed fleetlite)."""
    run([sys.executable, "-m", "venv", "--without-pip", str(folder)], folder.parent, 60)
    python = folder / "bin" / "python"
    run([sys.executable, "-m", "pip", "--python", str(python), "install", "-q", "--no-deps", "--no-index",
         str(wheel)], folder.parent, 120)
    site = Path(run([str(python), "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"],
                    folder.parent, 30).stdout.strip())
    dependencies = [path for path in sys.path if path.endswith("-packages") and Path(path).is_dir()]
    (site / "dependencies.pth").write_text("\n".join(dependencies) + "\n")
    return SimpleNamespace(python=python, bin=folder / "bin", site=site)


@pytest.fixture(scope="module")
def installed():
    with tempfile.TemporaryDirectory(prefix="fleetlite-wheel-") as folder:
        folder = Path(folder)
        wheel = build_wheel(copy_of_checkout(folder / "source"), folder / "dist")
        venv = installed_venv(folder / "venv", wheel)
        empty = folder / "empty"
        empty.mkdir()
        env = {name: value for name, value in clean_environment().items() if name != "PYTHONPATH"}
        env["PATH"] = f"{venv.bin}{os.pathsep}{env.get('PATH', '')}"
        yield SimpleNamespace(wheel=wheel, empty=empty, env=env, **vars(venv))


def test_the_wheel_holds_every_package_file_of_the_checkout_and_nothing_else(installed):
    with zipfile.ZipFile(installed.wheel) as wheel:
        shipped = {name for name in wheel.namelist() if ".dist-info/" not in name}
    expected = set()
    for folder, package in PACKAGE_FOLDERS.items():
        listed = run(["git", "ls-files", "--cached", "--others", "--exclude-standard", folder], ROOT, 30).stdout
        for name in listed.split():
            if name.endswith(SHIPPED_DATA) and (ROOT / name).is_file():
                expected.add(package + name[len(folder):])
    assert "fleetlite/tuning/tuner.py" in expected and "fleetlite/proto/strategy.proto" in expected
    assert sorted(expected - shipped) == [], "files the wheel leaves out"
    assert sorted(shipped - expected) == [], "files the wheel ships that are not the package's"


def test_every_fleetlite_module_imports_from_the_installed_wheel(installed):
    result = run([str(installed.python), "-c", IMPORT_EVERY_MODULE], installed.empty, 120, installed.env)
    imported = json.loads(result.stdout.splitlines()[-1])
    assert imported["failed"] == []
    assert {"fleetlite.tuning.tuner", "fleetlite.launcher.main", "fleetlite.strategies.topk_exchange"} <= set(imported["files"])
    outside = {name: file for name, file in imported["files"].items() if not file.startswith(str(installed.site))}
    assert outside == {}, f"modules not from the installed wheel in {installed.site}"


def test_fleetlite_run_trains_the_digits_example_on_two_processes_from_an_empty_folder(installed):
    help_text = run(["fleetlite", "run", "--help"], installed.empty, 60, installed.env).stdout
    assert "--nproc_per_node" in help_text and "--explain" in help_text
    job = installed.empty / "job"
    job.mkdir()
    shutil.copy(ROOT / "examples" / "train_digits.py", job)
    shutil.copy(ROOT / "configs" / "cpu_gloo.yaml", job)
    result = run(["fleetlite", "run", "--nproc_per_node", "2", "--log_dir", "log", "train_digits.py",
                  "--strategy", "cpu_gloo.yaml", "--epochs", "1"], job, 150, installed.env)
    log = (job / "log" / "workerlog.0").read_text()
    assert "fleetlite compile report: rank 0/2" in log and "test accuracy" in log, result.stdout + log
    accuracy = float(log.split("test accuracy ")[1].split()[0])
    assert accuracy > 0.5, log
