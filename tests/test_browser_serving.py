"""The Fleet sidebar's Serving section in a real browser against the real Hub.

alice has a model folder holding the tiny stdlib model of tests/test_serving_hub.py. In JupyterLab she
opens Fleet → Serving, deploys the folder as endpoint ``echo`` from the section's form (a quarter of a
mock GPU per replica), sees it become READY with its route healthy, makes a token (shown once, in a
curl line) and calls the endpoint's URL with it, scales it to 2 and deletes it.

Then a second endpoint ``chat`` serves tests/openai_server.py (OpenAI's chat API): she opens its Chat
panel from the section's Chat button and sees the reply stream in word by word; lists its tokens in the
section, revokes one (its calls then get 401) and the panel's own (the panel makes a new one and goes
on).

Last, the Model Store (opened from the section's button) shows the project's two model folders as
cards: one with a README (rendered untrusted: its script never runs) and a model, one whose broken
definition greys Deploy out with the reason. Deploy from a card: a GPU share over the project's quota
is refused inside the dialog, a quarter then makes an endpoint of that folder that becomes READY.
Screenshots go to test-artifacts/browser/ (sidebar-serving-*.png, chat-*.png, model-store-*.png).
"""

from __future__ import annotations

import os
import re
import time
from pathlib import Path

import pytest
import requests

from tests.browserfixture import hub_login
from tests.hubfixture import start_hub
from tests.test_serving_hub import BAD, DEFINITION, SERVER, _folder, _project_folder, _wait

pytestmark = pytest.mark.hub

REPO = Path(__file__).resolve().parents[1]
ARTIFACTS = Path(os.environ.get("LABFLEET_TEST_ARTIFACTS", REPO / "test-artifacts")) / "browser"
PASSWORD = "alice-password-1"
WAIT_MS = 60_000
OPENAI_SERVER = REPO / "tests" / "openai_server.py"
CHAT_DEFINITION = """
models:
  - name: echo-chat
    model_path: /models
    service:
      start_command: [python3, openai_server.py]
      port: 8000
      health_check:
        path: /v1/models
        interval: 1.0
        max_retries: 2
        max_wait_time: 2.0
        initial_delay: 0.5
"""
# The Model Store's endpoint: the name its dialog suggests for folder sentiment-echo.
STORE_ENDPOINT = "sentiment-echo"


@pytest.fixture(scope="module")
def hub(tmp_path_factory):
    state = tmp_path_factory.mktemp("browser-serving")
    hub = start_hub(state, env={"LABFLEET_SERVING_INTERVAL": "1"})
    root = hub.wait_token("root")
    for path, body in [
        ("/domains", {"name": "acme", "total_resource_slots": {"gpu.shares": 4}}),
        ("/projects", {"domain": "acme", "name": "ml", "total_resource_slots": {"gpu.shares": 2}}),
        ("/users", {"username": "alice", "domain": "acme", "projects": ["ml"], "password": PASSWORD}),
    ]:
        r = hub.api("POST", path, root, json=body)
        assert r.status_code == 201, r.text
    alice = hub.wait_token("alice")
    _folder(hub, alice, "echo-model", {"model-definition.yaml": DEFINITION, "server.py": SERVER})
    hub.alice_token = alice
    yield hub
    for name in ("echo", "chat", STORE_ENDPOINT):
        hub.api("DELETE", f"/endpoints/{name}", alice)
    time.sleep(2)
    hub.hub_api("DELETE", "/users/alice/servers/work")
    hub.stop()


def tid(name: str) -> str:
    return f'[data-testid="{name}"]'


def shot(locator, name: str) -> None:
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    locator.screenshot(path=str(ARTIFACTS / f"{name}.png"))


def refresh_until(page, check, what: str, timeout: float = 120.0) -> None:
    """Press the panel's refresh button until ``check()`` holds."""
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, f"{what}: not within {timeout}s"
        page.locator(tid("lf-refresh")).click()
        time.sleep(1)


