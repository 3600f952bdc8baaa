"""Checks of vllm_interfaces rows by reading a module's source with ast (no import).

Used for the rows whose contract lives in source text (literal, metrics, reads), and for every row
whose module does not import on a CPU-only machine. Standard library only: it runs inside vLLM's
environment (vllm_probe.py) and in the main one (its own tests). A check returns the problems it
found, one line each; [] when the interface is as we use it.
"""
from __future__ import annotations

import ast
import functools
from pathlib import Path


def module_file(root: Path, module: str) -> Path | None:
    """The source of ``module`` under ``root`` (a directory on sys.path), or None."""
    base = root.joinpath(*module.split("."))
    for path in (base.with_suffix(".py"), base / "__init__.py"):
        if path.is_file():
            return path
    return None


@functools.lru_cache(maxsize=64)
def parse(path: Path) -> ast.Module:
    return ast.parse(path.read_text(encoding="utf-8"), str(path))


def defining_module(root: Path, module: str, name: str, depth: int = 3) -> str:
    """The module that defines ``name`` (its first dotted part) when ``module`` only re-exports it
    (``from vllm.config.cache import CacheConfig`` in vllm/config/__init__.py); else ``module``."""
    path = module_file(root, module)
    if path is None or depth == 0:
        return module
    top = name.split(".")[0]
    tree = parse(path)
    for node in tree.body:
        if isinstance(node, (ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and node.name == top:
            return module
        if isinstance(node, ast.ImportFrom) and any((a.asname or a.name) == top for a in node.names):
            package = module if path.name == "__init__.py" else module.rpartition(".")[0]
            base = package.split(".")[:len(package.split(".")) - node.level + 1] if node.level else []
            source = ".".join(base + ([node.module] if node.module else []))
            return defining_module(root, source, name, depth - 1)
    return module


def string_constants(tree: ast.AST) -> set[str]:
    """Every str constant, f-string parts included."""
    return {n.value for n in ast.walk(tree) if isinstance(n, ast.Constant) and isinstance(n.value, str)}


def find_class(tree: ast.Module, name: str) -> ast.ClassDef | None:
    return next((n for n in ast.walk(tree) if isinstance(n, ast.ClassDef) and n.name == name), None)


def class_attributes(cls: ast.ClassDef) -> set[str]:
    """Names a class defines in its body (fields, constants, methods, properties) and self.X it assigns."""
    names: set[str] = set()
    for node in cls.body:
        if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            names.add(node.target.id)
        elif isinstance(node, ast.Assign):
            names |= {t.id for t in node.targets if isinstance(t, ast.Name)}
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            names.add(node.name)
    for node in ast.walk(cls):
        targets = node.targets if isinstance(node, ast.Assign) else [node.target] if isinstance(
            node, (ast.AnnAssign, ast.AugAssign)) else []
        for target in targets:
            if isinstance(target, ast.Attribute) and isinstance(target.value, ast.Name) and target.value.id == "self":
                names.add(target.attr)
    return names


def class_and_bases_attributes(tree: ast.Module, cls: ast.ClassDef) -> set[str]:
    """Attributes of cls and of its bases defined in the same module (other modules' bases are not followed)."""
    names, seen, todo = set(), set(), [cls]
    while todo:
        c = todo.pop()
        if c.name in seen:
            continue
        seen.add(c.name)
        names |= class_attributes(c)
        todo += [b for base in c.bases if isinstance(base, ast.Name) and (b := find_class(tree, base.id)) is not None]
    return names


def find_function(tree: ast.Module, dotted: str) -> ast.FunctionDef | ast.AsyncFunctionDef | None:
    """``f`` at module level or ``Class.f``."""
    scope: list[ast.stmt] = tree.body
    *owners, name = dotted.split(".")
    for owner in owners:
        cls = next((n for n in scope if isinstance(n, ast.ClassDef) and n.name == owner), None)
        if cls is None:
            return None
        scope = cls.body
    return next((n for n in scope if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)) and n.name == name), None)


def missing_in_order(have: list[str], want: tuple[str, ...]) -> str | None:
    """None when ``want`` is ``have``'s leading run; else what differs."""
    if tuple(have[:len(want)]) == want:
        return None
    return f"expected {list(want)} first, found {have}"


