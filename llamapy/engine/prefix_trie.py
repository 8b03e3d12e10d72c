"""A token-prefix index over fixed-size blocks, for the RAM prompt cache.

Each item (an id and its token ids) hangs at the end of the path of its full blocks of
``block`` tokens; every node knows the length of the shortest item below it. Finding the items
that share the longest prefix with a prompt walks the prompt's blocks once, then looks only at
the branches that leave that path, deepest first, skipping a branch whose shortest item is too
long to be usable. A cache whose entries all start with one long system prompt holds them under
one branch point, so a lookup does not compare the prompt with every entry. With 1,000 entries
behind a 300-token prefix (``bench/bench_prompt_cache.py``), a scan of one bucket took 8-10 ms
a lookup and 13 ms an offer; through this index a conversation's next turn is found in 0.04 ms,
a new conversation's shared prefix in 0.7 ms (the branches at the system prompt's end), and an
offer takes 0.3 ms.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence

__all__ = ["PrefixTrie", "restorable"]

Block = tuple[int, ...]
#: ``min_len`` of a node with no items below it (only the root is ever empty).
_EMPTY = 1 << 62


def _common(a: Sequence[int], b: Sequence[int]) -> int:
    """Common prefix length of two short sequences (at most one block)."""
    n = min(len(a), len(b))
    if a[:n] == b[:n]:
        return n
    i = 0
    while a[i] == b[i]:
        i += 1
    return i


def restorable(min_fraction: float, exact: bool) -> Callable[[int, int], bool]:
    """The caches' rule for :meth:`PrefixTrie.best`: an entry of ``size`` tokens sharing
    ``n`` with the prompt is worth restoring when ``n`` is at least ``min_fraction`` of it
    (and at least 1), and, with ``exact``, when all of it is shared."""

    def usable(n: int, size: int) -> bool:
        return n >= max(1, min_fraction * size) and (n >= size or not exact)

    return usable


class _Node:
    __slots__ = ("children", "ends", "min_len")

    def __init__(self) -> None:
        self.children: dict[Block, _Node] = {}
        #: Items whose full blocks end at this node: id -> token ids.
        self.ends: dict[int, tuple[int, ...]] = {}
        self.min_len = _EMPTY

    def refresh(self) -> None:
        """Recompute ``min_len`` from the node's own items and its children."""
        lens = [len(t) for t in self.ends.values()]
        lens += [c.min_len for c in self.children.values()]
        self.min_len = min(lens, default=_EMPTY)


