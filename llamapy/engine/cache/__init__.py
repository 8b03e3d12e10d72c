"""The prefix caches below the slots, and how a run picks what it starts from.

- :mod:`.tier`: the :class:`~.tier.CacheTier` contract every level below the slots keeps;
- :mod:`.ram`: the RAM tier (serialised sequence states, byte-bounded, LRU, per tenant);
- :mod:`.disk` and its ``disk_*`` helpers: the disk tier (files kept across restarts, shared by
  servers on one folder, written and read off the tick thread);
- :mod:`.radix`: the token-prefix index both tiers search;
- :mod:`.pin_table` and :mod:`.pinning`: prefixes a request asks to keep for a time;
- :mod:`.resolver`: which source (the slot itself, a donor slot, then each tier in order) a run
  starts from, and where dropped KV goes.
"""