def check(tree: ast.Module, kind: str, name: str, uses: tuple[str, ...]) -> list[str]:
    """Problems of one row in one module's source."""
    if kind == "literal":
        consts = string_constants(tree)
        return [f"no string {u!r}" for u in uses if not any(alt in consts for alt in u.split("|"))]
    if kind == "metrics":
        return check_metrics(tree, uses)
    if kind == "reads":
        return check_reads(tree, name, uses)
    if kind == "function":
        fn = find_function(tree, name)
        if fn is None:
            return [f"no function {name}"]
        params = [a.arg for a in fn.args.posonlyargs + fn.args.args + fn.args.kwonlyargs]
        params = params[1:] if "." in name and params[:1] in (["self"], ["cls"]) else params
        problem = missing_in_order(params, uses)
        return [f"parameters: {problem}"] if problem else []
    if kind == "constant":
        owner, _, attr = name.rpartition(".")
        scope = find_class(tree, owner).body if owner and find_class(tree, owner) else tree.body if not owner else None
        if scope is None:
            return [f"no class {owner}"]
        for node in scope:
            if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == attr for t in node.targets):
                value = eval(compile(ast.Expression(node.value), "<vllm>", "eval"), {"__builtins__": {}})  # noqa: S307
                return [] if repr(value) == uses[0] else [f"value {value!r}, expected {uses[0]}"]
        return [f"no constant {name}"]
    cls = find_class(tree, name)
    if cls is None:
        return [f"no class {name}"]
    if kind == "enum_strings":  # from the source only the member names are known: str(member) is taken as name.lower()
        members = {t.id.lower() for n in cls.body if isinstance(n, ast.Assign) for t in n.targets if isinstance(t, ast.Name)}
        return [f"no member {u!r}" for u in uses if u not in members]
    if kind in ("tagged_struct", "array_struct"):
        spec, options = struct_spec(tree, name)
        return struct_problems(kind, name, [f for f, _, _ in spec], options, uses)
    attrs = class_and_bases_attributes(tree, cls)
    return [f"no attribute {u!r}" for u in uses if u not in attrs]


def struct_problems(kind: str, name: str, fields: list[str], options: dict[str, object],
                    uses: tuple[str, ...]) -> list[str]:
    """A msgspec Struct's fields and options (tag, tag_field, array_like) against how we decode it.
    Shared by the source check and the live one (vllm_probe), which reads them off the class."""
    array_like = bool(options.get("array_like", False))
    if kind == "array_struct":
        problems = [] if array_like else ["not array_like: its fields no longer travel by position"]
        order = missing_in_order(fields, uses)
        return problems + ([f"fields: {order}"] if order else [])
    problems = [f"no field {u!r}" for u in uses if u not in fields]
    if array_like:
        problems.append("array_like: events no longer travel as maps")
    tag = options.get("tag")
    tag = name.rpartition(".")[2] if tag is True else tag
    if (options.get("tag_field") or "type", tag) != ("type", name.rpartition(".")[2]):
        problems.append(f"tagged {options.get('tag_field') or 'type'}={tag!r}, expected type={name!r}")
    return problems


def check_metrics(tree: ast.Module, uses: tuple[str, ...]) -> list[str]:
    """Each "name=type": vLLM makes the metric with a call whose callee's name holds the type
    (self._counter_cls(name="vllm:x", ...), self._gauge_cls, self._histogram_cls), or lists its name
    in a table assigned to a variable whose name holds the type (counter_specs = [("vllm:x", doc)])."""
    made_by: dict[str, set[str]] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            callee = node.func.attr if isinstance(node.func, ast.Attribute) else getattr(node.func, "id", "")
            for kw in node.keywords:
                if kw.arg == "name" and isinstance(kw.value, ast.Constant) and isinstance(kw.value.value, str):
                    made_by.setdefault(kw.value.value, set()).add(callee.lower())
        elif isinstance(node, ast.Assign):
            targets = {t.id.lower() for t in node.targets if isinstance(t, ast.Name)}
            for const in string_constants(node.value):
                made_by.setdefault(const, set()).update(targets)
    problems = []
    for use in uses:
        metric, _, kind = use.partition("=")
        callees = made_by.get(metric)
        if not callees:
            problems.append(f"no metric {metric!r}")
        elif not any(kind in c for c in callees):
            problems.append(f"metric {metric!r} is made by {sorted(callees)}, not a {kind}")
    return problems


def check_reads(tree: ast.Module, name: str, uses: tuple[str, ...]) -> list[str]:
    """``name``: "Class.method" (or alternatives "A.m|A.n", the first found): it reads self.<each use>."""
    fn = next((f for alt in name.split("|") if (f := find_function(tree, alt)) is not None), None)
    if fn is None:
        return [f"none of {name.split('|')} exists"]
    read = {n.attr for n in ast.walk(fn) if isinstance(n, ast.Attribute) and isinstance(n.value, ast.Name)
            and n.value.id == "self"}
    return [f"{fn.name} does not read self.{u}" for u in uses if u not in read]


def struct_spec(tree: ast.Module, name: str) -> tuple[list[tuple[str, bool, object]], dict[str, object]]:
    """A msgspec Struct as its source defines it: ([(field, has_default, default)] in msgspec's order,
    base classes' fields first; the class options: tag, array_like, omit_defaults...), bases followed
    within the module. Defaults must be literals (vLLM's are None or numbers)."""
    cls = find_class(tree, name)
    if cls is None:
        raise LookupError(f"no class {name}")
    fields: list[tuple[str, bool, object]] = []
    options: dict[str, object] = {}
    for base in cls.bases:
        if isinstance(base, ast.Name) and find_class(tree, base.id) is not None:
            base_fields, base_options = struct_spec(tree, base.id)
            fields += base_fields
            options.update(base_options)
    options.update({kw.arg: ast.literal_eval(kw.value) for kw in cls.keywords if kw.arg})
    for node in cls.body:
        if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            entry = (node.target.id, node.value is not None,
                     ast.literal_eval(node.value) if node.value is not None else None)
            at = next((i for i, f in enumerate(fields) if f[0] == node.target.id), None)
            if at is None:
                fields.append(entry)
            else:  # redefined in a subclass (KVEventBatch.events): msgspec keeps the base's position
                fields[at] = entry
    return fields, options