class PrefixTrie:
    """Items (``item_id``, token ids) indexed by their prefixes, in blocks of ``block``."""

    def __init__(self, block: int = 32) -> None:
        if block < 1:
            raise ValueError("block must be at least 1")
        self.block = block
        self._root = _Node()
        self.size = 0

    def _blocks(self, tokens: Sequence[int]) -> Iterator[Block]:
        b = self.block
        for i in range(0, len(tokens) - b + 1, b):
            yield tuple(tokens[i:i + b])

    def _path(self, tokens: Sequence[int]) -> list[_Node]:
        """The nodes along ``tokens``'s full blocks, as far as they exist (root first)."""
        node, path = self._root, [self._root]
        for blk in self._blocks(tokens):
            child = node.children.get(blk)
            if child is None:
                break
            node = child
            path.append(node)
        return path

    def add(self, item_id: int, tokens: tuple[int, ...]) -> None:
        node = self._root
        node.min_len = min(node.min_len, len(tokens))
        for blk in self._blocks(tokens):
            node = node.children.setdefault(blk, _Node())
            node.min_len = min(node.min_len, len(tokens))
        node.ends[item_id] = tokens
        self.size += 1

    def remove(self, item_id: int, tokens: tuple[int, ...]) -> None:
        path = self._path(tokens)
        del path[-1].ends[item_id]
        self.size -= 1
        blocks = list(self._blocks(tokens))
        for depth in range(len(path) - 1, -1, -1):
            node = path[depth]
            if depth and not node.ends and not node.children:
                del path[depth - 1].children[blocks[depth - 1]]
            else:
                node.refresh()

    def best(self, prompt: tuple[int, ...], usable: Callable[[int, int], bool]
             ) -> tuple[int | None, int]:
        """The item with the longest common prefix ``n`` with ``prompt`` for which
        ``usable(n, len(item))`` holds, and that ``n``; ``(None, 0)`` if none (ties: any of
        them). ``usable`` must not turn true as the length grows at a fixed ``n``, nor turn
        false as ``n`` grows at a fixed length: a branch is judged by its shortest item and
        by the most it could share."""
        b, path = self.block, self._path(prompt)
        for depth in range(len(path) - 1, -1, -1):
            node, base = path[depth], depth * b
            rest = prompt[base:base + b]
            skip = path[depth + 1] if depth + 1 < len(path) else None
            found: tuple[int | None, int] = (None, 0)
            for item_id, tokens in node.ends.items():
                n = base + _common(tokens[base:], rest)
                if n > found[1] and usable(n, len(tokens)):
                    found = (item_id, n)
            for blk, child in node.children.items():
                if child is skip or not usable(base + b - 1, child.min_len):
                    continue
                n = base + _common(blk, rest)
                if n > found[1] and usable(n, child.min_len):
                    found = (self._shortest(child), n)
            if found[0] is not None:
                return found  # shallower items share fewer than ``base`` tokens
        return None, 0

    @staticmethod
    def _shortest(node: _Node) -> int:
        """An item of ``node``'s subtree with the subtree's shortest length."""
        while True:
            for item_id, tokens in node.ends.items():
                if len(tokens) == node.min_len:
                    return item_id
            node = next(c for c in node.children.values() if c.min_len == node.min_len)

    def extends(self, tokens: Sequence[int]) -> bool:
        """Whether an item holds ``tokens`` (or an extension of them)."""
        b = self.block
        depth = len(tokens) // b
        path = self._path(tokens)
        if len(path) <= depth:
            return False
        node, rest = path[depth], tuple(tokens[depth * b:])
        if any(len(t) >= len(tokens) and t[depth * b:len(tokens)] == rest
               for t in node.ends.values()):
            return True
        return any(blk[:len(rest)] == rest for blk in node.children)

    def prefixes_of(self, tokens: Sequence[int]) -> list[int]:
        """The items whose token ids are a prefix of ``tokens`` (``tokens`` itself included)."""
        out = []
        for depth, node in enumerate(self._path(tokens)):
            base = depth * self.block
            out += [i for i, t in node.ends.items()
                    if len(t) <= len(tokens) and tuple(tokens[base:len(t)]) == t[base:]]
        return out

    def items(self) -> Iterator[tuple[int, tuple[int, ...], int]]:
        """Every item as ``(item_id, tokens, depth)`` (for integrity checks)."""
        stack = [(self._root, 0)]
        while stack:
            node, depth = stack.pop()
            for item_id, tokens in node.ends.items():
                yield item_id, tokens, depth
            stack += [(c, depth + 1) for c in node.children.values()]

    def check(self) -> None:
        """Raise ``AssertionError`` if a node's ``min_len`` or an item's depth is wrong."""
        order: list[tuple[_Node, int]] = []
        stack = [(self._root, 0)]
        while stack:  # (no recursion: a path is as deep as a long prompt has blocks)
            node, depth = stack.pop()
            order.append((node, depth))
            stack += [(c, depth + 1) for c in node.children.values()]
        low: dict[int, int] = {}
        for node, depth in reversed(order):  # children before their parents
            lens = [len(t) for t in node.ends.values()]
            if any(n // self.block != depth for n in lens):
                raise AssertionError("prefix trie: an item ends at the wrong depth")
            low[id(node)] = min(lens + [low[id(c)] for c in node.children.values()],
                                default=_EMPTY)
            if low[id(node)] != node.min_len:
                raise AssertionError("prefix trie: a node's shortest length is stale")
