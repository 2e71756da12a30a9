"""MNIST into the host's cache (``python -m suite data fetch``): the download, bounded in time
however the server behaves, and imports for machines without internet (``--from``: Keras' file, or
a folder of the four IDX files). ``datasets`` says where the cache is and which data a run uses."""

from __future__ import annotations

import http.client
import math
import os
import shutil
import socket
import tempfile
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path
from types import TracebackType
from typing import Any

from suite.environment.datasets import (
    FETCH_COMMAND,
    SHAPES,
    BadSource,
    FetchError,
    cache_dir,
    expected_sha256,
    identity_for,
    idx_path,
    npz_path,
    sha256_cached,
    sha256_override,
)
from suite.worker import data as wdata

MNIST_URL = "https://storage.googleapis.com/tensorflow/tf-keras-datasets/mnist.npz"  # Keras' own origin
URL_ENV = "SUITE_MNIST_URL"
TIMEOUT_S = 60.0  # each wait for the server (connecting, each read): --timeout
# The whole download, however steadily bytes arrive: a server sending one byte a second never trips
# TIMEOUT_S. 600 s lets Keras' 11 MB mnist.npz arrive at about 150 kbit/s.
DEADLINE_S = 600.0
DEADLINE_ENV = "SUITE_FETCH_DEADLINE_S"
URL_SCHEMES = ("http", "https")
STALE_PART_S = 3600.0  # a .part entry untouched this long is left by a fetch or import that was killed


def fetch(
    url: str | None = None,
    *,
    timeout: float = TIMEOUT_S,
    deadline: float | None = None,
    say: Callable[[str], None] = print,
) -> Path:
    """Download mnist.npz into the cache once; a cached file with the right sha256 is kept as it is.

    The bytes go to a temporary file in the cache folder, are hashed as they arrive, and are renamed
    onto ``mnist.npz`` only when complete and verified: a corrupt or cut-off download leaves nothing.
    ``timeout`` bounds each wait for the server, ``deadline`` (default: ``fetch_deadline()``) the
    whole download.
    """
    deadline = fetch_deadline() if deadline is None else deadline
    target, expected = npz_path(), expected_sha256()
    _remove_stale_parts(cache_dir(), say)
    if sha256_override():
        say(sha256_override())
    if target.is_file() and sha256_cached(target) == expected:
        say(f"{target}: already cached (sha256 {expected} verified)")
        return target
    if not url and (imported := identity_for({}))["source"] == "idx":
        # MNIST imported with --from as IDX files counts as there: a download would put mnist.npz beside
        # it, which runs take first, and change the data (and every fingerprint) of the runs on file.
        say(f"{idx_path()}: MNIST imported as IDX files (sha256 {imported['sha256'][:12]}...); runs use them")
        say(f"nothing downloaded (`{FETCH_COMMAND} --url URL` downloads mnist.npz, which runs then take instead)")
        return idx_path()
    if url:
        origin = "--url"
    elif os.environ.get(URL_ENV):
        url, origin = os.environ[URL_ENV], f"${URL_ENV}"
    else:
        url, origin = MNIST_URL, "the default URL"
    scheme = url.split(":", 1)[0].lower() if ":" in url else ""
    if scheme not in URL_SCHEMES:
        raise BadSource(
            f"{origin} {url}: scheme {scheme or '(none)'!r} is not allowed; give an http:// or https:// URL "
            f"(for a file on this machine: {FETCH_COMMAND} --from PATH)"
        )
    target.parent.mkdir(parents=True, exist_ok=True)
    say(f"downloading {url} -> {target}")
    fd, tmp_name = tempfile.mkstemp(dir=target.parent, prefix=".mnist.npz.", suffix=".part")
    tmp = Path(tmp_name)
    try:
        with os.fdopen(fd, "wb") as out:
            received, announced = _download(url, origin, out, timeout, deadline)
            out.flush()
            os.fsync(out.fileno())
        if announced is not None and received != announced:
            raise FetchError(f"download of {url} interrupted: {received} of {announced} bytes arrived")
        digest = wdata.sha256_of(tmp)
        if digest != expected:
            raise FetchError(
                f"download of {url} ({received} bytes) has sha256 {digest}, expected {expected}: "
                "not Keras' mnist.npz (corrupt, or a different file); nothing was cached"
            )
        os.replace(tmp, target)
    finally:
        tmp.unlink(missing_ok=True)
    say(f"{target}: sha256 {expected} verified")
    return target


def _remove_stale_parts(folder: Path, say: Callable[[str], None]) -> None:
    """Remove the ``.mnist*.part`` files and folders a killed fetch or import left, once untouched for an hour.

    Younger ones are left alone: another fetch or import may be writing them now.
    """
    cutoff = time.time() - STALE_PART_S
    for entry in folder.glob(".mnist*.part"):
        try:
            if entry.lstat().st_mtime >= cutoff:
                continue
            if entry.is_dir() and not entry.is_symlink():
                shutil.rmtree(entry)
            else:
                entry.unlink()
        except OSError:
            continue  # gone meanwhile, or not ours to remove: it does not stop the fetch
        say(f"removed {entry}, left by an earlier fetch or import that did not finish")


