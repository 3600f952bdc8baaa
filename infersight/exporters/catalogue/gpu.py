"""GPU telemetry (infersight.gpu): GPU_METRICS.

Each name is "infersight_gpu_" + a field of infersight.gpu.fields, in base units, labelled by device
index and UUID. Sources: DCGM, dcgm-exporter or NVML (GPM on Hopper+). MIG GPU-instance series are kept
in the sampler's frames but not exposed under these labels. The families are built by
infersight.gpu.exposition from the sampler."""
from __future__ import annotations

from infersight.exporters.catalogue.spec import MetricSpec, P

GPU_LABELS = ("gpu", "uuid")
GPU_GR_ENGINE_ACTIVE = MetricSpec(P + "gpu_gr_engine_active_ratio", "gauge",
                                  "Fraction of time the graphics/compute engine was active.", GPU_LABELS, "ratio")
GPU_SM_ACTIVE = MetricSpec(P + "gpu_sm_active_ratio", "gauge",
                           "Fraction of time at least one warp was resident on an SM, averaged over SMs.",
                           GPU_LABELS, "ratio")
GPU_SM_OCCUPANCY = MetricSpec(P + "gpu_sm_occupancy_ratio", "gauge",
                              "Resident warps over the maximum warps per SM, averaged over SMs.", GPU_LABELS, "ratio")
GPU_TENSOR_ACTIVE = MetricSpec(P + "gpu_tensor_active_ratio", "gauge",
                               "Fraction of cycles the tensor pipes were active.", GPU_LABELS, "ratio",
                               views={"by_gpu": f"max by (gpu) ({P}gpu_tensor_active_ratio)"})
GPU_DRAM_ACTIVE = MetricSpec(P + "gpu_dram_active_ratio", "gauge",
                             "Fraction of cycles the device memory interface was busy.", GPU_LABELS, "ratio",
                             views={"by_gpu": f"max by (gpu) ({P}gpu_dram_active_ratio)"})
GPU_UTILIZATION = MetricSpec(P + "gpu_utilization_ratio", "gauge",
                             "Fraction of the sample period a kernel was running (coarse: any kernel counts).",
                             GPU_LABELS, "ratio")
GPU_MEMORY_COPY_UTILIZATION = MetricSpec(P + "gpu_memory_copy_utilization_ratio", "gauge",
                                         "Fraction of the sample period device memory was read or written.",
                                         GPU_LABELS, "ratio")
GPU_POWER = MetricSpec(P + "gpu_power_watts", "gauge", "Board power draw.", GPU_LABELS, "watts")
GPU_ENERGY = MetricSpec(P + "gpu_energy_joules", "counter", "GPU energy consumed since the driver loaded.",
                        GPU_LABELS, "joules",
                        views={"watts": f"sum by (gpu) (rate({P}gpu_energy_joules_total[$__rate_interval]))"})
GPU_MEMORY_USED = MetricSpec(P + "gpu_memory_used_bytes", "gauge", "Framebuffer memory in use.", GPU_LABELS, "bytes",
                             views={"used_ratio": f"{P}gpu_memory_used_bytes / {P}gpu_memory_total_bytes"})
GPU_MEMORY_FREE = MetricSpec(P + "gpu_memory_free_bytes", "gauge", "Framebuffer memory free.", GPU_LABELS, "bytes")
GPU_MEMORY_TOTAL = MetricSpec(P + "gpu_memory_total_bytes", "gauge", "Framebuffer memory installed.", GPU_LABELS,
                              "bytes")
GPU_TEMPERATURE = MetricSpec(P + "gpu_temperature_celsius", "gauge", "GPU die temperature.", GPU_LABELS, "celsius")
GPU_MEMORY_TEMPERATURE = MetricSpec(P + "gpu_memory_temperature_celsius", "gauge", "HBM temperature.", GPU_LABELS,
                                    "celsius")
GPU_SM_CLOCK = MetricSpec(P + "gpu_sm_clock_hertz", "gauge", "SM clock.", GPU_LABELS, "hertz")
GPU_MEMORY_CLOCK = MetricSpec(P + "gpu_memory_clock_hertz", "gauge", "Memory clock.", GPU_LABELS, "hertz")
GPU_PCIE_TX = MetricSpec(P + "gpu_pcie_tx_bytes_per_second", "gauge",
                         "PCIe bytes sent by the GPU per second (headers included).", GPU_LABELS, "bytes_per_second")
GPU_PCIE_RX = MetricSpec(P + "gpu_pcie_rx_bytes_per_second", "gauge",
                         "PCIe bytes received by the GPU per second (headers included).", GPU_LABELS,
                         "bytes_per_second")
GPU_NVLINK_TX = MetricSpec(P + "gpu_nvlink_tx_bytes_per_second", "gauge", "NVLink bytes sent per second, all links.",
                           GPU_LABELS, "bytes_per_second")
GPU_NVLINK_RX = MetricSpec(P + "gpu_nvlink_rx_bytes_per_second", "gauge",
                           "NVLink bytes received per second, all links.", GPU_LABELS, "bytes_per_second")
GPU_COLLECTOR_ERRORS = MetricSpec(P + "gpu_collector_errors", "counter",
                                  "Failed GPU telemetry polls (scrape errors, NVML/DCGM errors), by collector.",
                                  ("collector",))

GPU_METRICS: tuple[MetricSpec, ...] = (
    GPU_GR_ENGINE_ACTIVE, GPU_SM_ACTIVE, GPU_SM_OCCUPANCY, GPU_TENSOR_ACTIVE, GPU_DRAM_ACTIVE, GPU_UTILIZATION,
    GPU_MEMORY_COPY_UTILIZATION, GPU_POWER, GPU_ENERGY, GPU_MEMORY_USED, GPU_MEMORY_FREE, GPU_MEMORY_TOTAL,
    GPU_TEMPERATURE, GPU_MEMORY_TEMPERATURE, GPU_SM_CLOCK, GPU_MEMORY_CLOCK, GPU_PCIE_TX, GPU_PCIE_RX, GPU_NVLINK_TX,
    GPU_NVLINK_RX, GPU_COLLECTOR_ERRORS,
)
