"""Commands for people, tests and benchmarks, never on a serving path: ``bench``, ``demo``,
``sample_checkpoints`` (generated checkpoints; nothing is downloaded) and ``reference_hf`` (a
transformers model fed by weightcache: the oracle and the demo's engine)."""
