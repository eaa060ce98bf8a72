"""The docstrings and comments in src/ name modules and files that exist: a dotted path
`inftyformer.x.y` (a module, or a name a module defines), a file `x/y.py` (from the repository,
the package, or the folder of the file that names it), a bare `y.py`, a `docs/….md` page, and
a short reference in backticks `module.name` (a module of the package by its own name, and a
name it defines). So that a module moved or renamed cannot leave its old name behind in the
prose."""

from __future__ import annotations

import ast
import functools
import io
import re
import tokenize
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "src" / "inftyformer"
SOURCES = sorted(PACKAGE.rglob("*.py"))

DOTTED = re.compile(r"\binftyformer(?:\.[A-Za-z_]\w*)+")
# a path of folders ending in a .py or .md file; a bare module file name
FILE = re.compile(r"(?<![\w./-])((?:[\w.-]+/)+[\w-]+\.(?:py|md))\b")
BARE = re.compile(r"(?<![\w./-])([a-z_][a-z0-9_]*\.py)\b")
# `a.b` in backticks: a module and a name in it, or an object and its attribute (when `a` is
# a name the file's code uses, which is not checked)
SHORT = re.compile(r"`([a-z_][a-z0-9_]*)\.([A-Za-z_]\w*)")
FILE_TYPES = {"py", "md", "json", "jsonl", "jinja", "txt", "tsv", "csv", "safetensors"}
# what the prose names as objects of the protocols it describes (a task, an optimiser)
OBJECTS = {"task", "optimizer"}
# names that are not modules or files of this repository
NOT_OURS = {
    "__init__.py",  # any package's
    "inftyformer_auto.py",  # the module a saved model carries (`hf/remote_code.py`)
    "inftyformer.strategies",  # the entry-point group of strategy plugins (`core/seams.py`)
}
ALL_FILES = {p.name for p in ROOT.rglob("*") if ".git" not in p.parts}


def prose(path: Path) -> list[tuple[int, str]]:
    """(line, text) of every comment and docstring in `path`."""
    text = path.read_text(encoding="utf-8")
    out = [
        (tok.start[0], tok.string)
        for tok in tokenize.generate_tokens(io.StringIO(text).readline)
        if tok.type == tokenize.COMMENT
    ]
    for node in ast.walk(ast.parse(text)):
        body = getattr(node, "body", None)
        if isinstance(body, list) and body and isinstance(body[0], ast.Expr):
            value = body[0].value
            if isinstance(value, ast.Constant) and isinstance(value.value, str):
                out.append((value.lineno, value.value))
    return out


def defines(module: Path, name: str) -> bool:
    """`module` defines `name` at its top level (a def, a class, an assignment, an import, or a
    name its `__all__` lists: a package that imports lazily)."""
    tree = ast.parse(module.read_text(encoding="utf-8"))
    for node in tree.body:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            found = {node.name}
        elif isinstance(node, ast.Assign | ast.AnnAssign):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            found = {n.id for t in targets for n in ast.walk(t) if isinstance(n, ast.Name)}
            if "__all__" in found and node.value is not None:
                found |= {c.value for c in ast.walk(node.value) if isinstance(c, ast.Constant)}
        elif isinstance(node, ast.Import | ast.ImportFrom):
            found = {(a.asname or a.name).split(".")[0] for a in node.names}
        else:
            continue
        if name in found:
            return True
    return False


def dotted_exists(reference: str) -> bool:
    """`inftyformer.a.b…`: folders, then a module, then at most a name the module defines and
    an attribute of that (`inftyformer.core.seams.Strategy.changeable`); or a name a
    package's `__init__` defines."""
    parts = reference.split(".")[1:]
    folder = PACKAGE
    for i, part in enumerate(parts):
        if (folder / part).is_dir():
            folder = folder / part
        elif (folder / f"{part}.py").is_file():
            module, rest = folder / f"{part}.py", parts[i + 1 :]
            break
        else:
            module, rest = folder / "__init__.py", parts[i:]
            break
    else:
        return True
    return not rest or (len(rest) <= 2 and defines(module, rest[0]))


def file_exists(reference: str, where: Path) -> bool:
    """`x/y.py` from the repository, the package, or a folder above the file naming it."""
    if reference in NOT_OURS or any(ch in reference for ch in "*{"):
        return True
    return any((base / reference).exists() for base in (ROOT, PACKAGE, *where.parents))


