"""The HTTP routes, one module per API: ``openai`` (chat, completions, models, embeddings via
``embeddings``), ``responses``, ``anthropic``, ``ollama``, ``llama`` (llama-server's own
endpoints, with its slot files in ``slot_files``), ``models`` (router mode's load/unload) and
``vertex`` (Vertex AI's prediction protocol)."""
