"""pytest plugin of the conformance kit (options, report header, markers)."""
