"""Integrations with frameworks, each an optional extra (`pip install -e '.[django]'` in a
checkout: see the README's Install)."""
