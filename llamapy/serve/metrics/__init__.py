"""``/metrics``: ``registry`` (ours, Prometheus format, one registry per app), ``compat``
(llama-server's ``llamacpp:`` names) and ``gateway`` (vLLM's ``vllm:`` names), all read from the
same engine stats."""