def open_serving(hub, browser):
    """alice's Lab (her session ``work`` started from the spawn form unless it runs) with the Fleet
    panel showing only its Serving section; the page."""
    page = hub_login(browser, hub, "alice", PASSWORD, width=1400, own_context=True)
    work = hub.hub_api("GET", "/users/alice").json()["servers"].get("work") or {}
    if not work.get("ready"):
        page.goto(f"{hub.url}/hub/spawn/alice/work")
        page.select_option("#lf-project", "acme/ml")
        page.click('form#spawn_form input[type="submit"], form#spawn_form button[type="submit"]')
        page.wait_for_url("**/user/alice/work/**", timeout=WAIT_MS)
    page.goto(f"{hub.url}/user/alice/work/lab")
    page.wait_for_selector("#jp-main-dock-panel", state="attached", timeout=WAIT_MS)
    tab = page.locator('li[data-id="labfleet-sidebar"]')
    tab.wait_for(state="attached", timeout=WAIT_MS)
    if "lm-mod-current" not in (tab.get_attribute("class") or ""):
        tab.click()
    # Only Serving open: the panel is short enough to see it whole.
    for section in ("session", "quota", "usage", "sessions", "folders", "apps"):
        toggle = page.locator(tid(f"lf-section-toggle-{section}"))
        if toggle.get_attribute("aria-expanded") == "true":
            toggle.click()
    return page


def test_deploy_call_scale_and_delete_from_the_sidebar(hub, browser):
    from playwright.sync_api import expect

    expect.set_options(timeout=WAIT_MS)
    page = open_serving(hub, browser)
    sidebar = page.locator("#labfleet-sidebar")
    serving = page.locator(tid("lf-section-serving"))
    expect(serving.locator(tid("lf-endpoints-empty"))).to_be_visible()

    # Deploy from the form: the model folder is offered, the rest typed.
    page.locator(tid("lf-deploy-toggle")).click()
    expect(page.locator(f"{tid('lf-deploy-folder')} option")).to_have_text(["echo-model"])
    page.fill(tid("lf-deploy-name"), "echo")
    page.fill(tid("lf-deploy-cpu"), "0.25")
    page.fill(tid("lf-deploy-mem"), "256m")
    page.fill(tid("lf-deploy-gpu"), "0.25")
    shot(sidebar, "sidebar-serving-deploy-form")
    page.locator(tid("lf-deploy-submit")).click()
    expect(page.locator(tid("lf-endpoint-deployed"))).to_contain_text("Endpoint echo is deploying")
    item = page.locator(tid("lf-endpoint-echo"))
    refresh_until(page, lambda: item.get_attribute("data-status") == "READY", "echo READY")
    expect(item.locator(tid("lf-endpoint-meta"))).to_contain_text("1 of 1 healthy · acme/ml · echo-model")
    route = item.locator(".lf-route")
    expect(route).to_have_count(1)
    expect(route).to_have_attribute("data-health", "HEALTHY")

    # A token, shown once in a curl line that works.
    item.locator(tid("lf-endpoint-new-token")).click()
    line = item.locator(tid("lf-endpoint-curl")).inner_text()
    m = re.fullmatch(r'curl -H "Authorization: Bearer (lfsrv_\S+)" (\S+)', line.strip())
    assert m, line
    token, url = m.groups()
    assert url == f"{hub.url}/services/labfleet/serve/echo/"
    answer = requests.get(f"{url}whoami", headers={"Authorization": f"Bearer {token}"}, timeout=30)
    server = route.get_attribute("data-testid").removeprefix("lf-route-")
    assert answer.status_code == 200 and answer.json()["replica"] == server, answer.text
    shot(sidebar, "sidebar-serving-ready-token")
    item.locator(tid("lf-endpoint-token-close")).click()
    expect(item.locator(tid("lf-endpoint-token"))).to_have_count(0)

    # Scale to 2: the second replica shows once it is healthy.
    item.locator(tid("lf-endpoint-replicas")).fill("2")
    item.locator(tid("lf-endpoint-scale")).click()
    expect(item.locator(tid("lf-endpoint-note"))).to_have_text("Scaled to 2 replicas.")
    refresh_until(page, lambda: item.get_attribute("data-healthy") == "2", "2 healthy replicas")
    expect(item.locator('.lf-route[data-health="HEALTHY"]')).to_have_count(2)
    shot(sidebar, "sidebar-serving-scaled")

    # Delete, after a second click: the URL answers nothing once it is gone.
    item.locator(tid("lf-endpoint-delete")).click()
    expect(item.locator(tid("lf-endpoint-delete"))).to_have_text("Really delete?")
    item.locator(tid("lf-endpoint-delete")).click()
    refresh_until(page, lambda: page.locator(tid("lf-endpoints-empty")).count() == 1, "echo gone")
    gone = requests.get(f"{url}whoami", headers={"Authorization": f"Bearer {token}"}, timeout=30)
    assert gone.status_code in (404, 503), gone.status_code
    page.context.close()


