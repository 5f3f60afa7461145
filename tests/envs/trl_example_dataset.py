"""TRL's second documented ``environment_factory`` example, verbatim: the dataset owns the task
(TRL docs/source/grpo_trainer.md, "Providing an external dataset (optional)"). Its ``increment`` has no
docstring there ("see the full docstring above"), so the schema comes from its type hints."""

from datasets import Dataset

# Each row carries the prompt and the task data (here, the counter target to reach).
dataset = Dataset.from_dict(
    {
        "prompt": [[{"role": "user", "content": f"Increment the counter to {i}."}] for i in range(1, 7)],
        "target": list(range(1, 7)),
    }
)

class IncrementEnv:
    def reset(self, target, **kwargs) -> None:  # the row's `target` column arrives as a keyword argument
        self.counter = 0
        self.target = target

    def get_reward(self) -> float:
        return float(self.counter == self.target)

    def increment(self, step: int) -> int:  # exposed as a tool (see the full docstring above)
        self.counter += step
        return self.counter
