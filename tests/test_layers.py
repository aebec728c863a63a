"""The package's layers stay layered: models -> engine -> policy -> front ends, each importing only from its
own layer or those below (function-level imports included); the engine imports no UI; pure modules import
neither llama.cpp nor Textual."""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "app" / "speclocal"
BASE = {"speclocal", "speclocal.errors", "speclocal.options", "speclocal.locations", "speclocal.files",
        "speclocal.formatting", "speclocal.stats", "speclocal.tasks", "speclocal.interrupt", "speclocal.drafts",
        "speclocal.suite"}
LAYERS = ("base", "models", "engine", "policy", "front end")
PURE = BASE | {"speclocal.engine.types", "speclocal.engine.sampling", "speclocal.engine.drafting.base",
               "speclocal.engine.drafting.context", "speclocal.engine.drafting.copy", "speclocal.engine.matching",
               "speclocal.engine.chat", "speclocal.engine.equivalence", "speclocal.policy.costmodel"}
NO_UI = ("textual", "rich", "speclocal.tui")


def layer(module: str) -> int:
    if module in BASE:
        return 0
    for i, name in ((1, "models"), (2, "engine"), (3, "policy")):
        if module == f"speclocal.{name}" or module.startswith(f"speclocal.{name}."):
            return i
    return 4


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _runtime_nodes(node: ast.AST):
    """Every node under `node`, except what sits in `if TYPE_CHECKING:` blocks (types only, never imported)."""
    for child in ast.iter_child_nodes(node):
        if isinstance(child, ast.If) and isinstance(child.test, ast.Name) and child.test.id == "TYPE_CHECKING":
            continue
        yield child
        yield from _runtime_nodes(child)


def imports(source: str, module: str) -> set[str]:
    """Every module `source` imports at run time, anywhere in it (relative imports resolved against `module`)."""
    out: set[str] = set()
    for node in _runtime_nodes(ast.parse(source)):
        if isinstance(node, ast.Import):
            out.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join(module.split(".")[: -node.level] + ([base] if base else []))
            out.add(base)
            out.update(f"{base}.{a.name}" for a in node.names)  # `from speclocal import policy`
    return out


def violations(sources: dict[str, str]) -> list[str]:
    """Each import that goes up a layer, brings a UI into the engine, or loads llama.cpp/Textual into a pure
    module, as one line."""
    known = set(sources)
    bad = []
    for module, source in sorted(sources.items()):
        for imp in sorted(imports(source, module)):
            target = imp if imp in known or not imp.startswith("speclocal") else _owner(imp, known)
            if target in known and layer(target) > layer(module):
                bad.append(f"{module} ({LAYERS[layer(module)]}) imports {target} ({LAYERS[layer(target)]})")
            if layer(module) <= 3 and imp.startswith(NO_UI):
                bad.append(f"{module} imports the UI module {imp}")
            if module in PURE and (imp.startswith(("llama_cpp", "textual")) or imp == "speclocal.engine.llama"):
                bad.append(f"pure module {module} imports {imp}")
    return bad


def _owner(name: str, known: set[str]) -> str:
    while name and name not in known:
        name = name.rpartition(".")[0]
    return name


def package_sources() -> dict[str, str]:
    return {module_name(p): p.read_text(encoding="utf-8") for p in PACKAGE.rglob("*.py")}


def test_no_module_imports_from_a_higher_layer():
    sources = package_sources()
    assert len(sources) > 40 and "speclocal.engine.generate" in sources and "speclocal.tui.app" in sources
    assert violations(sources) == []


def test_the_check_catches_each_kind_of_violation():
    sources = package_sources()
    planted = {
        "speclocal.engine.generate": "def f():\n    from speclocal.policy.auto import AutoDrafter\n",
        "speclocal.models.plan": "from speclocal.tui import app\n",
        "speclocal.engine.drafting.base": "from speclocal.engine.llama import LoadedModel\n",
        "speclocal.options": "import textual\n",
    }
    found = violations({**sources, **planted})
    assert any("speclocal.engine.generate (engine) imports speclocal.policy.auto (policy)" == f for f in found)
    assert any(f.startswith("speclocal.models.plan (models) imports speclocal.tui") for f in found)
    assert "pure module speclocal.engine.drafting.base imports speclocal.engine.llama" in found
    assert "pure module speclocal.options imports textual" in found
