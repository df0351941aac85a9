"""click parameter types: option values are checked while the command line is parsed.

The rule for exit codes (README, "Exit codes"): a value of the wrong *form* -- not a
``ROLE=DIR``, an unknown GPU target, a relative path where the server needs an absolute one,
serve args vLLM would not take -- is a usage error (click's ``BadParameter``, exit 2), reported
before anything runs.  A value of the right form naming something that is not there (a missing
directory) is bad input (``BadInput``, exit 3).  Numbers use click's own ``IntRange`` /
``FloatRange`` (``POSITIVE_INT``, ``NON_NEGATIVE_SECONDS``).
"""

from __future__ import annotations

import os
import stat
from pathlib import Path, PurePosixPath

import click

from cachebake.errors import BadInput, from_os_error

POSITIVE_INT = click.IntRange(min=1)
NON_NEGATIVE_SECONDS = click.FloatRange(min=0.0)
POSITIVE_SECONDS = click.FloatRange(min=0.0, min_open=True)


class RoleDirType(click.ParamType):
    """``ROLE=DIR`` or a bare ``DIR`` (a Triton cache) -> ``CacheRoot``; ROLE is a known cache
    role and DIR an existing directory."""

    name = "[ROLE=]DIR"

    def convert(self, value, param, ctx):
        from cachebake.artifact.snapshot import CacheRoot
        from cachebake.roles import ROLE_ENV

        if isinstance(value, CacheRoot):
            return value
        role, sep, path = str(value).partition("=")
        if not sep:
            role, path = "triton", str(value)
        if role not in ROLE_ENV:
            self.fail(f"unknown cache role {role!r} in {value!r} (known: {', '.join(ROLE_ENV)})",
                      param, ctx)
        if not path:
            self.fail(f"empty path in {value!r}", param, ctx)
        try:
            is_dir = stat.S_ISDIR(os.stat(path).st_mode)
        except FileNotFoundError:
            raise BadInput(f"{path}: no such directory") from None
        except OSError as e:  # e.g. a parent this user cannot enter
            raise from_os_error(e, path) from None
        if not is_dir:
            raise BadInput(f"{path}: not a directory")
        return CacheRoot(role, Path(path))


class GpuTargetType(click.ParamType):
    """A GPU target that exists (``sm_90``, ``cuda:90``, ``gfx942``) -> its key, ``cuda:90``."""

    name = "TARGET"

    def convert(self, value, param, ctx):
        from cachebake.gpu import GPUTargetSpec

        try:
            return GPUTargetSpec.parse(str(value)).key
        except BadInput as e:
            self.fail(str(e), param, ctx)


class AbsolutePathType(click.ParamType):
    """An absolute path, normalized: where a server (or a mount) sees a directory.  A relative
    one would be resolved against whatever directory the server happens to start in.  No
    control characters: a newline in a server path is never a real directory, and it would
    end a line of the YAML, shell or terminal text the path is written into."""

    name = "ABSOLUTE_PATH"

    def convert(self, value, param, ctx):
        from cachebake.serve.command import one_line

        text = os.fspath(value)
        if one_line(text) != text:
            self.fail(f"{ascii(text)} holds a control character: not a path a server reads",
                      param, ctx)
        if not PurePosixPath(text).is_absolute():
            self.fail(f"{text!r} is not an absolute path (the server resolves it, not this "
                      "shell)", param, ctx)
        return os.path.normpath(text)


class KubernetesFormType(click.ParamType):
    """A value Kubernetes takes in one form only (cachebake.distribute.k8s.FORMS: names,
    Secret names, quantities): checked here, so a bad one is a usage error naming the option,
    not a manifest the API server refuses."""

    def __init__(self, name: str, form: str):
        self.name, self.form = name, form

    def convert(self, value, param, ctx):
        from cachebake.distribute.k8s import form_error

        why = form_error(self.form, str(value))
        if why:
            self.fail(why, param, ctx)
        return str(value)


class ImageNameType(click.ParamType):
    """A container image name (``[HOST[:PORT]/]REPO[:TAG][@DIGEST]``, Docker's grammar)."""

    name = "IMAGE"

    def convert(self, value, param, ctx):
        from cachebake.distribute.registry import is_image_name

        text = str(value)
        if not is_image_name(text):
            self.fail(f"{ascii(text)} is not an image name ([HOST[:PORT]/]REPO[:TAG][@DIGEST], "
                      "lower-case repository)", param, ctx)
        return text


class ServeArgsType(click.ParamType):
    """vLLM serving arguments, as JSON or ``vllm serve`` flags -> a checked dict."""

    name = "SERVE_ARGS"

    def convert(self, value, param, ctx):
        from cachebake.vllm.serveargs import parse_serve_args, validate_serve_args

        if isinstance(value, dict):
            return value
        try:
            return validate_serve_args(parse_serve_args(str(value)))
        except BadInput as e:
            self.fail(str(e), param, ctx)


class GpuMemoryType(click.ParamType):
    """``plan --gpu-memory``: GiB (a Hopper GPU of that size) or a known memory class."""

    name = "GIB|CLASS"

    def convert(self, value, param, ctx):
        from cachebake.vllm.kernels.plan import GPU_CLASSES, gpu_target

        try:
            gpu_target(value)
        except BadInput:
            self.fail(f"{ascii(str(value))}: give GiB (e.g. 80) or a class ({', '.join(GPU_CLASSES)})",
                      param, ctx)
        return str(value)


K8S_NAME = KubernetesFormType("NAME", "name")
SECRET_NAME = KubernetesFormType("SECRET", "secret")
CLAIM_NAME = KubernetesFormType("CLAIM", "claim")
QUANTITY = KubernetesFormType("QUANTITY", "quantity")
IMAGE_NAME = ImageNameType()
ROLE_DIR = RoleDirType()
GPU_TARGET = GpuTargetType()
ABSOLUTE_PATH = AbsolutePathType()
SERVE_ARGS = ServeArgsType()
GPU_MEMORY = GpuMemoryType()
