"""Kernel-level captures (Kineto, Nsight Systems, Nsight Compute): parse once into DataFrames,
then analyse with pure functions that never mutate their inputs.

Frames and their columns are documented in `kernels/frames.py`. The modules:
- `load.detect_kind` / `load.load_trace`: a path -> KernelTrace (kineto.py, nsys.py, ncu.py);
- `ranges`: nesting of NVTX / record_function ranges and the innermost range at an instant;
- `paths.path_parts`, `categories.classify`: phase / layer / op and the diagnosis category;
- `attribution`: `attribute_to_requests`, `kernel_summary_by_request`, `kernel_time_by_range`;
- `timeline`: `idle_gaps`, `phase_breakdown`, `category_breakdown`, `top_kernels`;
- `roofline`: `analytic_work`, `place_on_roofline`, `roofline_for_phase` (DeviceCeilings, StepShape);
- `findings`: plain-word findings with actions; `report`: all of it for `infersight analyze`.
"""
