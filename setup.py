"""tirjax: RL for multi-turn tool-using LLM agents in JAX/Flax (PORTool, HiDiffTIR)."""

from pathlib import Path

from setuptools import find_packages, setup


def _requirements(name: str) -> list[str]:
  lines = Path(__file__).with_name(name).read_text().splitlines()
  return [line.split("#")[0].strip() for line in lines if line.split("#")[0].strip()]


setup(
    name="tirjax",
    version="0.1.0",
    description=__doc__,
    python_requires=">=3.11",
    packages=find_packages(include=["tirjax", "tirjax.*"]),
    install_requires=_requirements("requirements.txt"),
    extras_require={"wandb": _requirements("requirements-wandb.txt")},
)
