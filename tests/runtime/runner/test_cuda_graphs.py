"""CUDA graphs for decode steps: bucket and padding logic on the CPU; on a GPU, greedy tokens
identical between graph and eager mode (skipped without CUDA)."""
from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from infersight.runtime import LLM, ModelConfig, SamplingParams
from infersight.runtime.runner.cuda_graphs import batch_buckets, bucket_for, width_buckets
from infersight.runtime.runner.graph_inputs import DecodeInputs, DecodeRow, decode_rows
from infersight.runtime.runner.model_runner import FeedItem
from infersight.runtime.observer import EngineObserver

cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


def test_batch_buckets_follow_vllm_sizes_capped_at_max() -> None:
    assert batch_buckets(32) == [1, 2, 4, 8, 16, 24, 32]
    assert batch_buckets(1) == [1]
    assert batch_buckets(5) == [1, 2, 4, 5]
    assert batch_buckets(20) == [1, 2, 4, 8, 16, 20]
    assert batch_buckets(64)[-3:] == [48, 56, 64]


def test_width_buckets_are_powers_of_two_ending_at_the_max() -> None:
    assert width_buckets(256) == [4, 8, 16, 32, 64, 128, 256]
    assert width_buckets(100) == [4, 8, 16, 32, 64, 100]
    assert width_buckets(3) == [3]


def test_bucket_for_picks_the_smallest_that_fits() -> None:
    sizes = [1, 2, 4, 8, 16, 24, 32]
    assert [bucket_for(n, sizes) for n in (1, 2, 3, 5, 8, 17, 25, 32)] == [1, 2, 4, 8, 8, 24, 32, 32]
    assert bucket_for(33, sizes) is None


def _item(table: list[int], pos: int, tokens: list[int] | None = None, logits: int = 1) -> FeedItem:
    return FeedItem(SimpleNamespace(block_table=table), pos, tokens or [pos % 7], logits)  # type: ignore[arg-type]


def test_decode_rows_slots_and_tables() -> None:
    # block_size 4: position 9 is in the table's third block (id 2), offset 1 -> slot 2 * 4 + 1.
    first, second = [5, 7, 2, 9], [3]
    rows = decode_rows([_item(first, 9), _item(second, 0)], block_size=4)
    assert rows is not None and len(rows) == 2 and rows.max_blocks == 3
    assert (rows.tokens, rows.positions, rows.slots) == ([9 % 7, 0], [9, 0], [9, 12])
    assert [rows.blocks(0), rows.blocks(1)] == [[5, 7, 2], [3]]
    assert rows.tables[0] is first and rows.tables[1] is second  # the tables themselves, not copies
    assert decode_rows([_item([5], 1, tokens=[1, 2])], 4) is None  # a prefill chunk: eager
    assert decode_rows([_item([5], 1, logits=0)], 4) is None


def test_inputs_fill_pads_rows_to_the_spare_block() -> None:
    inputs = DecodeInputs(max_batch=4, max_blocks=8, block_size=4, pad_block=10, device="cpu")
    rows = [DecodeRow(11, 9, 9, [5, 7, 2]), DecodeRow(12, 0, 12, [3])]
    inputs.fill(rows, bucket=4, width=4)
    batch = inputs.batch(4, 4)
    assert batch.input_ids.tolist() == [11, 12, 0, 0]
    assert batch.positions.tolist() == [9, 0, 0, 0]
    assert batch.slot_mapping.tolist() == [9, 12, 40, 40]  # padding writes into block 10 only
    assert batch.decode_context_lens.tolist() == [10, 1, 1, 1]
    tables = batch.decode_block_tables
    assert tables.shape == (4, 4) and tables.is_contiguous()
    assert tables[0, :3].tolist() == [5, 7, 2] and tables[1, 0] == 3 and tables[2:, 0].tolist() == [10, 10]
    assert batch.decode_index.tolist() == batch.logits_index.tolist() == [0, 1, 2, 3]
    assert batch.segments == []


