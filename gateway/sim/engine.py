"""The engine loop shared by both flavours: clock, time model, token emission.

One step = one forward pass. The flavour's scheduler plans it (which requests
prefill how many tokens, which decode one), the loop sleeps for the modelled
step time divided by `speed`, then the scheduler commits it: progress advances,
full blocks enter the prefix cache, finished prefills and decodes sample a
token, finished requests release their memory.

Time model: `step = step_base_s + prefill_token_s * prefill tokens +
decode_seq_s * decoding sequences + attention_token_s * attended KV tokens`,
where the attended KV tokens are, summed over the step's sequences, each
one's context so far plus its new tokens: attention reads every sequence's
whole KV each step, so long contexts and many streams slow every step (see
`SimConfig` for the default's source). Approximations: attention is priced
by the KV it reads (the memory-bound decode regime); the quadratic compute
of a long prefill chunk over a long context is not modelled, and a prefill
chunk costs the same whether it shares the step with decodes or not.

Clock: see `SimClock`. While busy, simulated time is the sum of modelled
step times; while idle it follows wall time x `speed`. Wall-clock times
(`*_wall`) are recorded too, for measurements across processes.

Abort takes effect at once: the request leaves the running set or the queue
and its blocks are released; a step already in flight ignores it on commit.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import asdict, dataclass
from typing import Any, Protocol

from gateway.sim.config import SimConfig
from gateway.sim.request import Aborted, Failed, Finish, RequestRecord, SimRequest, State, Token


class SimClock:
    """Simulated seconds since creation.

    Idle, the clock runs at wall time x speed. While the engine is busy it
    advances by exactly the modelled step times: during a step it never passes
    the step's end, and at the end it is set to it, so neither the event loop's
    sleep overshoot nor Python overhead (magnified by `speed`) leaks into the
    simulated latencies of back-to-back steps.
    """

    def __init__(self, speed: float) -> None:
        self.speed = speed
        self._base = 0.0
        self._wall = time.monotonic()
        self._cap: float | None = None

    def now(self) -> float:
        t = self._base + (time.monotonic() - self._wall) * self.speed
        return t if self._cap is None else min(t, self._cap)

    async def sleep(self, sim_seconds: float) -> None:
        await asyncio.sleep(sim_seconds / self.speed)

    async def step(self, sim_seconds: float, start: float | None = None) -> float:
        """Run one engine step of `sim_seconds`; return the simulated time at its end.

        `start` (the moment an idle engine was woken) keeps the wake-up latency
        of the event loop out of simulated time, unless it exceeds the step.
        """
        now = self.now()
        end = max((now if start is None else start) + sim_seconds, now)
        self._cap = end
        try:
            await asyncio.sleep(sim_seconds / self.speed)
        finally:
            self._cap = None
            self._base, self._wall = end, time.monotonic()
        return end


@dataclass(slots=True)
class Totals:
    """Counters since start or the last reset."""

    requests: int = 0
    finished: int = 0
    errors: int = 0
    preemptions: int = 0
    #: llama.cpp: requests that had to wait for a slot.
    deferrals: int = 0
    aborts: int = 0
    prefix_queries_tokens: int = 0
    prefix_hits_tokens: int = 0
    prompt_tokens: int = 0
    prompt_tokens_processed: int = 0
    generation_tokens: int = 0
    steps: int = 0
    busy_time: float = 0.0
    busy_slots_total: int = 0
    prompt_time: float = 0.0
    generation_time: float = 0.0

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True, slots=True)
class Work:
    """One request's share of a step: `n` tokens, a decode or a prefill chunk."""

    req: SimRequest
    n: int
    decode: bool


class Scheduler(Protocol):
    def add(self, req: SimRequest) -> None: ...
    def remove(self, req: SimRequest) -> None: ...
    def schedule(self) -> list[Work]: ...
    def commit(self, plan: list[Work], now: float) -> None: ...
    def gauges(self) -> dict[str, Any]: ...
    def clear_cache(self) -> None: ...


class Observer(Protocol):
    """Metric hooks (vLLM histograms); every call gets simulated seconds."""

    def on_first_token(self, record: RequestRecord) -> None: ...
    def on_token_gap(self, gap: float) -> None: ...
    def on_finish(self, record: RequestRecord) -> None: ...


class NullObserver:
    def on_first_token(self, record: RequestRecord) -> None:
        return None

    def on_token_gap(self, gap: float) -> None:
        return None

    def on_finish(self, record: RequestRecord) -> None:
        return None


