"""The ``vllm`` load profile: arenas that hold exactly what vLLM's kernels use on a rank.

The bytes come from vLLM itself — its model classes, weight loaders, sharding, fusion and
``process_weights_after_loading`` — run once per rank by ``weightcache daemon --profile vllm``
(``publisher``); engines get them through the ``weightcache`` load format (``loader``, registered
by ``plugin`` through the ``vllm.general_plugins`` entry point), which builds the model on the
meta device and binds every parameter and buffer to a read-only view of the mapped arena.

This package sits at the top of the data plane: it may import ``client``, ``wire``, ``arenas`` and
``daemon``; nothing below imports it. ``publish`` and ``bind`` need only torch (they move tensors
between a model and an arena); the other modules import vLLM.
"""
