"""--container_image and its companions: the node step in a container (pyxis + enroot, `srun --container-image`).

Pure, apart from looking at local files: the image (a squashfs path, else a registry reference), the mounts the
launcher adds without being asked (every host path the node step touches, at the same path), pyxis's srun options,
and what the bundle records of the image. Only the node step runs in the container; the batch script stays on the
host, where srun and scontrol are (docs/containers.md).
"""

from __future__ import annotations

import hashlib
import os
import re

from launcher.problems import Problem

# enroot's URI: [docker://|dockerd://|podman://][USER@][REGISTRY#]IMAGE[:TAG][@DIGEST]; pyxis also takes REGISTRY/IMAGE
SCHEMES = ("docker://", "dockerd://", "podman://")
REFERENCE = re.compile(
    r"^(?:[\w.-]+@)?(?:[a-z0-9.-]+(?::\d+)?#)?[a-z0-9]+(?:[._-]+[a-z0-9]+)*(?:[/:.][a-z0-9]+(?:[._-]+[a-z0-9]+)*)*"
    r"(?::[\w][\w.-]{0,127})?(?:@sha256:[0-9a-f]{64})?$"
)
MOUNT_FLAGS = {"ro", "rw", "private", "rprivate", "slave", "rslave", "shared", "rshared", "nosuid", "nodev", "noexec"}
SYSTEM_PREFIXES = ("/usr", "/usr/local", "/")  # a Python there is the image's own: not mounted over the image's
ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
COMPANIONS = ("container_mounts", "container_workdir", "container_env", "container_writable")


def is_file_image(image: str) -> bool:
    """pyxis's rule: a squashfs file starts with / or . (anything else is a registry reference)."""
    return image.startswith(("/", "."))


def image_problems(image: str) -> list[Problem]:
    if is_file_image(image):
        if not os.path.isfile(image):
            what = "is a directory, not a squashfs file" if os.path.isdir(image) else "does not exist"
            return [
                Problem(
                    "container_image",
                    f"{image} {what}",
                    "give an image file (.sqsh; `enroot import`) or a registry reference like "
                    "nvcr.io#nvidia/pytorch:24.01-py3",
                )
            ]
        if not os.access(image, os.R_OK):
            return [
                Problem(
                    "container_image",
                    f"{image} is not readable",
                    f"chmod a+r {image}, or copy it where the nodes can read it",
                )
            ]
        return []
    bare = next((image[len(s) :] for s in SCHEMES if image.startswith(s)), image)
    if not REFERENCE.match(bare):
        return [
            Problem(
                "container_image",
                f"{image!r} is neither a file (starting with / or .) nor a registry reference",
                "give a path to a .sqsh image, or a reference like nvcr.io#nvidia/pytorch:24.01-py3 or ubuntu:24.04",
            )
        ]
    return []


def parse_mounts(text: str | None) -> list[tuple[str, str, str]]:
    """`SRC[:DST[:FLAGS]]`, comma-separated (pyxis's --container-mounts) -> (src, dst, flags)."""
    out = []
    for item in (text or "").split(","):
        if item.strip():
            src, _, rest = item.strip().partition(":")
            dst, _, flags = rest.partition(":")
            out.append((src, dst or src, flags))
    return out


def mount_problems(text: str | None) -> list[Problem]:
    out = []
    for src, dst, flags in parse_mounts(text):
        if not os.path.isabs(src) or not os.path.isabs(dst):
            out.append(
                Problem(
                    "container_mounts",
                    f"{src}:{dst}: both sides must be absolute paths",
                    "give /host/path[:/container/path[:ro]]",
                )
            )
        elif not os.path.exists(src):
            out.append(
                Problem(
                    "container_mounts",
                    f"{src} does not exist on this host",
                    f"create it, or drop {src} from --container_mounts",
                )
            )
        bad = [f for f in flags.split("+") if f and f not in MOUNT_FLAGS]
        if bad:
            out.append(
                Problem(
                    "container_mounts",
                    f"{src}: unknown mount option {', '.join(bad)}",
                    f"use {', '.join(sorted(MOUNT_FLAGS))}, joined by +",
                )
            )
    return out


