"""``rooftrace classify``: split every recorded input token into cache-hit and fresh.

``prefix`` builds the prefix-block chains and simulates the cache; ``accounting`` applies them to a
day of requests and writes the token accounting; ``memory`` checks, before it starts, that a
day's prefix blocks fit the memory limit.

Public entry: :func:`classify_tokens`.
"""

from pipeline.classify.accounting import classify_tokens

__all__ = ["classify_tokens"]
