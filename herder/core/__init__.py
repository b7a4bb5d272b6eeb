"""The pure core: the domain model, settings and the scheduling decisions, with no I/O.

Everything above (store, services, runtime, api, cli) may import it; it imports none of them."""
