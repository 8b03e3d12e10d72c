"""A deterministic backend in pure Python, for tests and simulation.

- :mod:`.backend`: :class:`~.backend.FakeBackend` (the ``Backend`` protocol, KV cells, faults);
- :mod:`.model`: the logits it computes (:class:`~.model.FakeModel`) and a simulated clock and
  cost model;
- :mod:`.kv`: its serialised sequence state;
- :mod:`.sampler`: its sampler chain;
- :mod:`.text`: a byte-level text model with a chat template, for layers above the engine.
"""