# Installed in the page: every change of the Chat panel's conversation records the last reply's text,
# so the test sees whether it grew piece by piece or came at once.
WATCH_REPLY = """() => {
  window.__lfReplies = [];
  const conv = document.querySelector('[data-testid="lf-chat-conversation"]');
  new MutationObserver(() => {
    const texts = conv.querySelectorAll('[data-role="assistant"] [data-testid="lf-chat-text"]');
    if (texts.length) window.__lfReplies.push(texts[texts.length - 1].textContent);
  }).observe(conv, { subtree: true, childList: true, characterData: true });
}"""


def _chat_call(hub, token, text="hi"):
    return requests.post(
        f"{hub.url}/services/labfleet/serve/chat/v1/chat/completions",
        headers={"Authorization": f"Bearer {token}"},
        json={"messages": [{"role": "user", "content": text}]},
        timeout=30,
    )


def _tokens(hub):
    r = hub.api("GET", "/endpoints/chat/tokens", hub.alice_token)
    assert r.status_code == 200, r.text
    return r.json()


def dismiss_news(page) -> None:
    """JupyterLab's own question about its news, when it shows, is answered: not in the way."""
    news = page.locator(".Toastify__toast", has_text="official Jupyter news")
    if news.count():
        news.get_by_role("button", name="No", exact=True).click()
        news.wait_for(state="detached")


def _ask(page, text: str) -> str:
    """Send ``text`` in the Chat panel; the reply once it is whole, after checking that it streamed."""
    from playwright.sync_api import expect

    panel = page.locator(tid("lf-chat"))
    before = panel.locator('[data-role="assistant"]').count()
    page.evaluate(WATCH_REPLY)
    dismiss_news(page)
    panel.locator(tid("lf-chat-box")).fill(text)
    expect(panel.locator(tid("lf-chat-send"))).to_be_enabled()
    panel.locator(tid("lf-chat-box")).press("Enter")  # Enter sends (Shift+Enter: a new line)
    reply = panel.locator('[data-role="assistant"]').nth(before)
    expect(reply).to_have_attribute("data-state", "done")
    final = reply.locator(tid("lf-chat-text")).inner_text()
    seen = [t.replace("\u258d", "") for t in page.evaluate("window.__lfReplies")]
    partial = {t for t in seen if t and t != final and final.startswith(t)}
    # One word per event, 0.15 s apart: several partial replies showed before the whole one.
    assert len(partial) >= 2, (seen, final)
    return final