MODULES: dict[str, list[Path]] = {}  # a module's own name → its files (several: state.py)
for _path in SOURCES:
    _stem = _path.parent.name if _path.name == "__init__.py" else _path.stem
    MODULES.setdefault(_stem, []).append(_path)


@functools.cache
def identifiers(path: Path) -> set[str]:
    """Every name the code of `path` uses: variables, arguments, attributes, imports."""
    names = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Name):
            names.add(node.id)
        elif isinstance(node, ast.arg):
            names.add(node.arg)
        elif isinstance(node, ast.Attribute):
            names.add(node.attr)
        elif isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            names.add(node.name)
        elif isinstance(node, ast.Import | ast.ImportFrom):
            for alias in node.names:
                names |= {alias.asname or "", *alias.name.split(".")}
            names |= set((getattr(node, "module", None) or "").split("."))
    return names


def short_exists(module: str, name: str, used: set[str]) -> bool:
    """`module.name` in backticks: an object's attribute when the code uses `module` as a
    name (or it is one of `OBJECTS`); else a module of the package, by its own name, whose
    code has `name` (or a package holding a module `name`)."""
    if module in used | OBJECTS or module == "inftyformer" or name in FILE_TYPES:
        return True
    for path in MODULES.get(module, []):
        if name in identifiers(path):
            return True
        if path.name == "__init__.py" and (path.parent / f"{name}.py").exists():
            return True
    return False


def stale_in(text: str, where: Path, used: set[str] = frozenset()) -> list[str]:
    """The references in `text` (prose of the file `where`, whose code uses the names `used`)
    to what does not exist."""
    found = [r for r in DOTTED.findall(text) if r not in NOT_OURS and not dotted_exists(r)]
    found += [r for r in FILE.findall(text) if not file_exists(r, where)]
    found += [f"{a}.{b}" for a, b in SHORT.findall(text) if not short_exists(a, b, used)]
    return found + [r for r in BARE.findall(text) if r not in ALL_FILES | NOT_OURS]


# stale references in files that another change is editing, to be fixed there: (file, name);
# each must still be stale (the test says when one is fixed, to take it off this list)
PENDING: set[tuple[str, str]] = set()  # (file, reference) known stale, to be fixed


def test_the_prose_in_src_names_modules_and_files_that_exist():
    assert len(SOURCES) > 100
    found = {
        (str(path.relative_to(ROOT)), ref): line
        for path in SOURCES
        for line, text in prose(path)
        for ref in stale_in(text, path, identifiers(path))
    }
    assert [
        f"{path}:{line}: {ref}" for (path, ref), line in found.items() if (path, ref) not in PENDING
    ] == []
    assert sorted(PENDING - set(found)) == [], "fixed: take them off PENDING"


@pytest.mark.parametrize(
    "text, stale",
    [
        ("see `inftyformer.core.seams.register`", False),
        ("see `inftyformer.core.seams.Strategy.changeable`", False),
        ("see `inftyformer.extensions.densities` and `inftyformer.LongTermState`", False),
        ("see `inftyformer.long_term_memory.LongTermMemory`", True),
        ("see `inftyformer.core.seams.no_such_name`", True),
        ("see `hf/head_read.py` and `../core/state.py`", False),
        ("see `tests/tiny_pretrained.py` and docs/results/benchmarks/retrieval_cost.md", False),
        ("see `docs/retrieval_cost.md`", True),
        ("see `stream_places/places.py`", True),
        ("its weights' initialisation `weights.py`", True),
        ("its weights' initialisation `init_weights.py`", False),
        ("the salience (`places.salience`), the state (`state_record.memory_record`)", False),
        ("the salience (`stream_places.salience`)", True),
        ("the memory (`long_term_memory.LongTermMemory`)", True),
        ("the memory (`memory.LongTermMemory`), its kinds (`models.MODEL_KINDS`)", True),
        ("a saved run's `results.json`, `config.tau` of a config", False),
    ],
)
def test_a_stale_reference_is_found(tmp_path, text, stale):
    """The check itself, on a comment and a docstring of a file in hf/."""
    path = tmp_path / "copy.py"
    path.write_text(f'"""{text}"""\n# {text}\n', encoding="utf-8")
    where, used = PACKAGE / "hf" / "x.py", {"config"}  # its code has a variable `config`
    found = [ref for _, words in prose(path) for ref in stale_in(words, where, used)]
    assert bool(found) == stale, found
