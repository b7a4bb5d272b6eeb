"""The functional core: pure functions over frozen values, the clock passed in."""
