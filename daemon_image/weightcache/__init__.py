"""weightcache data plane: load a checkpoint once, keep it resident, let engines map it.

The pieces, one module each: ``checkpoint`` (reading and validating a Hugging Face
checkpoint directory), ``sharding`` (tensor/pipeline-parallel rules per architecture),
``quantization`` (the allowlist and block-wise FP8), ``loader`` (plan + fill, shared by the
daemon and the disk fallback), ``arena`` (one shared allocation per rank), ``protocol``
(the wire messages), ``daemon`` and ``client`` (both ends of the socket).
"""

__version__ = "0.1.0"