def python_prefixes(python: str) -> list[str]:
    """The installation a host Python lives in (PREFIX/bin/python), a virtual environment's base too; none for a
    Python of the system's own directories (the image's)."""
    found = []
    for exe in (os.path.abspath(python), os.path.realpath(python)):
        found.append(os.path.dirname(os.path.dirname(exe)))
    cfg = os.path.join(found[0], "pyvenv.cfg")
    if os.path.isfile(cfg):
        with open(cfg, encoding="utf-8") as f:
            homes = [line.split("=", 1)[1].strip() for line in f if line.split("=", 1)[0].strip() == "home"]
        found += [os.path.dirname(home) for home in homes]
    return [
        p for p in dict.fromkeys(found) if p not in SYSTEM_PREFIXES and not p.startswith(("/usr/", "/bin", "/sbin"))
    ]


def needed_mounts(paths: list[str]) -> list[str]:
    """Each path once, none below another (its parent is mounted whole), in the order given.

    The order is the caller's, not the names': a sorted list would move the checkout among the other mounts with
    the directory it was cloned into.
    """
    unique = list(dict.fromkeys(os.path.abspath(p) for p in paths))

    def below(path: str, other: str) -> bool:
        return path != other and path.startswith(other.rstrip("/") + "/")

    return [p for p in unique if not any(below(p, other) for other in unique)]


def unsafe_paths(paths: list[str]) -> list[str]:
    """Paths pyxis's --container-mounts cannot carry (its separators)."""
    return [p for p in paths if "," in p or ":" in p]


def srun_options(
    image: str, paths: list[str], mounts: str | None, workdir: str | None, env: str | None, writable: bool
) -> list[str]:
    """pyxis's options for the node step's srun: the image, the launcher's mounts then the user's, and the rest."""
    entries = [f"{p}:{p}" for p in needed_mounts(paths)]
    entries += [f"{s}:{d}" + (f":{f}" if f else "") for s, d, f in parse_mounts(mounts)]
    out = [f"--container-image={os.path.abspath(image) if is_file_image(image) else image}"]
    out.append(f"--container-mounts={','.join(entries)}")
    if workdir:
        out.append(f"--container-workdir={workdir}")
    if env:
        out.append(f"--container-env={env}")
    if writable:
        out.append("--container-writable")
    return out


def env_problems(env: str | None, workdir: str | None) -> list[Problem]:
    out = []
    bad = [n for n in (env or "").split(",") if n and not ENV_NAME.match(n)]
    if bad:
        out.append(
            Problem(
                "container_env",
                f"{', '.join(bad)} not environment variable names",
                "give NAME[,NAME...]: the host's values of these replace the image's",
            )
        )
    if workdir and not os.path.isabs(workdir):
        out.append(
            Problem(
                "container_workdir",
                f"{workdir} is not an absolute path",
                "give an absolute directory inside the container",
            )
        )
    return out


def record(image: str) -> dict[str, str]:
    """What the bundle keeps of the image: its path and sha256 (a file), or the reference as given."""
    if not is_file_image(image):
        return {"reference": image}
    digest = hashlib.sha256()
    with open(image, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return {"path": os.path.abspath(image), "sha256": digest.hexdigest()}


def problems(c: object, python: str | None) -> list[Problem]:
    """Every problem with the container flags (`c`: the ContainerArgs group) and the interpreter they call."""
    image = getattr(c, "container_image", None)
    if not image:
        given = [name for name in COMPANIONS if getattr(c, name, None)]
        return [
            Problem(name, "has no effect without --container_image", "give --container_image, or drop it")
            for name in given
        ]
    out = image_problems(image) + mount_problems(getattr(c, "container_mounts", None))
    out += env_problems(getattr(c, "container_env", None), getattr(c, "container_workdir", None))
    if python and not os.path.isabs(python):
        out.append(
            Problem(
                "python",
                f"{python!r} would be looked up on the image's PATH, not yours",
                "give an absolute path (a Python in the image, or on a host path the nodes see)",
            )
        )
    return out
