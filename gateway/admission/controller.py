"""Admission: lease KV room and prefill capacity on a replica, or wait in the queue.

`AdmissionController.take(ctx, ranked)` returns a `Lease` (`.replica` is
where to forward), given back by `gateway.pipeline.release.lease`. It takes the first
ranked replica that can admit now; otherwise the request waits in the
gateway queue (priority class, then deadline, then arrival) and is woken —
by a lease release or a fresh metrics reading, never by a polling loop —
when the dispatcher can place it on any of its ranked candidates.

Per replica, a request is admitted when (all in tokens unless noted):
- KV: leased + need ≤ watermark(class) × capacity − external use seen in
  metrics (an idle ledger admits anything up to the whole free capacity);
- prefill: backlog + uncached prompt ≤ TTFT target(class) × measured
  prefill rate (an empty backlog admits any single prompt);
- the engine's own waiting queue ≤ `max_engine_waiting`;
- in flight < the concurrency bound (config or the engine's slots); with no
  known capacity, `unknown_capacity_max_in_flight`.
With one gateway the trackers are the ledger and a fit is a grant (no
suspension in between); with a shared store the same limits go into one
atomic `StateStore.reserve` (see `gateway.admission.ledger`).

Leaving: admitted; 503 `deadline_unreachable` as soon as the remaining time
cannot cover the estimated TTFT; 504 at the deadline
(the pipeline's timer cancels the wait); client gone (cancelled, removed at
once); 503 `queue_full` with `Retry-After` from the drain rate; 400 when the
request exceeds every replica's capacity.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from gateway.admission.demand import DemandEstimator, identity
from gateway.admission.ledger import Demand, Lease, Limits, SharedLease, claims
from gateway.admission.limits import replica_limits
from gateway.admission.metrics import AdmissionMetrics
from gateway.admission.queue import AdmissionQueue, Entry, QueueFull
from gateway.config.schema import PRIORITY_CLASSES, AdmissionConfig
from gateway.errors import BadRequest, NoHealthyReplica, Overloaded, StateUnavailable
from gateway.replicas.livestate import ReplicaLive
from gateway.replicas.registry import Replica, ReplicaRegistry
from gateway.request.context import RequestContext
from gateway.state import MemoryStateStore, StateStore
from gateway.supervise import Supervisor

__all__ = ["AdmissionController", "Lease"]


@dataclass(slots=True, eq=False)
class Waiter:
    ctx: RequestContext
    ranked: list[Replica]
    cls: str
    future: asyncio.Future[Lease]


class AdmissionController:
    def __init__(
        self,
        cfg: AdmissionConfig,
        registry: ReplicaRegistry,
        store: StateStore | None = None,
        metrics: AdmissionMetrics | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._cfg = cfg
        self._store: StateStore = store if store is not None else MemoryStateStore(clock)
        # An in-process store: the trackers below are the ledger (`gateway.admission.ledger`).
        self._local = not self._store.shared
        self._clock = clock
        self.metrics = metrics
        self.estimator = DemandEstimator(cfg)
        self.trackers: dict[str, ReplicaLive] = {}
        for r in registry:
            self.replica_added(r)
        registry.subscribe(self)
        self.queue: AdmissionQueue[Waiter] = AdmissionQueue(
            PRIORITY_CLASSES, cfg.queue_max_requests, cfg.queue_max_tokens, clock
        )
        self._pump_task: asyncio.Task[None] | None = None
        self._tasks = Supervisor("admission")
        self._repump = False
        if metrics is not None:
            metrics.watch(
                registry,
                lambda: [(c, st.length, st.tokens) for c, st in self.queue.stats.items()],
                self.estimator.ratios.items,
            )

    @property
    def enabled(self) -> bool:
        return self._cfg.enabled

    # --- what routing asks --------------------------------------------------

    def can_admit(self, ctx: RequestContext, replica: Replica) -> bool:
        """Cheap synchronous check against the local view (the reserve decides)."""
        if not self._cfg.enabled:
            return replica.healthy
        return not isinstance(
            replica_limits(
                self._cfg, replica, self.estimator.demand(ctx, replica.name), self._class(ctx)
            ),
            str,
        )

    def replica_added(self, replica: Replica) -> None:
        """Track a replica (at start, or one that joined the set at run time)."""
        tracker = self.trackers[replica.name] = ReplicaLive(
            self._cfg, replica.config.capacity_tokens
        )
        replica.ledger.live = tracker.state

    def replica_removed(self, replica: Replica) -> None:
        self.trackers.pop(replica.name, None)
        self.estimator.ratios.forget(replica.name)
        self.kick()

    def on_update(self, replica: Replica) -> None:
        """A fresh reading (or a failed poll) for `replica`: publish its state
        (`Replica.live`), re-evaluate the queue."""
        tracker = self.trackers.get(replica.name)
        if tracker is not None:
            replica.ledger.live = tracker.state
        self.estimator.ratios.identify(replica.name, identity(replica))
        self.kick()

    # --- acquire ------------------------------------------------------------

    async def take(self, ctx: RequestContext, ranked: list[Replica]) -> Lease:
        """A lease on the first ranked replica that can admit now, else after
        waiting in the queue. Given back by `gateway.pipeline.release`."""
        lease = self._begin(ctx, ranked)
        return lease if lease is not None else await self._enter(ctx, ranked)

    def _begin(self, ctx: RequestContext, ranked: list[Replica]) -> Lease | None:
        """The part of admission that never suspends: a lease granted now, or
        None (the request must reserve in a shared store or wait in the queue)."""
        if not ranked:
            raise NoHealthyReplica("No healthy replica is available.", retry_after=1.0)
        ctx.admission.queued_at = self._clock()
        if not self._cfg.enabled:
            replica = next((r for r in ranked if r.healthy), ranked[0])
            return self._granted(
                ctx, Lease(replica, self.estimator.demand(ctx), self._delta, held=False)
            )
        cls = self._class(ctx)
        demand = self.estimator.demand(ctx)
        self._check_fits(ctx, cls, demand, ranked)
        if self._local and not self._queued_at_or_above(cls):
            lease = self._try_local(ctx, ranked, cls, demand)
            if lease is not None:
                self._count_admitted(cls, 0.0)
                return self._granted(ctx, lease)
        return None

    async def _enter(self, ctx: RequestContext, ranked: list[Replica]) -> Lease:
        """After `_begin` returned None: reserve in the shared store, or queue."""
        cls = self._class(ctx)
        demand = self.estimator.demand(ctx)
        if not self._local and not self._queued_at_or_above(cls):
            lease = await self._try_ranked(ctx, ranked, cls, demand)
            if lease is not None:
                self._count_admitted(cls, 0.0)
                return self._granted(ctx, lease)
        return self._granted(ctx, await self._wait(ctx, ranked, cls, demand))

    def _granted(self, ctx: RequestContext, lease: Lease) -> Lease:
        ctx.admission.admitted_at = self._clock()
        ctx.admission.on_first_byte = lease.first_byte
        return lease

    def _check_fits(
        self, ctx: RequestContext, cls: str, demand: Demand, ranked: list[Replica]
    ) -> None:
        largest = 0
        for r in ranked:
            cap = r.live.capacity_tokens if r.live is not None else None
            if cap is None:
                return  # a replica of unknown size might hold it
            largest = max(largest, cap)
        if demand.kv_tokens <= largest:
            return
        self._reject(cls, "exceeds_capacity")
        raise BadRequest(
            f"This request needs {demand.kv_tokens} KV tokens ({demand.prompt_tokens} prompt + "
            f"{demand.output_tokens} output), more than any replica holds ({largest}).",
            param="max_tokens",
            code="exceeds_replica_capacity",
            reason="exceeds_capacity",
        )

    def _queued_at_or_above(self, cls: str) -> bool:
        if not len(self.queue):
            return False
        rank = self.queue.rank(cls)
        return any(st.length for c, st in self.queue.stats.items() if self.queue.rank(c) <= rank)

    # --- the queue ----------------------------------------------------------

    async def _wait(
        self, ctx: RequestContext, ranked: list[Replica], cls: str, demand: Demand
    ) -> Lease:
        deadline = ctx.deadline.at if ctx.deadline is not None else math.inf
        future: asyncio.Future[Lease] = asyncio.get_running_loop().create_future()
        try:
            entry = self.queue.push(
                Waiter(ctx, ranked, cls, future), cls, deadline, demand.kv_tokens
            )
        except QueueFull as full:
            self._reject(cls, "queue_full")
            raise Overloaded(
                f"The gateway queue for {cls} requests is full ({full.what}); retry later.",
                retry_after=full.retry_after,
                reason="queue_full",
            ) from None
        self.kick()
        try:
            lease = await self._await_admission(entry, demand, future)
        except BaseException as exc:
            if isinstance(exc, asyncio.CancelledError):
                gone = "deadline_exceeded" if self._clock() >= deadline - 0.001 else "client_gone"
                self._reject(cls, gone)
            # A lease granted at the moment the wait ended is nobody's: give it back.
            orphan = self._withdraw(entry, future)
            if orphan is not None:
                await orphan.release()
            raise
        self.queue.remove(entry)
        self._count_admitted(cls, self._clock() - entry.enqueued_at)
        return lease

    def _withdraw(self, entry: Entry[Waiter], future: asyncio.Future[Lease]) -> Lease | None:
        """Take a waiter out of the queue; returns a lease granted to it that
        nobody will use (the wait ended some other way), for the caller to close."""
        self.queue.remove(entry)
        if not future.done():
            future.cancel()
            return None
        if future.cancelled() or future.exception() is not None:
            return None
        return future.result()

    async def _await_admission(
        self, entry: Entry[Waiter], demand: Demand, future: asyncio.Future[Lease]
    ) -> Lease:
        for _ in range(
            100_000
        ):  # each round waits until the shed instant moves: bounded in practice
            shed_at = entry.deadline - self._estimated_ttft(entry, demand)
            wait = shed_at - self._clock()
            if wait <= 0 and future.done():
                return future.result()
            if wait <= 0:
                self._reject(entry.cls, "deadline_unreachable")
                raise Overloaded(
                    "The request cannot start before its deadline at the current load.",
                    retry_after=self.queue.retry_after(entry.cls),
                    reason="deadline_unreachable",
                    code="deadline_unreachable",
                )
            done, _ = await asyncio.wait({future}, timeout=None if math.isinf(wait) else wait)
            if done:
                return future.result()
        raise Overloaded("Admission wait did not converge.", reason="queue_stuck")

    def _estimated_ttft(self, entry: Entry[Waiter], demand: Demand) -> float:
        states = [r.live for r in entry.item.ranked if r.healthy and r.live is not None]
        if not states:
            return 0.0
        own = min(s.estimated_ttft_s(demand.prefill_tokens) for s in states)
        total_rate = sum(s.prefill_tokens_per_s for s in states) or 1.0
        return own + self.queue.ahead_tokens(entry) / total_rate

    async def close(self) -> None:
        """Stop the dispatcher (at shutdown)."""
        await self._tasks.stop()

    def kick(self) -> None:
        """Wake the dispatcher (lease released, fresh reading, new waiter)."""
        if self._pump_task is not None and not self._pump_task.done():
            self._repump = True
            return
        if len(self.queue):
            self._pump_task = self._tasks.spawn("pump", self._pump)

    async def _pump(self) -> None:
        """Admit waiters in queue order; stop at the first that cannot be placed."""
        for _ in range(10_000):
            self._repump = False
            for entry in self.queue.ordered():
                w = entry.item
                if w.future.done():
                    self.queue.remove(entry)
                    continue
                try:
                    lease = await self._try_ranked(w.ctx, w.ranked, w.cls)
                except StateUnavailable as err:
                    # The shared ledger cannot be reached (`on_failure: closed`):
                    # this waiter gets the 503; the next one tries again.
                    self.queue.remove(entry)
                    if not w.future.done():
                        w.future.set_exception(err)
                    continue
                if lease is None:
                    break
                if w.future.done():  # cancelled while we reserved
                    await lease.close()
                    continue
                self.queue.remove(entry, admitted=True)
                w.future.set_result(lease)
            if not self._repump:
                return

    # --- the decision -------------------------------------------------------

    async def _try_ranked(
        self, ctx: RequestContext, ranked: list[Replica], cls: str, uncached: Demand | None = None
    ) -> Lease | None:
        """`uncached`: the demand with nothing cached (`estimator.demand(ctx)`), when known."""
        if self._local:
            return self._try_local(ctx, ranked, cls, uncached)
        for replica, demand, limits in self._fitting(ctx, ranked, cls, uncached):
            now = self._clock()
            ttl = (
                max(0.0, (ctx.deadline.at if ctx.deadline is not None else now) - now)
                + self._cfg.lease_grace_s
            )
            result = await self._store.reserve(claims(replica.name, demand, limits), ttl)
            if result.reservation is not None:
                return SharedLease(
                    replica, demand, self._store, result.reservation, ttl, self._delta
                )
        return None

    def _try_local(
        self, ctx: RequestContext, ranked: list[Replica], cls: str, uncached: Demand | None = None
    ) -> Lease | None:
        """The in-process ledger: the trackers' counters are the whole ledger, and
        `_limits` checked them without suspending, so a fit is a grant."""
        for replica, demand, _limits in self._fitting(ctx, ranked, cls, uncached):
            return Lease(replica, demand, self._delta)
        return None

    def _fitting(
        self, ctx: RequestContext, ranked: list[Replica], cls: str, uncached: Demand | None
    ) -> Iterator[tuple[Replica, Demand, Limits]]:
        """The ranked replicas that can admit now, in order, with the demand and
        reserve limits on each."""
        cached = ctx.routing.cached_tokens
        for replica in ranked:
            if uncached is None or cached.get(replica.name):
                demand = self.estimator.demand(ctx, replica.name)
            else:
                demand = uncached
            limits = replica_limits(self._cfg, replica, demand, cls)
            if not isinstance(limits, str):
                yield replica, demand, limits

    def _delta(self, lease: Lease, kv: int, prefill: int, in_flight: int) -> None:
        replica = lease.replica
        replica.ledger.in_flight += in_flight
        t = self.trackers.get(replica.name)
        if t is not None:  # (None: the replica left the set)
            replica.ledger.live = t.ledger_changed(
                t.leased + kv, t.backlog + prefill, t.in_flight + in_flight, self._clock()
            )
        if kv < 0 or prefill < 0 or in_flight < 0:
            self.kick()

    def _class(self, ctx: RequestContext) -> str:
        return ctx.priority if ctx.priority in PRIORITY_CLASSES else "standard"

    def _count_admitted(self, cls: str, waited: float) -> None:
        if self.metrics is not None:
            self.metrics.admitted_by(cls).inc()
            self.metrics.queue_wait_by(cls).observe(waited)

    def _reject(self, cls: str, reason: str) -> None:
        if self.metrics is not None:
            self.metrics.rejected.labels(cls, reason).inc()

    def describe(self) -> dict[str, Any]:
        return {
            "enabled": self._cfg.enabled,
            "queue": {
                c: {
                    "length": st.length,
                    "tokens": st.tokens,
                    "drain_per_s": None if st.drain_per_s is None else round(st.drain_per_s, 3),
                }
                for c, st in self.queue.stats.items()
            },
            "prompt_ratios": self.estimator.ratios.describe(),
        }
