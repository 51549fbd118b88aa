"""Reading a supervisor's HTTP endpoints in process tests: /metrics parsed into samples."""

from __future__ import annotations

import socket
import urllib.error
import urllib.request

from prometheus_client.parser import text_string_to_metric_families

# (sample name, sorted labels) -> value
Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def get(port: int, path: str) -> tuple[int, str]:
    """Status and body of GET http://127.0.0.1:port/path; OSError if nothing listens."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5) as resp:
            return int(resp.status), resp.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


def scrape(port: int) -> Samples:
    status, text = get(port, "/metrics")
    assert status == 200
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def metric(samples: Samples, name: str, **labels: str) -> float | None:
    """One sample's value, None if the series does not exist (never incremented)."""
    return samples.get((name, tuple(sorted(labels.items()))))
