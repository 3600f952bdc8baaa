"""`infersight export-hf`: a named config and its weights as a Hugging Face model directory."""
from __future__ import annotations

import argparse


def run(args: argparse.Namespace) -> int:
    from infersight.runtime.checkpoints.export import export_hf

    print(export_hf(args.model, args.out, weights=args.weights))
    return 0


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("export-hf", help="write a named model (tiny-moe as Mixtral, tiny-draft as Llama) as a "
                                         "Hugging Face model directory that transformers and vLLM load")
    p.add_argument("model", help="a named config (tiny-moe, tiny-draft, ...)")
    p.add_argument("--out", required=True, help="the directory to write (config.json, model.safetensors, tokenizer.json, ...)")
    p.add_argument("--weights", help="a safetensors file of the engine's names (default: the shipped weights)")
    p.set_defaults(func=run)
