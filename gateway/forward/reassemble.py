"""Rebuild a non-streaming OpenAI response from streamed chunks.

llama.cpp notices a dropped *non-streaming* connection only after about a
second of total server inactivity (never while other streams run or while
its `/slots` is polled), so a client that gives up would keep a slot busy
to the end. The gateway therefore sends non-streaming requests to
llama.cpp replicas as streams (a closed stream frees the slot in ~30 ms)
and reassembles the chunks into the body the client asked for:
`chat.completion` (content, reasoning_content, tool_calls merged by index,
finish_reason, usage) or `text_completion`, with llama.cpp's `timings`.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any


@dataclass(slots=True)
class _Choice:
    index: int
    role: str = "assistant"
    text: list[str] = field(default_factory=list)
    reasoning: list[str] = field(default_factory=list)
    tool_calls: dict[int, dict[str, Any]] = field(default_factory=dict)
    finish_reason: str | None = None
    logprobs: list[Any] = field(default_factory=list)


class StreamAssembler:
    def __init__(self, endpoint: str) -> None:
        self._endpoint = endpoint
        self._buf = b""
        self._choices: dict[int, _Choice] = {}
        self._meta: dict[str, Any] = {}
        self.usage: dict[str, Any] | None = None
        self.error: dict[str, Any] | None = None
        self._extra: dict[str, Any] = {}

    def feed(self, data: bytes) -> None:
        buf = (self._buf + data).replace(b"\r\n", b"\n")
        *events, self._buf = buf.split(b"\n\n")
        for event in events:
            self._event(event)

    def _event(self, event: bytes) -> None:
        lines = [ln[5:].strip() for ln in event.split(b"\n") if ln.startswith(b"data:")]
        payload = b"\n".join(lines)
        if not payload or payload == b"[DONE]":
            return
        try:
            obj = json.loads(payload)
        except ValueError:
            return
        if isinstance(obj, dict):
            self._chunk(obj)

    def _chunk(self, obj: dict[str, Any]) -> None:
        if isinstance(obj.get("error"), dict):
            self.error = obj["error"]
            return
        for key in ("id", "created", "model", "system_fingerprint"):
            if key in obj and key not in self._meta:
                self._meta[key] = obj[key]
        if isinstance(obj.get("usage"), dict):
            self.usage = obj["usage"]
        for key in ("timings", "prompt_filter_results"):
            if key in obj:
                self._extra[key] = obj[key]
        for choice in obj.get("choices") or ():
            if isinstance(choice, dict):
                self._choice(choice)

    def _choice(self, c: dict[str, Any]) -> None:
        index = c.get("index", 0)
        state = self._choices.setdefault(index, _Choice(index))
        if c.get("finish_reason") is not None:
            state.finish_reason = c["finish_reason"]
        lp = c.get("logprobs")
        if isinstance(lp, dict) and isinstance(lp.get("content"), list):
            state.logprobs.extend(lp["content"])
        if self._endpoint == "completions":
            if isinstance(c.get("text"), str):
                state.text.append(c["text"])
            return
        delta = c.get("delta") or {}
        if isinstance(delta.get("role"), str):
            state.role = delta["role"]
        if isinstance(delta.get("content"), str):
            state.text.append(delta["content"])
        if isinstance(delta.get("reasoning_content"), str):
            state.reasoning.append(delta["reasoning_content"])
        for call in delta.get("tool_calls") or ():
            if isinstance(call, dict):
                _merge_tool_call(state.tool_calls, call)

    def body(self) -> dict[str, Any]:
        chat = self._endpoint == "chat"
        out: dict[str, Any] = {
            "id": self._meta.get("id", ""),
            "object": "chat.completion" if chat else "text_completion",
            "created": self._meta.get("created", 0),
            "model": self._meta.get("model", ""),
        }
        if "system_fingerprint" in self._meta:
            out["system_fingerprint"] = self._meta["system_fingerprint"]
        out["choices"] = [self._render(c, chat) for _, c in sorted(self._choices.items())]
        if self.usage is not None:
            out["usage"] = self.usage
        out.update(self._extra)
        return out

    def _render(self, c: _Choice, chat: bool) -> dict[str, Any]:
        logprobs = {"content": c.logprobs} if c.logprobs else None
        if not chat:
            return {
                "index": c.index,
                "text": "".join(c.text),
                "logprobs": logprobs,
                "finish_reason": c.finish_reason,
            }
        message: dict[str, Any] = {
            "role": c.role,
            "content": "".join(c.text) if c.text or not c.tool_calls else None,
        }
        if c.reasoning:
            message["reasoning_content"] = "".join(c.reasoning)
        if c.tool_calls:
            message["tool_calls"] = [c.tool_calls[i] for i in sorted(c.tool_calls)]
        return {
            "index": c.index,
            "message": message,
            "logprobs": logprobs,
            "finish_reason": c.finish_reason,
        }


def _merge_tool_call(calls: dict[int, dict[str, Any]], delta: dict[str, Any]) -> None:
    index = delta.get("index", len(calls))
    call = calls.setdefault(
        index, {"id": "", "type": "function", "function": {"name": "", "arguments": ""}}
    )
    if isinstance(delta.get("id"), str):
        call["id"] = delta["id"]
    if isinstance(delta.get("type"), str):
        call["type"] = delta["type"]
    fn = delta.get("function") or {}
    if isinstance(fn.get("name"), str):
        call["function"]["name"] += fn["name"]
    if isinstance(fn.get("arguments"), str):
        call["function"]["arguments"] += fn["arguments"]
