"""Recipes for users' own environment images (labfleet.compute.recipes): checks, hashes, the Dockerfile."""

from __future__ import annotations

import re

import pytest

from labfleet.compute.recipes import (
    LABEL_BASE,
    LABEL_RECIPE_HASH,
    LAYERS,
    Recipe,
    apt_packages,
    context_files,
    dockerfile,
    layer_keys,
    parse_recipe,
    pip_packages_recipe,
    recipe_hash,
)
from labfleet.core.errors import InvalidInput

BASE = "quay.io/jupyter/scipy-notebook:2024-10-01"
FILES = {
    "apt.txt": "# tools\ncurl\nlibgl1=1.7.0-1  # for opencv\n",
    "requirements.txt": 'numpy>=2\npandas[performance]==2.2.3 ; python_version >= "3.10"\n',
    "postBuild": "#!/bin/bash\nset -e\njupyter labextension list\n",
}


def refused(base=BASE, files=None, **kwargs) -> str:
    with pytest.raises(InvalidInput) as e:
        parse_recipe(base, files if files is not None else {}, **kwargs)
    return e.value.message


# --- parse_recipe: what is taken --------------------------------------------------------------------


def test_a_recipe_with_every_file_is_taken_in_layer_order():
    recipe = parse_recipe(BASE, {**FILES, "environment.yml": "dependencies:\n  - python=3.11\n"}, conda=True)
    assert recipe.base == BASE
    assert list(recipe.files) == ["apt.txt", "environment.yml", "requirements.txt", "postBuild"]


def test_an_empty_recipe_is_just_the_base():
    recipe = parse_recipe(BASE, {})
    assert recipe.files == {}
    text = dockerfile(recipe)
    assert "RUN" not in text and "COPY" not in text
    assert text.splitlines()[1] == f"FROM {BASE}"


def test_line_ends_are_normalised_and_blank_files_are_absent():
    crlf = parse_recipe(BASE, {"requirements.txt": "numpy\r\npandas\r\n", "apt.txt": "  \n\n"})
    lf = parse_recipe(BASE, {"requirements.txt": "numpy\npandas\n"})
    assert crlf == lf
    assert recipe_hash(crlf) == recipe_hash(lf)


@pytest.mark.parametrize(
    "base",
    [
        "ubuntu",
        "python:3.11-slim",
        "library/ubuntu:24.04",
        "localhost:5000/team/img:v1",
        "registry.example.com/a/b/c:latest",
        "ubuntu@sha256:" + "a" * 64,
    ],
)
def test_image_references_that_are_taken(base):
    assert parse_recipe(base, {}).base == base


# --- parse_recipe: refusals, each with its message -----------------------------------------------------


@pytest.mark.parametrize(
    "base",
    [
        "",
        "Ubuntu",
        "MyOrg/img",
        "ubuntu:latest\nRUN id",
        "ubuntu latest",
        "$BASE",
        "a/../b",
        "img:" + "t" * 129,
        None,
    ],
)
def test_a_base_that_is_no_image_reference_is_refused(base):
    assert "is not an image reference" in refused(base)


def test_an_unknown_file_is_refused():
    message = refused(files={"Dockerfile": "FROM scratch"})
    assert "'Dockerfile' is not a recipe file" in message
    assert "apt.txt, environment.yml, requirements.txt, postBuild" in message


def test_files_that_are_not_a_mapping_are_refused():
    assert "mapping of file name to text" in refused(files=["apt.txt"])  # type: ignore[arg-type]


def test_a_file_that_is_not_text_is_refused():
    assert refused(files={"postBuild": b"echo hi"}) == "postBuild must be text"


def test_a_nul_is_refused_with_its_line():
    assert refused(files={"postBuild": "echo a\necho \x00b\n"}) == (
        "postBuild line 2: a NUL character; a recipe file is text"
    )


def test_text_that_cannot_be_utf8_is_refused():
    assert refused(files={"requirements.txt": "numpy\ud800"}) == "requirements.txt is not valid UTF-8 text"


def test_a_recipe_over_the_size_limit_is_refused_naming_its_files():
    message = refused(files={"postBuild": "x" * 900, "requirements.txt": "numpy\n"}, max_bytes=800)
    assert message.startswith("the recipe is 906 bytes, over the limit of 800 bytes")
    assert "postBuild 900 bytes" in message and "requirements.txt 6 bytes" in message


