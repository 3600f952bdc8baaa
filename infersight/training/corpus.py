"""An offline, seeded, task-labelled training corpus, built from what any Python installation has.

Four tasks, the ones of infersight.workload, each a list of documents that start with the task's
system prompt (so the models learn those shared prefixes):

    code      Python standard-library sources, cut at top-level statements into ~2 KB chunks
    json      JSON records, one per line, from a seeded generator with a few fixed schemas
    chat      English prose: stdlib docstrings, the pydoc topic texts, licence texts
    creative  high-entropy text: random characters, and words of the other sources shuffled

Same seed and same standard library (and licence files) give byte-identical files. A held-out
fraction of each task's documents is kept apart for evaluation and prompts.

On disk (Corpus.save): `<task>.train.bin` is the training documents, UTF-8, each followed by a
NUL byte (NUL never occurs in the text); `<task>.heldout.jsonl` has one {"text": ...} per line;
`manifest.json` has the seed, the Python version and a sha256 per file.
"""
from __future__ import annotations

import ast
import hashlib
import json
import platform
import random
import re
import sys
import sysconfig
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable, Iterator

from infersight.training.generated_text import creative_bodies, json_bodies, word_pool
from infersight.workload import _STDLIB_FILES, SYSTEM_PROMPTS, TASKS

DOC_SEP = b"\x00"
HELDOUT_FRACTION = 0.05
CODE_CHUNK_CHARS = 2000        # target size of one code document
CODE_MAX_CHARS_PER_FILE = 32_000  # so that a few big modules do not dominate the code task
CODE_MAX_FILE_BYTES = 150_000  # bigger files are skipped for code
CHAT_DOC_CHARS = 900
LICENCE_DIRS = ("/usr/share/common-licenses",)
# Directories of the standard library that are not library source (or not useful text).
_SKIP_DIRS = frozenset({"site-packages", "dist-packages", "test", "tests", "idle_test", "__pycache__",
                        "encodings", "pydoc_data", "turtledemo"})
_MANIFEST_VERSION = 1


@dataclass
class Corpus:
    """train[task]: training documents joined, each followed by DOC_SEP; heldout[task]: documents."""

    train: dict[str, bytes]
    heldout: dict[str, list[str]]
    seed: int
    max_bytes_per_task: int
    python_version: str = field(default_factory=platform.python_version)

    @property
    def tasks(self) -> tuple[str, ...]:
        return tuple(self.train)

    def train_documents(self, task: str) -> list[bytes]:
        return [d for d in self.train[task].split(DOC_SEP) if d]

    def summary(self) -> dict[str, dict[str, int]]:
        return {t: {"train_bytes": len(self.train[t]), "train_docs": self.train[t].count(DOC_SEP),
                    "heldout_docs": len(self.heldout[t]),
                    "heldout_bytes": sum(len(d.encode("utf-8")) for d in self.heldout[t])}
                for t in self.tasks}

    def save(self, directory: str | Path) -> Path:
        out = Path(directory)
        out.mkdir(parents=True, exist_ok=True)
        files: dict[str, bytes] = {}
        for task in self.tasks:
            files[f"{task}.train.bin"] = self.train[task]
            files[f"{task}.heldout.jsonl"] = "".join(
                json.dumps({"text": d}, ensure_ascii=False) + "\n" for d in self.heldout[task]).encode("utf-8")
        for name, data in files.items():
            (out / name).write_bytes(data)
        manifest = {
            "version": _MANIFEST_VERSION, "seed": self.seed, "max_bytes_per_task": self.max_bytes_per_task,
            "python": self.python_version, "tasks": list(self.tasks), "summary": self.summary(),
            "files": {name: {"sha256": hashlib.sha256(data).hexdigest(), "bytes": len(data)}
                      for name, data in sorted(files.items())},
        }
        (out / "manifest.json").write_text(json.dumps(manifest, indent=2, sort_keys=True) + "\n", encoding="utf-8")
        return out

    @classmethod
    def load(cls, directory: str | Path, verify: bool = True) -> "Corpus":
        """Read a saved corpus; with verify, every file must match its sha256 in the manifest."""
        src = Path(directory)
        manifest = json.loads((src / "manifest.json").read_text(encoding="utf-8"))
        data: dict[str, bytes] = {}
        for name, meta in manifest["files"].items():
            data[name] = (src / name).read_bytes()
            if verify and hashlib.sha256(data[name]).hexdigest() != meta["sha256"]:
                raise ValueError(f"{src / name}: sha256 does not match {src / 'manifest.json'}")
        tasks = manifest["tasks"]
        heldout = {t: [json.loads(line)["text"] for line in data[f"{t}.heldout.jsonl"].decode("utf-8").splitlines()]
                   for t in tasks}
        return cls(train={t: data[f"{t}.train.bin"] for t in tasks}, heldout=heldout, seed=manifest["seed"],
                   max_bytes_per_task=manifest["max_bytes_per_task"], python_version=manifest["python"])


