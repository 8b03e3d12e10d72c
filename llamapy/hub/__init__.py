"""Models by name: Hugging Face Hub downloads (:mod:`.fetch`, chosen by :mod:`.select`) and the
local store of pulled models (:mod:`.store`, ``python -m llamapy pull|list|rm|show``).

Needs ``huggingface_hub`` (the ``serve`` extra); nothing here is imported by the engine.
"""

from __future__ import annotations

from .fetch import Downloaded, HubAccess, HubFile, fetch_model, hub_cache_dir
from .select import choose_files

__all__ = ["Downloaded", "HubAccess", "HubFile", "choose_files", "fetch_model",
           "hub_cache_dir"]
