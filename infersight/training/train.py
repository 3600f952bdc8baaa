"""Train a reference model (tiny-moe, tiny-draft or any ModelConfig) on a Corpus.

Batches are random windows of the task streams, equal task weights, each window starting with
BOS (half of them at a document start, so the system prompts are learnt right after BOS). AdamW,
warmup then cosine decay, bf16 autocast on CUDA, gradient clipping, and for MoE models a small
Switch-style load-balancing loss: small enough that the router stays visibly imbalanced (on an
H200, 3000 steps of 32x1024 tokens: coefficient 0.01 left every layer's expert shares within
0.11-0.14, 0.001 left some layers at 0.06-0.26).

The forward is Transformer.forward_train (causal SDPA over the window, no KV cache), on the
same parameters that inference uses.
"""
from __future__ import annotations

import contextlib
import copy
import dataclasses
import hashlib
import json
import math
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import torch
import torch.nn.functional as F

from infersight.runtime.config import ModelConfig, resolve_model
from infersight.runtime.model.transformer import Transformer
from infersight.runtime.model.moe import MoEFFN
from infersight.runtime.tokenizer import ByteTokenizer
from infersight.runtime.model.weights import SHIPPED_WEIGHTS_DIR, init_random, save_safetensors
from infersight.training.corpus import Corpus

BOS, EOS, PAD = ByteTokenizer.bos_id, ByteTokenizer.eos_id, ByteTokenizer.pad_id
IGNORE = -100  # target id that the loss skips (padding past a stream's end)
_SAVE_DTYPES = {"float16": torch.float16, "bfloat16": torch.bfloat16, "float32": torch.float32}


@dataclass
class TrainResult:
    """final_loss / task_loss: mean cross-entropy (nats per byte) on held-out text, the overall one
    being the mean over tasks. expert_load: per MoE layer, the share of top-k assignments each
    expert got on held-out text (1 / n_experts each when balanced)."""

    model_name: str
    config: dict
    steps: int
    batch_size: int
    seq_len: int
    lr: float
    seed: int
    aux_loss_coef: float
    device: str
    final_loss: float
    task_loss: dict[str, float]
    train_loss: float
    tokens_seen: int
    seconds: float
    params: int
    history: list[dict] = field(default_factory=list)
    expert_load: list[list[float]] = field(default_factory=list)
    extra: dict = field(default_factory=dict)
    model: Transformer | None = field(default=None, repr=False, compare=False)

    def to_dict(self) -> dict:
        out = {f.name: getattr(self, f.name) for f in dataclasses.fields(self) if f.name != "model"}
        out["bits_per_byte"] = {t: v / math.log(2) for t, v in self.task_loss.items()}
        return out


def init_model(cfg: ModelConfig, device: str, seed: int) -> Transformer:
    """Fresh random float32 weights by seed (never the shipped ones), in train mode."""
    with torch.device("meta"):
        model = Transformer(cfg, attention_backend="sdpa")
    model = model.to_empty(device=device)
    model.rope.reset_tables()
    init_random(model, seed)
    return model.train()


