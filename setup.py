"""The native extension, beside pyproject.toml (which holds everything else).

setuptools reads the package's metadata from pyproject.toml; only the C extension is
declared here, as setuptools asks. It is built by every install, ``pip install .`` and
``pip install -e .`` (``make install``) alike, with the machine's C compiler and no
dependency beyond setuptools. Warnings are errors: ``-Wall -Wextra -Werror`` and a few
more, none turned off. ``CFLAGS``/``LDFLAGS`` from the environment are added by
setuptools after these (``make sanitize`` builds with AddressSanitizer that way).
"""

from __future__ import annotations

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

# GCC and Clang (the "unix" compiler of setuptools); another compiler gets its defaults.
_STRICT = [
    "-std=c11",
    "-Wall",
    "-Wextra",
    "-Werror",
    "-Wshadow",
    "-Wpointer-arith",
    "-Wstrict-prototypes",
    "-Wmissing-prototypes",
    "-Wvla",
]


_HEADERS = [
    "asyncstream/shards/_records.h",
    "asyncstream/shards/_table.h",
    "asyncstream/shards/_member.h",
]


class _StrictBuild(build_ext):
    """build_ext with warnings as errors where the compiler takes the flags."""

    def build_extensions(self) -> None:
        if self.compiler.compiler_type == "unix":
            for extension in self.extensions:
                extension.extra_compile_args = [*_STRICT, *extension.extra_compile_args]
        super().build_extensions()


setup(
    ext_modules=[
        Extension("asyncstream.order._drawc", sources=["asyncstream/order/_drawc.c"]),
        Extension(
            "asyncstream.stream._nextc",
            sources=["asyncstream/stream/_nextc.c", "asyncstream/stream/_soonest.c"],
            depends=["asyncstream/stream/_soonest.h"],
        ),
        Extension(
            "asyncstream.shards._tarwalk",
            sources=[
                "asyncstream/shards/_tarwalk.c",
                "asyncstream/shards/_records.c",
                "asyncstream/shards/_member.c",
            ],
            depends=_HEADERS,
        ),
        # The batch sink reads a chunk's records through _records.h's C sink protocol.
        Extension(
            "dali_ops._batchc",
            sources=["dali_ops/_batchc.c"],
            include_dirs=["asyncstream/shards"],
            depends=_HEADERS,
        ),
    ],
    cmdclass={"build_ext": _StrictBuild},
)