def build_corpus(seed: int = 0, max_bytes_per_task: int = 2_000_000,
                 heldout_fraction: float = HELDOUT_FRACTION) -> Corpus:
    """Build all four tasks; at most max_bytes_per_task UTF-8 bytes of documents per task."""
    docs: dict[str, list[str]] = {}
    docs["code"] = _take(_code_bodies(), "code", max_bytes_per_task)
    docs["json"] = _take(json_bodies(random.Random(f"json:{seed}")), "json", max_bytes_per_task)
    docs["chat"] = _take(_round_robin([_docstring_bodies(), _licence_bodies(), _pydoc_topic_bodies()]),
                         "chat", max_bytes_per_task)
    words = word_pool(docs["chat"] + docs["code"])
    docs["creative"] = _take(creative_bodies(random.Random(f"creative:{seed}"), words), "creative",
                             max_bytes_per_task)
    train: dict[str, bytes] = {}
    heldout: dict[str, list[str]] = {}
    for task in TASKS:
        keep, held = _split(docs[task], random.Random(f"heldout:{seed}:{task}"), heldout_fraction)
        train[task] = b"".join(d.encode("utf-8") + DOC_SEP for d in keep)
        heldout[task] = held
    return Corpus(train=train, heldout=heldout, seed=seed, max_bytes_per_task=max_bytes_per_task)


# --- assembling documents -----------------------------------------------------------------------

def _clean(text: str) -> str:
    return text.replace("\r\n", "\n").replace("\r", "\n").replace("\x00", "")


def _take(bodies: Iterable[str], task: str, budget: int) -> list[str]:
    """System prompt + body, duplicates dropped, until the next document would pass the budget
    (the first document is always kept, so a task is never empty)."""
    out: list[str] = []
    seen: set[str] = set()
    total = 0
    for body in bodies:
        doc = SYSTEM_PROMPTS[task] + _clean(body)
        if doc in seen or not body.strip():
            continue
        size = len(doc.encode("utf-8"))
        if out and total + size > budget:
            break
        seen.add(doc)
        out.append(doc)
        total += size
    return out


def _split(docs: list[str], rng: random.Random, fraction: float) -> tuple[list[str], list[str]]:
    """(train, held-out): a seeded sample of round(fraction * n) documents (at least one of two) is held out."""
    n = len(docs)
    k = 0 if n < 2 else min(n - 1, max(1, round(fraction * n)))
    held = set(rng.sample(range(n), k))
    return [d for i, d in enumerate(docs) if i not in held], [d for i, d in enumerate(docs) if i in held]


def _round_robin(sources: list[Iterator[str]]) -> Iterator[str]:
    """One item from each source in turn, so the budget is shared between sources."""
    live = list(sources)
    while live:
        for src in list(live):
            item = next(src, None)
            if item is None:
                live.remove(src)
            else:
                yield item


def _group(paragraphs: Iterable[str], target: int) -> Iterator[str]:
    """Consecutive paragraphs joined by blank lines into bodies of about `target` characters."""
    cur: list[str] = []
    size = 0
    for p in paragraphs:
        if cur and size + len(p) > target:
            yield "\n\n".join(cur)
            cur, size = [], 0
        cur.append(p)
        size += len(p) + 2
    if cur:
        yield "\n\n".join(cur)


def _paragraphs(text: str) -> list[str]:
    return [" ".join(p.split()) for p in re.split(r"\n\s*\n", text) if p.strip()]


# --- sources ----------------------------------------------------------------------------------

def _stdlib_root() -> Path:
    return Path(sysconfig.get_paths()["stdlib"])


def _stdlib_files() -> list[Path]:
    """Library modules in a fixed order: the workload's prompt modules first, then the rest sorted
    by a hash of their path (sorted walk, spread across the alphabet so a byte cap is not 'a-c only')."""
    root = _stdlib_root()
    found = sorted(p.relative_to(root).as_posix() for p in root.rglob("*.py"))
    rels = [r for r in found if not (set(r.split("/")[:-1]) & _SKIP_DIRS)
            and not r.rsplit("/", 1)[-1].startswith("test_")]
    first = [r for r in _STDLIB_FILES if r in rels]
    rest = sorted((r for r in rels if r not in first), key=lambda r: hashlib.sha256(r.encode()).hexdigest())
    return [root / r for r in first + rest]


def _read(path: Path) -> str:
    return _clean(path.read_text(encoding="utf-8", errors="replace"))


def _code_bodies() -> Iterator[str]:
    for path in _stdlib_files():
        if path.stat().st_size > CODE_MAX_FILE_BYTES:
            continue
        used = 0
        for chunk in code_chunks(_read(path)):
            if used + len(chunk) > CODE_MAX_CHARS_PER_FILE:
                break
            used += len(chunk)
            yield chunk


