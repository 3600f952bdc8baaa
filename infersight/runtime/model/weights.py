"""Build a model: weights from safetensors when present, else deterministic random init by seed."""
from __future__ import annotations

from pathlib import Path
from typing import Mapping

import torch

from infersight.runtime.checkpoints.loader import load_checkpoint
from infersight.runtime.config import ModelConfig
from infersight.runtime.errors import WeightsError
from infersight.runtime.model.transformer import Transformer
from infersight.runtime.ranges import RangeMarker

# Trained weights shipped with the package live here as <model name>.safetensors.
SHIPPED_WEIGHTS_DIR = Path(__file__).resolve().parents[2] / "models"  # infersight/models


def shipped_weights(name: str) -> Path | None:
    path = SHIPPED_WEIGHTS_DIR / f"{name}.safetensors"
    return path if path.is_file() else None


def init_random(model: Transformer, seed: int) -> None:
    """Same seed, same weights: draw in parameter-name order on a generator of the model's device
    (so a 40B-parameter shape is initialised on the GPU, not on the host)."""
    init_named_random(dict(model.named_parameters()), model.cfg.n_layers, seed, next(model.parameters()).device)


def init_named_random(params: Mapping[str, torch.Tensor], n_layers: int, seed: int,
                      device: torch.device | str) -> None:
    """init_random over parameters given by their full-model names. A meta tensor stands for a
    parameter this process does not hold (another expert-parallel rank's expert): its draws go to
    a transient buffer of its size, so the rest of the stream, hence every weight held, is the
    full model's."""
    gen = torch.Generator(device=device).manual_seed(seed)
    with torch.no_grad():
        for name, param in sorted(params.items()):
            if param.ndim == 1:
                if not param.is_meta:
                    param.fill_(1.0)
                continue
            std = 0.02
            if name.endswith(("attn.out.weight", "down.weight")):
                std = 0.02 / (2 * n_layers) ** 0.5  # keep the residual stream's variance flat with depth
            target = torch.empty(param.shape, dtype=param.dtype, device=device) if param.is_meta else param
            target.normal_(0.0, std, generator=gen)


def load_safetensors(model: Transformer, path: str | Path) -> None:
    """Load every parameter from a safetensors file; names and shapes must match exactly."""
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    path = Path(path)
    if not path.is_file():
        raise WeightsError(f"weights file not found: {path}")
    try:
        tensors = load_file(str(path))
    except (SafetensorError, OSError, ValueError, RuntimeError) as exc:
        raise WeightsError(f"cannot read {path} as safetensors: {exc}") from None
    expected = dict(model.named_parameters())
    missing = sorted(set(expected) - set(tensors))
    extra = sorted(set(tensors) - set(expected))
    if missing or extra:
        raise WeightsError(f"{path} does not match model {model.cfg.name!r}: "
                           f"missing {missing[:5]}{'...' if len(missing) > 5 else ''}, "
                           f"unexpected {extra[:5]}{'...' if len(extra) > 5 else ''}")
    with torch.no_grad():
        for name, param in expected.items():
            src = tensors[name]
            if tuple(src.shape) != tuple(param.shape):
                raise WeightsError(f"{path}: {name} has shape {tuple(src.shape)}, "
                                   f"model {model.cfg.name!r} expects {tuple(param.shape)}")
            param.copy_(src.to(param.dtype))


def save_safetensors(model: Transformer, path: str | Path) -> None:
    from safetensors.torch import save_file

    save_file({k: v.detach().to("cpu").contiguous() for k, v in model.named_parameters()}, str(path),
              metadata={"model": model.cfg.name})


def build_model(cfg: ModelConfig, *, dtype: torch.dtype, device: str, seed: int,
                weights: str | Path | None = None, attention_backend: str = "flash",
                ranges: RangeMarker | None = None, decode_attention: str = "torch") -> Transformer:
    """A model in eval mode on `device`: explicit weights, else its Hugging Face checkpoint, else
    shipped weights, else random by seed."""
    # Built on the meta device and materialised once on the target: no throw-away host init.
    with torch.device("meta"):
        model = Transformer(cfg, attention_backend, ranges, decode_attention).to(dtype)
    model = model.to_empty(device=device)
    model.tie_weights()
    model.rope.reset_tables()
    path = weights if weights is not None else shipped_weights(cfg.name)
    if cfg.checkpoint and weights is None:
        load_checkpoint(model, cfg)
    elif path is not None:
        load_safetensors(model, path)
    else:
        init_random(model, seed)
    return model.eval()
