"""Rollout decisions: observed pods + the desired versions → what to do next. Pure.

Engines are units (engine_units.py): one pod, or a group of ``parallelism.nodes`` pods — a
single-pod engine is a group of one. The rollout's steps and its report (which replicas are
done, the stall, the phase, the generation the Service selects) are decided over one view per
unit, alike for every size; the steps name units by their head pod and apply to all its pods.

Two kinds of change reach running engines:

- **Engine rollout** (the engine template changed, the daemons did not): up to ``maxSurge``
  replicas roll at once (default 1: one at a time). For each replica whose turn it is, a
  new-version standby is started next to the old pods (a *surge* pod, hidden from the ordinary
  scaling logic so it is not trimmed as an extra standby); once it is Ready it is relabelled
  active and the old active is deleted with its grace period (the engine drains on SIGTERM), then
  the old standbys go and new ones are created. Both versions map the same daemon arena, so
  briefly having two actives behind the Service mixes nothing. A replica is done when no old pod
  is left (terminating ones included) and its new active and standbys are Ready; only then does
  the next replica take its place.
- **Generation change** (what the daemons hold changed: ``daemon_spec_hash``), one of two ways,
  chosen once when the change starts (``generation_strategy``) and visible afterwards in which
  DaemonSets exist:

  - *blue/green*, when every node reports room for a second copy (on GPUs too: a GPU holder
    pod, not the daemon pod, books the node's GPUs, so both generations' daemons can use them): a
    second DaemonSet of the new generation starts next to the serving one (its own socket
    directory per generation), loads on every node, new-generation engines start next to the old ones, the Service switches, the old
    engines drain, and only then is the old generation's DaemonSet deleted (a ``DeleteDaemonSet``).
    The Service never loses its Ready engines.
  - *node by node* otherwise: the DaemonSet is updated in place; a node's old-generation engines
    are drained, then its daemon pod is deleted (the DaemonSet is ``OnDelete``, so it is replaced
    only then) and reloads; new-generation engines start next to it.

  Either way the Service selects one generation (a label in its selector) and switches
  atomically once every replica has a Ready new-generation engine, so clients never see two
  fingerprints at once.

A new-version pod that is not Ready within ``readyDeadlineSeconds`` of its creation stalls the
rollout: the old version keeps serving, an engine rollout starts no further replica (those already
under way finish; with ``maxSurge`` 1 there are none), and the status says which pod and why. Changing the spec back makes the old pods current again; the stalled pod is
then the outdated one and is retired like any other.

The modules, one job each: ``views`` (what the spec asks for and what is observed, one view per
unit), ``decisions`` (a pass's ``Plan`` and the stall), ``engine`` and ``generation`` (the two
kinds of change), ``planner`` (one pass: which kind of change, then the phase), ``strategy``
(blue/green or node by node) and ``status`` (``status.rollout`` and its conditions).
"""
