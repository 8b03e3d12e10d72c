"""Images and audio for a model with a multimodal projector (``mmproj``).

:mod:`.probe` reads an item's kind, format and size from its header before anything decodes it;
:mod:`.audio` reads PCM WAV in Python; :mod:`.checks` holds a request's media to the limits;
:mod:`.sources` turns what a request sends (data URLs, base64, allowed files and URLs) into
bytes, :mod:`.remote` fetching a URL from checked addresses only;
:class:`.encoder.MediaEncoder` (the only module here on the native binding, imported on its own)
encodes media into a :class:`~llamapy.engine.media.MediaPrompt`;
:class:`FakeMediaEncoder` stands in for servers on the fake backend.
"""

from .checks import check_media_items, check_physical_batch, no_projector
from .fake import FakeMediaEncoder
from .probe import IMAGE_FORMATS, MediaInfo, probe

__all__ = ["IMAGE_FORMATS", "FakeMediaEncoder", "MediaInfo", "check_media_items",
           "check_physical_batch", "no_projector", "probe"]
