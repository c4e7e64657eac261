"""Build of ferry._core against libferry.

The library is found with pkg-config (``ferry.pc``; set PKG_CONFIG_PATH for a
prefix outside the default search path).  Build-tree mode, for ``make check``
and for trying a build without installing it: FERRY_BUILDDIR names the
configured build directory (and FERRY_SRCDIR the source tree, default: the
parent of this folder); the extension then links that tree's
``.libs/libferry.so`` with an rpath to it.
"""

import os
import shlex
import subprocess

from setuptools import Extension, setup

HERE = os.path.dirname(os.path.abspath(__file__))
os.chdir(HERE)  # the sources are named relative to this folder
SOURCES = [os.path.join("src", name) for name in
           ("module.c", "errors.c", "engine.c", "memory.c", "segment.c", "request.c",
            "batch.c", "stats.c", "storage.c")]


def pkg_config(*args):
    try:
        out = subprocess.run(["pkg-config", *args, "ferry"], check=True,
                             capture_output=True, text=True).stdout
    except (OSError, subprocess.CalledProcessError) as error:
        raise SystemExit(
            "ferry: pkg-config cannot find ferry.pc (install Ferry, set PKG_CONFIG_PATH to "
            "its lib/pkgconfig, or set FERRY_BUILDDIR to a build tree): %s" % error)
    return shlex.split(out)


def library_flags():
    builddir = os.environ.get("FERRY_BUILDDIR")
    if builddir:
        srcdir = os.environ.get("FERRY_SRCDIR") or os.path.dirname(HERE)
        libdir = os.path.join(os.path.abspath(builddir), ".libs")
        return dict(include_dirs=[os.path.join(srcdir, "include")], library_dirs=[libdir],
                    libraries=["ferry"], runtime_library_dirs=[libdir])
    flags = dict(include_dirs=[], library_dirs=[], libraries=[], runtime_library_dirs=[])
    for flag in pkg_config("--cflags") + pkg_config("--libs"):
        if flag.startswith("-I"):
            flags["include_dirs"].append(flag[2:])
        elif flag.startswith("-L"):
            flags["library_dirs"].append(flag[2:])
            # an install outside the loader's path still loads
            if flag[2:] not in ("/usr/lib", "/usr/lib64", "/usr/lib/x86_64-linux-gnu"):
                flags["runtime_library_dirs"].append(flag[2:])
        elif flag.startswith("-l"):
            flags["libraries"].append(flag[2:])
    return flags


setup(
    ext_modules=[Extension(
        "ferry._core", sources=SOURCES, depends=[os.path.join("src", "ferry_py.h")],
        extra_compile_args=["-std=gnu11", "-Wall", "-Wextra", "-Wno-missing-field-initializers",
                            "-Wno-cast-function-type"],
        **library_flags())],
)