def test_inputs_fill_rewrites_every_row_whose_table_changed() -> None:
    # fill skips rows whose block list it already wrote; each later fill must still read back
    # exactly its own rows: a grown table, another sequence in a row, a row padding overwrote,
    # and another width (a new row layout).
    inputs = DecodeInputs(max_batch=4, max_blocks=8, block_size=4, pad_block=10, device="cpu")

    def tables(rows: list[DecodeRow], bucket: int, width: int) -> list[list[int]]:
        inputs.fill(rows, bucket, width)
        got = inputs.batch(bucket, width).decode_block_tables
        return [got[i, :len(r.blocks)].tolist() for i, r in enumerate(rows)] + [got[i, :1].tolist()
                                                                               for i in range(len(rows), bucket)]

    a, b, c = DecodeRow(1, 9, 9, [5, 7, 2]), DecodeRow(2, 0, 12, [3]), DecodeRow(3, 4, 24, [6, 8])
    assert tables([a, b, c], 4, 4) == [[5, 7, 2], [3], [6, 8], [10]]
    assert tables([a, b, c], 4, 4) == [[5, 7, 2], [3], [6, 8], [10]]  # nothing changed: the same rows
    grown = DecodeRow(1, 12, 0, [5, 7, 2, 0])
    assert tables([grown, c], 4, 4) == [[5, 7, 2, 0], [6, 8], [10], [10]]  # grown; c moved up; padding
    assert tables([a, b, c], 4, 4) == [[5, 7, 2], [3], [6, 8], [10]]  # rows padding overwrote, rewritten
    assert tables([b, a], 2, 8) == [[3], [5, 7, 2]]  # another width: another layout


