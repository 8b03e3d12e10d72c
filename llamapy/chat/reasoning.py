"""Split a model's reasoning (``<think>...</think>``) from its answer, chunk by chunk.

A reasoning block counts only at the start of the output (after optional whitespace); a
``<think>`` later in the answer is ordinary text. When the chat template already opened the
block (``started=True``), output begins inside reasoning and only the end marker matters; a
repeated start marker there is dropped. Whitespace around the block is trimmed: leading and
trailing whitespace of the reasoning and leading whitespace of the answer after it. An
unclosed block (generation stopped while thinking) is reasoning.

Text that could be the beginning of a marker is held back until the next chunk decides it, so a
partial marker never leaks into either stream; the parts emitted never depend on how the
output was chunked.
"""

from __future__ import annotations

import enum

from llamapy.chat.delta import Delta


def held_suffix(text: str, marker: str) -> int:
    """Length of the longest suffix of ``text`` that is a proper prefix of ``marker``."""
    for size in range(min(len(marker) - 1, len(text)), 0, -1):
        if text.endswith(marker[:size]):
            return size
    return 0


class _State(enum.Enum):
    START = "start"  # nothing decided yet: is there a reasoning block?
    REASONING_LEAD = "reasoning_lead"  # inside reasoning, nothing emitted yet
    REASONING = "reasoning"
    ANSWER_LEAD = "answer_lead"  # after the block, skipping whitespace
    ANSWER = "answer"


class ReasoningParser:
    """Incremental splitter of reasoning and answer text.

    ``feed`` returns a :class:`Delta` with ``reasoning`` and ``content``; ``flush`` ends the
    stream and returns whatever was held back.
    """

    def __init__(
        self, start: str = "<think>", end: str = "</think>", *, started: bool = False
    ) -> None:
        if not start or not end:
            raise ValueError("reasoning markers must be non-empty")
        self.start = start
        self.end = end
        self._state = _State.REASONING_LEAD if started else _State.START
        self._buf = ""
        self._final = False
        self._start_seen = False  # at most one start marker is consumed

    @property
    def in_reasoning(self) -> bool:
        """True while the output is inside the reasoning block."""
        return self._state in (_State.REASONING_LEAD, _State.REASONING)

    def feed(self, text: str) -> Delta:
        """Consume a chunk of output; return the text that is now decided."""
        if self._final:
            raise RuntimeError("feed() after flush()")
        self._buf += text
        return self._run()

    def flush(self) -> Delta:
        """End of output: release everything held back."""
        self._final = True
        return self._run()

    def _run(self) -> Delta:
        out = Delta()
        handlers = {
            _State.START: self._start,
            _State.REASONING_LEAD: self._reasoning_lead,
            _State.REASONING: self._reasoning,
            _State.ANSWER_LEAD: self._answer_lead,
            _State.ANSWER: self._answer,
        }
        while handlers[self._state](out):
            pass
        return out

    def _start(self, out: Delta) -> bool:
        stripped = self._buf.lstrip()
        if stripped.startswith(self.start):
            self._buf = stripped[len(self.start) :]
            self._start_seen = True
            self._state = _State.REASONING_LEAD
            return True
        if not self._final and self.start.startswith(stripped):
            return False
        self._state = _State.ANSWER
        return True

    def _reasoning_lead(self, out: Delta) -> bool:
        stripped = self._buf.lstrip()
        if not self._start_seen and stripped.startswith(self.start):
            stripped = stripped[len(self.start) :].lstrip()
            self._start_seen = True
        elif not self._start_seen and not self._final and self.start.startswith(stripped):
            return False
        self._buf = stripped
        if not stripped and not self._final:
            return False
        self._state = _State.REASONING
        return True

    def _reasoning(self, out: Delta) -> bool:
        buf = self._buf
        index = buf.find(self.end)
        if index >= 0:
            out.reasoning += buf[:index].rstrip()
            self._buf = buf[index + len(self.end) :]
            self._state = _State.ANSWER_LEAD
            return True
        if self._final:
            out.reasoning += buf.rstrip()
            self._buf = ""
            return False
        keep = held_suffix(buf, self.end)
        body = buf[: len(buf) - keep]
        decided = body.rstrip()
        out.reasoning += decided
        self._buf = buf[len(decided) :]
        return False

    def _answer_lead(self, out: Delta) -> bool:
        self._buf = self._buf.lstrip()
        if not self._buf:
            return False
        self._state = _State.ANSWER
        return True

    def _answer(self, out: Delta) -> bool:
        out.content += self._buf
        self._buf = ""
        return False
