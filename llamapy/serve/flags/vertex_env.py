"""Vertex AI's ``AIP_*`` variables (read before the HTTP stack is imported; the predict route
itself is :mod:`llamapy.serve.routes.vertex`)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from ...errors import InvalidOptionError


@dataclass(frozen=True, slots=True)
class VertexSettings:
    """Where Vertex AI reaches the server (from its ``AIP_*`` variables)."""

    predict_path: str = "/predict"
    health_path: str | None = None
    port: int | None = None


def vertex_settings(environ: Mapping[str, str]) -> VertexSettings | None:
    """The settings when ``AIP_MODE`` is ``PREDICTION``, else None; a bad value raises
    :class:`InvalidOptionError`."""
    if environ.get("AIP_MODE", "") != "PREDICTION":
        return None
    predict = environ.get("AIP_PREDICT_ROUTE") or "/predict"
    health = environ.get("AIP_HEALTH_ROUTE") or None
    for name, path in (("AIP_PREDICT_ROUTE", predict), ("AIP_HEALTH_ROUTE", health)):
        if path is not None and (not path.startswith("/") or len(path) > 256):
            raise InvalidOptionError(f"{name} must be a path starting with '/'", option=name)
    port_text = environ.get("AIP_HTTP_PORT")
    port = None
    if port_text:
        if not port_text.isdigit() or not 0 < int(port_text) < 65536:
            raise InvalidOptionError("AIP_HTTP_PORT must be a port number",
                                     option="AIP_HTTP_PORT")
        port = int(port_text)
    return VertexSettings(predict, health, port)
