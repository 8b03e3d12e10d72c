"""A small pure-Python GBNF recogniser and sampler, to test the grammars we emit.

``Grammar.parse(text)`` reads llama.cpp's GBNF (literals, classes, rule references, groups,
``* + ?`` and ``{m}``/``{m,}``/``{m,n}``); ``matches(text)`` decides membership by computing,
for each grammar node and start position, the set of end positions (memoised; fine for the
non-left-recursive grammars we generate); ``sample(rng)`` generates a random member, taking the
shortest derivations once it is deep enough that it must finish.
"""

from __future__ import annotations

import math
import random
import re
from dataclasses import dataclass, field

_CLASS_POOL = (
    [chr(c) for c in range(0x20, 0x7F)]
    + list("\t\n\r\x00\x01\x1f\x7f")
    + list("éßЖ日本😀\u2028\ufeff")
)


@dataclass(frozen=True)
class Lit:
    text: str


@dataclass(frozen=True)
class Cls:
    ranges: tuple[tuple[int, int], ...]
    negated: bool

    def accepts(self, char: str) -> bool:
        inside = any(lo <= ord(char) <= hi for lo, hi in self.ranges)
        return inside != self.negated


@dataclass(frozen=True)
class Ref:
    name: str


@dataclass(frozen=True)
class Seq:
    items: tuple[object, ...]


@dataclass(frozen=True)
class Alt:
    options: tuple[object, ...]


@dataclass(frozen=True)
class Rep:
    node: object
    low: int
    high: int | None


class _Reader:
    def __init__(self, text: str) -> None:
        self.text = text
        self.pos = 0

    def peek(self) -> str:
        return self.text[self.pos] if self.pos < len(self.text) else ""

    def skip_space(self) -> None:
        while self.pos < len(self.text):
            char = self.text[self.pos]
            if char in " \t\r\n":
                self.pos += 1
            elif char == "#":
                while self.pos < len(self.text) and self.text[self.pos] != "\n":
                    self.pos += 1
            else:
                return

    def char(self) -> int:
        char = self.text[self.pos]
        if char != "\\":
            self.pos += 1
            return ord(char)
        kind = self.text[self.pos + 1]
        sizes = {"x": 2, "u": 4, "U": 8}
        if kind in sizes:
            digits = self.text[self.pos + 2 : self.pos + 2 + sizes[kind]]
            self.pos += 2 + sizes[kind]
            return int(digits, 16)
        self.pos += 2
        simple = {"n": "\n", "t": "\t", "r": "\r"}
        if kind in simple:
            return ord(simple[kind])
        if kind in '\\"[]-^':
            return ord(kind)
        raise ValueError(f"unknown escape \\{kind}")


def _parse_alt(reader: _Reader) -> object:
    options = [_parse_seq(reader)]
    while reader.peek() == "|":
        reader.pos += 1
        options.append(_parse_seq(reader))
    return options[0] if len(options) == 1 else Alt(tuple(options))


def _parse_seq(reader: _Reader) -> object:
    items = []
    while True:
        reader.skip_space()
        char = reader.peek()
        if char in ("", "|", ")"):
            break
        items.append(_parse_postfix(reader, _parse_atom(reader)))
    return items[0] if len(items) == 1 else Seq(tuple(items))


def _parse_atom(reader: _Reader) -> object:
    char = reader.peek()
    if char == '"':
        reader.pos += 1
        chars = []
        while reader.peek() != '"':
            chars.append(chr(reader.char()))
        reader.pos += 1
        return Lit("".join(chars))
    if char == "[":
        reader.pos += 1
        negated = reader.peek() == "^"
        reader.pos += negated
        ranges = []
        while reader.peek() != "]":
            low = reader.char()
            high = low
            if reader.peek() == "-" and reader.text[reader.pos + 1] != "]":
                reader.pos += 1
                high = reader.char()
            ranges.append((low, high))
        reader.pos += 1
        return Cls(tuple(ranges), negated)
    if char == "(":
        reader.pos += 1
        node = _parse_alt(reader)
        reader.skip_space()
        assert reader.peek() == ")", reader.text[reader.pos :]
        reader.pos += 1
        return node
    match = re.compile(r"[a-zA-Z0-9-]+").match(reader.text, reader.pos)
    if not match:
        raise ValueError(f"unexpected {reader.text[reader.pos : reader.pos + 20]!r}")
    reader.pos = match.end()
    return Ref(match.group())


def _parse_postfix(reader: _Reader, node: object) -> object:
    while True:
        char = reader.peek()
        if char and char in "*+?":
            reader.pos += 1
            node = Rep(node, 0 if char != "+" else 1, 1 if char == "?" else None)
        elif char == "{":
            end = reader.text.index("}", reader.pos)
            spec = reader.text[reader.pos + 1 : end]
            reader.pos = end + 1
            low, _, high = spec.partition(",")
            if "," not in spec:
                node = Rep(node, int(low), int(low))
            else:
                node = Rep(node, int(low), int(high) if high else None)
        else:
            return node


