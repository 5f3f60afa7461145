"""What a checkpoint holds and how it is written atomically and read back (``store``)."""

from grouprl.train.checkpoint.store import (
    PATTERN,
    fsync_tree,
    latest_checkpoint,
    list_checkpoints,
    load_checkpoint,
    log_sizes,
    resolve_resume,
    rng_state,
    save_checkpoint,
    save_final_atomic,
    set_learning_rate,
    set_rng_state,
    tmp_checkpoint,
    to_device,
    truncate_logs,
)

__all__ = ["PATTERN", "fsync_tree", "latest_checkpoint", "list_checkpoints", "load_checkpoint", "log_sizes",
           "resolve_resume", "rng_state", "save_checkpoint", "save_final_atomic", "set_learning_rate",
           "set_rng_state", "tmp_checkpoint", "to_device", "truncate_logs"]
