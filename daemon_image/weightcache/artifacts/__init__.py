"""A node-local cache of engine compile artifacts (vLLM's ``VLLM_CACHE_ROOT``: torch.compile,
Inductor and Triton output), kept next to the weights and keyed by what makes them valid.

Torch-free, so the daemon's serving image and the operator-rendered engine wrapper can use it.
``store.py`` is the directory format (lookup, staging, publication, eviction); ``key.py`` what an
entry is valid for; ``engine.py`` the engine's side (the wrapper around ``vllm serve``).
"""
