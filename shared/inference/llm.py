"""The LLM client: any OpenAI-compatible chat-completions server (OpenAI, vLLM, Ollama, llama.cpp).

One `LLM` per process, shared by the stages in it. It owns what a call costs and how it
fails, so that callers only see an answer or an `LLMUnavailable` with a countable reason:
- the official `openai` client does the HTTP, the retries on 429/5xx (honouring
  Retry-After) and the timeouts;
- a semaphore caps the calls in flight in this process;
- a token budget per subject per day (UTC, wall clock: it guards spend, not event time)
  is checked before a call and charged after it, from the usage the server reports;
- every call, token and fallback is counted per subject and globally, per day, in Redis
  (`usage()` sums them for `memflow inspect` and the benchmark);
- `ask` is the one way a stage asks: the call, the reading of the reply (a pure reader from
  `pipeline/`), the fallback when either fails, the counters and the trace of the call.
The API key is a SecretStr: it goes to the client and nowhere else (no log line, no trace).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any, Generic, TypeVar

import openai
import redis

from memflow.pipeline.gate import redact
from memflow.pipeline.models import LLMTrace
from memflow.pipeline.prompting import Message, Refused
from memflow.shared.errors import MemflowError
from memflow.shared.redisdb.counters import DailyCounters
from memflow.shared.redisdb.keys import Keys
from memflow.shared.settings import Settings

log = logging.getLogger(__name__)
# Counters are kept this long (inspect sums the last 30 days).
USAGE_KEEP_DAYS = 40
TOTAL = "total"  # the prefix of everyone's running totals (`total:<name>`)
USAGE_DAYS = 30
T = TypeVar("T")


class LLMUnavailable(MemflowError):
    """No usable answer: `reason` is one of timeout, rate_limited, http_<status>, connection, budget, empty."""

    def __init__(self, reason: str, detail: str = "") -> None:
        super().__init__(f"{reason}: {detail}" if detail else reason)
        self.reason = reason


@dataclass(frozen=True)
class Answer:
    text: str
    prompt_tokens: int
    completion_tokens: int
    latency_ms: float


@dataclass(frozen=True)
class Reading(Generic[T]):
    """What a reader made of a reply, or what stands in for it on a fallback.

    `items`: what it holds (candidates, verdicts, routes; on a fallback, the stand-ins); `counts`:
    counters to add (items dropped, verdicts unreadable); `note`: said in the trace. `refused`: the
    reply was read (its counts count) and still cannot be used: the fallback stands in. A reply
    that cannot be read at all raises `Refused` from the reader instead."""

    value: T
    items: int = 0
    counts: dict[str, int] = field(default_factory=dict)
    note: str | None = None
    refused: Refused | None = None


@dataclass(frozen=True)
class Asked(Generic[T]):
    """The value a stage goes on with; `fallback` names why the fallback stood in (None: the model's)."""

    value: T
    fallback: str | None = None


class LLM:
    def __init__(self, settings: Settings, client: redis.Redis, keys: Keys, *,
                 trace: Callable[[LLMTrace], None]) -> None:
        assert settings.llm.base_url, "LLM() needs MEMFLOW_LLM_BASE_URL"
        self.settings = settings
        self.model = settings.llm.model
        self._redis = client
        self._keys = keys
        self._trace = trace
        key = settings.llm.api_key.get_secret_value() if settings.llm.api_key else "none"  # Ollama/vLLM want any
        self._client = openai.OpenAI(base_url=settings.llm.base_url, api_key=key, timeout=settings.llm.timeout_s,
                                     max_retries=settings.llm.max_retries)
        self._slots = threading.BoundedSemaphore(settings.llm.max_concurrency)

    def complete(self, subject: str, purpose: str, prompt: list[Message], *,
                 timeout: float | None = None, retries: int | None = None) -> Answer:
        """One chat completion for `subject`, charged to its budget; `LLMUnavailable` when there is none.
        `retries`: instead of MEMFLOW_LLM_MAX_RETRIES, for a call whose `timeout` is someone's whole wait."""
        if self.spent_today(subject) >= self.settings.llm.daily_token_budget:
            raise LLMUnavailable("budget", f"{subject} spent its {self.settings.llm.daily_token_budget} tokens today")
        started = time.perf_counter()
        with self._slots:
            response = self._call(prompt, timeout, retries)
        usage = response.usage
        answer = Answer(text=(response.choices[0].message.content or "") if response.choices else "",
                        prompt_tokens=usage.prompt_tokens if usage else 0,
                        completion_tokens=usage.completion_tokens if usage else 0,
                        latency_ms=(time.perf_counter() - started) * 1000)
        # Time waited is counted beside the calls, so `memflow status` shows a mean per call over the days kept.
        self.count(subject, {"calls": 1, f"calls:{purpose}": 1, "prompt_tokens": answer.prompt_tokens,
                             "completion_tokens": answer.completion_tokens, "latency_ms": round(answer.latency_ms)})
        if not answer.text.strip():
            raise LLMUnavailable("empty", "the server answered with no text")
        return answer

    def ask(self, subject: str, purpose: str, prompt: list[Message], *, read: Callable[[str], Reading[T]],
            fallback: Callable[[], Reading[T]], session_id: str | None = None,
            timeout: float | None = None, retries: int | None = None) -> Asked[T]:
        """Ask the model and read its reply; when there is no answer (`LLMUnavailable`) or it is refused,
        the fallback stands in, counted per subject and globally by reason. Either way the call is traced."""
        started, answer = time.perf_counter(), None
        try:
            answer = self.complete(subject, purpose, prompt, timeout=timeout, retries=retries)
            reading = self._read(subject, answer, read)
        except (LLMUnavailable, Refused) as exc:
            stand_in = fallback()
            self.count(subject, {"fallbacks": 1, f"fallback:{exc.reason}": 1})
            self._trace(_traced(purpose, subject, session_id, started, answer, failed=exc,
                                stand_ins=stand_in.items))
            return Asked(stand_in.value, exc.reason)
        self._trace(_traced(purpose, subject, session_id, started, answer, items=reading.items,
                            note=reading.note))
        return Asked(reading.value)

    def _read(self, subject: str, answer: Answer, read: Callable[[str], Reading[T]]) -> Reading[T]:
        reading = read(answer.text)
        if any(reading.counts.values()):
            self.count(subject, reading.counts)
        if reading.refused is not None:
            raise reading.refused
        return reading

    def _call(self, prompt: list[Message], timeout: float | None, retries: int | None) -> Any:
        extra: dict[str, Any] = {"response_format": {"type": "json_object"}} if self.settings.llm.json_mode else {}
        client = self._client if retries is None else self._client.with_options(max_retries=retries)
        try:
            return client.chat.completions.create(
                model=self.model, messages=prompt,  # type: ignore[arg-type]
                temperature=0, max_tokens=self.settings.llm.max_output_tokens,
                timeout=timeout if timeout is not None else self.settings.llm.timeout_s, **extra)
        except openai.APITimeoutError as exc:
            raise LLMUnavailable("timeout", str(exc)) from None
        except openai.RateLimitError as exc:
            raise LLMUnavailable("rate_limited", str(exc)) from None
        except openai.APIStatusError as exc:
            raise LLMUnavailable(f"http_{exc.status_code}", str(exc)) from None
        except openai.APIConnectionError as exc:
            raise LLMUnavailable("connection", str(exc)) from None

    # -- accounting ------------------------------------------------------------------

    def count(self, subject: str, amounts: dict[str, int], at: datetime | None = None) -> None:
        """Add to today's counters of `subject` and of everyone."""
        count_usage(self._redis, self._keys, subject, amounts, at)

    def spent_today(self, subject: str) -> int:
        day = _today()
        prompt, completion = self._redis.hmget(self._keys.llm_usage(subject), f"{day}:prompt_tokens",
                                               f"{day}:completion_tokens")
        return int(prompt or 0) + int(completion or 0)

    def close(self) -> None:
        self._client.close()


def _traced(purpose: str, subject: str, session_id: str | None, started: float, answer: Answer | None, *,
            failed: LLMUnavailable | Refused | None = None, items: int = 0, stand_ins: int = 0,
            note: str | None = None) -> LLMTrace:
    """The trace of one call; a fallback says why (`failed`, redacted) and how much stood in."""
    return LLMTrace(purpose=purpose, subject=subject, session_id=session_id,
                    outcome="ok" if failed is None else "fallback", reason=failed.reason if failed else note,
                    detail=redact(str(failed))[:200] if failed else None, items=items, stand_ins=stand_ins,
                    prompt_tokens=answer.prompt_tokens if answer else 0,
                    completion_tokens=answer.completion_tokens if answer else 0, latency_ms=elapsed_ms(started),
                    at=datetime.now(UTC))


def count_usage(client: redis.Redis, keys: Keys, subject: str, amounts: dict[str, int],
                at: datetime | None = None) -> None:
    at = at or datetime.now(UTC)
    day = at.date().isoformat()
    counters = DailyCounters(client, USAGE_KEEP_DAYS)  # the days past the window are pruned as it is written
    pipe = client.pipeline(transaction=False)
    counters.add(keys.llm_usage(subject), at, {f"{day}:{name}": n for name, n in amounts.items()}, via=pipe)
    # Everyone's also keeps running totals (no day: never pruned), which GET /metrics serves as counters:
    # a sum over the days kept would fall each day a day is pruned, and Prometheus would read a reset.
    counters.add(keys.llm_usage(None), at, {f"{day}:{name}": n for name, n in amounts.items()}
                 | {f"{TOTAL}:{name}": n for name, n in amounts.items()}, via=pipe)
    pipe.execute()


def usage(client: redis.Redis, keys: Keys, subject: str | None, now: datetime | None = None,
          days: int = USAGE_DAYS) -> dict[str, Any]:
    """The LLM counters of `subject` (None: everyone) over the last `days` days, with cost per event
    and per candidate the LLM wrote."""
    raw = client.hgetall(keys.llm_usage(subject))
    window = set(_days(now or datetime.now(UTC), days))
    totals: dict[str, int] = {}
    for entry, value in raw.items():
        day, _, name = (entry.decode() if isinstance(entry, bytes) else entry).partition(":")
        if day in window:
            totals[name] = totals.get(name, 0) + int(value)
    return summarise(totals, days)


def summarise(totals: dict[str, int], days: int) -> dict[str, Any]:
    tokens_in, tokens_out = totals.get("prompt_tokens", 0), totals.get("completion_tokens", 0)
    events, written = totals.get("events", 0), totals.get("candidates", 0)
    return {
        "days": days,
        "calls": totals.get("calls", 0),
        "calls_by_purpose": _by_prefix(totals, "calls:"),
        "prompt_tokens": tokens_in,
        "completion_tokens": tokens_out,
        "fallbacks": totals.get("fallbacks", 0),
        "fallbacks_by_reason": _by_prefix(totals, "fallback:"),
        "mean_latency_ms": round(totals.get("latency_ms", 0) / calls, 1) if (calls := totals.get("calls", 0)) else None,
        "events": events,
        "candidates": written,
        "per_event": _per(tokens_in, tokens_out, totals.get("calls", 0), events),
        "per_candidate": _per(tokens_in, tokens_out, totals.get("calls", 0), written),
    }


def _per(tokens_in: int, tokens_out: int, calls: int, n: int) -> dict[str, float] | None:
    if not n:
        return None
    return {"calls": round(calls / n, 4), "prompt_tokens": round(tokens_in / n, 1),
            "completion_tokens": round(tokens_out / n, 1)}


def _by_prefix(totals: dict[str, int], prefix: str) -> dict[str, int]:
    return {name.removeprefix(prefix): n for name, n in sorted(totals.items()) if name.startswith(prefix)}


def _days(now: datetime, days: int) -> Iterable[str]:
    return ((now - timedelta(days=d)).date().isoformat() for d in range(days))


def elapsed_ms(started: float) -> float:
    """Milliseconds since `started` (a time.perf_counter() reading), for traces."""
    return round((time.perf_counter() - started) * 1000, 1)


def _today() -> str:
    return datetime.now(UTC).date().isoformat()
