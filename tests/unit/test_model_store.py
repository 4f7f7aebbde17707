"""The Model Store's cards: a README's title and summary as plain text, with fallbacks; decoding
capped READMEs; search; and a card read from a real folder store, where files that cannot be read
(not UTF-8, too large, a directory, a broken definition) say so instead of breaking the listing."""

from __future__ import annotations

import pytest

from labfleet.serving import store
from labfleet.serving.store import (
    Candidate,
    card,
    cards,
    decode_readme,
    matches,
    plain_text,
    title_and_summary,
)
from labfleet.storage.store import FolderStore


def test_first_h1_and_first_paragraph():
    readme = """# Sentiment *classifier*

A [DistilBERT](https://example.org) model that labels `text` as **positive** or
negative.

Second paragraph.
"""
    assert title_and_summary(readme, "folder") == (
        "Sentiment classifier",
        "A DistilBERT model that labels text as positive or negative.",
    )


@pytest.mark.parametrize(
    "readme, expected",
    [
        (None, ("folder", "")),
        ("", ("folder", "")),
        ("just a line", ("folder", "just a line")),
        ("## Only a subheading\n\nBody.", ("folder", "Body.")),
        # Setext headings: "===" is level 1, "---" under text is level 2 (not a rule, not the summary).
        ("My model\n========\n\nIt serves.", ("My model", "It serves.")),
        ("Usage\n-----\n\nRun it.", ("folder", "Run it.")),
        # A closing run of #s is not part of the title; "#hashtag" is not a heading.
        ("# Echo ##\n#hashtag text", ("Echo", "#hashtag text")),
    ],
)
def test_fallbacks_and_headings(readme, expected):
    assert title_and_summary(readme, "folder") == expected


def test_what_a_summary_skips():
    readme = """---
title: front matter
---
<!-- a comment
over lines -->
[![build](https://ci/badge.svg)](https://ci) ![cov](https://cov.svg)

<p align="center"><img src="logo.png"></p>

```python
print("code is not a summary")
```

    indented code neither

- nor a list
| nor | a table |
***
[ref]: https://example.org

# Title after all that

> The quoted pitch, in_snake_case and 2*3*4.
"""
    assert title_and_summary(readme, "f") == (
        "Title after all that",
        "The quoted pitch, in_snake_case and 2*3*4.",
    )


def test_an_unclosed_fence_hides_the_rest():
    assert title_and_summary("```\n# not a title\ntext", "f") == ("f", "")


def test_long_summaries_and_titles_are_capped_at_a_word():
    title, summary = title_and_summary("# " + "t" * 500 + "\n\n" + "word " * 200, "f")
    assert len(title) == store.MAX_TITLE and title.endswith("…")
    assert len(summary) <= store.MAX_SUMMARY and summary.endswith("word…")


def test_plain_text_leaves_no_markup_and_no_html():
    assert plain_text('See <a href="x">here</a> and <https://x.org> \\*not em\\*') == (
        "See here and https://x.org *not em*"
    )
    assert plain_text("__strong__ and _em_ and snake_case_name") == "strong and em and snake_case_name"


def test_decode_readme():
    assert decode_readme("héllo".encode(), truncated=False) == ("héllo", None)
    assert decode_readme(b"\xef\xbb\xbfbom", truncated=False) == ("bom", None)
    # A capped read may cut a character in two: the tail goes, it is not an error.
    assert decode_readme("abé".encode()[:-1], truncated=True) == ("ab", None)
    assert decode_readme("abé".encode()[:-1], truncated=False) == (None, "README.md is not UTF-8 text")
    assert decode_readme(b"\xff\xfe latin", truncated=True) == (None, "README.md is not UTF-8 text")


def test_matches_name_or_title_ignoring_case():
    c = {"name": "bert-small", "title": "Sentiment Classifier"}
    assert matches(c, None) and matches(c, "  ") and matches(c, "BERT") and matches(c, "sentiment cl")
    assert not matches(c, "gpt")


# ---------------------------------------------------------------- cards from a real folder store


def _candidate(tmp_path, name, files):
    fs = FolderStore(tmp_path / name)
    fs.create()
    for rel, content in files.items():
        path = fs.data_dir / rel
        if content is None:
            path.mkdir()
        else:
            path.write_bytes(content if isinstance(content, bytes) else content.encode())
    return Candidate(
        id=f"id-{name}",
        name=name,
        project="acme/ml",
        owner="project:acme/ml",
        host="local",
        permission="rw",
        can_deploy=True,
        store=fs,
    )


DEFINITION = "models:\n- name: echo\n  service:\n    start_command: [python3, s.py]\n    port: 8000\n"


def test_a_card_with_readme_and_definition(tmp_path):
    c = card(
        _candidate(
            tmp_path, "echo", {"README.md": "# Echo\n\nSays it back.", "model-definition.yaml": DEFINITION}
        )
    )
    assert c["title"] == "Echo" and c["summary"] == "Says it back." and c["readme"].startswith("# Echo")
    assert c["readme_truncated"] is False and c["readme_error"] is None
    assert (
        c["has_definition"] and c["model"] == {"name": "echo", "port": 8000} and c["definition_error"] is None
    )
    assert (c["id"], c["project"], c["can_deploy"]) == ("id-echo", "acme/ml", True)


def test_a_bare_folder_is_a_card_too(tmp_path):
    c = card(_candidate(tmp_path, "bare", {}))
    assert (c["title"], c["summary"], c["readme"], c["readme_error"]) == ("bare", "", None, None)
    assert (c["has_definition"], c["model"], c["definition_error"]) == (False, None, None)


def test_unreadable_files_say_so_on_the_card(tmp_path):
    big = "# Big\n\nFirst.\n\n" + "é" * store.MAX_README_BYTES
    found = [
        _candidate(tmp_path, "latin", {"README.md": b"# Caf\xe9\n", "model-definition.yaml": "models: [\n"}),
        _candidate(tmp_path, "big", {"README.md": big, "model-definition.yml": "models: []"}),
        _candidate(tmp_path, "dirs", {"README.md": None, "model-definition.yaml": None}),
        _candidate(tmp_path, "huge", {"model-definition.yaml": "#" * (300 * 1024)}),
    ]
    by = {c["name"]: c for c in cards(found)}
    latin = by["latin"]
    assert latin["readme"] is None and latin["readme_error"] == "README.md is not UTF-8 text"
    assert latin["title"] == "latin" and latin["model"] is None
    assert latin["definition_error"].startswith("model-definition.yaml: not valid YAML")
    assert by["big"]["readme_truncated"] and len(by["big"]["readme"].encode()) <= store.MAX_README_BYTES
    assert by["big"]["title"] == "Big" and by["big"]["summary"] == "First."
    assert "needs a list `models`" in by["big"]["definition_error"]
    assert by["dirs"]["readme_error"] == "README.md: is a directory"
    assert by["dirs"]["has_definition"] and "is a directory" in by["dirs"]["definition_error"]
    assert by["huge"]["definition_error"] == "model-definition.yaml is larger than 262144 bytes"


def test_cards_are_sorted_by_title_and_searched(tmp_path):
    found = [
        _candidate(tmp_path, "zeta", {"README.md": "# Alpha model"}),
        _candidate(tmp_path, "beta", {}),
    ]
    assert [c["name"] for c in cards(found)] == ["zeta", "beta"]
    assert [c["name"] for c in cards(found, search="ALPHA")] == ["zeta"]
    assert [c["name"] for c in cards(found, search="bet")] == ["beta"]
    assert cards(found, search="nothing") == []