class WindowSampler:
    """Training windows: row = [BOS] + seq_len bytes of one task's stream; the document separator
    reads as EOS and bytes past the stream's end as PAD (target IGNORE). Rows cycle through the
    tasks, so every task gets the same share of each batch. The streams live on `device` and the
    windows are cut there, so a training step never waits on the host."""

    def __init__(self, corpus: Corpus, seq_len: int, seed: int, doc_start_prob: float = 0.5,
                 device: str = "cpu") -> None:
        self.seq_len, self.doc_start_prob, self.device = seq_len, doc_start_prob, device
        self.tasks = [t for t in corpus.tasks if corpus.train[t]]
        if not self.tasks:
            raise ValueError("the corpus has no training text")
        self.streams: dict[str, torch.Tensor] = {}
        self.doc_starts: dict[str, torch.Tensor] = {}
        for t in self.tasks:
            s = torch.frombuffer(bytearray(corpus.train[t]), dtype=torch.uint8)
            after_sep = (s == 0).nonzero().flatten() + 1
            self.doc_starts[t] = torch.cat([torch.zeros(1, dtype=torch.long), after_sep[after_sep < len(s)]]).to(device)
            self.streams[t] = s.to(device)
        self.offsets = torch.arange(seq_len, device=device)
        self.gen = torch.Generator(device=device).manual_seed(seed)

    def batch(self, batch_size: int, step: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
        """(inputs [B, T], targets [B, T]) int64 on the sampler's device."""
        n = len(self.tasks)
        counts = [sum(1 for r in range(batch_size) if (r + step) % n == i) for i in range(n)]
        full = torch.cat([self._rows(t, c) for t, c in zip(self.tasks, counts) if c])
        targets = full[:, 1:]
        return full[:, :-1].contiguous(), torch.where(targets == PAD, IGNORE, targets)

    def _rows(self, task: str, count: int) -> torch.Tensor:
        stream, starts = self.streams[task], self.doc_starts[task]
        length, dev, gen = len(stream), self.device, self.gen
        uniform = torch.randint(0, max(1, length - self.seq_len), (count,), generator=gen, device=dev)
        at_doc = starts[torch.randint(0, len(starts), (count,), generator=gen, device=dev)]
        pick_doc = torch.rand(count, generator=gen, device=dev) < self.doc_start_prob
        idx = torch.where(pick_doc, at_doc, uniform)[:, None] + self.offsets
        vals = stream[idx.clamp(max=length - 1)].long()
        vals = torch.where(vals == 0, EOS, vals)
        vals = torch.where(idx >= length, PAD, vals)
        return torch.cat([torch.full((count, 1), BOS, dtype=torch.long, device=dev), vals], dim=1)


def heldout_windows(docs: list[str], seq_len: int, max_windows: int) -> torch.Tensor:
    """[N, seq_len + 1] windows over BOS doc EOS BOS doc EOS ..., stride seq_len, PAD at the end."""
    ids: list[int] = []
    for d in docs:
        ids += [BOS, *d.encode("utf-8"), EOS]
        if len(ids) > max_windows * seq_len + 1:
            break
    n = min(max_windows, max(1, -(-(len(ids) - 1) // seq_len)))
    ids = ids[: n * seq_len + 1]
    ids += [PAD] * (n * seq_len + 1 - len(ids))
    t = torch.tensor(ids, dtype=torch.long)
    return torch.stack([t[i * seq_len: i * seq_len + seq_len + 1] for i in range(n)])


def _autocast(device: str) -> contextlib.AbstractContextManager:
    if device.startswith("cuda"):
        return torch.autocast("cuda", dtype=torch.bfloat16)
    return contextlib.nullcontext()


def lm_loss(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1), ignore_index=IGNORE)


@torch.no_grad()
def evaluate(model: Transformer, corpus: Corpus, seq_len: int, device: str, batch_size: int = 16,
             max_windows: int = 64) -> tuple[dict[str, float], list[list[float]], dict[str, list[list[float]]]]:
    """(held-out loss per task, expert load per MoE layer overall, the same per task)."""
    was_training = model.training
    model.eval()
    routers = [layer.ffn.router for layer in model.layers if isinstance(layer.ffn, MoEFFN)]
    captured: list[torch.Tensor] = []
    hooks = [r.register_forward_hook(lambda _m, _i, out: captured.append(out.detach())) for r in routers]
    n_experts, top_k = model.cfg.n_experts, model.cfg.top_k
    losses: dict[str, float] = {}
    load_by_task: dict[str, list[list[float]]] = {}
    total_counts = torch.zeros(len(routers), max(n_experts, 1), device=device)
    try:
        for task in corpus.tasks:
            if not corpus.heldout[task]:
                continue
            windows = heldout_windows(corpus.heldout[task], seq_len, max_windows)
            loss_sum, n_tok = 0.0, 0
            counts = torch.zeros_like(total_counts)
            for chunk in windows.split(batch_size):
                chunk = chunk.to(device)
                inputs, targets = chunk[:, :-1], chunk[:, 1:].clone()
                targets[targets == PAD] = IGNORE
                captured.clear()
                with _autocast(device):
                    logits, _ = model.forward_train(inputs)
                valid = targets != IGNORE
                loss_sum += F.cross_entropy(logits[valid], targets[valid], reduction="sum").item()
                n_tok += int(valid.sum())
                keep = (inputs != PAD).flatten()
                for i, router_logits in enumerate(captured):
                    ids = router_logits[keep].float().topk(top_k, dim=-1).indices.flatten()
                    counts[i] += torch.bincount(ids, minlength=n_experts).float()
            losses[task] = loss_sum / max(n_tok, 1)
            total_counts += counts
            load_by_task[task] = (counts / counts.sum(-1, keepdim=True).clamp(min=1)).tolist()
    finally:
        for h in hooks:
            h.remove()
        model.train(was_training)
    load = (total_counts / total_counts.sum(-1, keepdim=True).clamp(min=1)).tolist() if routers else []
    return losses, load, load_by_task


def train(model_name: str | ModelConfig, corpus: Corpus, steps: int, device: str, batch_size: int,
          seq_len: int, lr: float, seed: int, aux_loss_coef: float = 0.001, log_every: int = 50, *,
          warmup_steps: int | None = None, min_lr_ratio: float = 0.1, weight_decay: float = 0.1,
          grad_clip: float = 1.0, doc_start_prob: float = 0.5, eval_windows: int = 64,
          log: Callable[[str], None] | None = print) -> TrainResult:
    """Train a fresh model from random init (by seed) and evaluate it on the held-out text."""
    cfg = resolve_model(model_name)
    if seq_len > cfg.max_seq_len:
        raise ValueError(f"seq_len {seq_len} exceeds {cfg.name} max_seq_len {cfg.max_seq_len}")
    if steps < 0 or batch_size < 1 or seq_len < 2:
        raise ValueError("steps must be >= 0, batch_size >= 1 and seq_len >= 2")
    torch.manual_seed(seed)
    model = init_model(cfg, device, seed)
    sampler = WindowSampler(corpus, seq_len, seed, doc_start_prob, device=device)
    decay = [p for p in model.parameters() if p.ndim >= 2]
    no_decay = [p for p in model.parameters() if p.ndim < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": weight_decay},
                             {"params": no_decay, "weight_decay": 0.0}],
                            lr=lr, betas=(0.9, 0.95), eps=1e-8, fused=device.startswith("cuda"))
    warmup = warmup_steps if warmup_steps is not None else min(200, max(1, steps // 20))

    def lr_factor(step: int) -> float:
        if step < warmup:
            return (step + 1) / warmup
        progress = min(1.0, (step - warmup) / max(1, steps - warmup))
        return min_lr_ratio + (1 - min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * progress))

    sched = torch.optim.lr_scheduler.LambdaLR(opt, lr_factor)
    n_params = sum(p.numel() for p in model.parameters())
    if log:
        log(f"[{cfg.name}] {n_params / 1e6:.2f}M params, {steps} steps of {batch_size}x{seq_len} tokens on {device}")
    history: list[dict] = []
    tokens = torch.zeros((), dtype=torch.long, device=device)
    window_loss = torch.zeros((), device=device)
    window_aux = torch.zeros((), device=device)
    window_steps = 0
    train_loss = float("nan")
    t0 = time.perf_counter()
    for step in range(steps):
        inputs, targets = sampler.batch(batch_size, step)
        tokens += (targets != IGNORE).sum()
        with _autocast(device):
            logits, aux = model.forward_train(inputs)
        loss = lm_loss(logits, targets)
        total = loss + aux_loss_coef * aux if cfg.is_moe else loss
        opt.zero_grad(set_to_none=True)
        total.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), grad_clip)
        opt.step()
        sched.step()
        window_loss += loss.detach()
        window_aux += aux.detach()
        window_steps += 1
        if (step + 1) % log_every == 0 or step + 1 == steps:
            train_loss = window_loss.item() / window_steps
            entry = {"step": step + 1, "loss": round(train_loss, 5), "aux": round(window_aux.item() / window_steps, 5),
                     "lr": opt.param_groups[0]["lr"], "seconds": round(time.perf_counter() - t0, 2)}
            history.append(entry)
            if log:
                log(f"[{cfg.name}] step {entry['step']:>6}  loss {entry['loss']:.4f}  aux {entry['aux']:.3f}  "
                    f"lr {entry['lr']:.2e}  {entry['seconds']:.0f}s")
            window_loss.zero_()
            window_aux.zero_()
            window_steps = 0
    if device.startswith("cuda"):
        torch.cuda.synchronize()
    seconds = time.perf_counter() - t0
    tokens_seen = int(tokens)
    task_loss, load, load_by_task = evaluate(model, corpus, seq_len, device, max_windows=eval_windows)
    final = sum(task_loss.values()) / max(len(task_loss), 1)
    if log:
        log(f"[{cfg.name}] held-out loss {final:.4f} " + " ".join(f"{t} {v:.3f}" for t, v in task_loss.items()))
    return TrainResult(model_name=cfg.name, config=dataclasses.asdict(cfg), steps=steps, batch_size=batch_size,
                       seq_len=seq_len, lr=lr, seed=seed, aux_loss_coef=aux_loss_coef, device=device,
                       final_loss=final, task_loss=task_loss, train_loss=train_loss, tokens_seen=tokens_seen,
                       seconds=seconds, params=n_params, history=history, expert_load=load,
                       extra={"expert_load_by_task": load_by_task, "warmup_steps": warmup,
                              "corpus_seed": corpus.seed, "corpus_python": corpus.python_version},
                       model=model.eval())


def save(result: TrainResult, out_dir: str | Path = SHIPPED_WEIGHTS_DIR, dtype: str = "float16") -> Path:
    """Write <out_dir>/<name>.safetensors (parameters stored as `dtype`; loading casts them back to
    the engine's dtype) and <out_dir>/<name>.train.json. Returns the weights path."""
    if result.model is None:
        raise ValueError("the TrainResult holds no model")
    if dtype not in _SAVE_DTYPES:
        raise ValueError(f"dtype must be one of {sorted(_SAVE_DTYPES)}, got {dtype!r}")
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    cpu = copy.deepcopy(result.model).to("cpu")
    if dtype == "float16":
        biggest = max(p.detach().abs().max().item() for p in cpu.parameters())
        if biggest > 60000:
            raise ValueError(f"a weight of magnitude {biggest} does not fit float16; save as bfloat16")
    cpu = cpu.to(_SAVE_DTYPES[dtype])
    path = out / f"{result.model_name}.safetensors"
    save_safetensors(cpu, path)
    write_result(result, out, weights=path, dtype=dtype)
    return path


def write_result(result: TrainResult, out_dir: str | Path, weights: Path | None = None,
                 dtype: str | None = None) -> Path:
    info = result.to_dict()
    if weights is not None:
        info["weights"] = {"file": weights.name, "dtype": dtype, "bytes": weights.stat().st_size,
                           "sha256": hashlib.sha256(weights.read_bytes()).hexdigest()}
    path = Path(out_dir) / f"{result.model_name}.train.json"
    path.write_text(json.dumps(info, indent=2, sort_keys=True) + "\n", encoding="utf-8")
    return path


@torch.no_grad()
def greedy_agreement(target: Transformer, draft: Transformer, corpus: Corpus, seq_len: int, device: str,
                     max_windows: int = 16, batch_size: int = 16) -> dict[str, float]:
    """Per task, how often the draft's argmax equals the target's on held-out text (teacher forced):
    a proxy for the greedy speculative-decoding acceptance rate."""
    out: dict[str, float] = {}
    for task in corpus.tasks:
        if not corpus.heldout[task]:
            continue
        same = n = 0
        for chunk in heldout_windows(corpus.heldout[task], seq_len, max_windows).split(batch_size):
            inputs = chunk[:, :-1].to(device)
            valid = inputs != PAD
            with _autocast(device):
                a = target.forward_train(inputs)[0].argmax(-1)
                b = draft.forward_train(inputs)[0].argmax(-1)
            same += int(((a == b) & valid).sum())
            n += int(valid.sum())
        out[task] = same / max(n, 1)
    return out


def speculative_acceptance(target: str | ModelConfig, draft: str | ModelConfig, target_weights: str | Path,
                           draft_weights: str | Path, device: str = "cpu", num_requests: int = 96,
                           seed: int = 0, max_tokens: int = 48) -> dict[str, dict[str, float]]:
    """Run infersight.workload's prompts through the engine as the demo does (greedy, speculative
    decoding with `draft`) and count accepted / proposed draft tokens per task and overall."""
    from infersight.runtime import LLM, SamplingParams
    from infersight.workload import TASKS, WorkloadConfig, build_workload

    requests = build_workload(WorkloadConfig(num_requests=num_requests, max_tokens=max_tokens, seed=seed))
    llm = LLM(target, device=device, seed=seed, weights=target_weights, speculative_model=draft,
              speculative_weights=draft_weights, max_num_seqs=32, max_num_batched_tokens=512)
    params = [SamplingParams(temperature=0.0, max_tokens=r.max_tokens, ignore_eos=True, task=r.task)
              for r in requests]
    outputs = llm.generate([r.prompt for r in requests], params)
    counts: dict[str, list[int]] = {}
    for r, o in zip(requests, outputs):
        for key in (r.task, "all"):
            c = counts.setdefault(key, [0, 0])
            c[0] += o.num_spec_accepted
            c[1] += o.num_spec_proposed
    order = [t for t in TASKS if t in counts] + ["all"]
    return {k: {"accepted": counts[k][0], "proposed": counts[k][1],
                "rate": counts[k][0] / counts[k][1] if counts[k][1] else 0.0} for k in order}