def test_chat_panel_streams_and_tokens_revoke_from_the_sidebar(hub, browser):
    from playwright.sync_api import expect

    expect.set_options(timeout=WAIT_MS)
    alice = hub.alice_token
    _folder(
        hub,
        alice,
        "chat-model",
        {"model-definition.yaml": CHAT_DEFINITION, "openai_server.py": OPENAI_SERVER.read_text()},
    )
    r = hub.api(
        "POST",
        "/endpoints",
        alice,
        json={
            "name": "chat",
            "project": "acme/ml",
            "model_folder": "chat-model",
            "replicas": 1,
            "slots": {"cpu": 0.25, "mem": "256m"},
        },
    )
    assert r.status_code == 201, r.text
    page = open_serving(hub, browser)
    sidebar = page.locator("#labfleet-sidebar")
    item = page.locator(tid("lf-endpoint-chat"))
    refresh_until(page, lambda: item.get_attribute("data-status") == "READY", "chat READY")

    # The Chat button opens the panel in the main area: the endpoint's name and URL on top.
    item.locator(tid("lf-endpoint-open-chat")).click()
    tab = page.locator("#labfleet-chat-chat")
    expect(tab.locator(tid("lf-chat-endpoint"))).to_have_text("chat")
    expect(tab.locator(tid("lf-chat-url"))).to_contain_text(f"{hub.url}/services/labfleet/serve/chat/")
    question = "tell me how streaming works in the panel"
    assert _ask(page, question) == f"You said: {question}"
    expect(tab.locator(tid("lf-chat-url"))).to_contain_text("model echo-chat")
    # The panel's token (its own, made through the API) is nowhere in the page.
    assert "lfsrv_" not in page.content()
    dismiss_news(page)
    shot(page.locator("#main"), "chat-reply")
    made = [t for t in _tokens(hub) if t["note"] == "Chat panel" and t["valid"]]
    assert len(made) == 1 and made[0]["requests"] >= 1, made
    panel_token = made[0]["id"]

    # A token made in the section works until it is revoked there (after the dialog): then 401.
    item.locator(tid("lf-endpoint-new-token")).click()
    line = item.locator(tid("lf-endpoint-curl")).inner_text()
    m = re.fullmatch(r'curl -H "Authorization: Bearer (lfsrv_(\d+)_\S+)" \S+', line.strip())
    assert m, line
    token, token_id = m.group(1), m.group(2)
    assert _chat_call(hub, token).json()["choices"][0]["message"]["content"] == "You said: hi"
    item.locator(tid("lf-endpoint-token-close")).click()
    item.locator(tid("lf-endpoint-tokens-toggle")).click()
    row = item.locator(tid(f"lf-token-{token_id}"))
    expect(row).to_be_visible()
    expect(item.locator(tid(f"lf-token-{panel_token}"))).to_contain_text("Chat panel")
    expect(row.locator(tid("lf-token-meta"))).to_contain_text("by alice")
    dismiss_news(page)
    shot(sidebar, "sidebar-serving-tokens")
    row.locator(tid("lf-token-revoke")).click()
    dialog = page.locator(".jp-Dialog")
    expect(dialog).to_contain_text(f"Revoke token {token_id} of chat?")
    dialog.locator("button.jp-mod-warn").click()
    expect(row).to_have_count(0)
    refused = _chat_call(hub, token)
    assert refused.status_code == 401, refused.text

    # Revoking the panel's own token: its next message gets 401, it makes a new token and goes on.
    item.locator(tid(f"lf-token-{panel_token}")).locator(tid("lf-token-revoke")).click()
    page.locator(".jp-Dialog button.jp-mod-warn").click()
    expect(item.locator(tid(f"lf-token-{panel_token}"))).to_have_count(0)
    assert _ask(page, "still there?") == "You said: still there?"
    expect(tab.locator(tid("lf-chat-error"))).to_have_count(0)
    renewed = [t for t in _tokens(hub) if t["note"] == "Chat panel" and t["valid"]]
    assert [t["id"] for t in renewed] != [panel_token] and len(renewed) == 1, renewed
    dismiss_news(page)
    shot(page.locator("#main"), "chat-after-renew")

    # Closing the tab revokes the panel's token.
    page.locator('li.lm-TabBar-tab[data-id="labfleet-chat-chat"] .lm-TabBar-tabCloseIcon').click()
    deadline = time.monotonic() + 30
    while any(t["note"] == "Chat panel" and t["valid"] for t in _tokens(hub)):
        assert time.monotonic() < deadline, _tokens(hub)
        time.sleep(0.5)
    page.context.close()


