"""End-to-end suites for infertune and the real control plane they run against."""
