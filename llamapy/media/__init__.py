"""Images and audio for a model with a multimodal projector (``mmproj``).

:class:`MediaEncoder` checks, decodes and encodes a request's media into a
:class:`~llamapy.engine.media.MediaPrompt` (:mod:`.encoder`); :func:`probe` reads an item's
kind, format and size from its header before anything decodes it (:mod:`.probe`);
:class:`FakeMediaEncoder` stands in for servers on the fake backend.
"""

from .encoder import MediaEncoder, check_media_items
from .fake import FakeMediaEncoder
from .probe import IMAGE_FORMATS, MediaInfo, probe

__all__ = ["IMAGE_FORMATS", "FakeMediaEncoder", "MediaEncoder", "MediaInfo",
           "check_media_items", "probe"]
