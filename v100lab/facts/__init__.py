"""Facts: immutable data (model spec, run configuration, the tidy table, devices, the results store)."""
