"""``rooftrace classify``: split every recorded input token into cache-hit and fresh.

``prefix`` builds the prefix-block chains and simulates the cache; ``accounting`` applies them to a
day of requests and writes the token accounting.
"""
