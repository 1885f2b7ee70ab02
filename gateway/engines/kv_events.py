"""vLLM's KV cache events: decode one ZMQ message into typed events (no sockets here).

vLLM (`--kv-events-config '{"enable_kv_cache_events": true, "publisher": "zmq", ...}'`)
publishes each batch as a three-frame multipart message::

    [topic, sequence number (8 bytes, big-endian, unsigned), msgpack payload]

The payload is `[ts, [event, ...], data_parallel_rank]` (the rank may be missing or nil);
each event is a msgpack map with a `"type"` key: `BlockStored` (`block_hashes`,
`parent_block_hash`, `token_ids`, `block_size`, `lora_id`, `medium`, and fields this
decoder does not need), `BlockRemoved` (`block_hashes`, `medium`), `AllBlocksCleared`.
Block hashes are integers by default (the low 64 bits of the sha256 block hash; vLLM's
`VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES=0` sends the 32 bytes instead, also accepted). Event
types this module does not know are kept as `UnknownEvent`, so that a newer engine does
not break a subscriber.

Needs `msgpack` (the `kv-events` extra); importing it without raises an ImportError that
says what to install.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

try:
    import msgpack  # type: ignore[import-untyped]
except ImportError as exc:  # pragma: no cover - depends on the installed extras
    raise ImportError(
        "gateway.engines.kv_events needs msgpack: pip install 'llm-admission-gateway[kv-events]'"
    ) from exc

BlockHash = bytes | int
SEQ_BYTES = 8


class KVEventDecodeError(ValueError):
    """A message that is not vLLM's KV event wire format; the text names the part."""


@dataclass(frozen=True, slots=True)
class BlockStored:
    block_hashes: tuple[BlockHash, ...]
    parent_block_hash: BlockHash | None
    token_ids: tuple[int, ...]
    block_size: int
    lora_id: int | None
    medium: str | None


@dataclass(frozen=True, slots=True)
class BlockRemoved:
    block_hashes: tuple[BlockHash, ...]
    medium: str | None


@dataclass(frozen=True, slots=True)
class AllBlocksCleared:
    pass


@dataclass(frozen=True, slots=True)
class UnknownEvent:
    type: str


KVEvent = BlockStored | BlockRemoved | AllBlocksCleared | UnknownEvent


@dataclass(frozen=True, slots=True)
class KVEventBatch:
    topic: bytes
    seq: int
    ts: float
    events: tuple[KVEvent, ...]
    data_parallel_rank: int | None


def decode_message(frames: Sequence[bytes]) -> KVEventBatch:
    """One multipart message (`[topic, seq, payload]`) as a batch of typed events."""
    if len(frames) != 3:
        raise KVEventDecodeError(f"kv event message: expected 3 frames, got {len(frames)}")
    topic, seq_frame, payload = frames
    if len(seq_frame) != SEQ_BYTES:
        raise KVEventDecodeError(
            f"kv event sequence frame: expected {SEQ_BYTES} bytes, got {len(seq_frame)}"
        )
    seq = int.from_bytes(seq_frame, "big", signed=False)
    try:
        data = msgpack.unpackb(payload, raw=False, strict_map_key=False)
    except (ValueError, msgpack.ExtraData, msgpack.FormatError, msgpack.StackError) as exc:
        raise KVEventDecodeError(f"kv event payload (seq {seq}): not msgpack: {exc}") from exc
    ts, events, rank = _batch_fields(data, seq)
    return KVEventBatch(
        topic=bytes(topic),
        seq=seq,
        ts=ts,
        events=tuple(decode_event(e, f"payload.events[{i}]") for i, e in enumerate(events)),
        data_parallel_rank=rank,
    )


def _batch_fields(data: Any, seq: int) -> tuple[float, list[Any], int | None]:
    if not isinstance(data, list) or len(data) not in (2, 3):
        raise KVEventDecodeError(f"kv event payload (seq {seq}): expected [ts, events, rank]")
    ts, events = data[0], data[1]
    rank = data[2] if len(data) == 3 else None
    if not isinstance(ts, int | float) or isinstance(ts, bool):
        raise KVEventDecodeError(f"kv event payload.ts (seq {seq}): not a number: {ts!r}")
    if not isinstance(events, list):
        raise KVEventDecodeError(f"kv event payload.events (seq {seq}): not a list")
    if rank is not None and not _is_int(rank):
        raise KVEventDecodeError(f"kv event payload.data_parallel_rank (seq {seq}): {rank!r}")
    return float(ts), events, rank


def decode_event(event: Any, where: str = "event") -> KVEvent:
    """One decoded msgpack event map as a typed event."""
    if not isinstance(event, Mapping) or not isinstance(event.get("type"), str):
        raise KVEventDecodeError(f"kv {where}: expected a map with a string 'type'")
    kind = event["type"]
    if kind == "BlockStored":
        return BlockStored(
            block_hashes=_hashes(event, where),
            parent_block_hash=_optional_hash(event, "parent_block_hash", where),
            token_ids=_ints(event, "token_ids", where),
            block_size=_int_field(event, "block_size", where),
            lora_id=_optional_int(event, "lora_id", where),
            medium=_optional_str(event, "medium", where),
        )
    if kind == "BlockRemoved":
        return BlockRemoved(
            block_hashes=_hashes(event, where), medium=_optional_str(event, "medium", where)
        )
    if kind == "AllBlocksCleared":
        return AllBlocksCleared()
    return UnknownEvent(type=kind)


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_hash(value: Any) -> bool:
    return isinstance(value, bytes) or _is_int(value)


def _hashes(event: Mapping[str, Any], where: str) -> tuple[BlockHash, ...]:
    value = event.get("block_hashes")
    if not isinstance(value, list) or not all(_is_hash(h) for h in value):
        raise KVEventDecodeError(f"kv {where}.block_hashes: expected a list of bytes or ints")
    return tuple(value)


def _optional_hash(event: Mapping[str, Any], key: str, where: str) -> BlockHash | None:
    value = event.get(key)
    if value is not None and not _is_hash(value):
        raise KVEventDecodeError(f"kv {where}.{key}: expected bytes, int or nil")
    return value


def _ints(event: Mapping[str, Any], key: str, where: str) -> tuple[int, ...]:
    value = event.get(key)
    if not isinstance(value, list) or not all(_is_int(v) for v in value):
        raise KVEventDecodeError(f"kv {where}.{key}: expected a list of ints")
    return tuple(value)


def _int_field(event: Mapping[str, Any], key: str, where: str) -> int:
    value = event.get(key)
    if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
        raise KVEventDecodeError(f"kv {where}.{key}: expected a positive int, got {value!r}")
    return int(value)


def _optional_int(event: Mapping[str, Any], key: str, where: str) -> int | None:
    value = event.get(key)
    if value is not None and not _is_int(value):
        raise KVEventDecodeError(f"kv {where}.{key}: expected an int or nil, got {value!r}")
    return value


def _optional_str(event: Mapping[str, Any], key: str, where: str) -> str | None:
    value = event.get(key)
    if value is not None and not isinstance(value, str):
        raise KVEventDecodeError(f"kv {where}.{key}: expected a string or nil, got {value!r}")
    return value
