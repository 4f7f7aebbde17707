"""labfleet.compute.registry without a registry: what an image reference must be, and a registry
that does not answer is an OSError (the build queue logs it and goes on). Deleting from a real
registry is in tests/test_swarm.py."""

from __future__ import annotations

import pytest

from labfleet.compute import registry
from tests.hubfixture import free_port


def test_an_image_reference_names_a_registry_a_repository_and_a_tag():
    assert registry.split_ref("10.0.0.1:5000/labfleet/env:abc") == ("10.0.0.1:5000", "labfleet/env", "abc")
    for bad in ("labfleet", "host/repo", "host/:tag", "host/repo:a/b", "host/repo@sha256:00:x", "/repo:t"):
        with pytest.raises(ValueError, match="is not registry/repository:tag"):
            registry.split_ref(bad)


def test_a_registry_that_does_not_answer_is_an_os_error(tmp_path):
    with pytest.raises(OSError):
        registry.delete_image(f"127.0.0.1:{free_port()}/labfleet/env:abc", certs=tmp_path, timeout=5)
