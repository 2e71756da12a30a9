"""MNIST on the host: the cache, the download, imports for machines without internet, and the data's identity.

The cache is the Keras one, ``$KERAS_HOME/datasets`` (default ``~/.keras/datasets``): Keras itself
keeps ``mnist.npz`` there, so a copy a user already has counts, and both backends already know
the folder. It holds at most

- ``mnist.npz``: Keras' file, byte for byte (sha256 ``MNIST_NPZ_SHA256``), downloaded once by
  ``python -m suite data fetch`` or copied from a file with ``--from FILE.npz``;
- ``mnist-idx/``: the four IDX files of LeCun's distribution, imported with ``--from FOLDER``.
  They hold the same digits as ``mnist.npz`` but are other bytes, so they get an identity of
  their own instead of being passed off as Keras' file.

Before planning, the host resolves which data each run will use and writes that into the spec
(``config.data.identity``), so the fingerprint covers it: a result on synthetic digits is never
"done" for a run on real ones. The identity names no host path, so fingerprints match across
machines; the ``note`` beside it (why synthetic, where the file is) is left out of the fingerprint.
"""

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

from suite import paths
from suite.worker import data as wdata  # one definition of the digests, shared with the worker

MNIST_URL = "https://storage.googleapis.com/tensorflow/tf-keras-datasets/mnist.npz"  # Keras' own origin
URL_ENV = "SUITE_MNIST_URL"
# The expected sha256 of mnist.npz, replaceable so that tests can serve small files of their own
# (the real 11 MB file cannot be shipped with the tests). A file accepted under another hash is not
# called mnist.npz: its identity's source is wdata.NPZ_OVERRIDE_SOURCE, which the fingerprint, the
# result's data source and the report all show, and `data show` / `data fetch` say the override is on.
SHA_ENV = "SUITE_MNIST_SHA256"
FETCH_COMMAND = "python -m suite data fetch"
TIMEOUT_S = 60.0  # each wait for the server (connecting, each read): --timeout
# The whole download, however steadily bytes arrive: a server sending one byte a second never trips
# TIMEOUT_S. 600 s lets Keras' 11 MB mnist.npz arrive at about 150 kbit/s.
DEADLINE_S = 600.0
DEADLINE_ENV = "SUITE_FETCH_DEADLINE_S"
URL_SCHEMES = ("http", "https")
STALE_PART_S = 3600.0  # a .part entry untouched this long is left by a fetch or import that was killed
SHAPES = {  # what --from FOLDER must hold: all of MNIST, not a part of it
    "train-images-idx3-ubyte": (60000, 28, 28),
    "train-labels-idx1-ubyte": (60000,),
    "t10k-images-idx3-ubyte": (10000, 28, 28),
    "t10k-labels-idx1-ubyte": (10000,),
}
IDENTITY_KEYS = ("source", "sha256")  # what the fingerprint sees of an identity


class FetchError(Exception):
    """The download or import did not produce a verified file; nothing was left in the cache."""


class BadSource(Exception):
    """``--from PATH`` names something that is not MNIST as the suite takes it, or the URL is unusable (bad input)."""


def cache_dir() -> Path:
    return wdata.keras_home() / "datasets"


def npz_path() -> Path:
    return cache_dir() / "mnist.npz"


def idx_path() -> Path:
    return cache_dir() / wdata.IDX_FOLDER


def expected_sha256() -> str:
    return (os.environ.get(SHA_ENV) or wdata.MNIST_NPZ_SHA256).strip().lower()


def sha256_override() -> str:
    """A line saying that SUITE_MNIST_SHA256 replaces Keras' hash ("" when it does not)."""
    expected = expected_sha256()
    if expected == wdata.MNIST_NPZ_SHA256:
        return ""
    return (
        f"{SHA_ENV} override in effect: mnist.npz is taken to have sha256 {expected}, not Keras' "
        f"{wdata.MNIST_NPZ_SHA256}; such a file is recorded as source {wdata.NPZ_OVERRIDE_SOURCE!r}, not MNIST"
    )


