"""The OpenAPI file describes exactly the service's routes and methods."""

import re

import yaml

from labfleet.service import handlers
from labfleet.service.handlers import SPEC_FILE, routes

PREFIX = "/services/labfleet/"
METHODS = ("get", "post", "patch", "put", "delete")
# Paths below are compared relative to the service (/api/me, /metrics): the spec's paths live under
# its servers' URL (/services/labfleet/api), or a path's own (/metrics: /services/labfleet).
SERVICE = PREFIX.rstrip("/")


def _route_templates():
    """Turn each route regex into an OpenAPI path template with the spec's parameter names."""
    out = {}
    for pattern, handler in routes(PREFIX):
        if handler is handlers.SpecHandler or handler in handlers.PAGES:  # the spec itself; pages, no API
            continue
        path = pattern[len(SERVICE) :].replace(r"\.", ".")
        own = [c for c in handler.__mro__ if c.__module__.startswith("labfleet")]
        methods = {m for m in METHODS if any(m in c.__dict__ for c in own)}
        out[path] = (methods, handler)
    return out


def _expand(path, alternatives):
    """Every concrete form of ``path``: each choice of a group's literal alternatives ("(a|b)"
    in a route, a path parameter with an enum in the spec) spelled out, any other group "{}"."""
    match = re.search(r"\{([^}]+)\}|\(([^)]*)\)", path)
    if match is None:
        return {path}
    choices = alternatives(match)
    head, tail = path[: match.start()], path[match.end() :]
    return {head + c + rest for c in choices for rest in _expand(tail, alternatives)}


def _route_paths():
    """Route regexes as concrete paths: "(keypair|user|project)" three times, "([^/]+)" "{}"."""

    def alternatives(m):
        group = m.group(2) or ""
        return group.split("|") if re.fullmatch(r"[a-z-]+(\|[a-z-]+)+", group) else ["{}"]

    out = {}
    for path, (methods, _) in _route_templates().items():
        path = path.replace("/?(", "/(")  # files/?(.*): the path may be empty; the spec says files/{path}
        for concrete in _expand(path, alternatives):
            out[concrete] = methods
    return out


def _spec_paths(spec):
    """Spec paths as concrete paths: a path parameter with an enum once per value, any other "{}"."""
    out: dict = {}
    for api_path, item in spec["paths"].items():
        base = (item.get("servers") or spec["servers"])[0]["url"]
        assert base.startswith(SERVICE), f"{api_path}: served outside the service ({base})"
        path = base[len(SERVICE) :] + api_path
        methods = {m for m in item if m in METHODS}
        for method in methods:
            params = _params(spec, item, item[method])

            def alternatives(m, params=params):
                schema = params.get(m.group(1), {}).get("schema", {})
                schema = _resolve(spec, schema)
                return [str(v) for v in schema["enum"]] if "enum" in schema else ["{}"]

            for concrete in _expand(path, alternatives):
                out.setdefault(concrete, set()).add(method)
    return out


def _resolve(spec, node):
    while isinstance(node, dict) and "$ref" in node:
        target = spec
        for part in node["$ref"].removeprefix("#/").split("/"):
            target = target[part]
        node = target
    return node


def _params(spec, item, op):
    """The path parameters of an operation, by name (its own over its path's)."""
    out = {}
    for p in [*item.get("parameters", []), *op.get("parameters", [])]:
        p = _resolve(spec, p)
        if p["in"] == "path":
            out[p["name"]] = p
    return out


def test_every_route_is_in_the_spec_and_back():
    spec = yaml.safe_load(SPEC_FILE.read_text())
    spec_paths = _spec_paths(spec)
    route_paths = _route_paths()
    spec_paths.pop("/api/openapi.yaml")
    assert set(spec_paths) == set(route_paths), set(spec_paths) ^ set(route_paths)
    for path, methods in route_paths.items():
        assert spec_paths[path] == methods, f"{path}: spec {spec_paths[path]} vs handler {methods}"


def test_every_operation_answers_with_a_schema():
    """Every operation says what its success looks like (a non-empty schema), and every error answer
    is the common {status, message} JSON."""
    spec = yaml.safe_load(SPEC_FILE.read_text())
    for path, item in spec["paths"].items():
        for method in METHODS:
            op = item.get(method)
            if op is None:
                continue
            where = f"{method.upper()} {path}"
            ok = {code: _resolve(spec, r) for code, r in op["responses"].items() if code.startswith("2")}
            assert ok, f"{where}: no 2xx answer"
            for code, resp in ok.items():
                content = resp.get("content") or {}
                assert content, f"{where} {code}: no content"
                for media, body in content.items():
                    schema = _resolve(spec, body.get("schema") or {})
                    assert schema, f"{where} {code} {media}: empty schema"
            for code, resp in op["responses"].items():
                if code[0] in "45":
                    schema = _resolve(spec, _resolve(spec, resp)["content"]["application/json"]["schema"])
                    assert schema is spec["components"]["schemas"]["Error"], f"{where} {code}"
            for p in op.get("parameters", []) + item.get("parameters", []):
                p = _resolve(spec, p)
                schema = _resolve(spec, p["schema"])
                if p["in"] == "query" and schema.get("type") == "string" and "enum" not in schema:
                    assert schema.get("maxLength", 10**9) <= 255 or "pattern" in schema, (
                        f"{where} {p['name']}"
                    )


def test_error_schema_is_what_the_service_sends():
    spec = yaml.safe_load(SPEC_FILE.read_text())
    error = spec["components"]["schemas"]["Error"]
    assert error["required"] == ["status", "message"] and error["additionalProperties"] is False


def test_spec_is_valid_openapi_shape():
    spec = yaml.safe_load(SPEC_FILE.read_text())
    assert spec["openapi"].startswith("3.")
    for path, ops in spec["paths"].items():
        for m, op in ops.items():
            if m in METHODS:
                assert op["responses"], (path, m)
                for ref in re.findall(r"#/components/schemas/(\w+)", str(op)):
                    assert ref in spec["components"]["schemas"], ref
