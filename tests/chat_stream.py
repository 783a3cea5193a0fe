"""Streamed chat completions read as the load tests check them: only `data:` lines (SSE
comments, the server's keep-alives while a request waits for a row, are skipped and counted),
`data: [DONE]` last, no error event, the request's seed on every chunk; the deltas folded into
the reply's text, finish reason and usage."""

import json
from dataclasses import dataclass, field


class StreamBroken(AssertionError):
    """The stream broke OpenAI's streaming contract."""


@dataclass
class ChatStream:
    parts: list = field(default_factory=list)
    finish: str | None = None
    usage: dict | None = None
    chunks: int = 0
    keep_alives: int = 0
    done: bool = False

    @property
    def text(self):
        return "".join(self.parts)

    def check_finished(self):
        """Raises unless the stream ended as a finished reply: `[DONE]`, a finish reason, usage."""
        if not self.done:
            raise StreamBroken("stream ended without data: [DONE]")
        if self.finish not in ("stop", "length"):
            raise StreamBroken(f"no finish_reason (got {self.finish!r})")
        if self.usage is None:
            raise StreamBroken("no usage chunk")


async def read_chat_stream(resp, seed, stop_after=None):
    """Reads an httpx streaming response into a ChatStream; with `stop_after`, stops reading
    after that many data chunks (leaving the response's block then closes the connection)."""
    stream = ChatStream()
    async for line in resp.aiter_lines():
        if not line:
            continue
        if line.startswith(":"):
            stream.keep_alives += 1
            continue
        if not line.startswith("data: "):
            raise StreamBroken(f"not an SSE data line: {line[:200]!r}")
        data = line[len("data: "):]
        if data == "[DONE]":
            stream.done = True
            continue
        if stream.done:
            raise StreamBroken("data after [DONE]")
        chunk = json.loads(data)
        if "error" in chunk:
            raise StreamBroken(f"error event mid-stream: {data[:300]}")
        if chunk.get("seed") != seed:
            raise StreamBroken(f"chunk seed {chunk.get('seed')} != {seed}")
        stream.chunks += 1
        stream.usage = chunk.get("usage") or stream.usage
        for choice in chunk["choices"]:
            stream.parts.append(choice["delta"].get("content") or "")
            stream.finish = choice["finish_reason"] or stream.finish
        if stop_after is not None and stream.chunks >= stop_after:
            break
    return stream
