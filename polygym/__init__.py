"""polygym: train and evaluate LLM policies on many reinforcement-learning environments at once."""

__version__ = "0.1.0"
