"""Expert parallelism for the reference runtime: MoE experts sharded over W ranks, tokens
dispatched and combined by torch.distributed all-to-all (NCCL on GPUs, gloo on CPU).

| module | concept |
|---|---|
| `placement.py` | which rank hosts which experts (contiguous home shards, optional replicas) |
| `exchange.py` | where each (token, expert) pair goes, and the all-to-all / all-gather collectives |
| `moe.py` | `ExpertParallelMoE`: the sharded MoE FFN, bit-exact with `MoEFFN` without replicas |
| `stats.py` | per-layer phase timings, bytes per peer, tokens per local expert; flushed once per step |
| `local_model.py` | one rank's model: built on meta, sharded, then only its experts materialised and filled |
| `engine.py` | `ExpertParallelEngine`: the single-process `Engine` with its MoE layers sharded |
| `group.py` | the process group (torchrun environment, NCCL/gloo, NVLink multicast off) |
| `generation.py` | one rank's generation: the same greedy requests on every rank, its totals |

Every rank runs the same engine loop on the same requests; attention and the dense parts are
replicated, so the generated tokens equal the single-process engine's. The torchrun entry point
(with probes) is infersight.commands.ep_launch; W local CPU ranks for tests: tests/parallel/gloo_spawn.py.
"""
