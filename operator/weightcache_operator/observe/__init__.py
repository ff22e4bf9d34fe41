"""Observe: what the cluster holds for a cache, read once per pass (``snapshot.observe``) from the
API server and the watch-fed indexes (nodes, pods), and what has failed (``failures``). Reads
only; decides nothing, writes nothing."""