def fetch_deadline() -> float:
    """Seconds a whole download may take: ``$SUITE_FETCH_DEADLINE_S``, else DEADLINE_S."""
    text = os.environ.get(DEADLINE_ENV, "").strip()
    if not text:
        return DEADLINE_S
    try:
        seconds = float(text)
    except ValueError:
        seconds = math.nan
    if not 0 < seconds < math.inf:
        raise BadSource(
            f"${DEADLINE_ENV} {text!r}: give the seconds a whole download may take, "
            f"a number > 0 (default {DEADLINE_S:g})"
        )
    return seconds


def _download(url: str, origin: str, out: Any, timeout: float, deadline: float) -> tuple[int, int | None]:
    """Copy the body of ``url`` (given by ``origin``) into ``out`` within ``deadline`` seconds;
    (bytes received, Content-Length or None)."""
    watch = _Deadline(deadline)
    try:
        with watch:
            received, announced = _copy(url, origin, out, timeout, watch)
    except (FetchError, BadSource):
        if not watch.expired:
            raise
    if watch.expired:  # whatever the shut connection looked like to urllib, the deadline is why
        raise FetchError(
            f"download of {url} stopped after {deadline:g} s, the most a download may take, with {out.tell()} "
            f"bytes received; nothing was cached. On a slow link allow more with {DEADLINE_ENV}=SECONDS "
            f"(default {DEADLINE_S:g})"
        )
    return received, announced


def _copy(url: str, origin: str, out: Any, timeout: float, watch: _Deadline) -> tuple[int, int | None]:
    received = 0
    opener = urllib.request.build_opener(_WatchedHTTP(watch), _WatchedHTTPS(watch))
    try:
        with opener.open(url, timeout=timeout) as resp:
            length = resp.headers.get("Content-Length")
            announced = int(length) if length and length.isdigit() else None
            while True:
                chunk = resp.read(1 << 20)
                if not chunk:
                    break
                out.write(chunk)
                received += len(chunk)
    except http.client.IncompleteRead as exc:
        got = received + len(exc.partial)
        expected = f" of {received + len(exc.partial) + exc.expected}" if exc.expected is not None else ""
        raise FetchError(f"download of {url} interrupted: the server closed after {got}{expected} bytes") from None
    except urllib.error.HTTPError as exc:
        raise FetchError(f"download of {url} failed: HTTP {exc.code} {exc.reason}") from None
    except (urllib.error.URLError, OSError, http.client.HTTPException) as exc:
        reason = getattr(exc, "reason", None) or exc
        raise FetchError(f"download of {url} failed after {received} bytes: {reason}") from None
    except ValueError as exc:  # urlopen's word for a malformed URL
        raise BadSource(f"{origin} {url}: {exc}") from None
    return received, announced


class _Deadline:
    """Shuts every connection of a download once ``seconds`` have passed since ``with`` began.

    Each wait for the server has its own timeout, but that bounds no download: a server sending a
    byte every few seconds keeps every wait short for ever. Shutting the connection down ends the
    read that is waiting on it, whether in the TLS handshake, the headers or the body.
    """

    def __init__(self, seconds: float) -> None:
        self.expired = False
        self._sockets: list[socket.socket] = []  # duplicates of the download's sockets, ours to close
        self._lock = threading.Lock()
        self._timer = threading.Timer(seconds, self._expire)
        self._timer.daemon = True

    def __enter__(self) -> _Deadline:
        self._timer.start()
        return self

    def __exit__(self, *exc: type[BaseException] | BaseException | TracebackType | None) -> None:
        self._timer.cancel()
        with self._lock:
            for sock in self._sockets:
                sock.close()
            self._sockets.clear()

    def watch(self, sock: socket.socket) -> socket.socket:
        """``sock``, its connection watched from now on.

        What is kept is a duplicate: shutting it down ends the connection itself, whatever became of
        ``sock`` meanwhile (TLS detaches it when it wraps it, before the handshake).
        """
        with self._lock:
            self._sockets.append(sock.dup())
            if self.expired:
                _shut(self._sockets[-1])
        return sock

    def _expire(self) -> None:
        with self._lock:
            self.expired = True
            for sock in self._sockets:
                _shut(sock)

    def connection(self, connection_class: type[http.client.HTTPConnection]) -> type[http.client.HTTPConnection]:
        """``connection_class`` with each socket it opens watched from its creation."""
        watch = self.watch

        # A base known only at run time (HTTP or HTTPS) is beyond a static checker.
        class Watched(connection_class):  # type: ignore[valid-type, misc]
            def connect(self) -> None:
                make = self._create_connection  # type: ignore[has-type]  # http.client's hook for the socket
                self._create_connection = lambda *args: watch(make(*args))
                super().connect()

        return Watched


