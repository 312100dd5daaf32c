# dte: Python side of dted.  A plain setup.py (no pyproject build isolation)
# so `pip install client/python` works offline with Debian's setuptools, in a
# venv made with --system-site-packages (torch and numpy come from Debian).
from setuptools import setup

setup(
    name="dte",
    version="0.1.0",
    description="dted client: trainer/inference helpers for sparse weight sync",
    license="Apache-2.0",
    classifiers=["License :: OSI Approved :: Apache Software License"],
    packages=["dte", "dte.integrations"],
    python_requires=">=3.9",
)
