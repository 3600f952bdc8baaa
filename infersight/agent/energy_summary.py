"""The energy account told to users: the summary's `cost.energy` (headline, how it was obtained, the
parts in joules) from an EnergyMeter, each figure named measured (the counter, the idle power) or
modelled (the split, the dynamic/static cut)."""
from __future__ import annotations

import numpy as np

from infersight.agent.energy_meter import EnergyMeter
from infersight.correlate import energy as E

#: What every per-request joule figure is, in the summary, the API and the docs.
BASIS = "modelled split of measured energy"


def describe_energy(meter: EnergyMeter, gpu_status: str = "") -> dict[str, object]:
    """The account so far, for the summary (joules and seconds), with how it was obtained in one
    sentence (`status`); gpu_status: the sampler's status line, named when there is no energy."""
    if meter.cursor_ns is None or meter.from_ns is None:
        return {"measured": False, "headline": "not measured: no GPU energy counter",
                "status": "energy not measured: no GPU energy counter was read"
                + (f" ({gpu_status})" if gpu_status else "") + "; energy_j is null for every request"}
    # Read off the counter itself, not summed from the parts: the two agree exactly (conservation).
    delta_uj = int(E.counter_at(meter.readings.energy, np.array([meter.cursor_ns]))[0]) - meter.from_uj
    gpus = ", ".join(map(str, meter.gpus))
    watts = ", ".join(f"{meter.readings.power_hi.get(g, 0.0) * 1e3:.0f} W" for g in meter.gpus)
    split = meter.steps_by_model + meter.steps_by_tokens
    status = (f"energy_j is a {BASIS}. Measured: the total-energy counter of GPU(s) {gpus}, read at the "
              "sampler's interval and interpolated linearly at each step's start and end; the steps' energy "
              "plus idle_j (between steps) is the counter's rise exactly. Modelled: each step's energy is "
              "split over its requests by their modelled cost (split_model: the GPU's static power and dynamic "
              "joules per prefill, decode and draft token, fitted on the measured energy of the counter's "
              f"intervals; {meter.steps_by_model} of {split} steps split so, the rest by token share); once that "
              "fit is usable each step's energy is also cut into static_j (static power x step time: with the "
              "static power held at the measured idle power, idle_w_measured, exactly that, and dynamic_j the "
              "rest; with it fitted, in the model's proportion against dynamic_j, its tokens' modelled cost), "
              "and a request's energy_j = "
              "energy_dynamic_j + energy_static_j, its static part shared in proportion to its dynamic cost "
              "(unsplit_j: energy of steps split before the fit was usable, not cut). "
              "energy_sampling_bound_j: the most the interpolation between readings can have moved "
              f"into or out of a request, were the GPU's power anywhere between 0 W and the most seen ({watts})")
    headline = (f"{meter.requests_uj / 1e6:.1f} J in requests' steps ({BASIS}), {meter.idle_uj / 1e6:.1f} J idle "
                f"between steps, over {(meter.cursor_ns - meter.from_ns) / 1e9:.1f} s (GPU energy counter)")
    if meter.costs.usable:
        headline += (f"; of the requests' joules {meter.dynamic_uj / 1e6:.1f} J dynamic, "
                     f"{meter.static_uj / 1e6:.1f} J static ({meter.costs.static_w:.0f} W while steps run, "
                     + ("fitted)" if meter.costs.static_from == "fitted" else "the measured idle power)"))
    return {"measured": True, "basis": BASIS, "headline": headline, "status": status, "gpus": list(meter.gpus),
            "window_s": (meter.cursor_ns - meter.from_ns) / 1e9,
            "counter_delta_j": delta_uj / 1e6,
            "requests_j": meter.requests_uj / 1e6, "idle_j": meter.idle_uj / 1e6,
            # requests_j cut by the model ("modelled split of measured energy"): dynamic + static + unsplit.
            "dynamic_j": meter.dynamic_uj / 1e6, "static_j": meter.static_uj / 1e6,
            "unsplit_j": (meter.requests_uj - meter.dynamic_uj - meter.static_uj) / 1e6,
            "static_w": meter.costs.static_w if meter.costs.usable else None, "static_from": meter.costs.static_from,
            "static_w_fitted": meter.costs.static_w if meter.costs.usable and meter.costs.static_from == "fitted"
            else None,
            # Measured: the counter's rise over settled idle time (no step running), and how much was read.
            "idle_w_measured": meter.idle_w, "idle_s_read": meter.idle.ns / 1e9,
            "split_model": meter.costs.describe(), "steps_split_by_model": meter.steps_by_model,
            "steps_split_by_token_share": meter.steps_by_tokens,
            "sampling_bound_j_of_requests_taken": meter.bound_taken_uj / 1e6,
            "power_hi_w": {int(g): meter.readings.power_hi.get(g, 0.0) * 1e3 for g in meter.gpus},
            "steps_measured": meter.steps_measured, "steps_unmeasured": meter.steps_dropped,
            "rows_released_before_measured": meter.rows_timed_out}