def _shut(sock: socket.socket) -> None:
    try:
        sock.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass  # the connection has ended already


class _Watched(urllib.request.AbstractHTTPHandler):
    """urllib's handler, its connections watched by a _Deadline; every other default (proxies,
    redirects, certificates) stays as ``urlopen`` has it."""

    def __init__(self, watch: _Deadline) -> None:
        super().__init__()
        self.watch = watch

    def do_open(self, http_class: Any, req: Any, **kwargs: Any) -> Any:
        return super().do_open(self.watch.connection(http_class), req, **kwargs)


class _WatchedHTTP(_Watched, urllib.request.HTTPHandler):
    pass


class _WatchedHTTPS(_Watched, urllib.request.HTTPSHandler):
    pass


def import_from(source: Path, *, say: Callable[[str], None] = print) -> Path:
    """``data fetch --from PATH``: Keras' mnist.npz (checked by sha256), or a folder of the four IDX files."""
    _remove_stale_parts(cache_dir(), say)
    if source.is_dir():
        return _import_idx(source, say)
    if not source.is_file():
        if source.exists():  # a FIFO, a device: never read (a FIFO would wait for a writer, a device never end)
            raise BadSource(f"--from {source}: not a regular file; expected Keras' mnist.npz or a folder of IDX files")
        raise BadSource(f"--from {source}: no such file or folder")
    if source.suffix != ".npz":
        raise BadSource(f"--from {source}: expected Keras' mnist.npz or a folder of the four MNIST IDX files")
    if sha256_override():
        say(sha256_override())
    digest, expected = wdata.sha256_of(source), expected_sha256()
    if digest != expected:
        raise BadSource(
            f"--from {source}: sha256 {digest}, expected {expected} (Keras' mnist.npz); for other copies "
            "of MNIST give the folder of its four IDX files"
        )
    target = npz_path()
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp_name = tempfile.mkstemp(dir=target.parent, prefix=".mnist.npz.", suffix=".part")
    os.close(fd)
    try:
        shutil.copyfile(source, tmp_name)
        if wdata.sha256_of(Path(tmp_name)) != expected:
            raise FetchError(f"copying {source} to {target} changed its bytes; nothing was cached")
        os.replace(tmp_name, target)
    finally:
        Path(tmp_name).unlink(missing_ok=True)
    say(f"{target}: copied from {source} (sha256 {expected} verified)")
    return target


def _import_idx(folder: Path, say: Callable[[str], None]) -> Path:
    try:
        raw = wdata.read_idx_files(folder)
        arrays = {stem: wdata.parse_idx(raw[stem], f"{folder}/{stem}") for stem in SHAPES if stem in raw}
    except wdata.DataUnavailable as exc:
        raise BadSource(f"--from {folder}: {exc}") from None
    missing = [stem for stem in SHAPES if stem not in raw]
    if missing:
        has = ", ".join(sorted(raw)) or "no MNIST IDX files"
        hint = (
            " It holds only the t10k test set: for that alone, name the folder in a scenario's data.data_dir"
            if set(raw) == set(wdata.IDX_TEST)
            else ""
        )
        raise BadSource(f"--from {folder}: missing {', '.join(missing)} (each optionally .gz); it has {has}.{hint}")
    for stem, shape in SHAPES.items():
        array = arrays[stem]
        if array.shape != shape:
            raise BadSource(f"--from {folder}: {stem} has shape {array.shape}, MNIST's is {shape}")
        if "labels" in stem and array.max() >= wdata.CLASSES:
            raise BadSource(f"--from {folder}: {stem} holds label {int(array.max())}; MNIST's are 0-9")
    target = idx_path()
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(dir=target.parent, prefix=".mnist-idx.", suffix=".part"))
    old = target.with_name(target.name + ".old")
    try:
        for stem in SHAPES:  # stored decompressed: the worker then reads them without gunzip
            (staging / stem).write_bytes(raw[stem])
        if wdata.idx_digest(wdata.read_idx_files(staging)) != wdata.idx_digest(raw):
            raise FetchError(f"copying {folder} to {target} changed its bytes; nothing was cached")
        shutil.rmtree(old, ignore_errors=True)
        kept = target.exists()
        if kept:
            target.rename(old)
        try:
            staging.rename(target)
        except OSError as exc:
            if kept:  # put the previous import back: a failed import must not lose it
                old.rename(target)
            raise FetchError(f"storing {folder} as {target} failed ({exc}); the cache is as it was") from None
        shutil.rmtree(old, ignore_errors=True)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    say(f"{target}: the four IDX files of {folder} (sha256 over their contents {wdata.idx_digest(raw)})")
    return target
