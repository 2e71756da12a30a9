"""The backend registry: names for --backend, how auto chooses, what an explicit choice that cannot work does."""

from __future__ import annotations

from pathlib import Path

import pytest

from suite import backends
from suite.backends import AUTO, BackendOptions, BackendUnavailable, Entry

OPTS = BackendOptions(machine="m", results_dir=Path("res"), docker_host="tcp://127.0.0.1:9")


def _entry(usable: bool, why: str, prepared: list[str] | None = None, name: str = "") -> Entry:
    def prepare(opts: BackendOptions, say, chosen: bool) -> None:
        if prepared is not None:
            prepared.append(f"{name} chosen={chosen}")
        if not usable:
            raise BackendUnavailable(why)

    return Entry(f"{name} backend", lambda opts: name, lambda opts: (usable, why), prepare)


def test_names_are_auto_then_the_registry() -> None:
    assert backends.names() == [AUTO, *backends.BACKENDS]
    assert set(backends.BACKENDS) >= {"local", "docker"}


def test_auto_takes_the_first_usable_and_says_why_it_passed_the_others(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(backends, "BACKENDS", {"a": _entry(False, "a is down"), "b": _entry(True, "b is up")})
    assert backends.choose(OPTS) == ("b", "a is down")
    monkeypatch.setattr(backends, "BACKENDS", {"a": _entry(True, "a is up"), "b": _entry(True, "")})
    assert backends.choose(OPTS) == ("a", "a is up")
    monkeypatch.setattr(backends, "BACKENDS", {"a": _entry(False, "a is down")})
    with pytest.raises(BackendUnavailable, match="no backend can run here: a is down"):
        backends.choose(OPTS)


def test_prepare_reports_failures_and_tells_each_step_whether_it_was_chosen(monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[str] = []
    monkeypatch.setattr(
        backends, "BACKENDS", {"a": _entry(False, "a is down", seen, "a"), "b": _entry(True, "", seen, "b")}
    )
    assert backends.prepare(AUTO, OPTS, say=lambda _: None) == ["a: a is down"]
    assert backends.prepare("b", OPTS, say=lambda _: None) == []
    assert seen == ["a chosen=False", "b chosen=False", "b chosen=True"]


def test_unknown_name_is_refused() -> None:
    with pytest.raises(BackendUnavailable, match="no backend named 'nope'"):
        backends.make("nope", OPTS)


def test_local_backend_is_made_without_checks() -> None:
    backend = backends.make("local", OPTS)
    assert backend.name == "local" and backend.machine == "m"


def test_docker_without_an_engine_is_refused_with_what_to_do() -> None:
    pytest.importorskip("docker")
    with pytest.raises(BackendUnavailable, match="no Docker engine answers at tcp://127.0.0.1:9.*--backend local"):
        backends.make("docker", OPTS)
    # Under auto an unreachable engine is passed over quietly; chosen explicitly, it is a failure.
    assert backends.prepare(AUTO, OPTS, say=lambda _: None) == []
    assert backends.prepare("docker", OPTS, say=lambda _: None) == [
        "docker: no Docker engine answers at tcp://127.0.0.1:9"
    ]
