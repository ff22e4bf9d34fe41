"""The node's devices, read without torch or a CUDA context: ``gpu_identity`` (which GPU and
driver an arena belongs to), ``device_memory`` (free host and GPU memory for the operator),
``gpu_grant`` (the file naming the GPUs a cache's holder booked) and ``gpu_holder`` (the process
that books them)."""
