"""The GPU image tf2.21-cuda12.5, built as ``python -m suite images build`` builds it, checked inside.

No GPU is needed: TensorFlow's build facts, the CUDA libraries it opens at start and a CPU point
are all checkable without one. The build is long and large (the skip reason gives the figures
measured on a machine without a registry), so the test runs only when asked: SUITE_GPU_IMAGE_TEST=1.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest
from docker_fixtures import engine_client, small_specs  # noqa: F401 - fixtures

from suite.backends.docker import DockerBackend
from suite.environment import images

NAME = "tf2.21-cuda12.5"
SKIP_REASON = (
    "builds the tf2.21-cuda12.5 image: 9 min 12 s cold without a registry on 2 shared cores, downloading "
    "2.6 GB of wheels (TensorFlow and the CUDA 12.5 / cuDNN 9.3 ones) and taking 5.25 GB on the engine; "
    "17 s once the image is built; set SUITE_GPU_IMAGE_TEST=1 to run it"
)

pytestmark = [
    pytest.mark.docker,
    pytest.mark.slow,
    pytest.mark.skipif(os.environ.get("SUITE_GPU_IMAGE_TEST") != "1", reason=SKIP_REASON),
]

# The CUDA libraries TensorFlow opens with dlopen when it starts on a GPU, by name and the so-version
# it was built with: XLA's tsl/platform/default/dso_loader.cc (GetCudaRuntimeDsoHandle ... GetNcclDsoHandle)
# loads lib<name>.so.<version>. The driver's libcuda.so.1 is not in the image: the NVIDIA Container
# Toolkit injects it at run time.
CUDA_LIBRARIES = {
    "cudart": "12",
    "cublas": "12",
    "cublasLt": "12",
    "cufft": "11",
    "cusolver": "11",
    "cusparse": "12",
    "cupti": "12",
    "cudnn": "9",
    "nccl": "2",
}
# cuDNN 9's own parts, which libcudnn.so.9 opens from its directory when a cuDNN call first needs them.
CUDNN_PARTS = {
    f"cudnn_{part}": "9"
    for part in ("graph", "ops", "cnn", "adv", "heuristic", "engines_precompiled", "engines_runtime_compiled")
}

# Runs inside the image: TensorFlow's build facts, the CUDA wheels' versions, and for each library
# where it is (in a directory of the RUNPATH TensorFlow's own libraries carry: where their dlopen
# looks, LD_LIBRARY_PATH aside) and whether it loads.
CHECK = r"""
import ctypes, glob, json, os, struct, sys
from importlib import metadata
import tensorflow as tf

def runpath(path):
    # DT_RUNPATH (or DT_RPATH) of an ELF64 little-endian shared object, $ORIGIN expanded.
    with open(path, "rb") as f:
        def read(offset, size):
            f.seek(offset)
            return f.read(size)
        shoff, = struct.unpack("<Q", read(0x28, 8))
        shentsize, shnum = struct.unpack("<HH", read(0x3A, 4))
        sections = [struct.unpack("<IIQQQQIIQQ", read(shoff + i * shentsize, 64)) for i in range(shnum)]
        for s in sections:
            if s[1] != 6:  # SHT_DYNAMIC; its sh_link is the string table
                continue
            strtab = sections[s[6]]
            strings = read(strtab[4], strtab[5])
            dynamic = read(s[4], s[5])
            for off in range(0, len(dynamic), 16):
                tag, val = struct.unpack_from("<qQ", dynamic, off)
                if tag in (15, 29):  # DT_RPATH, DT_RUNPATH
                    text = strings[val:strings.index(b"\0", val)].decode()
                    origin = os.path.dirname(path)
                    return [os.path.normpath(p.replace("$ORIGIN", origin)) for p in text.split(":") if p]
    return []

