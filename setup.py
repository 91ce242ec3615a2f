"""The package list, computed so that a wheel cannot leave a sub-package out (setup.cfg holds
everything else). Every folder with an __init__.py under fleetlite/ is a package; launcher/ and
strategies/ stay top-level folders and install as fleetlite.launcher and fleetlite.strategies,
their own sub-packages included. tests/, benchmarks/ and examples/ are not installed."""
from setuptools import find_packages, setup

MAPPED_FOLDERS = {"fleetlite.launcher": "launcher", "fleetlite.strategies": "strategies"}


def packages():
    found = find_packages(include=["fleetlite", "fleetlite.*"])
    for package, folder in MAPPED_FOLDERS.items():
        found += [package] + [f"{package}.{sub}" for sub in find_packages(folder)]
    return found


setup(packages=packages(), package_dir=MAPPED_FOLDERS)
