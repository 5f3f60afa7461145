"""The step engine: log-probs through the chunked head, the micro-batch loss, the optimizer step, packing,
precision and model preparation."""
