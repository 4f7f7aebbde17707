"""The OpenAPI file describes exactly the service's routes and methods."""

import re

import yaml

from hub_ext.service import handlers
from hub_ext.service.handlers import SPEC_FILE, routes

PREFIX = "/services/labfleet/"
METHODS = ("get", "post", "patch", "put", "delete")


def _route_templates():
    """Turn each route regex into an OpenAPI path template with the spec's parameter names."""
    out = {}
    for pattern, handler in routes(PREFIX):
        if not pattern.startswith(PREFIX + "api") or handler is handlers.SpecHandler:
            continue
        path = pattern[len(PREFIX + "api") :].replace(r"\.", ".")
        own = [c for c in handler.__mro__ if c.__module__.startswith("hub_ext")]
        methods = {m for m in METHODS if any(m in c.__dict__ for c in own)}
        out[path] = (methods, handler)
    return out


def _normalize(path):
    # "{domain}" and "([^/]+)" and "(keypair|user|project)" all become "{}"
    path = re.sub(r"\{[^}]+\}", "{}", path)
    return re.sub(r"\([^)]*\)", "{}", path)


def test_every_route_is_in_the_spec_and_back():
    spec = yaml.safe_load(SPEC_FILE.read_text())
    spec_paths = {_normalize(p): {m for m in ops if m in METHODS} for p, ops in spec["paths"].items()}
    route_paths = {_normalize(p): methods for p, (methods, _) in _route_templates().items()}
    spec_paths.pop("/openapi.yaml")
    assert set(spec_paths) == set(route_paths), set(spec_paths) ^ set(route_paths)
    for path, methods in route_paths.items():
        assert spec_paths[path] == methods, f"{path}: spec {spec_paths[path]} vs handler {methods}"


def test_spec_is_valid_openapi_shape():
    spec = yaml.safe_load(SPEC_FILE.read_text())
    assert spec["openapi"].startswith("3.")
    for path, ops in spec["paths"].items():
        for m, op in ops.items():
            if m in METHODS:
                assert op["responses"], (path, m)
                for ref in re.findall(r"#/components/schemas/(\w+)", str(op)):
                    assert ref in spec["components"]["schemas"], ref
