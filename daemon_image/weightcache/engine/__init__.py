"""The reference engine: a small tensor-parallel LLM server that starts from the weight cache.

It exists to prove the whole path — daemon → mapped weights → served completions — anywhere:
on CPU in CI, on a GPU, and inside the Kubernetes end-to-end tests. One module per job:
``config`` (model hyper-parameters), ``model`` (the forward pass over mapped tensor views),
``parallel`` (compute, control and start-up process groups), ``weights`` (the three weight
modes), ``tokenizer``, ``scheduler`` (rank 0's request loop and the followers' mirror of it),
``server`` (HTTP), ``metrics``, ``timeline``, ``rank`` (one rank process from start to exit),
``launcher`` (one process per rank, supervised) and ``command`` (flags, environment, dispatch).
See docs/engine.md.
"""
