"""The package's dependencies run one way (README, "Where each idea lives"):

    core → extensions → memories → layers → models → (pretrained) → tasks → training →
    interface

Every `import` in src/inftyformer counts, also those inside functions and under TYPE_CHECKING:
a module may import only modules of its own layer or of a layer before it, and no set of modules
may import each other in a circle. The pretrained adapter (`inftyformer.hf`) sits beside the
models, after them: it builds on them, they never import it.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[1] / "src"

# each module's layer, by the first matching prefix (longest first); "" = the package itself
LAYERS = {
    "base": [
        "_checks",
        "_files",
        "_init",
        "_measure",
        "_progress",
        "precision",
        "ragged",
        "presets",
    ],
    # the ∞-former as published: it names nothing of ours
    "core": ["core"],
    # our extensions, behind the core's seams
    "extensions": ["extensions"],
    "memories": [
        "native.short_term_memory",
        "native.compressive_memory",
        "native.state",
        "native.state_record",
    ],
    "layers": [
        "native.relative_attention",
        "native.kl_term",
        "native.block",
        "native.model_config",
        "native.memory_settings",
    ],
    "models": [
        "native",
        "native.model",
        "native.streaming",
        "model_kinds",
        "base_weights",
        "pretrained_config",
        "retrieval.config",
        "retrieval.scorers",
        "retrieval.layouts",
        "retrieval",
        "",
    ],
    # the pretrained wings: the continuous memory on a pretrained base (hf) and the
    # training-free retrieval of exact past blocks (retrieval)
    "pretrained": [
        "hf",
        "retrieval.model",
        "retrieval.continuous",
        "retrieval.attention",
        "retrieval.state",
        "retrieval.store",
        "retrieval.decode",
        "retrieval.ask",
        "retrieval.prompts",
        "retrieval.session",
        "retrieval.pipeline",
    ],
    # the glue to lm-evaluation-harness and RULER: it reads text as data/ does
    "tasks": ["data", "metrics", "tasks", "inspection", "integrations"],
    "training": ["training"],
    "interface": [
        "cli",
        "commands",
        "configure",
        "errors",
        "demo",
        "inspection_plots",
        "bench",
        "settings_help",
    ],
}
ORDER = list(LAYERS)


def module_names() -> dict[str, Path]:
    out = {}
    for path in (SRC / "inftyformer").rglob("*.py"):
        parts = list(path.relative_to(SRC).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        out[".".join(parts)] = path
    return out


MODULES = module_names()


def imports(name: str) -> set[str]:
    """The inftyformer modules `name` imports (`from .x import y` counts as x.y when y is a
    module, else as x)."""
    path = MODULES[name]
    package = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
    found = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package[: len(package) - node.level + 1]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            for alias in node.names:
                sub = f"{target}.{alias.name}"
                found.add(sub if sub in MODULES else target)
    return {m for m in found if m in MODULES and m != name}


GRAPH = {name: imports(name) for name in MODULES}


def layer(name: str) -> str:
    rest = name.split(".", 1)[1] if "." in name else ""
    best = None
    for key, prefixes in LAYERS.items():
        for prefix in prefixes:
            hit = rest == prefix or (prefix and rest.startswith(prefix + "."))
            if hit and (best is None or len(prefix) > len(best[1])):
                best = (key, prefix)
    if best is None:
        raise AssertionError(f"{name} has no layer: add it to LAYERS in {Path(__file__).name}")
    return best[0]


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_every_module_has_a_layer():
    assert len(MODULES) > 40
    for name in MODULES:
        assert layer(name) in ORDER


def test_no_import_cycles():
    assert cycles(GRAPH) == []


def test_no_upward_imports():
    upward = [
        f"{a} ({layer(a)}) imports {b} ({layer(b)})"
        for a in sorted(GRAPH)
        for b in sorted(GRAPH[a])
        if ORDER.index(layer(b)) > ORDER.index(layer(a))
    ]
    assert upward == []


def test_the_checks_can_fail():
    """The cycle finder and the layer order catch what they are meant to."""
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert cycles(graph) == [["a", "b", "c"]]
    assert layer("inftyformer.hf.pretrained_lm") == "pretrained"
    assert layer("inftyformer.tasks.dialogue") == "tasks"
    assert layer("inftyformer.native.state") == "memories"
    assert layer("inftyformer") == "models"
    assert (
        "inftyformer.native.streaming" in GRAPH["inftyformer.native.model"]
    )  # a real edge is seen
    assert ORDER.index("models") < ORDER.index("pretrained") < ORDER.index("tasks")


@pytest.mark.parametrize("name", ["inftyformer.model_kinds", "inftyformer.native.state"])
def test_models_and_state_reach_nothing_that_imports_them(name):
    reach, todo = set(), [name]
    while todo:
        for nxt in GRAPH[todo.pop()]:
            if nxt not in reach:
                reach.add(nxt)
                todo.append(nxt)
    assert name not in reach


def test_the_sources_and_docs_point_only_inside_the_repository():
    """No reference to a specification file outside the repository, and every test file a
    module docstring or a document names exists."""
    root = SRC.parent
    texts = {p: p.read_text(encoding="utf-8") for p in MODULES.values()}
    texts.update({p: p.read_text(encoding="utf-8") for p in root.glob("docs/**/*.md")})
    texts[root / "README.md"] = (root / "README.md").read_text(encoding="utf-8")
    named = 0
    for path, text in texts.items():
        assert "SPEC §" not in text, path
        for test_path in re.findall(r"tests/[\w/]+\.py", text):
            named += 1
            assert (root / test_path).is_file(), f"{path} names {test_path}, which does not exist"
    assert named >= 2  # the streaming module and docs/results/lm.md name their tests


def test_the_core_code_names_no_strategy_of_ours():
    """Beyond imports: no name in the core's code (an identifier, an attribute, a string that is
    not a docstring) is the kind or a setting of one of our strategies; the core meets them only
    through the seams' protocols and capabilities (`core/seams.py`)."""
    import dataclasses

    from inftyformer.core import seams

    seams.discover()
    kinds = [cls for seam in seams.SEAMS for cls in seams.REGISTRY[seam].values()]
    theirs = {c for c in kinds if not c.__module__.startswith("inftyformer.core")}

    def names(classes: set[type]) -> set[str]:
        return {n for c in classes for n in (c.kind, *(f.name for f in dataclasses.fields(c)))}

    ours = names(theirs) - names(set(kinds) - theirs)  # (a setting the paper's have is theirs)
    assert {"fill", "mixture", "keep_first", "sharpness"} <= ours
    found = []
    for path in sorted((SRC / "inftyformer" / "core").glob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        docstrings = {
            id(node.body[0].value)
            for node in ast.walk(tree)
            if isinstance(getattr(node, "body", None), list)
            and node.body
            and isinstance(node.body[0], ast.Expr)
        }
        for node in ast.walk(tree):
            if isinstance(node, ast.Name | ast.Attribute | ast.arg):
                words = {getattr(node, "id", None) or getattr(node, "attr", None) or node.arg}
            elif isinstance(node, ast.Constant) and isinstance(node.value, str):
                words = set() if id(node) in docstrings else set(re.findall(r"\w+", node.value))
            else:
                continue
            found += [f"{path.name}:{node.lineno}: {w}" for w in sorted(words & ours)]
    assert found == []