def test_inputs_fill_writes_the_new_blocks_of_a_table_that_grew_in_place() -> None:
    # A request's block table is one list that only grows in place (kv_cache.allocate_slots); a
    # new list (admission after preemption, swap-in) is written whole even with the same ids count.
    inputs = DecodeInputs(max_batch=2, max_blocks=8, block_size=4, pad_block=10, device="cpu")
    table = [5, 7]
    req = SimpleNamespace(block_table=table)

    def written(pos: int) -> list[int]:
        rows = decode_rows([FeedItem(req, pos, [1], 1)], 4)  # type: ignore[arg-type]
        inputs.fill(rows, 1, 4)
        return inputs.batch(1, 4).decode_block_tables[0, :pos // 4 + 1].tolist()

    assert written(5) == [5, 7]
    table += [3]  # the next block, allocated in place
    assert written(8) == [5, 7, 3]
    assert written(6) == [5, 7]  # fewer blocks read (a verify rolled back): the row still holds them
    req.block_table = [9, 4, 6]  # recomputed after preemption: another list, other blocks
    assert written(8) == [9, 4, 6]


def test_cpu_engine_never_uses_graphs_and_says_why() -> None:
    llm = LLM("tiny-draft", max_model_len=64)
    assert llm.engine.target.graphs is None
    assert llm.engine.target.graph_blocker == "not a CUDA device"
    assert llm.engine.target.decode_widths is None  # the CPU path builds its batches as before


DENSE = ModelConfig("graph-dense", d_model=128, n_layers=2, n_heads=4, n_kv_heads=2, ffn_dim=256, max_seq_len=256)
PROMPTS = ["Graphs and eager mode", "x", "The quick brown fox jumps over the lazy dog, twice over.", "abc" * 10]


def _greedy(model: ModelConfig | str, n: int, dtype: str, enforce_eager: bool,
            observer: EngineObserver | None = None) -> tuple[list[list[int]], LLM]:
    llm = LLM(model, device="cuda", dtype=dtype, enforce_eager=enforce_eager, max_model_len=160,
              num_kv_blocks=64, block_size=16, max_num_seqs=8, enable_prefix_caching=False, observer=observer)
    params = SamplingParams(temperature=0.0, max_tokens=70, ignore_eos=True)  # contexts cross 64 tokens
    return [o.token_ids for o in llm.generate(PROMPTS[:n], params)], llm


@cuda
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("n", [1, 2, 4])
def test_graph_and_eager_greedy_tokens_identical(dtype: str, n: int) -> None:
    eager, eager_llm = _greedy(DENSE, n, dtype, enforce_eager=True)
    graph, graph_llm = _greedy(DENSE, n, dtype, enforce_eager=False)
    assert eager_llm.engine.target.graphs is None
    graphs = graph_llm.engine.target.graphs
    assert graphs is not None and graphs.num_replays >= 60, graph_llm.engine.target.graph_blocker
    assert {w for _, w in graphs.graphs} >= {4, 8}  # the context crossed a width bucket
    assert graph == eager


@cuda
def test_graph_sampling_is_seeded_like_eager() -> None:
    params = [SamplingParams(temperature=0.8, top_k=20, top_p=0.9, max_tokens=30, ignore_eos=True, seed=i)
              for i in range(3)]
    outs = []
    for eager in (True, False):
        llm = LLM(DENSE, device="cuda", dtype="float32", enforce_eager=eager, max_model_len=128, num_kv_blocks=32)
        outs.append([o.token_ids for o in llm.generate(PROMPTS[:3], params)])
    assert outs[0] == outs[1]


class _Counts(EngineObserver):
    wants_expert_counts = True

    def __init__(self) -> None:
        self.total: torch.Tensor | None = None

    def on_expert_counts(self, step_id: int, counts: torch.Tensor) -> None:
        self.total = counts.clone() if self.total is None else self.total + counts


@cuda
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_moe_graphs_keep_tokens_and_expert_counts(dtype: str) -> None:
    """MoE graphs run at exact batch sizes: the step's expert counts are those of the real tokens.
    float32 is the demo's dtype: its decode graphs used to fail to capture (torch._grouped_mm's
    fallback copies its offsets to the host), and the test used to pass with graphs off."""
    runs = []
    for eager in (True, False):
        obs = _Counts()
        tokens, llm = _greedy("tiny-moe", 3, dtype, enforce_eager=eager, observer=obs)
        runs.append((tokens, obs.total, llm.engine.target.graphs))
    (eager_tokens, eager_counts, _), (graph_tokens, graph_counts, graphs) = runs
    assert graphs is not None and graphs.disabled is None, graphs.disabled if graphs is not None else "no graphs"
    assert graphs.num_replays >= 60 and all(b == 3 for b, _ in graphs.graphs)
    assert graph_tokens == eager_tokens
    assert torch.equal(graph_counts, eager_counts)
    # Every token fed (the prompts, then each generated token but the last) is routed to top_k
    # experts in every layer: a count from the raw input, not from the model.
    from infersight.runtime.model.model_config import resolve_model
    from infersight.runtime.tokenizer import ByteTokenizer

    fed = sum(len(ByteTokenizer().encode(p)) for p in PROMPTS[:3]) + sum(len(t) - 1 for t in graph_tokens)
    assert graph_counts.sum(dim=1).tolist() == [resolve_model("tiny-moe").top_k * fed] * graph_counts.shape[0]


@cuda
def test_grouped_mm_is_only_chosen_where_it_does_not_sync() -> None:
    from infersight.runtime.model.moe_experts import grouped_mm_problem

    device = torch.device("cuda")
    if torch.cuda.get_device_capability() >= (9, 0):
        assert grouped_mm_problem(device, torch.bfloat16) is None  # the grouped kernel, graph-safe
    assert grouped_mm_problem(device, torch.float32) is not None  # the host loop fallback (or none)


def test_moe_graph_check_follows_the_expert_path() -> None:
    from infersight.runtime.runner.cuda_graphs import moe_syncs_host

    moe = LLM("tiny-moe", max_model_len=64).engine.target.model
    assert moe_syncs_host(moe, 4)  # no forward yet: whether the grouped GEMM runs is unknown
    for layer in moe.layers:
        layer.ffn._grouped_ok = True  # what a first CUDA forward finds where torch._grouped_mm runs
    assert not moe_syncs_host(moe, 4)
    moe.layers[1].ffn.expert_path = "loop"  # forced onto the host-syncing reference path
    assert moe_syncs_host(moe, 4)
    assert not moe_syncs_host(LLM("tiny-draft", max_model_len=64).engine.target.model, 4)


def test_compile_layers_is_ignored_on_the_cpu() -> None:
    from infersight.runtime.model.layers import RMSNorm

    model = LLM("tiny-draft", max_model_len=64, compile_layers=True).engine.target.model
    norm = next(m for m in model.modules() if isinstance(m, RMSNorm))
    assert "forward" not in vars(norm)  # the class's own forward: nothing was compiled


class _Steps(EngineObserver):
    def __init__(self) -> None:
        self.steps: list = []

    def on_step_end(self, stats) -> None:  # type: ignore[no-untyped-def]
        self.steps.append(stats)


@cuda
def test_steps_that_capture_say_so_and_capture_all_leaves_none_to_capture() -> None:
    """A lazy capture lands on the first decode step at each (batch size, width): that step says
    so (StepStats.graph_captures), since it is no sample of the steady step time. After
    capture_decode_graphs no step captures, and the tokens are those of the lazy engine."""
    runs = []
    for up_front in (False, True):
        obs = _Steps()
        llm = LLM(DENSE, device="cuda", dtype="float32", max_model_len=160, num_kv_blocks=64, block_size=16,
                  max_num_seqs=8, enable_prefix_caching=False, observer=obs)
        graphs = llm.engine.target.graphs
        assert graphs is not None, llm.engine.target.graph_blocker
        captured = llm.engine.capture_decode_graphs() if up_front else 0
        assert captured == (len(graphs.batch_sizes) * len(graphs.widths) if up_front else 0)
        params = SamplingParams(temperature=0.0, max_tokens=70, ignore_eos=True)
        tokens = [o.token_ids for o in llm.generate(PROMPTS[:2], params)]
        runs.append((tokens, [s.graph_captures for s in obs.steps], graphs.num_captures - captured))
    (lazy_tokens, lazy_marks, lazy_captures), (tokens, marks, later_captures) = runs
    assert tokens == lazy_tokens
    # Lazily: one capture per (bucket, width) met, each on the step that paid for it.
    assert sum(lazy_marks) == lazy_captures >= 2 and max(lazy_marks) == 1
    assert later_captures == 0 and set(marks) == {0}


@cuda
def test_capture_all_captures_a_moe_models_graphs_before_any_forward() -> None:
    """A MoE layer learns its expert path at its first forward; capture_decode_graphs runs before any,
    and used to skip every MoE graph (the demo then captured them on its requests' steps)."""
    if torch.cuda.get_device_capability() < (9, 0):
        pytest.skip("the grouped GEMM (graph-safe MoE) needs sm90")
    obs = _Steps()
    llm = LLM("tiny-moe", device="cuda", dtype="bfloat16", max_model_len=160, num_kv_blocks=64, block_size=16,
              max_num_seqs=4, enable_prefix_caching=False, observer=obs)
    graphs = llm.engine.target.graphs
    assert graphs is not None, llm.engine.target.graph_blocker
    assert llm.engine.capture_decode_graphs() == len(graphs.batch_sizes) * len(graphs.widths) > 0
    llm.generate(PROMPTS[:2], SamplingParams(temperature=0.0, max_tokens=40, ignore_eos=True))
    assert {s.graph_captures for s in obs.steps} == {0} and graphs.num_replays > 0
