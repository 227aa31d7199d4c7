"""The phase and run scopes: `with client.phase("rollout"):`, `@client.run("exp1")`."""

from __future__ import annotations

import contextlib
import contextvars
import inspect
import threading


class _Scope(contextlib.ContextDecorator):
    """`with client.phase("rollout"):` or `@client.phase("rollout")`, and the same
    for `client.run(...)`: `name` says which ("phase" or "run").

    The value lives in a ContextVar, so each thread (and each asyncio task) has its
    own; a scope restores whatever was current when it was entered. One scope object
    may be entered by several threads at once; within one thread, asyncio tasks
    should each use their own `with client.phase(...)`. Decorating a coroutine
    function is refused: the scope would end before its body runs.
    """

    def __init__(self, var: contextvars.ContextVar, value: str, name: str):
        self._var = var
        self._value = value
        self._name = name
        self._tokens = threading.local()

    def __enter__(self):
        stack = self._tokens.__dict__.setdefault("stack", [])
        stack.append(self._var.set(self._value))
        return self

    def __exit__(self, *exc) -> bool:
        self._var.reset(self._tokens.stack.pop())
        return False

    def _recreate_cm(self):  # each decorated call gets its own scope
        return _Scope(self._var, self._value, self._name)

    def __call__(self, function):
        if inspect.iscoroutinefunction(function) or inspect.isasyncgenfunction(function):
            raise TypeError(f"client.{self._name}(...) cannot decorate a coroutine function; "
                            f"use `with client.{self._name}(...)` inside it")
        return super().__call__(function)
