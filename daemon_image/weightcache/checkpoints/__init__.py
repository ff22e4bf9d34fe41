"""Reading a Hugging Face checkpoint and planning what each rank holds: ``checkpoint`` (open and
validate a directory from its safetensors headers), ``dtypes`` (stable dtype names), ``sharding``
(tensor/pipeline/expert-parallel rules per architecture), ``quantization`` (the allowlist and
block-wise FP8), ``read_tasks`` and ``experts`` (what a rank reads of a tensor; stacked experts),
``pipeline`` (plan a rank: those stages in order), ``loader`` (fill any flat buffer from a
plan), ``staging`` (pinned buffers for copies to and from a GPU), ``manifest`` (where each planned tensor lands in the arena, and the zero-copy views over it), ``planner`` (``weightcache plan``), ``page_cache``
(read-ahead and dropping pages) and ``progress`` (load progress). Imports no other part of the data
plane but the flat helpers."""