def test_the_default_size_limit_is_256_kib():
    parse_recipe(BASE, {"postBuild": "#" * (256 * 1024)})
    assert "over the limit of 262144 bytes" in refused(files={"postBuild": "#" * (256 * 1024 + 1)})


def test_environment_yml_needs_conda():
    assert refused(files={"environment.yml": "dependencies: [numpy]\n"}) == (
        f"environment.yml needs a base image with conda or mamba; {BASE} has neither"
    )
    parse_recipe(BASE, {"environment.yml": "dependencies: [numpy]\n"}, conda=True)


@pytest.mark.parametrize(
    "text, expected",
    [
        ("dependencies: [\n", "environment.yml line 2: not valid YAML"),
        ("- numpy\n", "environment.yml: not a conda environment"),
        (
            "dependencies:\n  - pip:\n      - --index-url http://evil/simple\n",
            "pip item 1: --index-url changes",
        ),
        (
            "dependencies:\n  - pip: [numpy, 'git+https://x/y.git']\n",
            "pip item 2: 'git+https://x/y.git' installs from a version-control URL",
        ),
        (
            'dependencies:\n  - pip:\n      - "numpy\\n--extra-index-url http://x"\n',
            "pip item 1 must be one line",
        ),
    ],
)
def test_environment_yml_pip_section_follows_requirements_rules(text, expected):
    assert expected in refused(files={"environment.yml": text}, conda=True)


@pytest.mark.parametrize(
    "line",
    [
        "curl wget",
        "Curl",
        "-o APT::Get::AllowUnauthenticated=true",
        "curl;id",
        "c",
        "curl=$(id)",
        "vim:amd64",
        "../x",
    ],
)
def test_an_apt_line_that_is_not_a_package_name_is_refused(line):
    message = refused(files={"apt.txt": f"# ok\ncurl\n{line}\n"})
    assert message.startswith(f"apt.txt line 3: {line!r} is not a Debian package name")


def test_apt_packages_in_order_once_without_comments():
    assert apt_packages("curl\n\n# c\nvim=2:9.0  # pinned\ncurl\n") == ["curl", "vim=2:9.0"]


@pytest.mark.parametrize(
    "line, expected",
    [
        ("-i https://evil/simple", "-i changes where pip fetches packages from"),
        ("--index-url https://evil/simple", "--index-url changes where pip fetches"),
        ("--index-url=https://evil/simple", "--index-url changes where pip fetches"),
        ("--extra-index-url https://evil/simple", "--extra-index-url changes where pip fetches"),
        ("--trusted-host evil", "--trusted-host changes where pip fetches"),
        ("-f https://evil/links", "-f changes where pip fetches"),
        ("--find-links /wheels", "--find-links changes where pip fetches"),
        ("--no-index", "--no-index changes where pip fetches"),
        ("--extra-index https://evil/simple", "option --extra-index is not allowed in a recipe"),
        (
            "-e git+https://github.com/x/y.git#egg=y",
            "-e installs from a local folder or a version-control URL",
        ),
        ("--editable .", "--editable installs from a local folder"),
        ("-r other.txt", "-r includes another file; a recipe has no other files"),
        ("--requirement=other.txt", "--requirement includes another file"),
        ("-c constraints.txt", "-c includes another file"),
        ("git+https://github.com/x/y.git", "installs from a version-control URL"),
        ("y @ git+https://github.com/x/y.git", "installs from a version-control URL"),
        ("y @ file:///tmp/y.whl", "installs from a local file"),
        ("file:///tmp/y.whl", "installs from a local file"),
        ("y @ https://example.com/y-1.0.whl", "installs from a URL; packages come from the package index"),
        ("./pkg", "is a local path"),
        ("/abs/pkg", "is a local path"),
        ("y-1.0-py3-none-any.whl", "names an archive file"),
        ("y.tar.gz", "names an archive file"),
        ("numpy --index-url https://evil/simple", "--index-url changes where pip fetches"),
        ("numpy --config-settings x=1", "--config-settings may not follow a requirement"),
        ("numpy --hash=md5:abc", "--hash needs a value like sha256"),
        ("--use-feature truststore", "option --use-feature is not allowed"),
        ("--only-binary $(id)", "--only-binary takes :all:, :none: or package names"),
        ("numpy=2", "'numpy=2' is not a requirement"),
        ("numpy; python_version > '3' +AAo-", "are not environment markers"),
        ("numpy;", "are not environment markers"),
    ],
)
def test_a_requirements_line_that_is_refused_is_named(line, expected):
    message = refused(files={"requirements.txt": f"# deps\nscipy\n{line}\n"})
    assert message.startswith("requirements.txt line 3: "), message
    assert expected in message


