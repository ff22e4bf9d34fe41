"""The engine side: ``weights`` (connect to a rank's daemon, compare fingerprints, map the arena
or fall back to disk) and ``binding`` (put the mapped tensors into a model built on the meta
device)."""
