"""A stdio server's stderr: a pipe the process writes, logged line by line to the logger
``durable_agent.mcp`` with the server's name in front, never to the worker's own stdout or
stderr; its last lines are kept for the text of a problem."""

from __future__ import annotations

import asyncio
import logging
import os
from collections import deque
from collections.abc import Callable
from contextlib import suppress
from typing import TextIO

log = logging.getLogger("durable_agent.mcp")

# How long a finished session waits for the last of its server's stderr to be logged.
STDERR_DRAIN_SECONDS = 1.0
# How many of the server's last stderr lines a problem quotes.
STDERR_TAIL_LINES = 3
# A quoted line is cut to this many characters.
STDERR_TAIL_CHARS = 300
# A "line" that grows past this without a newline is logged in pieces of this size.
_READ_CHUNK = 65536

Redact = Callable[[str], str]


class StderrLog:
    """The pipe a server process gets as its stderr (``writer``), and the task that logs what
    comes out of it; ``redact`` takes the secrets out of each line first."""

    def __init__(self, name: str, redact: Redact) -> None:
        self._name = name
        self._redact = redact
        read_fd, write_fd = os.pipe()
        self.writer: TextIO | None = os.fdopen(write_fd, "w")
        self._reader_file = os.fdopen(read_fd, "rb", buffering=0)
        self._pipe: asyncio.ReadTransport | None = None
        self._pump: asyncio.Task[None] | None = None
        self.tail: deque[str] = deque(maxlen=STDERR_TAIL_LINES)

    async def start(self) -> None:
        """Start logging what comes out of the pipe."""
        reader = asyncio.StreamReader()
        loop = asyncio.get_running_loop()
        self._pipe, _ = await loop.connect_read_pipe(
            lambda: asyncio.StreamReaderProtocol(reader), self._reader_file
        )
        self._pump = asyncio.create_task(self._log_lines(reader), name=f"mcp stderr {self._name}")

    def close_writer(self) -> None:
        """Close this process's end of the pipe (the server process keeps its own)."""
        if self.writer is not None:
            self.writer.close()
            self.writer = None

    async def finish(self) -> None:
        """Log what is left once the process is gone (bounded: a child of the server may keep
        the pipe open), then close the pipe."""
        self.close_writer()
        if self._pump is not None:
            done, _ = await asyncio.wait([self._pump], timeout=STDERR_DRAIN_SECONDS)
            if not done:
                self._pump.cancel()
                with suppress(asyncio.CancelledError):
                    await self._pump
        if self._pipe is not None:
            self._pipe.close()
        else:
            self._reader_file.close()

    async def _log_lines(self, reader: asyncio.StreamReader) -> None:
        pending = b""
        while chunk := await reader.read(_READ_CHUNK):
            *lines, pending = (pending + chunk).split(b"\n")
            for line in lines:
                self._line(line)
            if len(pending) >= _READ_CHUNK:
                self._line(pending)
                pending = b""
        if pending:
            self._line(pending)

    def _line(self, raw: bytes) -> None:
        line = self._redact(raw.decode("utf-8", "replace").rstrip())
        if line:
            self.tail.append(line[:STDERR_TAIL_CHARS])
            log.info("[%s] %s", self._name, line)
