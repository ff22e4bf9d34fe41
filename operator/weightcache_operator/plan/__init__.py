"""Plan: pure decisions from an observation to ``actions.Action`` values (DaemonSets, gates,
rollout, failover, scaling) and the status a pass reports. No API calls and no clock of its own,
so every decision is a unit test."""
