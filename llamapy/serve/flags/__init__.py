"""The command line of ``python -m llamapy.serve``, derived from the option tree: ``start``
(every ``Server`` start option), ``serving`` (the HTTP server's own flags, the serving options
of :class:`~llamapy.options.ServeOptions`, made by ``tree``), ``models`` (several models),
``hub`` (a model named on the Hugging Face Hub), ``log``, ``compat`` (llama-server flags kept
apart: the API key file, TLS and flags without an option of their own), ``env``
(llama-server's ``LLAMA_ARG_*`` variables) and ``vertex_env`` (Vertex AI's ``AIP_*``
variables)."""
