"""CaptureConfig: the capture endpoint's token, its rate limit and the auto-capture rules.

No CLI flags: the token is read or created in a 0600 file (agent.api.token_file); python users set the rest."""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from infersight.config_error import ConfigError

if TYPE_CHECKING:
    from infersight.agent.capture.controller import CaptureRules


@dataclass(frozen=True)
class CaptureConfig:
    """token: the bearer token of POST /api/v1/capture (None: read or create token_file, 0600; None
    there too: the port's default file). min_interval_s: between two requested captures. The auto
    rules are all off unless set: a TTFT p99 (s), a KV usage share, preemptions in one poll; cooldown_s
    between two automatic captures."""

    token: str | None = None
    token_file: str | None = None
    min_interval_s: float = 30.0
    auto_ttft_p99_s: float | None = None
    auto_kv_usage: float | None = None
    auto_preemptions: int | None = None
    auto_cooldown_s: float = 300.0

    def __post_init__(self) -> None:
        if self.token is not None and not self.token:
            raise ConfigError("the capture token must not be empty (None: read or create the token file)")
        for name in ("min_interval_s", "auto_cooldown_s"):
            if not getattr(self, name) >= 0:
                raise ConfigError(f"capture {name} must be >= 0 s, got {getattr(self, name)}")
        for name in ("auto_ttft_p99_s", "auto_kv_usage", "auto_preemptions"):
            if getattr(self, name) is not None and not getattr(self, name) > 0:
                raise ConfigError(f"capture {name} must be > 0 (None: off), got {getattr(self, name)}")

    def rules(self) -> CaptureRules:
        from infersight.agent.capture.controller import CaptureRules  # the controller's module: only when the agent is built

        return CaptureRules(self.auto_ttft_p99_s, self.auto_kv_usage, self.auto_preemptions, self.auto_cooldown_s)