libs = json.loads(sys.argv[1])
tf_dir = os.path.dirname(tf.__file__)
# The dlopen calls are in TensorFlow's own shared objects; each may carry the search path.
objects = sorted(glob.glob(os.path.join(tf_dir, "*.so*")) + glob.glob(os.path.join(tf_dir, "python", "*.so")))
dirs = list(dict.fromkeys(d for o in objects for d in runpath(o)))
found = {}
for name, version in libs.items():
    soname = f"lib{name}.so.{version}"
    where = [os.path.join(d, soname) for d in dirs if os.path.exists(os.path.join(d, soname))]
    entry = {"soname": soname, "path": where[0] if where else None, "loads": False, "error": None}
    if where:
        try:
            ctypes.CDLL(where[0], mode=ctypes.RTLD_GLOBAL)
            entry["loads"] = True
        except OSError as exc:
            entry["error"] = str(exc)
    found[name] = entry
wheels = {d.metadata["Name"]: d.version for d in metadata.distributions() if d.metadata["Name"].startswith("nvidia-")}
print(json.dumps({
    "build_info": {k: v for k, v in tf.sysconfig.get_build_info().items() if isinstance(v, (str, bool))},
    "tensorflow": tf.__version__,
    "objects": [os.path.basename(o) for o in objects],
    "runpath": dirs,
    "libraries": found,
    "wheels": wheels,
    "gpus": [d.name for d in tf.config.list_physical_devices("GPU")],
}))
"""


@pytest.fixture(scope="module", name="gpu_image")
def gpu_image_fixture(client: Any) -> str:
    rows = images.build_images([NAME], client=client, progress=lambda line: print(line, flush=True))
    return rows[0]["tag"]


def _inside(client: Any, image: str) -> dict[str, Any]:
    out = client.containers.run(
        image,
        ["python3", "-c", CHECK, json.dumps({**CUDA_LIBRARIES, **CUDNN_PARTS})],
        network_mode="none",
        environment={"CUDA_VISIBLE_DEVICES": "", "TF_CPP_MIN_LOG_LEVEL": "3"},
        remove=True,
        stderr=False,
    )
    return json.loads(out.decode().strip().splitlines()[-1])


def test_tensorflow_reports_cuda_12_5_and_cudnn_9_3(client: Any, gpu_image: str) -> None:
    facts = _inside(client, gpu_image)
    info = facts["build_info"]
    assert facts["tensorflow"] == "2.21.0"
    assert info["is_cuda_build"] is True, info
    assert info["cuda_version"].startswith("12.5"), info
    assert info["cudnn_version"].split(".")[0] == "9", info  # TensorFlow records the major version only
    wheels = facts["wheels"]
    assert wheels["nvidia-cudnn-cu12"].startswith("9.3."), wheels  # the minor comes from the pinned wheel
    assert wheels["nvidia-cuda-runtime-cu12"].startswith("12.5."), wheels
    assert facts["gpus"] == []  # no GPU here, and no driver in the image


def test_every_cuda_library_tensorflow_opens_is_there_and_loads(client: Any, gpu_image: str) -> None:
    facts = _inside(client, gpu_image)
    assert set(facts["libraries"]) == set(CUDA_LIBRARIES) | set(CUDNN_PARTS)
    assert facts["runpath"], f"none of TensorFlow's libraries {facts['objects']} carries a RUNPATH"
    missing = {name: e for name, e in facts["libraries"].items() if not e["path"]}
    assert missing == {}, f"not in TensorFlow's RUNPATH {facts['runpath']}: {missing}"
    broken = {name: e["error"] for name, e in facts["libraries"].items() if not e["loads"]}
    assert broken == {}, broken


def test_cpu_point_runs_ok_in_the_gpu_image(client: Any, gpu_image: str, tmp_path: Path) -> None:
    spec = small_specs(tmp_path, name="gpu_image_cpu_point")[0]
    backend = DockerBackend(machine="test", results_dir=tmp_path, image=gpu_image)
    try:
        result = backend.run(spec)
    finally:
        backend.close()
    assert result.status == "ok", (result.message, result.log_tail)
    assert result.run["image_labels"]["suite.image"] == NAME
    assert result.environment["versions"]["tensorflow"] == "2.21.0"
    assert result.environment["devices"]["gpus"] == []
