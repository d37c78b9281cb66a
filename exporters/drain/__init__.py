"""The drain controller: consumes drain recommendations and drains (or only audits) Slurm nodes.

``decide`` is the pure policy, ``state`` the persisted ledger, ``slurm_ops`` the narrow Slurm edge,
``controller`` the Kafka loop. Shadow mode (decide and audit, change nothing) is the default.
"""
