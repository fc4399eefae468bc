"""The one hook-session mechanism of `interp.hooks`: forward hooks that act only in the context that entered them.

A `ScopedHooks` registers its module hooks when its ``with`` block starts and removes them when it
ends, also when it raises. While it is entered it is in the current context's set of active
sessions, a `ContextVar`; every hook starts with ``if not self._active(): return None``. A forward
pass run by another thread or asyncio task on the same shared model calls the hook too (module
hooks are global to the module), but the session is not active in that context, so the hook does
nothing there: two captures or edits on one model, each in its own context, never see each other's
forward passes. Every session of the workbench is one: the U-Net captures and edits
(`interp.hooks.diffusion`), the language-model residual capture (`interp.hooks.lm`), the residual
replacement of SAE splicing (`interp.hooks.lm_splice`) and LM steering (`interp.hooks.lm_steer`).

Torch adds a hook to a module before marking it as taking kwargs, so a forward pass in another
thread can call a kwargs hook in between without them: hooks registered ``with_kwargs=True`` take
their kwargs as optional (that call is never their session's, so they return at once).
"""

from __future__ import annotations

from contextvars import ContextVar

# Sessions active in the current context; a hook acts only if its session is in here.
_ACTIVE_SESSIONS: ContextVar[tuple] = ContextVar("interp_hook_sessions", default=())


class ScopedHooks:
    """Forward hooks registered on entering the `with` and removed on leaving it, that act only in the context
    (thread, asyncio task) that entered it. Subclasses register their hooks in `_register` (appending each
    handle to ``self._handles``) and start each hook with `if not self._active(): return None`."""

    _handles: list
    _token = None

    def _register(self) -> list:
        """Register the hooks, appending their handles to ``self._handles``."""
        raise NotImplementedError

    def _active(self) -> bool:
        return self in _ACTIVE_SESSIONS.get()

    def __enter__(self):
        self._handles = []
        try:
            self._register()
        except BaseException:
            self._remove()
            raise
        self._token = _ACTIVE_SESSIONS.set(_ACTIVE_SESSIONS.get() + (self,))
        return self

    def _remove(self):
        for handle in self._handles:
            handle.remove()
        self._handles.clear()

    def __exit__(self, *exc):
        try:
            if self._token is not None:
                _ACTIVE_SESSIONS.reset(self._token)
                self._token = None
        finally:
            self._remove()
        return False


__all__ = ["ScopedHooks"]
