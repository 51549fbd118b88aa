"""Integrations with frameworks, each an optional extra (`pip install 'pgq-supervisor[django]'`)."""
