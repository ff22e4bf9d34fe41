"""What the engine profiles (``vllm``, …) share, below each engine's own package: a rank that fills
its arena with the engine's own loader and execs into the serving daemon (``publisher``), a loaded
torch model copied into a sealed arena (``publish``), and an engine's meta-built model bound to the
mapped arena (``bind``). An engine is one package above this one; nothing here names an engine.

This package's ``__init__`` and ``profile`` import no torch: the daemon's parser reaches them."""
