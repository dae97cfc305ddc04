"""One request as the client saw it (:class:`RequestResult`): TTFT, inter-token gaps, end-to-end latency,
token counts, status and the reason of a failure, llama-server's own ``timings``; vLLM's TPOT from them."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from v100lab.base.safeio import json_safe


@dataclass
class RequestResult:
    """One request as the client saw it. Times in seconds from the level's start (``t_send``) or from this
    request's send (``ttft_s``, ``e2el_s``); ``itl_s`` holds each gap between text events."""

    level: str
    level_index: int
    index: int
    max_tokens: int
    prompt_tokens_sent: int | None          # the prompt's length as sent (exact for token prompts)
    status: str = "failed"
    reason: str | None = None
    t_send: float | None = None
    ttft_s: float | None = None
    itl_s: list[float] = field(default_factory=list)
    e2el_s: float | None = None
    n_events: int = 0                       # events carrying generated text
    n_prompt: int | None = None             # prompt tokens (server's count when reported)
    n_gen: int | None = None                # output tokens (server's count when reported)
    finish_reason: str | None = None
    http_status: int | None = None
    usage: dict[str, Any] | None = None
    server_timings: dict[str, Any] | None = None
    draft_n: int | None = None              # speculative decoding: tokens drafted (timings.draft_n)
    draft_n_accepted: int | None = None     # ... and accepted by the target (timings.draft_n_accepted)

    @property
    def ok(self) -> bool:
        return self.status == "ok"

    @property
    def ttft_ms(self) -> float | None:
        return None if self.ttft_s is None else 1e3 * self.ttft_s

    @property
    def e2el_ms(self) -> float | None:
        return None if self.e2el_s is None else 1e3 * self.e2el_s

    @property
    def tpot_ms(self) -> float | None:
        """vLLM's TPOT: (latency − TTFT) / (output tokens − 1); None with fewer than two output tokens."""
        if not self.ok or not self.n_gen or self.n_gen < 2 or self.ttft_s is None or self.e2el_s is None:
            return None
        return 1e3 * (self.e2el_s - self.ttft_s) / (self.n_gen - 1)

    @property
    def decode_ts(self) -> float | None:
        """This request's decode rate: output tokens after the first per second (1000 / TPOT)."""
        t = self.tpot_ms
        return 1e3 / t if t else None

    @property
    def draft_acceptance(self) -> float | None:
        """Share of the drafted tokens the target accepted (None without drafts)."""
        return self.draft_n_accepted / self.draft_n if self.draft_n and self.draft_n_accepted is not None else None

    def as_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d.update(ttft_ms=self.ttft_ms, tpot_ms=self.tpot_ms, e2el_ms=self.e2el_ms,
                 itl_ms=[1e3 * x for x in self.itl_s], decode_ts=self.decode_ts,
                 draft_acceptance=self.draft_acceptance)
        del d["itl_s"]
        return json_safe(d)
