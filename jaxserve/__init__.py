"""jaxserve."""
