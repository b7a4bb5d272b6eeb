"""`herder simulate`: herder's own placement, outcome policy, breaker, accounts and health
driven on a virtual clock over a workload trace (docs/simulate.md)."""
