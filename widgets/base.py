"""What every labfleet widget shares: its data source, refreshing on the kernel's loop, and error display.

A widget is an ``ipywidgets.VBox`` of standard controls. ``await w.refresh()`` asks the source once and
updates the controls' traits; on a running loop (ipykernel runs one) the widget loads itself when created
and then every ``refresh_interval`` seconds, as an asyncio task, so the kernel is never blocked. A failed
refresh shows its message in the widget and the next one tries again.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

import ipywidgets as W
from traitlets import Float, observe

from labfleet.core.display import esc

from .client import FleetClient, FleetError
from .format import error_html


def default_client() -> Any:
    """The session's own endpoints, from the kernel's environment."""
    return FleetClient.from_env()


def error_message(e: BaseException) -> str:
    if isinstance(e, FleetError):
        return e.message
    return f"{type(e).__name__}: {e}"


def _close_tree(widget: W.Widget) -> None:
    """Close a widget and everything inside it (Box.close leaves its children open)."""
    for child in getattr(widget, "children", ()):
        _close_tree(child)
    widget.close()


class FleetWidget(W.VBox):
    """Base of the labfleet widgets (not used alone)."""

    refresh_interval = Float(
        0.0,
        help="""Seconds between automatic refreshes (0: none after the first load). Refreshes run as a
        task on the kernel's running event loop; changing this restarts that task.""",
    )

    title = ""

    def __init__(self, client: Any = None, refresh_interval: float | None = None, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.client = client if client is not None else default_client()
        self.error: str | None = None  # the last refresh's error; None once one succeeds
        self.message = ""  # the outcome of the last action (start, stop, upload, ...)
        self.busy_buttons: set[W.DOMWidget] = set()  # a refresh must not enable these mid-action
        self.message_is_error = False
        self.refreshes = 0  # successful refreshes so far
        self._task: asyncio.Task[None] | None = None
        self._actions: set[asyncio.Future[Any]] = set()
        self.header = W.HTML(f"<b>{esc(self.title)}</b>" if self.title else "")
        self.error_box = W.HTML("")
        self.message_box = W.HTML("")
        self.add_class("labfleet-widget")
        if refresh_interval is not None:
            self.refresh_interval = refresh_interval
        self._start()

    # -- refreshing ---------------------------------------------------------------------------------

    async def fetch(self) -> Any:  # pragma: no cover - every widget overrides it
        raise NotImplementedError

    def render(self, data: Any) -> None:  # pragma: no cover - every widget overrides it
        raise NotImplementedError

    async def refresh(self) -> bool:
        """Ask the source once and show the answer; on failure show why. True when it worked."""
        try:
            data = await self.fetch()
            self.render(data)
        except asyncio.CancelledError:
            raise
        except Exception as e:
            self.error = error_message(e)
            self.error_box.value = error_html(self.error)
            if not isinstance(e, FleetError):
                self.log.warning("labfleet widget %s: refresh failed", type(self).__name__, exc_info=True)
            return False
        self.error = None
        self.error_box.value = ""
        self.refreshes += 1
        return True

    def schedule_refresh(self) -> asyncio.Future[Any] | None:
        """Refresh soon, without waiting for it (for callbacks, e.g. after another widget started a session)."""
        return self.schedule(self.refresh())

    async def _run(self) -> None:
        while True:
            await self.refresh()
            if self.refresh_interval <= 0:
                return
            await asyncio.sleep(self.refresh_interval)

    def _start(self) -> None:
        try:
            asyncio.get_running_loop()
        except RuntimeError:
            # No loop runs (a plain script): the caller awaits refresh() itself.
            return
        self._task = asyncio.ensure_future(self._run())

    @observe("refresh_interval")
    def _interval_changed(self, change: dict[str, Any]) -> None:
        # Only a widget that started its task restarts it (without a running loop there is none).
        if self._task is None:
            return
        if not self._task.done():
            self._task.cancel()
            self._start()
        elif change["new"] > 0:
            self._start()

    def close(self) -> None:
        """Stop refreshing (and any action under way), then close the widget and its children."""
        # getattr: ipywidgets also calls close() from __del__, even for one whose __init__ failed.
        for task in [getattr(self, "_task", None), *getattr(self, "_actions", ())]:
            if task is not None and not task.done():
                task.cancel()
        self._task = None
        for child in self.children:
            _close_tree(child)
        super().close()

    # -- actions ------------------------------------------------------------------------------------

    def schedule(self, coro: Awaitable[Any]) -> asyncio.Future[Any] | None:
        """Run ``coro`` on the running loop without blocking the caller (a button handler)."""
        try:
            fut = asyncio.ensure_future(coro)
        except RuntimeError:
            # No event loop at all: nothing can run it; say so instead of failing silently.
            if asyncio.iscoroutine(coro):
                coro.close()
            self.show_message("no event loop runs here: await the widget's methods yourself", error=True)
            return None
        self._actions.add(fut)
        fut.add_done_callback(self._action_done)
        return fut

    def _action_done(self, fut: asyncio.Future[Any]) -> None:
        self._actions.discard(fut)
        if not fut.cancelled() and fut.exception() is not None:
            e = fut.exception()
            self.show_message(error_message(e), error=True)  # type: ignore[arg-type]

    def busy(self, button: W.DOMWidget, action: Callable[[], Awaitable[Any]]) -> asyncio.Future[Any] | None:
        """A button's click: disable it, run ``action`` on the loop, enable it again."""

        async def run() -> Any:
            button.disabled = True
            self.busy_buttons.add(button)
            try:
                return await action()
            finally:
                self.busy_buttons.discard(button)
                button.disabled = False

        return self.schedule(run())

    def show_message(self, message: str, *, error: bool = False) -> None:
        """Say how the last action went (an error in red)."""
        self.message = message
        self.message_is_error = error
        if error:
            self.message_box.value = error_html(message)
        else:
            self.message_box.value = f'<div class="lf-message">{esc(message)}</div>' if message else ""
