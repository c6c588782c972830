"""The layers of docs/architecture.md hold: lint-imports (import-linter) checks the contract in
pyproject.toml. The packages install from several top-level folders (pyproject's package-dir), which
import-linter cannot follow, so the check runs on a tree of links nesting them as they install."""

import json
import subprocess
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())


def installed_tree(out: Path) -> Path:
    """Links to every package's modules at their installed place under `out` (npu/hdl/..., npu/sim/...)."""
    st = PYPROJECT["tool"]["setuptools"]
    dirs = st["package-dir"]
    for pkg in st["packages"]:
        parts = pkg.split(".")
        prefix = max((p for p in dirs if pkg == p or pkg.startswith(p + ".")), key=len)
        src = ROOT / dirs[prefix] / Path(*parts[len(prefix.split(".")) :])
        dst = out / Path(*parts)
        dst.mkdir(parents=True, exist_ok=True)
        for f in src.glob("*.py"):
            (dst / f.name).symlink_to(f)
    return out


def lint_imports(tree: Path) -> subprocess.CompletedProcess:
    lint = Path(sys.executable).with_name("lint-imports")
    return subprocess.run(
        [str(lint), "--config", str(ROOT / "pyproject.toml"), "--no-cache"],
        cwd=tree,
        env={"PYTHONPATH": str(tree), "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
    )


def test_every_contract_module_is_in_a_layer():
    layers = PYPROJECT["tool"]["importlinter"]["contracts"][0]["layers"]
    listed = {m.strip() for layer in layers for m in layer.replace("|", ":").split(":")}
    modules = {f"npu.{f.stem}" for f in (ROOT / "npu").glob("*.py") if f.stem != "__init__"}
    assert modules <= listed, f"npu/ modules in no layer of pyproject.toml: {sorted(modules - listed)}"


def test_imports_only_point_down(tmp_path):
    r = lint_imports(installed_tree(tmp_path))
    assert r.returncode == 0 and "1 kept, 0 broken" in r.stdout, r.stdout + r.stderr


def test_an_upward_import_breaks_the_contract(tmp_path):
    """The check can fail: a contract module importing the driver is found."""
    tree = installed_tree(tmp_path)
    (tree / "npu" / "isa.py").unlink()
    source = (ROOT / "npu" / "isa.py").read_text()
    (tree / "npu" / "isa.py").write_text(source + "\nfrom npu.driver import Npu\n")
    r = lint_imports(tree)
    assert r.returncode != 0 and "npu.isa -> npu.driver" in r.stdout, r.stdout + r.stderr


def _module_of(tree: Path, f: Path) -> str:
    return ".".join(f.relative_to(tree).with_suffix("").parts).removesuffix(".__init__")


def test_every_project_import_names_a_module_that_exists(tmp_path):
    """import-linter skips imports of modules that do not exist; a renamed module must not leave any."""
    import ast

    tree = installed_tree(tmp_path)
    modules = {_module_of(tree, f) for f in tree.rglob("*.py")}
    missing = []
    for f in tree.rglob("*.py"):
        here = _module_of(tree, f)
        package = here if f.name == "__init__.py" else here.rpartition(".")[0]
        for node in ast.walk(ast.parse(f.read_text())):
            if isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    parent = package.split(".")[: len(package.split(".")) - node.level + 1]
                    base = ".".join(parent + ([base] if base else []))
                if not base.startswith("npu"):
                    continue
                for alias in node.names:  # `from pkg import module` or `from module import name`
                    if base not in modules and f"{base}.{alias.name}" not in modules:
                        missing.append(f"{here}: {base}")
            elif isinstance(node, ast.Import):
                missing += [f"{here}: {a.name}" for a in node.names if a.name.startswith("npu.")
                            and a.name not in modules]  # fmt: skip
    assert not missing, f"imports of modules that do not exist: {sorted(set(missing))}"


def test_no_package_or_compiler_module_imports_itself_back(tmp_path):
    """No import cycle between the packages, and none between the compiler's modules at run time (its
    passes may still name `Lowering`/`Lowerer` in type annotations only)."""
    import networkx as nx

    code = (
        "import grimp, json, networkx as nx\n"
        "g = grimp.build_graph('npu', cache_dir=None, exclude_type_checking_imports=True)\n"
        "print(json.dumps([[m, i] for m in g.modules for i in g.find_modules_directly_imported_by(m)]))\n"
    )
    tree = installed_tree(tmp_path)
    r = subprocess.run([sys.executable, "-c", code], cwd=tree, env={"PYTHONPATH": str(tree)},
                       capture_output=True, text=True)  # fmt: skip
    assert r.returncode == 0, r.stderr
    edges = json.loads(r.stdout)

    def cycles(group) -> list[list[str]]:
        g = nx.DiGraph()
        for a, b in edges:
            ga, gb = group(a), group(b)
            if ga and gb and ga != gb:
                g.add_edge(ga, gb)
        return [sorted(c) for c in nx.strongly_connected_components(g) if len(c) > 1]

    def package(m: str) -> str | None:
        parts = m.split(".")
        if len(parts) < 2 or parts[1] not in ("cli", "explore", "hdl", "compiler", "driver", "sim", "models"):
            return "contracts"
        return ".".join(parts[:3]) if parts[1] == "sim" and len(parts) > 2 else ".".join(parts[:2])

    assert cycles(package) == []
    assert cycles(lambda m: m if m.startswith("npu.compiler.") else None) == []
