"""Kernel-level captures (Kineto, Nsight Systems, Nsight Compute): parse once into DataFrames,
then analyse with pure functions that never mutate their inputs.

Frames and their columns are documented in `kernels/frames.py` (with `errors.TraceError`, shared by
every room); `bounded_run` runs one file's analysis in a child with a deadline and a memory ceiling.
The rooms:
- `readers/`: a capture file -> KernelTrace. `load.detect_kind` / `load.load_trace` pick the reader
  (kineto.py, nsys.py, ncu.py with units.py); `shapes`: a capture's shapes file; `input_files`:
  regular files, byte limits, bounded gunzip; `ranges`: nesting of NVTX / record_function ranges and
  the innermost range at an instant;
- `ceilings/`: the peaks a roofline is placed against (`device_ceilings`: DeviceCeilings and the
  datasheets), the cache `infersight bench ceilings` writes (`ceiling_cache`) and which one a
  roofline uses (`ceiling_lookup`);
- `analysis/`: `paths.path_parts`, `categories.classify` (phase / layer / op and the diagnosis
  category); `attribution` (`attribute_to_requests`, `kernel_summary_by_request`,
  `kernel_time_by_range`); `timeline` (`idle_gaps`, `phase_breakdown`, `category_breakdown`,
  `top_kernels`); `roofline` (`analytic_work`, `place_on_roofline`, `roofline_for_phase`);
  `findings` and `step_findings` (plain-word findings with actions); `report`: all of it for
  `infersight analyze`; `cpu_trace`: a trace with no GPU activity, its CPU ops and their report.
"""
