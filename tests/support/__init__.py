"""What the tests share: processes, environment, waits, ports, the herder command, both
harnesses (one machine's `herder up`, a fleet) and a private PostgreSQL cluster.

One module a noun, so a helper is written once and found by what it is about.
"""
