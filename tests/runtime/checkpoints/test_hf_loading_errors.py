"""A checkpoint the engine cannot serve is refused before any request, in one line naming what is
wrong: an unknown architecture, a missing tensor, a tensor of the wrong shape (the Python API
raises a ValueError subclass; the CLI exits 2 with one line and no traceback)."""
from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from hf_tiny_checkpoints import needs_transformers

pytestmark = needs_transformers


def _copy(src: Path, dst: Path) -> Path:
    shutil.copytree(src, dst)
    return dst


def _rewrite_tensors(directory: Path, change) -> None:  # noqa: ANN001 -- a function of the tensor dict
    from safetensors.torch import load_file, save_file

    path = directory / "model.safetensors"
    tensors = load_file(str(path))
    change(tensors)
    save_file(tensors, str(path), metadata={"format": "pt"})


@pytest.fixture(scope="module")
def broken(hf_checkpoints: dict[str, Path], tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Copies of the Qwen3 checkpoint, each broken one way."""
    root = tmp_path_factory.mktemp("hf_broken")
    src = hf_checkpoints["qwen3"]
    unknown = _copy(src, root / "unknown_arch")
    config = json.loads((unknown / "config.json").read_text())
    config["architectures"] = ["GPTNeoXForCausalLM"]
    (unknown / "config.json").write_text(json.dumps(config))
    missing = _copy(src, root / "missing_tensor")
    _rewrite_tensors(missing, lambda t: t.pop("model.layers.1.self_attn.k_norm.weight"))
    misshapen = _copy(src, root / "misshapen")

    def narrow(t: dict) -> None:  # noqa: ANN001
        t["model.layers.0.mlp.up_proj.weight"] = t["model.layers.0.mlp.up_proj.weight"][:-1].contiguous()

    _rewrite_tensors(misshapen, narrow)
    return {"unknown": unknown, "missing": missing, "misshapen": misshapen}


EXPECTED = {
    "unknown": r"architecture 'GPTNeoXForCausalLM' is not supported; supported: LlamaForCausalLM",
    "missing": r"tensor model\.layers\.1\.self_attn\.k_norm\.weight is missing from the checkpoint",
    "misshapen": r"tensor model\.layers\.0\.mlp\.up_proj\.weight has shape \[95, 64\], the config .* implies \[96, 64\]",
}


@pytest.mark.parametrize("case", sorted(EXPECTED))
def test_the_python_api_raises_one_line_naming_the_tensor(broken: dict[str, Path], case: str) -> None:
    from infersight.runtime import LLM

    with pytest.raises(ValueError, match=EXPECTED[case]) as info:
        LLM(model=str(broken[case]), num_kv_blocks=32, max_model_len=128)
    assert "\n" not in str(info.value)


def test_a_tensor_the_architecture_has_not_is_refused(hf_checkpoints: dict[str, Path], tmp_path: Path) -> None:
    import torch

    from infersight.runtime import LLM

    extra = _copy(hf_checkpoints["llama"], tmp_path / "extra")
    _rewrite_tensors(extra, lambda t: t.update({"model.layers.0.self_attn.o_proj.bias": torch.zeros(64)}))
    with pytest.raises(ValueError, match=r"tensor model\.layers\.0\.self_attn\.o_proj\.bias is not part of"):
        LLM(model=str(extra), num_kv_blocks=32, max_model_len=128)


def test_serve_exits_non_zero_with_one_line_and_no_traceback(broken: dict[str, Path]) -> None:
    """The missing tensor: found while the engine builds the model, after the config was accepted."""
    case = "missing"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    proc = subprocess.run([sys.executable, "-m", "infersight", "serve", "--model", str(broken[case]),
                           "--device", "cpu", "--listen", "127.0.0.1:0"],
                          capture_output=True, text=True, timeout=180, env=env)
    assert proc.returncode == 2, proc.stderr
    errors = [line for line in proc.stderr.splitlines() if line.startswith("infersight: error:")]
    assert len(errors) == 1, proc.stderr
    assert "Traceback" not in proc.stderr
    assert re.search(EXPECTED[case], errors[0])
