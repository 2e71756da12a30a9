"""The Docker tests' image, built without any registry by the product's own Debian route.

The test engine has no images and cannot pull, so the base is the one ``suite.environment.debian_base`` makes
for the ``tf2.21-cpu`` image (a debootstrapped bookworm root with that image's hash-locked packages,
``docker/locks/tf2.21-cpu.txt``, installed by the host's pip with ``--require-hashes``, imported into
the engine and tagged by a hash of its recipe: a second run finds it in a second instead of minutes).
It is the same base ``python -m suite images build`` makes for ``tf2.21-cpu`` where no registry
answers, so the tests and the product share it.

The project's ``docker/Dockerfile`` is then built on top of it with ``INSTALL=0`` and a base
override, tagged ``suite-bench:tf2.21-cpu-x<hash>``: it never stands in for the real image. Its
checks (every package of the lock installed at the lock's version; TensorFlow, Keras and NumPy
import) run in that build.

Run directly to (re)build and print the tags: ``python tests/docker_base.py``.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parents[1]
if str(REPO_ROOT) not in sys.path:  # when run as a script
    sys.path.insert(0, str(REPO_ROOT))

from suite.environment import debian_base, image_catalog  # noqa: E402 - after the path set-up above

TEST_VARIANT = "tf2.21-cpu"  # the images.yaml entry built on top: the CPU image the worker's runs use

BaseImageError = debian_base.DebianBaseError


def recipe() -> debian_base.DebianRecipe:
    """The product's Debian recipe for the test variant."""
    return debian_base.recipe_for(image_catalog.load_catalog().get(TEST_VARIANT))


def base_tag() -> str:
    return recipe().tag()


def ensure_base_image(client: Any, progress: Callable[[str], None] = print) -> str:
    """The tag of the registry-free base image, built only when the engine does not have it."""
    return debian_base.ensure(client, recipe(), progress)


def ensure_test_image(client: Any, progress: Callable[[str], None] = print) -> str:
    """The project's Dockerfile built on the base above; returns the image tag the tests run."""
    from suite.environment import images

    base = ensure_base_image(client, progress)
    try:
        built = images.build_images(
            [TEST_VARIANT], base_override={"BASE_IMAGE": base, "INSTALL": "0"}, progress=progress, client=client
        )
    except images.ImageError as exc:
        raise BaseImageError(str(exc)) from None
    return built[0]["tag"]


if __name__ == "__main__":
    import docker

    engine = docker.from_env()
    print(ensure_base_image(engine))
    print(ensure_test_image(engine))
