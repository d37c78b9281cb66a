"""Node health checks for Slurm prolog/epilog and periodic runs (Nagios exit codes)."""
