"""The CPU demo's roofline ceilings: without a compute and a bandwidth ceiling the flight recorder's
windows place no share of a roof (kernels.ceilings.ceiling_lookup), and a CPU has no datasheet entry. So the
demo looks in the ceilings cache first (what `infersight bench ceilings` measured on this machine),
and when it holds nothing for this CPU, measures the two ceilings itself with small sizes (a second
or two) into a cache of the run's own, and says so. Never into the user's cache: a quick measurement
there would stand in, labelled measured, for a proper one in every later roofline.

On CUDA the demo measures nothing: the agent finds the cache's entry or the GPU's datasheet itself.
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from infersight.kernels.ceilings.ceiling_cache import ENV_VAR, default_cache_path, host_cpu_name
from infersight.kernels.ceilings.ceiling_lookup import CeilingLookup, lookup_ceilings

#: The demo's own measurement: (copy MiB, GEMM n, warm-up runs, timed runs). A 64 MiB copy is far
#: larger than a CPU's last-level cache; a 512^3 matmul keeps the cores busy for milliseconds per run.
#: Both are smaller than `bench ceilings`' CPU defaults (256 MiB, 2048^3): a quick, lower estimate.
QUICK = (64, 512, 1, 5)
CACHE_NAME = "ceilings.json"


@dataclass(frozen=True)
class DemoCeilings:
    """The ceilings the agent will place the demo's windows against. cache: the file the agent
    reads them from; measured_now: the demo measured them itself (QUICK) rather than finding them."""

    lookup: CeilingLookup
    cache: Path
    measured_now: bool

    def agent_env(self) -> dict[str, str]:
        """The agent process's environment: this cache as $INFERSIGHT_CEILINGS."""
        return {**os.environ, ENV_VAR: str(self.cache)}

    def line(self) -> str:
        """For people: which ceilings, each with its source, and whether the demo measured them."""
        if self.lookup.ceilings is None:
            return self.lookup.missing
        how = (f"measured now by the demo (copy {QUICK[0]} MiB, GEMM {QUICK[1]}^3, median of {QUICK[3]}; "
               f"`infersight bench ceilings` measures them properly and caches them)" if self.measured_now
               else f"from the ceilings cache {self.cache}")
        return f"{self.lookup.describe()}; {how}"


def demo_ceilings(out_dir: Path, dtype: str) -> DemoCeilings:
    """This CPU's ceilings at dtype: from the cache (default_cache_path) when it has them, else
    measured now into out_dir/ceilings.json (module docstring)."""
    found = lookup_ceilings(host_cpu_name(), dtype, given_as=None)
    if found.ceilings is not None:
        return DemoCeilings(found, default_cache_path(), measured_now=False)
    from infersight.bench.ceilings import bench_ceilings  # torch: only when measuring

    cache = out_dir / CACHE_NAME
    copy_mib, gemm_n, warmup, repeats = QUICK
    bench_ceilings(device="cpu", dtype=dtype, copy_mib=copy_mib, gemm_n=gemm_n, warmup=warmup, repeats=repeats,
                   cache=cache)
    return DemoCeilings(lookup_ceilings(host_cpu_name(), dtype, cache=cache, given_as=None), cache,
                        measured_now=True)