_INNER_DEF = re.compile(r"^[ \t]+(?:async def |def |class |@)")


def code_chunks(source: str, target: int = CODE_CHUNK_CHARS) -> list[str]:
    """Python source cut at top-level statements (comments stay with the statement they precede),
    grouped into chunks of about `target` characters; a long class is cut at its methods."""
    lines = source.splitlines(keepends=True)
    if not lines:
        return []
    starts = _top_level_starts(source, lines)
    pieces: list[str] = []
    for a, b in zip(starts, starts[1:] + [len(lines)]):
        pieces.extend(_split_long(lines[a:b], target))
    chunks: list[str] = []
    cur = ""
    for p in pieces:
        if cur and len(cur) + len(p) > target:
            chunks.append(cur)
            cur = ""
        cur += p
    chunks.append(cur)
    return [c.strip("\n") + "\n" for c in chunks if c.strip()]


def _top_level_starts(source: str, lines: list[str]) -> list[int]:
    try:
        body = ast.parse(source).body
        starts = [min([n.lineno] + [d.lineno for d in getattr(n, "decorator_list", [])]) - 1 for n in body]
    except (SyntaxError, ValueError):
        starts = [i for i, ln in enumerate(lines) if ln[:1] not in ("", " ", "\t", "\n", "#", ")", "]", "}")]
    out: list[int] = []
    for s in starts:
        while s > 0 and lines[s - 1].startswith("#") and (not out or s - 1 > out[-1]):
            s -= 1  # a comment block right above a statement belongs to it
        if not out or s > out[-1]:
            out.append(s)
    if not out or out[0] != 0:
        out.insert(0, 0)
    return out


def _split_long(lines: list[str], target: int) -> list[str]:
    if sum(map(len, lines)) <= 2 * target:
        return ["".join(lines)]
    out: list[str] = []
    cur: list[str] = []
    size = 0
    for i, ln in enumerate(lines):
        boundary = bool(_INNER_DEF.match(ln)) and not (i and lines[i - 1].lstrip().startswith("@"))
        if cur and ((size >= target and boundary) or size >= 3 * target):
            out.append("".join(cur))
            cur, size = [], 0
        cur.append(ln)
        size += len(ln)
    if cur:
        out.append("".join(cur))
    return out


def _docstring_bodies() -> Iterator[str]:
    """Docstrings (> 40 characters, whitespace collapsed as in the workload), grouped."""
    def docstrings() -> Iterator[str]:
        for path in _stdlib_files():
            try:
                tree = ast.parse(_read(path))
            except (SyntaxError, ValueError):
                continue
            for node in ast.walk(tree):
                if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
                    doc = ast.get_docstring(node)
                    if doc and len(doc) > 40:
                        yield " ".join(doc.split())
    return _group(docstrings(), CHAT_DOC_CHARS)


def _licence_files() -> list[Path]:
    paths = [_stdlib_root() / "LICENSE.txt"]
    for d in LICENCE_DIRS:
        if Path(d).is_dir():
            paths += sorted(Path(d).iterdir())
    out: list[Path] = []
    seen: set[Path] = set()
    for p in paths:
        real = p.resolve()
        if p.is_file() and real not in seen:
            seen.add(real)
            out.append(p)
    return out


def _licence_bodies() -> Iterator[str]:
    for path in _licence_files():
        try:
            text = _read(path)
        except OSError:
            continue
        yield from _group(_paragraphs(text), CHAT_DOC_CHARS)


def _pydoc_topic_bodies() -> Iterator[str]:
    """The language-reference topics of pydoc_data/topics.py (what `help('if')` shows)."""
    path = _stdlib_root() / "pydoc_data" / "topics.py"
    if not path.is_file():
        return
    try:
        tree = ast.parse(_read(path))
    except (SyntaxError, ValueError):
        return
    for node in tree.body:
        if isinstance(node, ast.Assign) and isinstance(node.value, ast.Dict):
            for value in node.value.values:
                if isinstance(value, ast.Constant) and isinstance(value.value, str):
                    yield from _group(_paragraphs(value.value), CHAT_DOC_CHARS)


def describe(corpus: Corpus) -> str:
    """A small table of the corpus, for the CLI."""
    rows = [f"{'task':<9} {'train bytes':>12} {'train docs':>10} {'held-out docs':>13}"]
    for task, s in corpus.summary().items():
        rows.append(f"{task:<9} {s['train_bytes']:>12,} {s['train_docs']:>10,} {s['heldout_docs']:>13,}")
    rows.append(f"seed {corpus.seed}, python {corpus.python_version} ({sys.implementation.name})")
    return "\n".join(rows)
