"""pytest plugin (fixtures only)."""
