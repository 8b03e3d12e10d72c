"""A token-prefix index for the prompt caches: a radix tree of their entries' token ids.

Each edge holds a run of tokens, each node the items that end there, and the children of a
node start with distinct tokens. Every node knows the shortest item below it and one item of
that length. A lookup walks the prompt down the tree once; every item off that path shares
exactly the depth of the node where its branch leaves the path, so the deepest usable answer
is found by checking each node on the path against the shortest item below it: the work
follows the prompt's length, not the number of entries. Nothing depends on how entries are
spread, so a cache of thousands of conversations behind one system prompt answers a new
conversation as fast as a known one.

An earlier index hung items in a trie of 32-token blocks. Its lookups for a new conversation
compared the prompt with every branch leaving the system prompt's last block, one per
conversation: 2.2 ms at 1,000 entries and 8.7 ms at 5,000 (``bench/bench_prompt_cache.py``),
on the tick thread, for every queued request when the engine orders admissions.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence

__all__ = ["PrefixTrie", "restorable"]

Tokens = tuple[int, ...]
#: ``min_len`` of a node with no items below it (only the root is ever empty).
_EMPTY = 1 << 62


def _matched(edge: Tokens, tokens: Tokens, pos: int) -> int:
    """How many leading tokens of ``edge`` equal ``tokens[pos:]`` (slice compares run at C
    speed; a mismatch is located by bisection)."""
    n = min(len(edge), len(tokens) - pos)
    if tokens[pos:pos + n] == edge[:n]:
        return n
    lo, hi = 0, n - 1  # the first mismatch is at an index in [lo, hi]
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if tokens[pos:pos + mid] == edge[:mid]:
            lo = mid
        else:
            hi = mid - 1
    return lo


def restorable(min_fraction: float, exact: bool) -> Callable[[int, int], bool]:
    """The caches' rule for :meth:`PrefixTrie.best`: an entry of ``size`` tokens sharing
    ``n`` with the prompt is worth restoring when ``n`` is at least ``min_fraction`` of it
    (and at least 1), and, with ``exact``, when all of it is shared."""

    def usable(n: int, size: int) -> bool:
        return n >= max(1, min_fraction * size) and (n >= size or not exact)

    return usable


class _Node:
    __slots__ = ("children", "depth", "edge", "ends", "min_item", "min_len")

    def __init__(self, edge: Tokens, depth: int) -> None:
        #: The tokens from the parent to this node; ``depth`` counts them from the root.
        self.edge = edge
        self.depth = depth
        #: Children by the first token of their edge.
        self.children: dict[int, _Node] = {}
        #: Items whose tokens end at this node: id -> token ids.
        self.ends: dict[int, Tokens] = {}
        #: The shortest item below this node (this node included): its length and an id.
        self.min_len = _EMPTY
        self.min_item = -1

    def lower(self, length: int, item_id: int) -> None:
        if length < self.min_len:
            self.min_len, self.min_item = length, item_id

    def refresh(self) -> None:
        """Recompute the shortest item from the node's own items and its children."""
        self.min_len, self.min_item = _EMPTY, -1
        for item_id, tokens in self.ends.items():
            self.lower(len(tokens), item_id)
        for child in self.children.values():
            self.lower(child.min_len, child.min_item)


