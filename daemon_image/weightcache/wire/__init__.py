"""What a daemon and its engines agree on: ``fingerprint`` (what decides a cache's bytes, computed
by both), ``protocol`` (the framed msgpack messages on a rank's socket) and ``rankfiles`` (where a
rank's socket, ready file and lock are)."""
