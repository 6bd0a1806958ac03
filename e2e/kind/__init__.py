"""Running the e2e suites against a kind cluster (needs docker and kind)."""