# A README whose script and onerror handler would set window.__pwned, were they ever run.
STORE_README = """# Sentiment echo

Labels a review as **positive** or negative; here the stdlib echo model stands in.

<script>window.__pwned = "script"</script>
<img src="missing.png" onerror="window.__pwned = 'onerror'">

## Usage
Deploy it, then call `/predict`.
"""


def test_model_store_lists_reads_and_deploys(hub, browser):
    from playwright.sync_api import expect

    expect.set_options(timeout=WAIT_MS)
    alice = hub.alice_token
    root = hub.wait_token("root")
    files = {"README.md": STORE_README, "model-definition.yaml": DEFINITION, "server.py": SERVER}
    good = _project_folder(hub, root, "acme/ml", STORE_ENDPOINT, files)
    _project_folder(hub, root, "acme/ml", "llm-draft", {"model-definition.yaml": BAD["noport"]})
    before = {e["name"] for e in hub.api("GET", "/endpoints", alice).json()}
    page = open_serving(hub, browser)
    try:
        page.locator(tid("lf-open-model-store")).click()
        store = page.locator("#labfleet-model-store")
        cards = store.locator(".lf-ms-card")
        # The project's model folders, and alice's own (their cards say "your folder").
        own = [
            f["name"]
            for f in hub.api("GET", "/vfolders", alice).json()
            if f["usage_mode"] == "model" and f["owner"] == "user:alice" and f["status"] == "READY"
        ]
        expect(cards).to_have_count(2 + len(own))
        for name in own:
            expect(
                store.locator(tid(f"lf-ms-card-{name}")).locator(tid("lf-ms-card-project"))
            ).to_contain_text("your folder")
        card = store.locator(tid(f"lf-ms-card-{STORE_ENDPOINT}"))
        expect(card).to_have_attribute("data-folder-id", good["id"])
        expect(card.locator(tid("lf-ms-card-open"))).to_have_text("Sentiment echo")
        expect(card.locator(tid("lf-ms-card-project"))).to_have_text("acme/ml · sentiment-echo")
        expect(card.locator(tid("lf-ms-card-summary"))).to_have_text(
            "Labels a review as positive or negative; here the stdlib echo model stands in."
        )
        expect(card.locator(tid("lf-ms-model"))).to_have_text("Model: echo · port 8000")
        expect(card.locator(tid("lf-ms-deploy"))).to_be_enabled()
        broken = store.locator(tid("lf-ms-card-llm-draft"))
        expect(broken.locator(tid("lf-ms-card-open"))).to_have_text("llm-draft")
        expect(broken.locator(tid("lf-ms-card-summary"))).to_have_text("No description.")
        expect(broken.locator(tid("lf-ms-model"))).to_have_attribute("data-ok", "false")
        expect(broken.locator(tid("lf-ms-model"))).to_contain_text("port is missing")
        expect(broken.locator(tid("lf-ms-deploy"))).to_be_disabled()
        expect(broken.locator(tid("lf-ms-deploy"))).to_have_attribute(
            "title", "Its model-definition.yaml has a problem: fix it to serve it."
        )
        dismiss_news(page)
        shot(page.locator("#main"), "model-store-grid")

        # The search keeps the cards whose name or title holds it.
        store.locator(tid("lf-ms-search")).fill("SENTI")
        expect(cards).to_have_count(1)
        expect(card).to_be_visible()
        shot(page.locator("#main"), "model-store-search")
        store.locator(tid("lf-ms-search")).fill("")
        expect(cards).to_have_count(2 + len(own))

        # The README, rendered as untrusted Markdown: the heading shows, the script never ran.
        card.locator(tid("lf-ms-card-open")).click()
        readme = store.locator(tid("lf-ms-readme"))
        expect(readme.locator("h1")).to_contain_text("Sentiment echo")
        expect(readme.locator("strong")).to_have_text("positive")
        expect(readme.locator("script")).to_have_count(0)
        expect(store.locator(tid("lf-ms-detail-meta"))).to_contain_text("folder sentiment-echo")
        # Any image the sanitizer kept has failed to load by now (its onerror would have run).
        page.wait_for_function(
            "() => [...document.querySelectorAll('[data-testid=lf-ms-readme] img')].every(i => i.complete)"
        )
        assert page.evaluate("typeof window.__pwned") == "undefined"
        assert not readme.locator("[onerror]").count()
        shot(page.locator("#main"), "model-store-readme")
        store.locator(tid("lf-ms-back")).click()
        expect(cards).to_have_count(2 + len(own))

        # Deploy: a whole 3 GPUs is over the project's 2; the service's refusal shows in the dialog.
        card.locator(tid("lf-ms-deploy")).click()
        dialog = store.locator(tid("lf-ms-deploy-dialog"))
        expect(dialog.locator(tid("lf-ms-deploy-name"))).to_have_value(STORE_ENDPOINT)
        dialog.locator(tid("lf-ms-deploy-cpu")).fill("0.25")
        dialog.locator(tid("lf-ms-deploy-mem")).fill("256m")
        dialog.locator(tid("lf-ms-deploy-gpu")).fill("3")
        shot(page.locator("#main"), "model-store-deploy")
        dialog.locator(tid("lf-ms-deploy-submit")).click()
        error = dialog.locator(tid("lf-ms-deploy-error"))
        expect(error).to_contain_text("acme/ml would use 3 of its 2 gpu.shares")
        assert hub.api("GET", f"/endpoints/{STORE_ENDPOINT}", alice).status_code == 404
        assert {e["name"] for e in hub.api("GET", "/endpoints", alice).json()} == before
        shot(page.locator("#main"), "model-store-refused")

        # A quarter of a GPU: the dialog closes, the panel and a notification say it is deploying.
        dialog.locator(tid("lf-ms-deploy-gpu")).fill("0.25")
        dialog.locator(tid("lf-ms-deploy-submit")).click()
        expect(dialog).to_have_count(0)
        expect(store.locator(tid("lf-ms-deployed"))).to_contain_text(
            f"Endpoint {STORE_ENDPOINT} is deploying"
        )
        toast = page.locator(".Toastify__toast", has_text=f"Endpoint {STORE_ENDPOINT} is deploying")
        expect(toast).to_be_visible()
        toast.evaluate("t => Promise.all(t.getAnimations().map(a => a.finished))")  # slid in whole
        # The Fleet panel, where the notice sends her, lists it too.
        listed = page.locator(f"{tid('lf-section-serving')} {tid(f'lf-endpoint-{STORE_ENDPOINT}')}")
        expect(listed).to_be_visible()
        shot(page.locator("#main"), "model-store-deployed")
        ep = hub.api("GET", f"/endpoints/{STORE_ENDPOINT}", alice).json()
        assert ep["model_folder"]["id"] == good["id"] and ep["project"] == "acme/ml", ep
        assert ep["replicas"] == 1 and float(ep["slots"]["gpu.shares"]) == 0.25, ep
        _wait(
            "the store's endpoint READY",
            lambda: hub.api("GET", f"/endpoints/{STORE_ENDPOINT}", alice).json()["status"] == "READY",
            timeout=120,
            hub=hub,
        )
    finally:
        page.context.close()
        # Gone again, its GPU share given back, so that later tests start from what they expect.
        hub.api("DELETE", f"/endpoints/{STORE_ENDPOINT}", alice)
    _wait(
        "the store's endpoint destroyed",
        lambda: hub.api("GET", f"/endpoints/{STORE_ENDPOINT}", alice).json()["status"] == "DESTROYED",
        hub=hub,
    )