def test_an_encoding_declaration_is_refused():
    # pip would decode the file in it (utf-7 turns "+AAo-" into a new line, past the checks).
    message = refused(files={"requirements.txt": "# -*- coding: utf-7 -*-\nnumpy\n"})
    assert message == "requirements.txt line 1: an encoding declaration; a recipe's files are UTF-8"


def test_an_encoding_declaration_is_found_where_pip_looks():
    # pip splits at LF only to find it; \x85 is no line break there.
    message = refused(files={"requirements.txt": "numpy\x85scipy\n# coding=utf-7\n"})
    assert message == "requirements.txt line 2: an encoding declaration; a recipe's files are UTF-8"


def test_a_continued_line_is_checked_whole_and_named_by_its_first_line():
    message = refused(files={"requirements.txt": "numpy\nscipy \\\n  --index-url https://evil/simple\n"})
    assert message.startswith("requirements.txt line 2: --index-url")


def test_a_comment_line_never_hides_the_next_line():
    # pip does not continue a comment line that ends in a backslash; neither do the checks.
    message = refused(files={"requirements.txt": "# note \\\n--index-url https://evil/simple\n"})
    assert message.startswith("requirements.txt line 2: --index-url")


def test_a_line_break_that_pip_sees_is_a_line_break_here_too():
    message = refused(files={"requirements.txt": "# note\x85--index-url https://evil/simple\n"})
    assert message.startswith("requirements.txt line 2: --index-url")


def test_requirements_that_pip_takes_from_the_index_are_taken():
    text = (
        "numpy\n"
        "pandas>=2.1,<3  # a comment\n"
        "torch[cuda] == 2.5.1\n"
        "scikit-learn (>=1.5)\n"
        'tomli; python_version < "3.11"\n'
        "--pre\n"
        "--prefer-binary\n"
        "--only-binary :all:\n"
        "--no-binary=pyyaml,lxml\n"
        "requests==2.32.3 --hash=sha256:" + "a" * 64 + " \\\n"
        "    --hash sha256:" + "b" * 64 + "\n"
    )
    parse_recipe(BASE, {"requirements.txt": text})


# --- hashes and layer keys -------------------------------------------------------------------------


def test_the_hash_is_stable_and_order_independent():
    a = parse_recipe(BASE, FILES)
    b = parse_recipe(BASE, dict(reversed(list(FILES.items()))))
    assert recipe_hash(a) == recipe_hash(b) == recipe_hash(parse_recipe(BASE, dict(FILES)))
    assert re.fullmatch(r"[0-9a-f]{64}", recipe_hash(a))
    assert layer_keys(a) == layer_keys(b)


def test_the_hash_changes_with_the_base_and_any_file():
    a = parse_recipe(BASE, FILES)
    assert recipe_hash(parse_recipe("ubuntu:24.04", FILES)) != recipe_hash(a)
    for name in FILES:
        changed = {**FILES, name: FILES[name] + "\n# changed\n"}
        assert recipe_hash(parse_recipe(BASE, changed)) != recipe_hash(a), name
    assert recipe_hash(
        parse_recipe(BASE, {k: v for k, v in FILES.items() if k != "postBuild"})
    ) != recipe_hash(a)


def test_there_is_one_layer_key_per_layer():
    keys = layer_keys(parse_recipe(BASE, FILES))
    assert [name for name, _ in LAYERS] == ["apt", "conda", "pip", "postBuild"]
    assert len(keys) == len(LAYERS) == len(set(keys))


def _changed_layers(before: dict[str, str], after: dict[str, str], base: str = BASE) -> list[str]:
    old = layer_keys(parse_recipe(BASE, before))
    new = layer_keys(parse_recipe(base, after))
    return [name for (name, _), o, n in zip(LAYERS, old, new, strict=True) if o != n]


def test_a_change_in_requirements_keeps_the_apt_layer():
    changed = {**FILES, "requirements.txt": "numpy>=2\nscipy\n"}
    assert _changed_layers(FILES, changed) == ["pip", "postBuild"]


def test_a_change_in_apt_changes_every_layer():
    assert _changed_layers(FILES, {**FILES, "apt.txt": "curl\n"}) == ["apt", "conda", "pip", "postBuild"]


