"""rooftrace: capacity-plan LLM inference from real traffic."""

__version__ = "0.1.0"
