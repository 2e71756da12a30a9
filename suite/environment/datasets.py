"""MNIST on the host: the cache and the data's identity (the download and imports: ``mnist_fetch``).

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

import os
from pathlib import Path
from typing import Any

from suite import paths
from suite.worker import data as wdata  # one definition of the digests, shared with the worker

# The expected sha256 of mnist.npz, replaceable so that tests can serve small files of their own
# (the real 11 MB file cannot be shipped with the tests). A file accepted under another hash is not
# called mnist.npz: its identity's source is wdata.NPZ_OVERRIDE_SOURCE, which the fingerprint, the
# result's data source and the report all show, and `data show` / `data fetch` say the override is on.
SHA_ENV = "SUITE_MNIST_SHA256"
FETCH_COMMAND = "python -m suite data fetch"
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


# --------------------------------------------------------------------------- identity


_digests: dict[tuple[str, int, int], str] = {}
_idx_digests: dict[tuple[str, tuple], tuple[str, list[str]]] = {}


def sha256_cached(path: Path) -> str:
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
        digest = sha256_cached(npz)
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
        digest = sha256_cached(npz)
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
        kept = fingerprinted(identity)
        lines.append(f"runs get: {kept['source']}, sha256 {kept.get('sha256', 'not known')}")
    return lines
