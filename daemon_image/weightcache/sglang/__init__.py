"""SGLang on the weight cache: the ``sglang`` load profile (a daemon rank that runs SGLang's own
configuration, loading and post-processing, then publishes the rank through the shared publisher),
and the ``weightcache`` load format SGLang engines map their rank with (``plugin``, ``loader``).
Imports no SGLang until a rank loads or SGLang loads the plug-in (docs/sglang.md)."""
