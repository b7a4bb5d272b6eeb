"""`python -m herder.cli`."""

from herder.cli.root import main

main()
