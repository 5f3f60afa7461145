"""The training loops: GRPO-family (``grpo``), PPO with a critic (``ppo``), DPO on preference pairs (``dpo``)."""
