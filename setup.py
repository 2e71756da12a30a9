"""The build's one step beyond pyproject.toml: a wheel carries the image recipes and the locks.

``docker/`` (the image catalog, Dockerfile and locks) and ``requirements/`` (the environment locks)
live at the top of the repository, where ``run_all.sh`` and the docs name them. A built package
has no repository around it, so the wheel gets a copy of both as ``suite/_data/`` (found by
``suite/paths.py``). An editable install reads them from the checkout and copies nothing.
"""

import shutil
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py

DATA_FOLDERS = ("docker", "requirements")


class BuildWithData(build_py):
    def run(self) -> None:
        super().run()
        if getattr(self, "editable_mode", False):
            return
        top = Path(__file__).resolve().parent
        for name in DATA_FOLDERS:
            target = Path(self.build_lib) / "suite" / "_data" / name
            shutil.rmtree(target, ignore_errors=True)  # a file deleted since the last build must not ship
            shutil.copytree(top / name, target, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))


setup(cmdclass={"build_py": BuildWithData})
