"""What responses say about prefix reuse: the ``--cache-report`` values (applied by
:mod:`llamapy.openai_api.cache_report`)."""

from __future__ import annotations

__all__ = ["CACHE_REPORTS", "REPORT_BLOCK"]

#: ``--cache-report`` values: ``exact`` counts, counts rounded ``coarse`` to
#: :data:`REPORT_BLOCK`, or ``off`` (no reuse reported).
CACHE_REPORTS = ("exact", "coarse", "off")
#: Tokens ``coarse`` rounds reuse down to a multiple of (the step OpenAI reports cached tokens in).
REPORT_BLOCK = 128
