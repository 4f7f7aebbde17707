"""What an import may fetch and what an archive may write (labfleet.storage.importsafety): schemes,
credentials in URLs, hosts that resolve to non-public addresses (every address, IPv4-mapped IPv6
too) unless a superadmin allows them, and archive members that would leave the folder."""

from __future__ import annotations

import pytest

from labfleet.core.errors import Forbidden, InvalidInput
from labfleet.storage.importsafety import (
    Member,
    check_members,
    check_url,
    parse_allowed,
    suggested_name,
)

PUBLIC = "140.82.112.3"


def resolver(table):
    def resolve(host):
        return table.get(host, [])

    return resolve


DNS = resolver(
    {
        "github.com": [PUBLIC],
        "git.lab.internal": ["10.1.2.3"],
        "sneaky.example": [PUBLIC, "127.0.0.1"],  # one public address is not enough
        "mapped.example": ["::ffff:192.168.1.5"],
    }
)


def test_a_public_repository_notebook_or_archive_is_taken_with_its_kind_and_a_folder_name():
    repo = check_url("https://github.com/jupyter/notebook.git", resolver=DNS)
    assert (repo.kind, repo.host, repo.name, repo.addresses) == (
        "repository",
        "github.com",
        "notebook",
        (PUBLIC,),
    )
    assert check_url("https://github.com/a/b/raw/main/Intro%20Demo.ipynb", resolver=DNS).kind == "notebook"
    archive = check_url("http://github.com/a/data.TAR.GZ", resolver=DNS)
    assert (archive.kind, archive.name) == ("archive", "data")
    assert check_url("git://github.com/a/b", resolver=DNS).kind == "repository"
    assert suggested_name("/") == "import" and suggested_name("/x/we ird!.zip") == "we-ird"


@pytest.mark.parametrize(
    "url, words",
    [
        ("file:///etc/passwd", "file scheme"),
        ("ftp://github.com/x", "ftp scheme"),
        ("github.com/a/b", "no scheme"),
        ("https://alice:ghp_secret@github.com/a/b", "store a credential"),
        ("https://ghp_secret@github.com/a/b", "store a credential"),
        ("https:///a/b", "no host"),
        ("https://github.com:http/a", "port that is not a number"),
        ("https://github.com/a b", "spaces"),
        ("", "give the address"),
        (42, "give the address"),
        ("https://nowhere.example/x", "cannot resolve"),
    ],
)
def test_what_an_import_does_not_take_is_refused_with_why(url, words):
    with pytest.raises(InvalidInput) as e:
        check_url(url, resolver=DNS)
    assert words in e.value.message and "ghp_secret" not in e.value.message


@pytest.mark.parametrize(
    "url",
    [
        "http://127.0.0.1:8080/repo.git",
        "http://[::1]/x.ipynb",
        "http://169.254.169.254/latest/meta-data",  # link-local: a cloud's metadata service
        "https://git.lab.internal/team/repo.git",
        "https://sneaky.example/x.zip",
        "https://mapped.example/x.zip",
        "http://0.0.0.0/x",
        "http://224.0.0.1/x",
    ],
)
def test_a_host_that_is_not_public_is_refused_unless_allowed(url):
    with pytest.raises(Forbidden) as e:
        check_url(url, resolver=DNS)
    assert "not a public address" in e.value.message and "LABFLEET_IMPORT_ALLOWED_HOSTS" in e.value.message


def test_a_superadmin_allows_hosts_by_name_or_network():
    allowed = parse_allowed(" git.lab.internal , 127.0.0.0/8,")
    assert check_url("https://git.lab.internal/team/repo.git", allowed, DNS).addresses == ("10.1.2.3",)
    assert check_url("http://127.0.0.1:9/repo.git", allowed, DNS).host == "127.0.0.1"
    with pytest.raises(Forbidden):  # its public address is fine, its loopback one is not listed
        check_url("https://sneaky.example/x.zip", parse_allowed("10.0.0.0/8"), DNS)
    for bad in ("10.0.0.0/99", "a b", "x;y"):
        with pytest.raises(InvalidInput, match="LABFLEET_IMPORT_ALLOWED_HOSTS"):
            parse_allowed(bad)


def test_archive_members_stay_in_the_folder_and_are_files_or_folders():
    assert check_members(
        [Member("./"), Member("data/", "dir"), Member("./data/a.csv"), Member("b\\c.txt")]
    ) == [
        "data",
        "data/a.csv",
        "b/c.txt",
    ]
    for member, words in [
        (Member("../evil.sh"), "outside the folder"),
        (Member("data/../../evil.sh"), "outside the folder"),
        (Member("/etc/cron.d/x"), "absolute path"),
        (Member("C:/x"), "absolute path"),
        (Member("link", "symlink"), "is a symlink"),
        (Member("hard", "hardlink"), "is a hardlink"),
        (Member("dev", "device"), "is a device"),
        (Member("a\x00b"), "NUL"),
    ]:
        with pytest.raises(InvalidInput) as e:
            check_members([Member("ok.txt"), member])
        assert words in e.value.message, member


# ---------------------------------------------------------------- a domain's own hosts


def test_a_domains_allow_and_deny_lists():
    from labfleet.core.validate import check_host_rules
    from labfleet.storage.importsafety import check_domain_hosts, host_matches

    assert host_matches("gitlab.example.org", "*.example.org")
    assert not host_matches("example.org", "*.example.org")  # the subdomains, not the domain itself
    assert not host_matches("evil-example.org", "*.example.org")
    assert host_matches("github.com", "github.com") and not host_matches("github.com.evil", "github.com")
    rules = check_host_rules({"allow": ["GitHub.com", "*.example.org", "github.com"], "deny": []})
    assert rules == {"allow": ["github.com", "*.example.org"]}
    check_domain_hosts("github.com", rules, "acme")
    check_domain_hosts("git.example.org", rules, "acme")
    with pytest.raises(Forbidden, match="imports only from github.com"):
        check_domain_hosts("gitlab.com", rules, "acme")
    with pytest.raises(Forbidden, match="does not import from gitlab.com"):
        check_domain_hosts("gitlab.com", {"deny": ["gitlab.com"]}, "acme")
    check_domain_hosts("anything.org", {}, "acme")  # no rules: the service's own checks alone
    for bad in (
        [],
        {"allow": "x"},
        {"allow": ["a b"]},
        {"allow": ["http://x"]},
        {"other": []},
        {"deny": ["*"]},
    ):
        with pytest.raises(InvalidInput):
            check_host_rules(bad)
