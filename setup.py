"""tirjax: RL for multi-turn tool-using LLM agents in JAX/Flax (PORTool, HiDiffTIR)."""

from pathlib import Path

from setuptools import find_packages, setup

setup(
    name="tirjax",
    version="0.1.0",
    description=__doc__,
    python_requires=">=3.11",
    packages=find_packages(include=["tirjax", "tirjax.*"]),
    install_requires=[line.split("#")[0].strip()
                      for line in Path(__file__).with_name("requirements.txt").read_text().splitlines()
                      if line.split("#")[0].strip()],
)
