"""Model serving's numbers, the pure parts: one tick's counts split per endpoint and token
(labfleet.usage.serving_usage.split) and the Prometheus families built from plain endpoint rows
(labfleet.usage.metrics.serving_families)."""

from __future__ import annotations

from labfleet.usage import metrics
from labfleet.usage.metrics import EndpointRow
from labfleet.usage.serving_usage import Counts, split


def test_what_an_endpoint_has_beyond_its_tokens_came_without_one():
    endpoints = {"e1": Counts(10, 3, 100.0), "e2": Counts(2, 0, 8.0)}
    tokens = {7: Counts(6, 2, 60.0), 8: Counts(3, 0, 30.0)}
    rows = split(endpoints, tokens, {7: "e1", 8: "e1"})
    assert rows == {
        ("e1", 7): Counts(6, 2, 60.0),
        ("e1", 8): Counts(3, 0, 30.0),
        ("e1", None): Counts(1, 1, 10.0),  # an open endpoint's caller, or one refused before its token
        ("e2", None): Counts(2, 0, 8.0),
    }


def test_every_request_with_a_token_leaves_no_tokenless_row():
    rows = split({"e1": Counts(4, 1, 40.0)}, {7: Counts(4, 1, 40.0)}, {7: "e1"})
    assert rows == {("e1", 7): Counts(4, 1, 40.0)}


def test_a_token_gone_from_the_db_stays_in_its_endpoints_rest():
    rows = split({"e1": Counts(5, 0, 50.0)}, {7: Counts(2, 0, 20.0), 99: Counts(3, 0, 30.0)}, {7: "e1"})
    assert rows == {("e1", 7): Counts(2, 0, 20.0), ("e1", None): Counts(3, 0, 30.0)}
    assert split({}, {}, {}) == {}


def _samples(fams):
    return {(f.name, s.name, tuple(sorted(s.labels.items()))): s.value for f in fams for s in f.samples}


def test_serving_families_one_sample_per_endpoint_zeros_included():
    rows = [
        EndpointRow("echo", "ml", "acme", requests=12, errors=2, wanted=2, healthy=1),
        EndpointRow("idle", "ml", "acme", requests=0, errors=0, wanted=0, healthy=0),
    ]
    fams = metrics.serving_families(rows)
    assert [f.name for f in fams] == [
        "labfleet_serving_requests",
        "labfleet_serving_errors",
        "labfleet_serving_replicas_healthy",
        "labfleet_serving_replicas_wanted",
    ]
    assert [f.type for f in fams] == ["counter", "counter", "gauge", "gauge"]
    got = _samples(fams)
    echo = (("domain", "acme"), ("endpoint", "echo"), ("project", "ml"))
    idle = (("domain", "acme"), ("endpoint", "idle"), ("project", "ml"))
    assert got[("labfleet_serving_requests", "labfleet_serving_requests_total", echo)] == 12
    assert got[("labfleet_serving_errors", "labfleet_serving_errors_total", echo)] == 2
    assert got[("labfleet_serving_replicas_healthy", "labfleet_serving_replicas_healthy", echo)] == 1
    assert got[("labfleet_serving_replicas_wanted", "labfleet_serving_replicas_wanted", echo)] == 2
    assert got[("labfleet_serving_requests", "labfleet_serving_requests_total", idle)] == 0
    # No per-token label anywhere: as many series as endpoints, never as tokens.
    assert all(set(dict(k[2])) == {"endpoint", "project", "domain"} for k in got)
    assert metrics.serving_families([]) and all(f.samples == [] for f in metrics.serving_families([]))


def test_the_latency_buckets_fit_millisecond_proxying():
    b = metrics.SERVING_BUCKETS
    assert list(b) == sorted(b) and b[0] <= 0.001 and b[-1] >= 60
    assert sum(1 for x in b if x <= 0.01) >= 4  # a router's milliseconds are told apart