class PrefixTrie:
    """Items (``item_id``, token ids) indexed by their prefixes."""

    def __init__(self) -> None:
        self._root = _Node((), 0)
        self.size = 0

    def _walk(self, tokens: Tokens) -> tuple[list[_Node], _Node | None, int]:
        """Follow ``tokens`` down: the nodes reached whole (root first), the child whose edge
        they leave part-way (or None), and how many tokens matched."""
        node, pos, path = self._root, 0, [self._root]
        while pos < len(tokens):
            child = node.children.get(tokens[pos])
            if child is None:
                break
            k = _matched(child.edge, tokens, pos)
            if k < len(child.edge):
                return path, child, pos + k
            node, pos = child, pos + k
            path.append(node)
        return path, None, pos

    def add(self, item_id: int, tokens: Tokens) -> None:
        path, partial, pos = self._walk(tokens)
        for node in path:
            node.lower(len(tokens), item_id)
        node = path[-1]
        if partial is not None:  # split the edge where ``tokens`` leave it
            k = pos - node.depth
            mid = _Node(partial.edge[:k], pos)
            partial.edge = partial.edge[k:]
            mid.children[partial.edge[0]] = partial
            mid.lower(partial.min_len, partial.min_item)
            mid.lower(len(tokens), item_id)
            node.children[mid.edge[0]] = mid
            node = mid
        if pos < len(tokens):
            leaf = _Node(tokens[pos:], len(tokens))
            leaf.lower(len(tokens), item_id)
            node.children[tokens[pos]] = leaf
            node = leaf
        node.ends[item_id] = tokens
        self.size += 1

    def remove(self, item_id: int, tokens: Tokens) -> None:
        path, _, _ = self._walk(tokens)
        del path[-1].ends[item_id]
        self.size -= 1
        for depth in range(len(path) - 1, 0, -1):
            node, parent = path[depth], path[depth - 1]
            if not node.ends and not node.children:
                del parent.children[node.edge[0]]
            elif not node.ends and len(node.children) == 1:  # merge it into its only child
                (child,) = node.children.values()
                child.edge = node.edge + child.edge
                parent.children[node.edge[0]] = child
            elif node.min_item == item_id:
                node.refresh()
        if self._root.min_item == item_id:
            self._root.refresh()

    def best(self, prompt: Tokens, usable: Callable[[int, int], bool]) -> tuple[int | None, int]:
        """The item with the longest common prefix ``n`` with ``prompt`` for which
        ``usable(n, len(item))`` holds, and that ``n``; ``(None, 0)`` if none (ties: any of
        them). ``usable`` must not turn true as the length grows at a fixed ``n``, nor turn
        false as ``n`` grows at a fixed length: the items sharing ``n`` are judged by their
        shortest, and an item refused at its own ``n`` would be refused at any smaller one,
        so at a node of the path the shortest item below it decides for its side branches."""
        path, partial, pos = self._walk(prompt)
        below = partial if partial is not None else path[-1]
        if pos and below.min_len != _EMPTY and usable(pos, below.min_len):
            return below.min_item, pos
        for node in reversed(path[:-1] if partial is None else path):
            if node.depth and usable(node.depth, node.min_len):
                return node.min_item, node.depth
        return None, 0

    def extends(self, tokens: Sequence[int]) -> bool:
        """Whether an item holds ``tokens`` (or an extension of them)."""
        tokens = tuple(tokens)
        path, _, pos = self._walk(tokens)
        return pos == len(tokens) and path[-1].min_len != _EMPTY  # (empty: the root only)

    def extensions(self, tokens: Sequence[int]) -> list[int]:
        """The items whose token ids start with ``tokens`` (``tokens`` itself included)."""
        path, partial, pos = self._walk(tuple(tokens))
        if pos < len(tokens):
            return []
        out: list[int] = []
        stack = [partial if partial is not None else path[-1]]
        while stack:
            node = stack.pop()
            out += node.ends
            stack += node.children.values()
        return out

    def prefixes_of(self, tokens: Sequence[int]) -> list[int]:
        """The items whose token ids are a prefix of ``tokens`` (``tokens`` itself included)."""
        path, _, _ = self._walk(tuple(tokens))
        return [item_id for node in path for item_id in node.ends]

    def items(self) -> Iterator[tuple[int, Tokens, int]]:
        """Every item as ``(item_id, tokens, depth of its node)`` (for integrity checks)."""
        for node in self._nodes():
            for item_id, tokens in node.ends.items():
                yield item_id, tokens, node.depth

    def _nodes(self) -> list[_Node]:
        """Every node, parents before their children (no recursion: a path can be long)."""
        order, stack = [], [self._root]
        while stack:
            node = stack.pop()
            order.append(node)
            stack += node.children.values()
        return order

    def check(self) -> None:
        """Raise ``AssertionError`` if an edge, a depth or a node's shortest item is wrong."""
        items = {item_id: tokens for item_id, tokens, _ in self.items()}
        for node in reversed(self._nodes()):  # children before their parents
            lens = [len(t) for t in node.ends.values()]
            if min(lens + [c.min_len for c in node.children.values()], default=_EMPTY) \
                    != node.min_len:
                raise AssertionError("prefix trie: a node's shortest length is stale")
            shortest = items.get(node.min_item)
            if node.min_len != _EMPTY and (shortest is None or len(shortest) != node.min_len
                                           or node not in self._walk(shortest)[0]):
                raise AssertionError("prefix trie: a node's shortest item is not below it")
            if node is not self._root and not node.ends and len(node.children) < 2:
                raise AssertionError("prefix trie: a node without items does not branch")
            for first, child in node.children.items():
                if not child.edge or child.edge[0] != first \
                        or child.depth != node.depth + len(child.edge):
                    raise AssertionError("prefix trie: an edge is misfiled")
            for tokens in node.ends.values():
                if len(tokens) != node.depth or tokens[node.depth - len(node.edge):] != node.edge:
                    raise AssertionError("prefix trie: an item ends at the wrong node")
        for item_id, tokens in items.items():
            path, partial, _ = self._walk(tokens)
            if partial is not None or item_id not in path[-1].ends:
                raise AssertionError("prefix trie: an item is not on its own path")
