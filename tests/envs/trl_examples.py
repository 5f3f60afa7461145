"""TRL's first documented ``environment_factory`` example, verbatim (TRL docs/source/grpo_trainer.md, "Agent Training",
"Environments"). Only the class bodies are TRL's; the test
module builds the trainers. Keep them as TRL writes them: the point is that they run unchanged."""

import random


class IncrementEnv:
    # Reserved methods
    def reset(self, **kwargs) -> str | None:  # required; called at the start of each rollout
        self.counter = 0
        self.target = random.randint(1, 6)  # self-sample the task
        return f"Increment the counter by {self.target}."  # returned string becomes the prompt

    def get_reward(self) -> float:  # optional: the environment scores itself from its own state
        return float(self.counter == self.target)

    # Public methods (exposed as tools)
    def increment(self, step: int) -> int:
        """
        Increment the internal counter.

        Args:
            step: Value to add to the counter.

        Returns:
            The updated counter value.
        """
        self.counter += step
        return self.counter
