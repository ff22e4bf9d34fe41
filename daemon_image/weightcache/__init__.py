"""weightcache data plane: load a checkpoint once, keep it resident, let engines map it.

One subpackage per job, lower ones never importing higher ones: ``checkpoints`` (reading,
sharding, quantization, planning), ``gpu`` (devices and who booked them), ``wire`` (fingerprint,
protocol, rank files), ``arenas`` (one allocation per rank), ``client`` (the engine side),
``daemon`` (daemon, keeper, readiness), ``engine`` (the reference engine), ``tools`` (bench, demo,
sample checkpoints). ``cli`` is the ``weightcache`` command; ``logfmt``, ``gcpause`` and
``status_note`` are small helpers every layer may use. What the operator shares with the data plane
lives in ``weightcache_contract``.
"""

__version__ = "0.1.0"
