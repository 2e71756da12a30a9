"""The shipped KubeRay manifest, ``docs/cluster/raycluster.yaml``, against the RayCluster CRD's OpenAPI
schema of a pinned KubeRay release, and against what the suite itself pins and builds.

No Kubernetes cluster runs here. The schema is KubeRay's own file, vendored unchanged (gzipped) in
``tests/fixtures/kuberay/``: ``ray-operator/config/crd/bases/ray.io_rayclusters.yaml`` of
github.com/ray-project/kuberay at tag v1.5.2 (commit 9f65eca1d6226d20f9e7c340f2af27cc4a1c9985;
sha256 of the file 9b5ada939fdfd0edb5a6cf48f24a63bd792254c264967dd0930155a3941c2557, the same file
as v1.5.1's; Apache-2.0), of the 1.5 line the manifest's comment names (v1.5.0's file differs).
Undeclared fields are errors, as under ``kubectl apply``'s default strict field validation (this CRD
preserves unknown fields nowhere); list-map keys and CEL rules are not checked.
"""

from __future__ import annotations

import copy
import gzip
import hashlib
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml

from suite.spec import names

REPO = Path(__file__).resolve().parents[1]
MANIFEST = REPO / "docs" / "cluster" / "raycluster.yaml"
DOCKERFILE = REPO / "docs" / "cluster" / "Dockerfile"
CRD = REPO / "tests" / "fixtures" / "kuberay" / "ray.io_rayclusters-v1.5.2.yaml.gz"
CRD_SHA256 = "9b5ada939fdfd0edb5a6cf48f24a63bd792254c264967dd0930155a3941c2557"


def _strict(schema: Any) -> Any:
    """The schema with every declared object closed (``additionalProperties: false``), as the API
    server's strict field validation treats it, except where it keeps unknown fields."""
    if isinstance(schema, dict):
        out = {k: _strict(v) for k, v in schema.items()}
        if (
            "properties" in out
            and "additionalProperties" not in out
            and not out.get("x-kubernetes-preserve-unknown-fields")
        ):
            out["additionalProperties"] = False
        return out
    if isinstance(schema, list):
        return [_strict(v) for v in schema]
    return schema


@pytest.fixture(scope="module")
def validator() -> jsonschema.Draft7Validator:
    raw = gzip.decompress(CRD.read_bytes())
    assert hashlib.sha256(raw).hexdigest() == CRD_SHA256, "the vendored CRD is not KubeRay v1.5.2's file"
    crd = yaml.safe_load(raw)
    (version,) = [v for v in crd["spec"]["versions"] if v["name"] == "v1"]
    return jsonschema.Draft7Validator(_strict(version["schema"]["openAPIV3Schema"]))


def _manifest() -> dict[str, Any]:
    return yaml.safe_load(MANIFEST.read_text(encoding="utf-8"))


def _problems(validator: jsonschema.Draft7Validator, doc: dict[str, Any]) -> list[str]:
    return [f"{'.'.join(map(str, e.absolute_path))}: {e.message}" for e in validator.iter_errors(doc)]


def _containers(doc: dict[str, Any]) -> list[dict[str, Any]]:
    groups = [doc["spec"]["headGroupSpec"], *doc["spec"]["workerGroupSpecs"]]
    return [c for g in groups for c in g["template"]["spec"]["containers"]]


def test_the_manifest_passes_the_raycluster_schema(validator: jsonschema.Draft7Validator) -> None:
    doc = _manifest()
    assert doc["apiVersion"] == "ray.io/v1" and doc["kind"] == "RayCluster"
    assert _problems(validator, doc) == []


@pytest.mark.parametrize(
    ("path", "value", "said"),
    [
        (("spec", "workerGroupSpecs", 0, "replica"), 2, "'replica' was unexpected"),
        (("spec", "workerGroupSpecs", 0, "replicas"), "2", "'2' is not of type 'integer'"),
        (("spec", "headGroupSpec", "rayStartParams", "num-cpus"), 0, "0 is not of type 'string'"),
    ],
)
def test_the_schema_check_catches_a_slip(
    validator: jsonschema.Draft7Validator, path: tuple[Any, ...], value: Any, said: str
) -> None:
    # The check can fail: a misspelt field, and a number where KubeRay wants a string, and back.
    doc = copy.deepcopy(_manifest())
    node = doc
    for key in path[:-1]:
        node = node[key]
    node[path[-1]] = value
    assert any(said in p for p in _problems(validator, doc)), _problems(validator, doc)


def test_the_manifest_matches_what_the_suite_pins_and_builds() -> None:
    doc = _manifest()
    # One image serves head and workers: the one docs/cluster/Dockerfile's build line tags.
    images = {c["image"] for c in _containers(doc)}
    built = re.findall(r"docker build -f docs/cluster/Dockerfile -t (\S+) \.", DOCKERFILE.read_text())
    assert images == set(built) and len(images) == 1, (images, built)
    # The image installs a lock that exists, for its base image's Python, and that lock's Ray is the
    # manifest's rayVersion.
    text = DOCKERFILE.read_text()
    (lock,) = re.findall(r"^ARG LOCK=(\S+)$", text, re.M)
    (base,) = re.findall(r"^ARG BASE_IMAGE=python:(\d+\.\d+)-", text, re.M)
    assert lock.endswith(f"-py{base}.txt") and (REPO / lock).is_file(), (lock, base)
    (ray_pin,) = re.findall(r"^ray==(\S+) ", (REPO / lock).read_text(), re.M)
    assert doc["spec"]["rayVersion"] == ray_pin
    # The one pip install of the recipe installs that lock, hash-checked, wheels only.
    (install,) = [ln for ln in text.splitlines() if ln.startswith("RUN ") and "pip install" in ln]
    words = install.split()
    assert {"--require-hashes", "--only-binary", ":all:"} <= set(words) and words[words.index("-r") + 1] == '"$LOCK"'
    # What the build context leaves out: a checkout's venv and results never enter the image.
    ignored = (DOCKERFILE.parent / "Dockerfile.dockerignore").read_text().split()
    assert {".venv", "reports/results"} <= set(ignored), ignored


def test_the_manifest_gives_the_nodes_what_the_ray_backend_needs() -> None:
    spec = _manifest()["spec"]
    head = spec["headGroupSpec"]
    assert "suite_slot" not in head.get("resources", {}) and head["rayStartParams"]["num-cpus"] == "0"
    for group in spec["workerGroupSpecs"]:
        resources = group["resources"]
        assert resources["suite_slot"] == "1", group["groupName"]
        assert names.is_safe(group["labels"]["suite-machine"]), group["labels"]
        (container,) = group["template"]["spec"]["containers"]
        models = {k.split(":", 1)[1]: v for k, v in resources.items() if k.startswith("gpu_model:")}
        gpus = str(container["resources"]["limits"].get("nvidia.com/gpu", 0))
        assert all(count == gpus for count in models.values()), (models, gpus)
        # Ray resources and node labels belong to the group's own keys, not to rayStartParams.
        assert not {"resources", "labels"} & set(group.get("rayStartParams", {}))


def test_the_probe_command_is_one_the_pinned_ray_has() -> None:
    ray = Path(sys.executable).parent / "ray"
    if not ray.is_file():
        pytest.skip("the ray command is not next to this Python (the dev lock installs it)")
    commands = {c["livenessProbe"]["exec"]["command"][-1].split(" --address")[0] for c in _containers(_manifest())}
    assert commands == {"ray health-check"}
    proc = subprocess.run([str(ray), "health-check", "--help"], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0 and "--address" in proc.stdout, proc.stderr
