"""The HTTP API's contract: every request and response body, as pydantic models, one module
per router (`jobs`, `hosts`, `accounts`, `agents`, …) over the shared field types of `base`.

The server validates requests and declares responses with them (so the OpenAPI document
shows real schemas); the agent parses what it receives with them; the Python client submits
with the same model. Only pydantic and `herder.core` are imported, so an agent or a client
does not pull in FastAPI or the server.

Requests are strict (unknown fields, NUL characters, non-finite numbers and out-of-range
ints are refused: PostgreSQL cannot store them); replies ignore fields they do not know,
so a newer server can add one without breaking an agent.
"""
