"""Producers: the NVML GPU agent, Slurm hooks and watcher, health checks, the simulated fleet."""
