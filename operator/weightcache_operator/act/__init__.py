"""Act: carrying out a pass's actions in ``actions.ORDER`` (``executor``), the routing objects,
the status write and Events (``report``, ``events``), the operator's metrics, the finalizer."""
