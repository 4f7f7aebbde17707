"""Save as environment: the image's settings are the base's, never the session's (pure)."""

from labfleet.compute.envcommit import LABEL_SOURCE_SESSION, image_settings
from labfleet.compute.recipes import LABEL_BASE


def test_the_sessions_variables_and_labels_are_emptied_and_the_bases_kept():
    base = {
        "Env": ["PATH=/opt/venv/bin:/usr/bin", "LANG=C.UTF-8"],
        "Cmd": ["jupyterhub-singleuser"],
        "User": "1000:1000",
        "Labels": {"ai.labfleet.min.cpu": "1"},
    }
    container = {
        "Env": [
            "PATH=/home/jovyan/bin:/usr/bin",
            "JUPYTERHUB_API_TOKEN=secret",
            "LABFLEET_SERVICE_URL=http://x",
        ],
        "Cmd": ["sh", "-c", "echo secret"],
        "User": "0",
        "Labels": {"ai.labfleet.session-id": "s1", "ai.labfleet.min.cpu": "8"},
    }
    conf = image_settings(base, container, "s1", "labfleet/singleuser:test")
    assert conf["Env"] == [
        "PATH=/opt/venv/bin:/usr/bin",
        "LANG=C.UTF-8",
        "JUPYTERHUB_API_TOKEN=",
        "LABFLEET_SERVICE_URL=",
    ]
    assert conf["Cmd"] == ["jupyterhub-singleuser"] and conf["User"] == "1000:1000"
    assert conf["Labels"] == {
        "ai.labfleet.session-id": "",
        "ai.labfleet.min.cpu": "1",
        LABEL_BASE: "labfleet/singleuser:test",
        LABEL_SOURCE_SESSION: "s1",
    }
    assert "secret" not in repr(conf)
