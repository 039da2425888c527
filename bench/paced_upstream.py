"""An OpenAI-compatible upstream that answers at a fixed pace, for bench/upstream.py.

    .venv/bin/python bench/paced_upstream.py PORT [--first-token-ms 100] [--token-ms 25]

llama-server's own times move with the machine's load by more than the 20 ms the goal is
about; this server's do not (its first token comes `first-token-ms` after the request,
then one token every `token-ms`, for every stream at once), so the difference between
calling it directly and through Bastion is Bastion's. A streamed chat or completion
answers `max_tokens` tokens (" w0", " w1", ...); `prompt_tokens` is the number of words in
the messages, so that the bench can check both sides sent the same prompt.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time
from typing import Any

MODEL = "paced"


class PacedUpstream:
    def __init__(self, first_token_s: float, token_s: float) -> None:
        self._first_token_s = first_token_s
        self._token_s = token_s

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:  # keep-alive: one request after another on the connection
                head = (await reader.readuntil(b"\r\n\r\n")).decode("latin-1").split("\r\n")
                arrived = time.perf_counter()
                _, path, _ = head[0].split(" ", 2)
                headers = dict(
                    (name.strip().lower(), value.strip())
                    for name, _, value in (line.partition(":") for line in head[1:] if line)
                )
                length = int(headers.get("content-length", "0"))
                body = json.loads(await reader.readexactly(length)) if length else {}
                if path.endswith(("/chat/completions", "/completions")):
                    await self._stream(
                        writer, body, arrived, chat=path.endswith("/chat/completions")
                    )
                elif path.endswith("/models"):
                    listing = {"object": "list", "data": [{"id": MODEL, "object": "model",
                                                           "meta": {"n_ctx": 65536}}]}  # fmt: skip
                    _send_json(writer, listing)
                elif path.endswith("/health"):
                    _send_json(writer, {"status": "ok"})
                else:
                    writer.write(b"HTTP/1.1 404 Not Found\r\ncontent-length: 0\r\n\r\n")
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()

    async def _stream(
        self, writer: asyncio.StreamWriter, body: dict[str, Any], arrived: float, chat: bool
    ) -> None:
        writer.write(
            b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n"
            b"transfer-encoding: chunked\r\n\r\n"
        )
        await writer.drain()
        tokens = int(body.get("max_completion_tokens") or body.get("max_tokens") or 16)
        texts = [m.get("content") or "" for m in body.get("messages", [])] or [
            body.get("prompt", "")
        ]
        prompt_tokens = sum(len(str(text).split()) for text in texts)
        for n in range(tokens):
            due = arrived + self._first_token_s + n * self._token_s
            await asyncio.sleep(max(0.0, due - time.perf_counter()))
            text = f" w{n}"
            choice = (
                {"index": 0, "delta": {"content": text}} if chat else {"index": 0, "text": text}
            )
            _send_chunk(writer, {"object": "chat.completion.chunk", "choices": [choice]})
            await writer.drain()
        _send_chunk(writer, {"choices": [{"index": 0, "delta": {}, "finish_reason": "length"}]})
        usage = {"prompt_tokens": prompt_tokens, "completion_tokens": tokens}
        _send_chunk(
            writer, {"choices": [], "usage": usage | {"total_tokens": prompt_tokens + tokens}}
        )
        _send_chunk(writer, "[DONE]")
        writer.write(b"0\r\n\r\n")


def _send_json(writer: asyncio.StreamWriter, value: object) -> None:
    data = json.dumps(value).encode()
    head = b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: %d\r\n\r\n"
    writer.write(head % len(data) + data)


def _send_chunk(writer: asyncio.StreamWriter, event: object) -> None:
    data = b"data: " + (event if isinstance(event, str) else json.dumps(event)).encode() + b"\n\n"
    writer.write(b"%x\r\n" % len(data) + data + b"\r\n")


async def serve(port: int, first_token_s: float, token_s: float) -> None:
    upstream = PacedUpstream(first_token_s, token_s)
    server = await asyncio.start_server(upstream.handle, "127.0.0.1", port, backlog=512)
    async with server:
        await server.serve_forever()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("port", type=int)
    parser.add_argument("--first-token-ms", type=float, default=100.0)
    parser.add_argument("--token-ms", type=float, default=25.0)
    args = parser.parse_args()
    asyncio.run(serve(args.port, args.first_token_ms / 1000, args.token_ms / 1000))


if __name__ == "__main__":
    main()
