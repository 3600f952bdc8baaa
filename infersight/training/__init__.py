"""Training the small reference models (tiny-moe, tiny-draft) on an offline, task-labelled corpus.

`corpus.build_corpus` makes the text from what any Python installation has; `train.train` fits a
model to it; `python -m infersight.training` does both and writes infersight/models/<name>.safetensors.
"""
