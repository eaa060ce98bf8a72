"""`inftyformer._files`: every file the library writes appears whole or not at all."""

from __future__ import annotations

import pytest

from inftyformer._files import atomic_path, write_atomic


def test_a_failed_write_leaves_the_old_file_and_no_temporary(tmp_path):
    path = tmp_path / "a.json"
    write_atomic(path, "old")
    with pytest.raises(RuntimeError), atomic_path(path) as tmp:
        tmp.write_text("half")
        raise RuntimeError("killed")
    assert path.read_text() == "old"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.json"]
    write_atomic(path, "new ∞".encode(), durable=True)
    assert path.read_text(encoding="utf-8") == "new ∞"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.json"]


def test_a_directory_appears_whole_or_not_at_all(tmp_path):
    out = tmp_path / "model"
    with pytest.raises(KeyboardInterrupt), atomic_path(out) as tmp:
        tmp.mkdir()
        (tmp / "config.json").write_text("{}")
        raise KeyboardInterrupt
    assert list(tmp_path.iterdir()) == []
    with atomic_path(out) as tmp:
        tmp.mkdir()
        (tmp / "config.json").write_text("{}")
        assert not out.exists()  # nothing visible before the block ends
    assert [p.name for p in out.iterdir()] == ["config.json"]


def test_write_atomic_writes_a_pipe_or_device_directly(tmp_path):
    """/dev/stdout or a FIFO cannot be replaced: the bytes go straight to it."""
    import os
    import threading

    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    received = []
    reader = threading.Thread(target=lambda: received.append(fifo.read_bytes()))
    reader.start()
    write_atomic(fifo, "through ∞")
    reader.join(timeout=10)
    assert received == ["through ∞".encode()]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["pipe"]


# Calls that write a file (the path is their first argument; save_file's is its second).
WRITERS = {"write_text", "write_bytes", "save_file", "save_pretrained", "save", "savefig"}
# The writes that do not go through atomic_path, and why: (file, function, call).
DIRECT = {
    # the checkpoint's own commit protocol: data files under pending names (fsynced, checked by
    # sha256 on loading), committed by the manifest, which is written with write_atomic
    ("training/checkpoint.py", "_write_bytes", "open"),
    # Hugging Face writes the model folder (config, weights) itself (`saved_adapter.save` calls
    # its save_pretrained, handed in by the model's)
    ("hf/model.py", "save_pretrained", "save"),
    ("hf/saved_adapter.py", "_write_adapter", "save_pretrained"),
    # metrics.csv grows by appended lines (rewritten with atomic_path when a run opens it)
    ("training/logger.py", "__init__", "open"),
    # the one place that writes to a pipe or a device, which cannot be replaced
    ("_files.py", "write_atomic", "open"),
    # a kernel control file, not a file on disk: "5" resets the process's peak RSS
    ("_measure.py", "reset_peak_rss", "open"),
}


def _writes(tree):
    """(function, call) of every call in `tree` that writes a file, with the names bound by
    `with atomic_path(...) as NAME` in the same function (writing those is atomic)."""
    import ast

    for function in ast.walk(tree):
        if not isinstance(function, ast.FunctionDef | ast.AsyncFunctionDef):
            continue
        atomic = set()  # atomic_path's names, the files opened on them, in-memory buffers
        for node in ast.walk(function):
            for item in node.items if isinstance(node, ast.With) else ():
                call = item.context_expr
                if isinstance(item.optional_vars, ast.Name) and isinstance(call, ast.Call):
                    opened = {n.id for n in ast.walk(call) if isinstance(n, ast.Name)}
                    if getattr(call.func, "id", None) == "atomic_path" or opened & atomic:
                        atomic.add(item.optional_vars.id)
            if isinstance(node, ast.Assign) and "BytesIO" in ast.unparse(node.value):
                atomic.update(t.id for t in node.targets if isinstance(t, ast.Name))
        for call in ast.walk(function):
            if not isinstance(call, ast.Call):
                continue
            func = call.func
            name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", None)
            if name == "open":
                mode = call.args[1] if len(call.args) > 1 else None
                mode = next((k.value for k in call.keywords if k.arg == "mode"), mode)
                if not (isinstance(mode, ast.Constant) and set(str(mode.value)) & set("wax+")):
                    continue
                target = call.args[0]
            elif name in WRITERS and ast.unparse(func) != "self.save":  # (a checkpoint)
                args = [*call.args, *(k.value for k in call.keywords)]
                target = args[1] if name == "save_file" else (args[0] if args else func)
                if name == "write_text" or name == "write_bytes" or not args:
                    target = func.value if isinstance(func, ast.Attribute) else func
            else:
                continue
            used = {n.id for n in ast.walk(target) if isinstance(n, ast.Name)}
            if not used & atomic:
                yield function.name, name, call, target


def test_the_library_writes_files_only_through_atomic_path():
    """Every file the library writes appears whole or not at all: a call that writes a file
    (write_text, open for writing, save_file, save ...) writes a name `atomic_path` handed out,
    except the writes listed in DIRECT. A new direct write fails here."""
    import ast
    from pathlib import Path

    import inftyformer

    root = Path(inftyformer.__file__).parent
    found = set()
    for path in sorted(root.rglob("*.py")):
        relative = path.relative_to(root).as_posix()
        for function, name, call, target in _writes(ast.parse(path.read_text("utf-8"))):
            if (relative, function, name) in DIRECT:
                continue
            found.add(f"{relative}:{call.lineno} in {function}: {ast.unparse(target)}")
    assert not found, "files written without atomic_path:\n" + "\n".join(sorted(found))