def test_a_change_in_postbuild_changes_only_its_layer():
    assert _changed_layers(FILES, {**FILES, "postBuild": "#!/bin/sh\ntrue\n"}) == ["postBuild"]


def test_a_new_base_changes_every_layer():
    assert _changed_layers(FILES, FILES, base="ubuntu:24.04") == ["apt", "conda", "pip", "postBuild"]


# --- the Dockerfile --------------------------------------------------------------------------------


def instructions(text: str) -> list[str]:
    """The Dockerfile's instructions, continuation lines joined, runs of spaces made one, comments left out."""
    joined = text.replace("\\\n", " ")
    return [" ".join(line.split()) for line in joined.splitlines() if line and not line.startswith("#")]


def test_apt_runs_as_root_then_the_user_again_for_pip_and_postbuild():
    ins = instructions(dockerfile(parse_recipe(BASE, FILES)))
    kinds = [i.split()[0] + ("" if not i.startswith("USER") else " " + i.split()[1]) for i in ins]
    assert kinds == [
        "FROM",
        "USER root",
        "RUN",  # apt
        "USER 1000:1000",
        "COPY",
        "RUN",  # pip
        "COPY",
        "RUN",  # postBuild
        "LABEL",
    ]
    apt = ins[2]
    assert apt.startswith(
        "RUN apt-get update && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends"
    )
    assert "curl" in apt and "libgl1=1.7.0-1" in apt and apt.endswith("&& rm -rf /var/lib/apt/lists/*")
    users = [i for i in ins if i.startswith("USER")]
    assert users[-1] == "USER 1000:1000"
    assert users.count("USER root") == 1


def test_each_file_is_copied_right_before_its_layer_and_owned_by_the_user():
    ins = instructions(dockerfile(parse_recipe(BASE, FILES), user="1000:100"))
    pip_copy = ins.index("COPY --chown=1000:100 requirements.txt /tmp/labfleet-recipe/requirements.txt")
    assert ins[pip_copy + 1] == "RUN pip install --no-cache-dir -r /tmp/labfleet-recipe/requirements.txt"
    post_copy = ins.index("COPY --chown=1000:100 postBuild /tmp/labfleet-recipe/postBuild")
    assert ins[post_copy + 1] == (
        "RUN chmod +x /tmp/labfleet-recipe/postBuild && cd /tmp/labfleet-recipe && ./postBuild"
    )
    apt_run = next(i for i, line in enumerate(ins) if "apt-get" in line)
    assert apt_run < pip_copy < post_copy
    assert ins[-1].startswith("LABEL")  # the labels last: a new hash keeps every layer cached
    assert all("apt.txt" not in line for line in ins)  # apt's packages are written in the RUN itself


def test_the_conda_layer_comes_between_apt_and_pip():
    recipe = parse_recipe(BASE, {**FILES, "environment.yml": "dependencies: [python=3.11]\n"}, conda=True)
    text = dockerfile(recipe)
    assert (
        text.index("apt-get")
        < text.index("COPY --chown=1000:1000 environment.yml")
        < text.index("env update -n base -f /tmp/labfleet-recipe/environment.yml")
        < text.index("COPY --chown=1000:1000 requirements.txt")
    )


def test_the_labels_name_the_recipe_and_its_base():
    recipe = parse_recipe(BASE, FILES)
    assert f'LABEL {LABEL_RECIPE_HASH}="{recipe_hash(recipe)}" {LABEL_BASE}="{BASE}"' in dockerfile(recipe)


def test_without_apt_the_user_is_set_before_anything_runs():
    ins = instructions(dockerfile(parse_recipe(BASE, {"requirements.txt": "numpy\n"})))
    assert ins[:2] == [f"FROM {BASE}", "USER 1000:1000"]
    assert "USER root" not in ins


def test_a_file_with_nothing_to_install_makes_no_layer():
    recipe = parse_recipe(BASE, {"apt.txt": "# nothing yet\n", "requirements.txt": "--pre\n"})
    text = dockerfile(recipe)
    assert "apt-get" not in text and "pip install" not in text and "USER root" not in text
    assert set(context_files(recipe)) == {"Dockerfile"}


