"""The conformance kit for plugin authors."""
