"""The run's lifecycle on disk, torch-free: lock, output dir, resume-config table, signals, report refresh,
reward watch, and the checks made before a model loads."""
