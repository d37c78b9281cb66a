"""peerwatch: GPU-cluster monitoring for Slurm AI-training clusters, on Apache Kafka."""

__version__ = "0.1.0"
