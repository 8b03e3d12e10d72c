"""llama.cpp's chat layer as the layers above the server reach it (never from the binding):
a model's chat templates, what they make of a request, and the parser of one generation
(see :mod:`llamapy._native.chat_layer`)."""

from .._native.chat_layer import (
    ChatDiff,
    ChatMessage,
    ChatParams,
    ChatStream,
    ChatTemplates,
    ChatTrigger,
)

__all__ = ["ChatDiff", "ChatMessage", "ChatParams", "ChatStream", "ChatTemplates",
           "ChatTrigger"]
