"""The embedded generator in an engine process of its own (``generator.engine_process``), as vLLM's engine core:
the scheduler, the slot KV cache and the model (a ``ContinuousHFGenerator``, CUDA graphs and all) run in a child
process; the server process keeps HTTP, chat templates, tokenization, tool parsing, tracking and the store, so the
engine's decode steps no longer share a GIL with the event loop.

**The interface** (what a router of several replicas builds on): ``ProcessHFGenerator`` (``generator.py``) is a
``Generator`` (``engines/base.py``) and nothing more than:
- ``ProcessHFGenerator(facts, settings, placement, log_path)`` starts the engine process at once;
  ``wait_ready()`` blocks until it has loaded the model (``EngineStartError`` otherwise);
- ``generate(prompt_ids, sampling, on_token)``: token ids in, a ``GenerationResult`` out (per-token versions, top
  logprobs, the finish reason), the stream to ``on_token`` on the caller's event loop; named adapters are refused
  (they keep the in-process engine);
- ``load_weights(path, version)``: the engine copies a safetensors export (``/dev/shm`` on one host) into its
  module in place between decode steps; ``policy_version`` moves when it confirms, and each token carries the
  version that sampled it. The seam is ``generators/hf/sync.py: CopyIntoModule``;
- ``alive``, ``stats`` / ``counters()``, ``describe()``, ``ping()``, ``close()``.
A dead engine (exited, killed, or silent for ``generator.process.heartbeat_timeout_s``) fails every request in
flight and every later one with ``EngineUnavailableError`` (a 503): never a hang. Replacing it is the owner's
business.

**The parts**: ``wire.py`` (the messages and their msgpack encoding, chosen by measurement:
``benchmarks/serving/engine_wire.py``), ``spec.py`` (what the engine is started with), ``connection.py`` (the
server's end of the socket: non-blocking sends, a reader that settles each caller on its own event loop, the
deadlines), ``generator.py`` (the process's owner and the ``Generator`` face), ``child.py`` (the engine process's
own program).
"""

from agentjet.generators.hf.engine_process.generator import EngineStartError, ProcessHFGenerator

__all__ = ["EngineStartError", "ProcessHFGenerator"]
