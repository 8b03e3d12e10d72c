"""ggml backend devices for a model: the local GPUs and the devices of ggml RPC servers.

``rpc_servers`` (``host:port`` of ``ggml-rpc-server`` processes, which ``build_lib.py``
builds) lend their devices to a model: their layers are computed there. libllama's own
``--rpc`` registers the servers process-wide, so every later model would use them; here a
model that names RPC servers gets an explicit device list (the RPC devices first, as
libllama orders them, then the local GPUs) and a model that names none keeps libllama's
default. ggml aborts the process when it cannot reach a server, so each endpoint is probed
with a TCP connection first and an unreachable one is a :class:`RpcServerError`. A server
that dies while a model uses it still aborts this process (ggml's RPC client has no other
way out); RPC's transport is unauthenticated, so bind servers to loopback or a private
network.
"""

from __future__ import annotations

import socket
from collections.abc import Sequence
from typing import Any

from ..errors import RpcServerError
from ._loader import native

__all__ = ["async_gpus", "model_devices", "probe_rpc_server"]

#: Seconds a probe waits for a TCP connection to an RPC server.
PROBE_TIMEOUT_S = 5.0


def probe_rpc_server(endpoint: str, timeout: float = PROBE_TIMEOUT_S) -> None:
    """Raise :class:`RpcServerError` unless ``endpoint`` (``host:port``) accepts a connection."""
    host, _, port = endpoint.rpartition(":")
    try:
        with socket.create_connection((host, int(port)), timeout=timeout):
            pass
    except (OSError, ValueError) as exc:
        raise RpcServerError(f"RPC server {endpoint} is not reachable: {exc}") from exc


def _rpc_add_server() -> Any:
    """ggml's ``ggml_backend_rpc_add_server``, found through the RPC backend's proc address."""
    ffi, lib = native().ffi, native().lib
    reg = lib.ggml_backend_reg_by_name(b"RPC")
    if reg == ffi.NULL:
        raise RpcServerError("this libllama has no RPC backend; rebuild with python build_lib.py")
    fn = lib.ggml_backend_reg_get_proc_address(reg, b"ggml_backend_rpc_add_server")
    if fn == ffi.NULL:
        raise RpcServerError("the RPC backend does not export ggml_backend_rpc_add_server")
    return ffi.cast("ggml_backend_reg_t (*)(const char *)", fn)


def rpc_devices(endpoints: Sequence[str]) -> list[Any]:
    """The ggml devices of each RPC server, in order (ggml registers a server once)."""
    lib = native().lib
    add_server = _rpc_add_server()
    devices: list[Any] = []
    for endpoint in endpoints:
        probe_rpc_server(endpoint)
        reg = add_server(endpoint.encode())
        if reg == native().ffi.NULL:
            raise RpcServerError(f"RPC server {endpoint} reports no devices")
        devices += [lib.ggml_backend_reg_dev_get(reg, i)
                    for i in range(lib.ggml_backend_reg_dev_count(reg))]
    return devices


def local_gpus() -> list[Any]:
    """This host's GPUs as libllama picks them by default: discrete ones, else integrated."""
    lib = native().lib
    devices = [lib.ggml_backend_dev_get(i) for i in range(lib.ggml_backend_dev_count())]
    kinds = [int(lib.ggml_backend_dev_type(dev)) for dev in devices]
    for kind in (lib.GGML_BACKEND_DEVICE_TYPE_GPU, lib.GGML_BACKEND_DEVICE_TYPE_IGPU):
        found = [dev for dev, k in zip(devices, kinds, strict=True) if k == int(kind)]
        if found:
            return found
    return []


def async_gpus() -> bool:
    """Whether a local GPU libllama would use computes asynchronously (its ``caps.async``: a
    decode returns once its graph is queued, and reading the outputs waits for it)."""
    ffi, lib = native().ffi, native().lib
    props = ffi.new("struct ggml_backend_dev_props *")
    for dev in local_gpus():
        lib.ggml_backend_dev_get_props(dev, props)
        if getattr(props.caps, "async"):
            return True
    return False


def model_devices(rpc_servers: Sequence[str]) -> Any:
    """A NULL-terminated ``ggml_backend_dev_t[]`` for ``llama_model_params.devices``.

    The RPC servers' devices first, then the local GPUs. Keep the array alive until the
    model is loaded (libllama copies it).
    """
    devices = [*rpc_devices(rpc_servers), *local_gpus()]
    array = native().ffi.new("ggml_backend_dev_t[]", len(devices) + 1)
    for i, dev in enumerate(devices):
        array[i] = dev
    return array
