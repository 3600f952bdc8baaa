"""Hugging Face model directories for the reference engine: config.json mapped to a ModelConfig per
architecture, safetensors (single or sharded) loaded one tensor at a time by name, tokenizer.json
through `tokenizers`, the chat template rendered as transformers renders it, and the EOS ids of
generation_config.json.

Part of the runtime: imports nothing of ours outside infersight.runtime. Modules that read JSON
only (model_dir, architectures, generation_config) import no torch, so ModelConfig stays torch-free.
"""
