"""Small building blocks of the transformer: RMSNorm, rotary embeddings, SwiGLU."""
from __future__ import annotations

import math

import torch
from torch import nn

from infersight.runtime.model.model_config import Llama3RopeScaling


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        xf = x.float()
        xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)
        return xf.to(x.dtype) * self.weight


def llama3_inv_freq(inv_freq: torch.Tensor, scaling: Llama3RopeScaling) -> torch.Tensor:
    """Llama 3.1's frequency scaling: wavelengths longer than the original context over
    low_freq_factor are divided by `factor`, those shorter than it over high_freq_factor kept,
    and the band between interpolated linearly in original_context / wavelength."""
    wavelen = 2 * math.pi / inv_freq
    context = scaling.original_max_positions
    smooth = (context / wavelen - scaling.low_freq_factor) / (scaling.high_freq_factor - scaling.low_freq_factor)
    smoothed = (1 - smooth) * inv_freq / scaling.factor + smooth * inv_freq
    out = torch.where(wavelen > context / scaling.low_freq_factor, inv_freq / scaling.factor, inv_freq)
    medium = (wavelen <= context / scaling.low_freq_factor) & (wavelen >= context / scaling.high_freq_factor)
    return torch.where(medium, smoothed, out)


class RotaryEmbedding(nn.Module):
    """RoPE with a precomputed cos/sin table indexed by absolute position (rotate-half form)."""

    def __init__(self, head_dim: int, max_positions: int, theta: float,
                 scaling: Llama3RopeScaling | None = None) -> None:
        super().__init__()
        self.head_dim, self.max_positions, self.theta, self.scaling = head_dim, max_positions, theta, scaling
        self.register_buffer("cos", torch.empty(max_positions, head_dim // 2), persistent=False)
        self.register_buffer("sin", torch.empty(max_positions, head_dim // 2), persistent=False)
        self.reset_tables()

    def reset_tables(self) -> None:
        """(Re)compute the tables in float32 on the buffers' device (after a meta-device build too)."""
        device = self.cos.device
        if device.type == "meta":
            return
        inv_freq = 1.0 / (self.theta ** (torch.arange(0, self.head_dim, 2, dtype=torch.float64) / self.head_dim))
        if self.scaling is not None:
            inv_freq = llama3_inv_freq(inv_freq, self.scaling)
        angles = torch.outer(torch.arange(self.max_positions, dtype=torch.float64), inv_freq)
        self.cos = angles.cos().float().to(device)
        self.sin = angles.sin().float().to(device)

    def forward(self, x: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """x [T, H, D], positions [T] -> x rotated by each token's position."""
        cos = self.cos[positions].unsqueeze(1)
        sin = self.sin[positions].unsqueeze(1)
        x1, x2 = x.float().chunk(2, dim=-1)
        out = torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1)
        return out.to(x.dtype)


class SwiGLU(nn.Module):
    """down(silu(gate(x)) * up(x)); gate and up fused in one matmul."""

    def __init__(self, d_model: int, ffn_dim: int) -> None:
        super().__init__()
        self.gate_up = nn.Linear(d_model, 2 * ffn_dim, bias=False)
        self.down = nn.Linear(ffn_dim, d_model, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate, up = self.gate_up(x).chunk(2, dim=-1)
        return self.down(nn.functional.silu(gate) * up)
