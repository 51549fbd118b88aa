"""Durable workflows (docs/workflows.md): `ctx` for sync and async workflow handlers."""
