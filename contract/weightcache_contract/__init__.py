"""What the data plane (``weightcache``) and the operator (``weightcache_operator``) agree on.

Both sides import these modules, and the operator imports nothing else of the data plane, so its
image carries neither torch nor the daemon package. One module per agreement: ``backends`` (the
arena backends and their properties), ``daemon_report`` (a daemon pod's ``GET /status`` and its
metrics), ``errors`` (the exception hierarchy), ``launch`` (the daemon's flags and the engines'
environment, rendered by one side and parsed by the other), ``termination`` (the termination message's
environment variable and file), ``readonly_http`` and ``prometheus`` (the small HTTP endpoint and
metrics text both sides serve). Imports only the standard library and pydantic; never torch,
``weightcache`` or ``weightcache_operator``.
"""
