"""Folders are layers: no import of the library, however lazy, walks back up (STYLE.md rule 14).

Reads every import statement of fleetlite/, launcher/ and strategies/ (module level and inside
functions), places `launcher/` and `strategies/` where setup.py installs them
(`fleetlite.launcher`, `fleetlite.strategies`), and fails on any cycle between rooms: a
sub-package of fleetlite (`fleetlite.compile`) or a module at its root (`fleetlite.errors`).
A `__main__` module is an entry point: nothing imports it, so its imports close no loop (the
launcher's hands the tuner, which sits above the launcher, to the launcher).
"""
import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def installed_folders():
    """{package: folder} for fleetlite and the packages setup.py maps to folders of their own
    (its MAPPED_FOLDERS, read without running setup.py)."""
    mapped = next(node.value for node in ast.parse((ROOT / "setup.py").read_text()).body
                  if isinstance(node, ast.Assign) and [t.id for t in node.targets] == ["MAPPED_FOLDERS"])
    return {"fleetlite": "fleetlite", **ast.literal_eval(mapped)}


def library_modules():
    """{dotted module name: file} of every module that `pip install` ships."""
    modules = {}
    for package, folder in installed_folders().items():
        for path in (ROOT / folder).rglob("*.py"):
            parts = list(path.relative_to(ROOT / folder).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts = parts[:-1]
            name = ".".join([package, *parts])
            if name not in modules or folder != "fleetlite":
                modules[name] = path
    return modules


def imported(module, path, modules):
    """[(imported module, line)] for every import in `path` that names a library module."""
    found = []
    package = module if path.name == "__init__.py" else module.rsplit(".", 1)[0]
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found += [(_known(alias.name, modules), node.lineno) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            source = node.module or ""
            if node.level:
                base = package.split(".")[:len(package.split(".")) - node.level + 1]
                source = ".".join(base + ([node.module] if node.module else []))
            for alias in node.names:
                name = f"{source}.{alias.name}"
                found.append((name if name in modules else _known(source, modules), node.lineno))
    return [(target, line) for target, line in found if target]


def _known(name, modules):
    """The longest prefix of `name` that is a library module, or None."""
    parts = name.split(".")
    while parts and ".".join(parts) not in modules:
        parts.pop()
    return ".".join(parts) or None


def room(module):
    """fleetlite's sub-package or root module that `module` belongs to."""
    return ".".join(module.split(".")[:2])


def room_imports():
    """{(room, imported room): [file:line, ...]} over the whole library."""
    modules = library_modules()
    edges = {}
    for module, path in modules.items():
        if path.name == "__main__.py":
            continue
        for target, line in imported(module, path, modules):
            if room(target) != room(module):
                where = f"{path.relative_to(ROOT)}:{line}"
                edges.setdefault((room(module), room(target)), set()).add(where)
    return {pair: sorted(places) for pair, places in edges.items()}


def cycles(edges):
    """Each group of rooms that import each other in a loop (Tarjan's strongly connected components)."""
    graph = {}
    for source, target in edges:
        graph.setdefault(source, set()).add(target)
        graph.setdefault(target, set())
    index, low, stack, on_stack, groups = {}, {}, [], set(), []

    def visit(node):
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for following in sorted(graph[node]):
            if following not in index:
                visit(following)
                low[node] = min(low[node], low[following])
            elif following in on_stack:
                low[node] = min(low[node], index[following])
        if low[node] == index[node]:
            group = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                group.append(member)
                if member == node:
                    break
            if len(group) > 1:
                groups.append(sorted(group))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return groups


def test_the_reader_sees_lazy_imports_and_the_installed_folders():
    edges = room_imports()
    assert ("fleetlite.launcher", "fleetlite.errors") in edges       # launcher/ read as fleetlite.launcher
    assert ("fleetlite.strategies", "fleetlite.compile") in edges     # strategies/ as fleetlite.strategies
    assert any(line.startswith("fleetlite/__init__.py") for line in edges[("fleetlite", "fleetlite.data")])


def test_no_cycle_between_rooms():
    edges = room_imports()
    problems = []
    for group in cycles(edges):
        ties = [f"  {a} -> {b}: {', '.join(edges[(a, b)])}" for a in group for b in group if (a, b) in edges]
        problems.append(" <-> ".join(group) + "\n" + "\n".join(ties))
    assert not problems, "rooms that import each other:\n" + "\n".join(problems)
