"""The HTTP API of `herder server`: routers by resource over the coordinator; the bodies
are `herder.wire`'s models."""