class EngineCore:
    """State and emission shared by the loop and the flavour's scheduler."""

    def __init__(self, config: SimConfig, observer: Observer | None = None) -> None:
        self.config = config
        self.clock = SimClock(config.speed)
        self.totals = Totals()
        self.records: list[RequestRecord] = []
        self.observer: Observer = observer or NullObserver()

    def add_record(self, record: RequestRecord) -> None:
        """Count a received generation request (accepted or refused)."""
        self.totals.requests += 1
        self.records.append(record)

    def sample(self, req: SimRequest, now: float) -> str | None:
        """Emit the request's next token; return its stop reason, if it must stop."""
        token_id, text = req.output.next_piece()
        req.output_ids.append(token_id)
        rec = req.record
        rec.output_tokens += 1
        self.totals.generation_tokens += 1
        if rec.first_token is None:
            rec.first_token, rec.first_token_wall = now, time.time()
            self.totals.prompt_tokens += len(req.prompt)
            self.observer.on_first_token(rec)
        elif req.last_token_time is not None:
            self.observer.on_token_gap(now - req.last_token_time)
        req.last_token_time = now
        reason = req.stop_reason()
        req.events.put_nowait(Token(token_id, text, reason))
        return reason

    def finish(self, req: SimRequest, reason: str, now: float) -> None:
        req.state = State.FINISHED
        rec = req.record
        rec.finish, rec.finish_wall, rec.finish_reason = now, time.time(), reason
        self.totals.finished += 1
        self.observer.on_finish(rec)
        req.events.put_nowait(Finish(reason))

    def fail(self, req: SimRequest, status: int, error: dict[str, Any], now: float) -> None:
        req.state = State.FINISHED
        rec = req.record
        rec.finish, rec.finish_wall = now, time.time()
        rec.finish_reason, rec.error = "error", str(error.get("message", ""))
        self.totals.errors += 1
        req.events.put_nowait(Failed(status, error))


class Engine:
    """Runs the step loop of one replica; `run()` lives in the app's lifespan."""

    def __init__(self, core: EngineCore, scheduler: Scheduler) -> None:
        self.core = core
        self.scheduler = scheduler
        self._wake = asyncio.Event()
        self._paused = False
        self._idle = True
        self._woken_at: float | None = None

    @property
    def paused(self) -> bool:
        return self._paused

    def set_paused(self, paused: bool) -> None:
        self._paused = paused
        self._signal()

    def submit(self, req: SimRequest) -> None:
        self.scheduler.add(req)
        self._signal()

    def _signal(self) -> None:
        if self._idle and self._woken_at is None:
            self._woken_at = self.core.clock.now()
        self._wake.set()

    def abort(self, req: SimRequest) -> None:
        """Abort a live request now: leave the queue or batch, release its memory."""
        if not req.live:
            return
        self.scheduler.remove(req)
        req.state = State.ABORTED
        rec = req.record
        rec.aborted, rec.finish_reason = True, "abort"
        rec.abort_time, rec.abort_wall = self.core.clock.now(), time.time()
        self.core.totals.aborts += 1
        self.core.observer.on_finish(rec)
        req.events.put_nowait(Aborted())
        self._signal()

    def step_time(self, plan: list[Work]) -> float:
        cfg = self.core.config
        prefill = sum(w.n for w in plan if not w.decode)
        decoding = sum(1 for w in plan if w.decode)
        attended = sum(w.req.num_computed + w.n for w in plan)
        return (
            cfg.step_base_s
            + cfg.prefill_token_s * prefill
            + cfg.decode_seq_s * decoding
            + cfg.attention_token_s * attended
        )

    async def run(self) -> None:
        while True:
            plan = [] if self._paused else self.scheduler.schedule()
            if not plan:
                self._idle, self._woken_at = True, None
                self._wake.clear()
                await self._wake.wait()
                continue
            dt = self.step_time(plan)
            self._account(plan, dt)
            start, self._idle, self._woken_at = self._woken_at, False, None
            end = await self.core.clock.step(dt, start)
            self.scheduler.commit(plan, end)

    def _account(self, plan: list[Work], dt: float) -> None:
        totals = self.core.totals
        totals.steps += 1
        totals.busy_time += dt
        totals.busy_slots_total += len(plan)
        totals.prompt_tokens_processed += sum(w.n for w in plan if not w.decode)
        if any(not w.decode for w in plan):
            totals.prompt_time += dt
        else:
            totals.generation_time += dt