def npz_source() -> str:
    """The identity's source for the cached npz: Keras' file, or one accepted under an overridden hash."""
    return wdata.NPZ_OVERRIDE_SOURCE if sha256_override() else "mnist.npz"


# --------------------------------------------------------------------------- fetch and import


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
    if target.is_file() and _sha256_cached(target) == expected:
        say(f"{target}: already cached (sha256 {expected} verified)")
        return target
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


# --------------------------------------------------------------------------- identity


_digests: dict[tuple[str, int, int], str] = {}
_idx_digests: dict[tuple[str, tuple], tuple[str, list[str]]] = {}


def _sha256_cached(path: Path) -> str:
    """sha256 of a file, computed once per process while its size and mtime stay the same."""
    st = path.stat()
    key = (str(path.resolve()), st.st_size, st.st_mtime_ns)
    if key not in _digests:
        _digests[key] = wdata.sha256_of(path)
    return _digests[key]


def _idx_digest_cached(folder: Path) -> tuple[str, list[str]]:
    """(sha256 over the IDX contents, the stems found), once per process while the files stay the same."""
    stamp = tuple(sorted((p.name, p.stat().st_size, p.stat().st_mtime_ns) for p in folder.iterdir() if p.is_file()))
    key = (str(folder.resolve()), stamp)
    if key not in _idx_digests:
        raw = wdata.read_idx_files(folder)
        _idx_digests[key] = (wdata.idx_digest(raw) if raw else "", sorted(raw))
    return _idx_digests[key]


def resolve_data_dir(data_dir: str) -> Path:
    """A scenario's data.data_dir on the host: absolute, or relative to the project (the checkout, or
    the working directory of an installed suite)."""
    path = Path(data_dir)
    return path if path.is_absolute() else (paths.project_root() / path).resolve()


def identity_for(data_cfg: dict[str, Any]) -> dict[str, Any]:
    """Which data a run with this ``data`` section uses here: ``{"source", "sha256"}`` plus a ``note``.

    Sources: ``mnist.npz`` (Keras' file; ``npz (sha256 override)`` for a file accepted under
    SUITE_MNIST_SHA256's hash instead), ``idx`` (IDX files: a scenario's data_dir or an imported
    folder), ``synthetic`` (only where the scenario allows it), ``missing`` (the run cannot have data;
    the plan is refused, or for a data_dir the run fails with the note).
    """
    if data_cfg.get("data_dir"):
        folder = resolve_data_dir(str(data_cfg["data_dir"]))
        if not folder.is_dir():
            return {"source": "missing", "note": f"data.data_dir {data_cfg['data_dir']} is not a folder"}
        try:
            digest, stems = _idx_digest_cached(folder)
        except wdata.DataUnavailable as exc:
            # Files the scenario names that cannot be read: bad input, refused when the scenario loads
            # (check and run alike), not a failure of every run at its start.
            raise wdata.DataUnavailable(f"data.data_dir {data_cfg['data_dir']}: {exc}") from None
        if not set(wdata.IDX_TEST) <= set(stems):
            note = f"data.data_dir {data_cfg['data_dir']} holds no t10k-* IDX files (optionally .gz)"
            return {"source": "missing", "note": note}
        return {"source": "idx", "sha256": digest, "note": f"IDX files in {folder} ({', '.join(stems)})"}
    problems = []
    npz, expected = npz_path(), expected_sha256()
    if npz.is_file():
        digest = _sha256_cached(npz)
        if digest == expected:
            override = sha256_override()
            return {"source": npz_source(), "sha256": digest, "note": f"{npz}" + (f" ({override})" if override else "")}
        problems.append(f"{npz} has sha256 {digest[:12]}..., expected {expected[:12]}...")
    else:
        problems.append(f"no {npz}")
    folder = idx_path()
    if folder.is_dir():
        try:
            digest, stems = _idx_digest_cached(folder)
        except wdata.DataUnavailable as exc:  # the imported copy was damaged since: import it again
            problems.append(f"{exc}; import it again with `{FETCH_COMMAND} --from FOLDER`")
        else:
            if set(stems) == set(SHAPES):
                return {"source": "idx", "sha256": digest, "note": f"IDX files imported into {folder}"}
            problems.append(f"{folder} is incomplete ({', '.join(stems) or 'empty'})")
    why = "; ".join(problems)
    if data_cfg.get("allow_synthetic"):
        return {"source": "synthetic", "note": why}
    return {
        "source": "missing",
        "note": f"MNIST is not on this machine ({why}) and the scenario does not "
        f"allow synthetic data: run `{FETCH_COMMAND}`",
    }


