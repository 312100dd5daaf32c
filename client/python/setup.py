# dte: Python side of dted.  A plain setup.py (no pyproject build isolation)
# so `pip install client/python` (or `pip wheel --no-build-isolation`) works
# offline with Debian's setuptools, in a venv made with --system-site-packages
# (torch and numpy come from Debian).
#
# The installed package is the client side only: dte._lib (finds libdte by
# itself: DTE_LIB, the libdte0 package, the loader path; see its docstring),
# source, sink, shard, shm, trainers and dte.integrations.  The test and demo
# stand-ins (STANDINS below) stay in the source tree, where the tests and
# `make demo` import them with client/python on sys.path.
from setuptools import setup
from setuptools.command.build_py import build_py

# dte.<module>s that are test/demo stand-ins, not part of the installed package
# (packaging/mkdeb.sh leaves the same ones out of python3-dte).
STANDINS = ("checks", "demo", "megatron", "qwen3", "sglang", "toy")


class build_py_without_standins(build_py):
    """build_py (and so wheel and sdist) without the dte.<STANDINS> modules."""

    def find_package_modules(self, package, package_dir):
        return [m for m in super().find_package_modules(package, package_dir)
                if not (m[0] == "dte" and m[1] in STANDINS)]


setup(
    name="dte",
    version="0.1.0",
    description="dted client: trainer/inference helpers for sparse weight sync",
    license="Apache-2.0",
    classifiers=["License :: OSI Approved :: Apache Software License"],
    packages=["dte", "dte.integrations"],
    python_requires=">=3.9",
    # vLLM's general plugin (vllm/plugins/__init__.py load_general_plugins):
    # registers the "dted" weight transfer backend in every vLLM process.
    entry_points={"vllm.general_plugins": ["dted = dte.integrations.vllm_transfer:register"]},
    # torch as the trainer/engine already has it (any CUDA or CPU build,
    # Debian's 1.13.0a0 too: no lower bound a pre-release would miss);
    # engines are extras and not pinned: the integrations check at run time.
    install_requires=["torch"],
    extras_require={
        "vllm": ["vllm"],
        "sglang": ["sglang"],
        "megatron": ["megatron-core"],
    },
    cmdclass={"build_py": build_py_without_standins},
)