def test_the_index_url_only_when_given():
    recipe = parse_recipe(BASE, FILES)
    assert "PIP_INDEX_URL" not in dockerfile(recipe) and "PIP_TRUSTED_HOST" not in dockerfile(recipe)
    ins = instructions(dockerfile(recipe, index_url="https://pypi.internal/simple/"))
    arg = ins.index('ARG PIP_INDEX_URL="https://pypi.internal/simple/"')
    assert not any("PIP_TRUSTED_HOST" in line for line in ins)  # https: nothing to trust
    apt_run = next(i for i, line in enumerate(ins) if "apt-get" in line)
    assert (
        apt_run < arg < ins.index("RUN pip install --no-cache-dir -r /tmp/labfleet-recipe/requirements.txt")
    )


def test_an_http_index_is_a_trusted_host():
    text = dockerfile(parse_recipe(BASE, FILES), index_url="http://devpi.lan:3141/root/pypi/+simple/")
    assert 'ARG PIP_INDEX_URL="http://devpi.lan:3141/root/pypi/+simple/"' in text
    assert 'ARG PIP_TRUSTED_HOST="devpi.lan:3141"' in text


def test_the_apt_proxy_goes_to_apt_only():
    text = dockerfile(parse_recipe(BASE, FILES), apt_proxy="http://apt-cache:3142")
    assert "apt-get -o Acquire::http::Proxy=http://apt-cache:3142 update" in text
    assert "apt-get -o Acquire::http::Proxy=http://apt-cache:3142 install" in text


@pytest.mark.parametrize(
    "kwargs, expected",
    [
        ({"index_url": 'https://x/simple" && curl evil'}, "package index"),
        ({"index_url": "https://x/$(id)"}, "package index"),
        ({"index_url": "ftp://x/simple"}, "package index"),
        ({"apt_proxy": "http://x:3142 ; id"}, "apt proxy"),
        ({"user": "root"}, "may not be root"),
        ({"user": "0:0"}, "may not be root"),
        ({"user": "1000 && id"}, "is not uid[:gid]"),
    ],
)
def test_build_settings_are_checked(kwargs, expected):
    with pytest.raises(InvalidInput) as e:
        dockerfile(parse_recipe(BASE, FILES), **kwargs)
    assert expected in e.value.message


def test_a_hand_made_recipe_is_checked_before_it_reaches_the_dockerfile():
    with pytest.raises(InvalidInput, match="is not an image reference"):
        dockerfile(Recipe(base="ubuntu\nRUN id", files={}))
    with pytest.raises(InvalidInput, match="apt.txt line 1"):
        dockerfile(Recipe(base=BASE, files={"apt.txt": "curl; id"}))


def test_the_context_holds_the_dockerfile_and_the_files_it_copies():
    recipe = parse_recipe(BASE, FILES)
    ctx = context_files(recipe, index_url="https://pypi.internal/simple/")
    assert set(ctx) == {"Dockerfile", "requirements.txt", "postBuild"}
    assert ctx["Dockerfile"] == dockerfile(recipe, index_url="https://pypi.internal/simple/").encode()
    assert ctx["requirements.txt"] == FILES["requirements.txt"].encode()
    assert all(isinstance(v, bytes) for v in ctx.values())


# --- "Save as environment" ----------------------------------------------------------------------------


def test_a_saved_environment_keeps_only_safe_lines_sorted():
    freeze = (
        "numpy==2.1.3\n"
        "-e git+https://github.com/me/mine.git@abc#egg=mine\n"
        "# Editable install with no version control (local==0.1)\n"
        "-e /home/jovyan/local\n"
        "conda-pkg @ file:///home/conda/feedstock_root/build_artifacts/x.whl\n"
        "vcs-pkg @ git+https://github.com/x/y.git@abc\n"
        "url-pkg @ https://example.com/url_pkg-1.0.whl\n"
        "--index-url https://evil/simple\n"
        "Jinja2==3.1.4\n"
        "numpy==2.1.3\n"
        "garbage line with spaces\n"
    )
    apt = "vim\nlibc6:amd64\ncurl\nrm -rf /\ncurl\n"
    assert pip_packages_recipe(freeze, apt) == {
        "apt.txt": "curl\nvim\n",
        "requirements.txt": "Jinja2==3.1.4\nnumpy==2.1.3\n",
    }


def test_a_saved_environment_is_a_recipe():
    saved = pip_packages_recipe("numpy==2.1.3\nscipy==1.14.1\n", "curl\n")
    recipe = parse_recipe(BASE, saved)
    assert apt_packages(recipe.files["apt.txt"]) == ["curl"]


def test_nothing_left_means_no_file():
    assert pip_packages_recipe("-e .\n", "") == {}
