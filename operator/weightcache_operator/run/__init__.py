"""Run: when passes happen and who runs them: kopf's handlers, the pass (``reconcile``), one pass
at a time per cache (``runner``), the per-cache memory a pass keeps (``memory``), timers
(``alarms``) and the replicas' lease (``handover``)."""
