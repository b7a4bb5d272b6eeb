"""The HTTP API of `herder server`: operators' job endpoints and the agent protocol."""