def fingerprinted(identity: dict[str, Any]) -> dict[str, Any]:
    """The part of an identity a fingerprint covers: what the data is, not where it lies or why."""
    return {k: identity[k] for k in IDENTITY_KEYS if k in identity}


def locate(data_cfg: dict[str, Any], keras_home: Path | None = None) -> Path | None:
    """The file or folder on this host that a spec's identity names (None: synthetic or missing)."""
    source = (data_cfg.get("identity") or {}).get("source")
    if data_cfg.get("data_dir") and source == "idx":
        return resolve_data_dir(str(data_cfg["data_dir"]))
    home = (keras_home / "datasets") if keras_home is not None else cache_dir()
    if source in wdata.NPZ_SOURCES:
        return home / "mnist.npz"
    if source == "idx":
        return home / wdata.IDX_FOLDER
    return None


# --------------------------------------------------------------------------- the plan's data


def plan_problems(specs: list[Any], *, smoke: bool, allow_synthetic: bool) -> list[str]:
    """Why a plan must not start for want of data (empty: it may). One line per kind of problem."""
    missing = [s for s in specs if _identity(s).get("source") == "missing" and not s.config["data"].get("data_dir")]
    synthetic = [s for s in specs if _identity(s).get("source") == "synthetic"]
    problems = []
    how = f"Fetch MNIST first: `{FETCH_COMMAND}` (without internet: `{FETCH_COMMAND} --from PATH`)"
    if missing:
        names = sorted({s.scenario for s in missing})
        runs = f"{len(missing)} runs ({', '.join(names)}) have" if len(missing) > 1 else f"1 run ({names[0]}) has"
        problems.append(f"{runs} no data: {_identity(missing[0])['note']}")
    if synthetic and not smoke and not allow_synthetic:
        names = sorted({s.scenario for s in synthetic})
        why = _identity(synthetic[0]).get("note", "")
        problems.append(
            f"{len(synthetic)} full-size run{'s' * (len(synthetic) > 1)} ({', '.join(names)}) would train on "
            "synthetic digits, not MNIST "
            f"({why}). {how}; or accept synthetic data with --allow-synthetic"
        )
    elif missing:
        problems.append(how)
    return problems


def _identity(spec: Any) -> dict[str, Any]:
    return spec.config.get("data", {}).get("identity") or {}


def describe() -> list[str]:
    """``data show``: what the cache holds and the identity a run would get from it."""
    lines = [f"cache: {cache_dir()}"]
    if sha256_override():
        lines.append(sha256_override())
    npz, expected = npz_path(), expected_sha256()
    if npz.is_file():
        digest = _sha256_cached(npz)
        state = "verified" if digest == expected else f"WRONG, expected {expected}; not used"
        lines.append(f"mnist.npz: sha256 {digest} ({state})")
    else:
        lines.append("mnist.npz: not cached")
    folder = idx_path()
    if folder.is_dir():
        try:
            digest, stems = _idx_digest_cached(folder)
            lines.append(f"{wdata.IDX_FOLDER}/: {', '.join(stems) or 'no IDX files'} (sha256 over contents {digest})")
        except wdata.DataUnavailable as exc:
            lines.append(f"{wdata.IDX_FOLDER}/: unreadable ({exc}); not used")
    identity = identity_for({"allow_synthetic": True})
    if identity["source"] == "synthetic":
        lines.append(f"runs get: no MNIST ({identity['note']}); synthetic digits where a scenario allows them")
        lines.append(f"to train on MNIST: {FETCH_COMMAND} (without internet: {FETCH_COMMAND} --from PATH)")
    else:
        lines.append(f"runs get: {fingerprinted(identity)}")
    return lines
