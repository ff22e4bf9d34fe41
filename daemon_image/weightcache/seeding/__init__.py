"""Seeding: a starting rank copies a Ready peer daemon's finished arena instead of loading it.

A peer on another node that holds the same weights (``Fingerprint.weights_digest``: the same
checkpoint content, layout, quantization, dtype, engine profile and environment) serves its arena
over TCP (``server.py``); the starting rank (``client.py``) writes the bytes straight into its new
arena, checking each chunk against the peer's chunk digests as it arrives, and falls back to the
next peer, then to the disk, on any refusal, mismatch, death, stall or trickle.

Trust (``messages.py``): both sides prove they hold the cache's credential (HMAC over fresh nonces
from both), and the peer's offer (its fingerprint, manifest and chunk digests) is authenticated
with the same key, bound to this connection's nonces. Beyond that, the starting rank plans its own
layout from the checkpoint's headers and refuses a manifest that differs from it, so a peer decides
no tensor's place, and every byte it sends is hashed before the arena is sealed and served.
"""
