"""`backend: auto` never falls back to the unisolated rlimit backend; choosing rlimit explicitly warns."""

from __future__ import annotations

import logging

import pytest

from sage.configs.schema import SandboxConfig
from sage.engines.verify import sandbox as sandbox_module
from sage.engines.verify.sandbox import Job, Sandbox


def test_auto_stops_with_install_hint_when_only_rlimit_works(monkeypatch):
    monkeypatch.setattr(sandbox_module, "available_backends", lambda: ["rlimit"])
    with pytest.raises(RuntimeError, match="apt-get install bubblewrap"):
        Sandbox(SandboxConfig())
    monkeypatch.setattr(sandbox_module, "available_backends", lambda: [])
    with pytest.raises(RuntimeError, match="apt-get install bubblewrap"):
        Sandbox(SandboxConfig(backend="auto"))


def test_auto_prefers_isolating_backends(monkeypatch):
    monkeypatch.setattr(sandbox_module, "available_backends", lambda: ["unshare", "rlimit"])
    assert Sandbox(SandboxConfig()).backend == "unshare"


def test_explicit_rlimit_warns_once_per_sandbox(monkeypatch, caplog):
    monkeypatch.setattr(sandbox_module, "available_backends", lambda: ["bwrap", "rlimit"])
    with caplog.at_level(logging.WARNING, logger="sage.engines.verify.sandbox"):
        Sandbox(SandboxConfig(backend="bwrap"))
        assert not caplog.records
        sandbox = Sandbox(SandboxConfig(backend="rlimit"))
    warned = [r for r in caplog.records if "WITHOUT isolation" in r.getMessage()]
    assert len(warned) == 1 and "read and write" in warned[0].getMessage()
    assert sandbox.backend == "rlimit"


@pytest.mark.skipif("rlimit" not in sandbox_module.available_backends(), reason="rlimit backend unusable here")
def test_explicit_rlimit_still_runs(caplog):
    with caplog.at_level(logging.WARNING, logger="sage.engines.verify.sandbox"):
        res = Sandbox(SandboxConfig(backend="rlimit", timeout_s=10)).execute(
            [Job("def f():\n    return 3\n", "f", [[]])])
    assert res[0].outputs == [3] and res[0].backend == "rlimit"
    assert sum("WITHOUT isolation" in r.getMessage() for r in caplog.records) == 1
