"""Speculative decoding: drafts verified in the target's batch, never changing the output.

- :mod:`.drafting`: the :class:`~.drafting.Drafter` contract and prompt-lookup (n-gram) drafts;
- :mod:`.model_drafter`: drafts from a second, smaller model;
- :mod:`.speculator`: how long a draft pays, which runs draft, and the verification step.
"""
