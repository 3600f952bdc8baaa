"""The training corpus: deterministic by seed, four non-empty tasks, held-out text kept apart."""
from __future__ import annotations

import json

import pytest

from infersight.training.corpus import DOC_SEP, Corpus, build_corpus, code_chunks
from infersight.workload import SYSTEM_PROMPTS, TASKS

SMALL = 40_000


@pytest.fixture(scope="module")
def corpus() -> Corpus:
    return build_corpus(seed=0, max_bytes_per_task=SMALL)


def _files(c: Corpus, tmp_path, name: str) -> dict[str, bytes]:
    d = c.save(tmp_path / name)
    return {p.name: p.read_bytes() for p in sorted(d.iterdir())}


def test_same_seed_gives_byte_identical_files(corpus, tmp_path):
    again = build_corpus(seed=0, max_bytes_per_task=SMALL)
    assert _files(corpus, tmp_path, "a") == _files(again, tmp_path, "b")


def test_other_seed_changes_generated_tasks(corpus):
    other = build_corpus(seed=1, max_bytes_per_task=SMALL)
    assert other.train["json"] != corpus.train["json"]
    assert other.train["creative"] != corpus.train["creative"]


def test_all_tasks_present_with_system_prompts_and_within_budget(corpus):
    assert corpus.tasks == TASKS
    for task in TASKS:
        docs = corpus.train_documents(task)
        assert docs and corpus.heldout[task], task
        assert all(d.decode("utf-8").startswith(SYSTEM_PROMPTS[task]) for d in docs)
        assert all(d.startswith(SYSTEM_PROMPTS[task]) for d in corpus.heldout[task])
        total = sum(len(d) for d in docs) + sum(len(d.encode("utf-8")) for d in corpus.heldout[task])
        assert total <= SMALL
        assert corpus.train[task].endswith(DOC_SEP) and corpus.train[task].count(DOC_SEP) == len(docs)


def test_heldout_is_disjoint_from_train(corpus):
    for task in TASKS:
        train = {d.decode("utf-8") for d in corpus.train_documents(task)}
        assert not train & set(corpus.heldout[task]), task


def test_json_documents_are_valid_json_lines(corpus):
    for doc in corpus.train_documents("json")[:20]:
        for line in doc.decode("utf-8")[len(SYSTEM_PROMPTS["json"]):].splitlines():
            assert isinstance(json.loads(line), dict)


def test_save_load_round_trip_and_manifest(corpus, tmp_path):
    d = corpus.save(tmp_path / "c")
    loaded = Corpus.load(d)
    assert loaded.train == corpus.train and loaded.heldout == corpus.heldout and loaded.seed == 0
    manifest = json.loads((d / "manifest.json").read_text())
    assert manifest["python"] == corpus.python_version
    assert set(manifest["files"]) == {f"{t}.{k}" for t in TASKS for k in ("train.bin", "heldout.jsonl")}
    (d / "json.train.bin").write_bytes(b"tampered")
    with pytest.raises(ValueError, match="sha256"):
        Corpus.load(d)


def test_code_chunks_cut_at_top_level_statements():
    src = "import os\n\n# about f\ndef f():\n    return 1\n\n\nclass C:\n    x = 1\n"
    assert code_chunks(src, target=10) == ["import os\n", "# about f\ndef f():\n    return 1\n",
                                           "class C:\n    x = 1\n"]
    assert "".join(code_chunks(src, target=1000)) == src
