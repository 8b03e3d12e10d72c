"""The OpenAI-compatible HTTP server: ``python -m llamapy.serve`` or :func:`create_app`."""

from .app import create_app

__all__ = ["create_app"]