@dataclass
class Grammar:
    rules: dict[str, object]
    _memo: dict[tuple[int, int], frozenset[int]] = field(default_factory=dict)
    _text: str = ""

    @classmethod
    def parse(cls, text: str) -> Grammar:
        rules: dict[str, object] = {}
        for line in text.splitlines():
            if not line.strip() or line.lstrip().startswith("#"):
                continue
            name, _, body = line.partition("::=")
            reader = _Reader(body)
            node = _parse_alt(reader)
            reader.skip_space()
            assert reader.pos == len(body), f"trailing text in rule {name}: {body[reader.pos :]}"
            rules[name.strip()] = node
        for node in rules.values():
            _check_refs(node, rules)
        return cls(rules)

    # --- recognition --------------------------------------------------------------------------

    def matches(self, text: str, start: str = "root") -> bool:
        self._memo = {}
        self._text = text
        return len(text) in self._ends(Ref(start), 0)

    def _ends(self, node: object, pos: int) -> frozenset[int]:
        key = (id(node), pos)
        if key in self._memo:
            return self._memo[key]
        self._memo[key] = frozenset()  # guards against (unexpected) left recursion
        result = frozenset(self._compute(node, pos))
        self._memo[key] = result
        return result

    def _compute(self, node: object, pos: int) -> set[int]:
        text = self._text
        if isinstance(node, Lit):
            return {pos + len(node.text)} if text.startswith(node.text, pos) else set()
        if isinstance(node, Cls):
            return {pos + 1} if pos < len(text) and node.accepts(text[pos]) else set()
        if isinstance(node, Ref):
            return set(self._ends(self.rules[node.name], pos))
        if isinstance(node, Alt):
            return set().union(*(self._ends(option, pos) for option in node.options))
        if isinstance(node, Seq):
            current = {pos}
            for item in node.items:
                current = set().union(*(self._ends(item, p) for p in current)) if current else set()
            return current
        assert isinstance(node, Rep)
        return self._repeat(node, pos)

    def _repeat(self, node: Rep, pos: int) -> set[int]:
        frontier = {pos}
        for _ in range(node.low):
            frontier = set().union(*(self._ends(node.node, p) for p in frontier))
            if not frontier:
                return set()
        result = set(frontier)
        count = node.low
        while frontier and (node.high is None or count < node.high):
            step = set().union(*(self._ends(node.node, p) for p in frontier))
            frontier = step - result if node.high is None else step
            result |= step
            count += 1
        return result

    # --- generation ---------------------------------------------------------------------------

    def sample(self, rng: random.Random, start: str = "root", max_depth: int = 12) -> str:
        heights = _min_heights(self.rules)
        out: list[str] = []
        _Sampler(self.rules, heights, rng, max_depth).emit(Ref(start), 0, out)
        return "".join(out)


def _check_refs(node: object, rules: dict[str, object]) -> None:
    if isinstance(node, Ref):
        assert node.name in rules, f"undefined rule {node.name}"
    for child in _children(node):
        _check_refs(child, rules)


def _children(node: object) -> tuple[object, ...]:
    if isinstance(node, Seq):
        return node.items
    if isinstance(node, Alt):
        return node.options
    if isinstance(node, Rep):
        return (node.node,)
    return ()


def _height(node: object, heights: dict[str, float]) -> float:
    if isinstance(node, Ref):
        return heights[node.name] + 1
    if isinstance(node, Seq):
        return max((_height(item, heights) for item in node.items), default=0)
    if isinstance(node, Alt):
        return min(_height(option, heights) for option in node.options)
    if isinstance(node, Rep):
        return 0 if node.low == 0 else _height(node.node, heights)
    return 0


def _min_heights(rules: dict[str, object]) -> dict[str, float]:
    heights = {name: math.inf for name in rules}
    changed = True
    while changed:
        changed = False
        for name, node in rules.items():
            height = _height(node, heights)
            if height < heights[name]:
                heights[name], changed = height, True
    return heights


@dataclass
class _Sampler:
    rules: dict[str, object]
    heights: dict[str, float]
    rng: random.Random
    max_depth: int

    def emit(self, node: object, depth: int, out: list[str]) -> None:
        deep = depth >= self.max_depth
        if isinstance(node, Lit):
            out.append(node.text)
        elif isinstance(node, Cls):
            out.append(self._class_char(node))
        elif isinstance(node, Ref):
            self.emit(self.rules[node.name], depth + 1, out)
        elif isinstance(node, Seq):
            for item in node.items:
                self.emit(item, depth, out)
        elif isinstance(node, Alt):
            options = node.options
            if deep:
                best = min(_height(o, self.heights) for o in options)
                options = tuple(o for o in options if _height(o, self.heights) == best)
            self.emit(self.rng.choice(options), depth, out)
        elif isinstance(node, Rep):
            for _ in range(self._count(node, deep)):
                self.emit(node.node, depth, out)

    def _count(self, node: Rep, deep: bool) -> int:
        if deep:
            return node.low
        extra = 0
        while self.rng.random() < 0.6 and extra < 6:
            extra += 1
        high = node.low + 6 if node.high is None else node.high
        return min(node.low + extra, high)

    def _class_char(self, node: Cls) -> str:
        if not node.negated:
            low, high = self.rng.choice(node.ranges)
            while True:
                code = self.rng.randint(low, min(high, low + 200))
                if not 0xD800 <= code <= 0xDFFF:
                    return chr(code)
        return self.rng.choice([c for c in _CLASS_POOL if node.accepts(c)])
