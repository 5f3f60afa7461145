"""Ranks: the only place processes exist, and the sharding strategies (DDP, FSDP2, DeepSpeed ZeRO-2/3)."""
