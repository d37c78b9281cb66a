"""NVML GPU agent core: the narrow NVML interface, per-GPU probing, the sampler and the XID watcher."""
