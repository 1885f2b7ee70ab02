"""Feedback from every answer: the engine's reported cache hits correct the
prefix index of the replica that served the request.

At routing time the router records the stamps of the blocks the chosen
replica's index matched (`Routing.index_stamps`, `PrefixIndex.stamps`). The
answer's `usage` says how many prompt tokens the engine actually reused
(`Usage.cached_tokens`, read by the engine's adapter). Converted to the index's
blocks (with the engine's own prompt-token count when it reports one):

- at least two blocks fewer than predicted: block `k` (the first one the engine lacked) and
  everything the index last used no later than it are gone from the engine,
  which evicts least recently used first, so the index drops them all. The
  request's own chain was re-stamped when it was routed: the engine has just
  computed it and holds it again.
- more blocks than predicted: the engine held a prefix the index did not (it
  evicted it early, or another gateway instance sent it): the index learns
  the reported prefix.

A shortfall of one block corrects nothing: it is within the rounding between
the engine's token blocks and the index's byte blocks (another block size,
uneven bytes per token, an engine recomputing a fully cached prompt's last
block), and acting on it would drop most of the index on every such answer.

Each answer observes predicted - reported cached tokens in
`gateway_routing_prefix_prediction_error_tokens{replica}`, the prediction
being the matched blocks in the engine's tokens (its reported prompt tokens
spread over the prompt's bytes), so that the token estimate's error is not
counted as the index's, and the reported tokens capped at the prompt's full
blocks (the index hashes whole blocks only). Engines whose slots
each hold one prompt (llama.cpp) do not evict least recently used first: the
drop may be too wide there, and later answers that report more restore it.
"""

from __future__ import annotations

from gateway.request.context import PrefixBlocks, RequestContext
from gateway.scheduling.cycle import indexed_tokens, tokens_per_block
from gateway.scheduling.metrics import SchedulingMetrics
from gateway.scheduling.prefix import PrefixIndex


def learn(
    index: PrefixIndex | None,
    ctx: RequestContext,
    replica: str,
    estimate: int,
    metrics: SchedulingMetrics,
) -> None:
    """Observe the prediction error of an answered request and correct the
    replica's `index` (`estimate`: the router's prompt-token count, used when
    the engine reports none)."""
    usage, blocks = ctx.usage, ctx.routing.prefix
    if usage is None or usage.cached_tokens is None or blocks is None:
        return
    prompt_tokens = usage.prompt_tokens or estimate
    stamps = ctx.routing.index_stamps
    predicted = indexed_tokens(len(stamps), prompt_tokens, blocks)
    held = min(usage.cached_tokens, indexed_tokens(len(blocks.hashes), prompt_tokens, blocks))
    metrics.prediction_error.labels(replica).observe(predicted - held)
    if index is not None:
        reported = reported_blocks(usage.cached_tokens, prompt_tokens, blocks)
        apply_feedback(index, replica, stamps, blocks, reported, metrics)


def reported_blocks(cached: int, prompt_tokens: int, blocks: PrefixBlocks) -> int:
    """The engine's cached tokens in the index's blocks (`prompt_tokens`: the
    engine's count when it reports one)."""
    per_block = tokens_per_block(prompt_tokens, blocks)
    if per_block <= 0:
        return 0
    return min(len(blocks.hashes), int(cached / per_block + 0.5))


def apply_feedback(
    index: PrefixIndex,
    replica: str,
    stamps: tuple[int, ...],
    blocks: PrefixBlocks,
    reported: int,
    metrics: SchedulingMetrics,
) -> None:
    """Correct `index` (the replica's) with the engine's `reported` blocks."""
    predicted = len(stamps)
    if reported + 1 < predicted:
        metrics.dropped_blocks_by(replica).inc(index.drop_through(stamps[reported]))
    elif reported > predicted:
        index.insert(blocks.hashes[:reported])
        metrics.learned_blocks_by(replica).inc(reported - predicted)
